"""benchmarks/bench_model.py end to end at the tiny size: one worker, its protocol, the JSON.

No timing is asserted (speed is reported by the benchmark, never tested): only that the
orchestrator and a worker process agree, and that the step computed the BERT loss.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = 2000  # word ids are drawn from [1000, VOCAB)


# Extended tier: a rehearsal of a benchmark tool (an orchestrator and a worker process, each
# compiling its steps: ~12 s of make test's budget). What the suite checks of the model step
# itself stays in make test (test_train, test_model_flops for the FLOP count behind its MFU);
# its command line answering -h stays below.
@pytest.mark.extended
def test_bench_model_tiny_runs_and_reports(tmp_path):
    output = tmp_path / "bench.json"
    command = [
        sys.executable, "-m", "benchmarks.bench_model", "--sizes=tiny", "--peers=ours",
        "--modes=fwdbwd,train,peak", "--ours_variants=f32", "--reps=2", "--iters=1",
        "--warmup=1", "--peak_n=128", "--peak_iters=1", "--seq=32", "--preds=5",
        f"--vocab={VOCAB}", f"--output_json={output}",
    ]  # fmt: skip
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(output.read_text())
    steps = {r["case"]: r for r in report["records"] if r["mode"] != "matmul"}
    assert set(steps) == {"fwdbwd:ours[f32,threefry2x32]", "train:ours[f32,threefry2x32]"}
    for record in steps.values():
        assert record["n"] == 2  # 2 repetitions x 1 timed step
        # A freshly initialised model predicts ~uniformly: MLM ln(V) + NSP ln(2).
        assert abs(record["first_loss"] - (math.log(VOCAB) + math.log(2))) < 0.2
        assert record["batch"] == 16 and record["seq"] == 32
        # MFU against the best matmul of the run (a 128^3 product here: not a real peak).
        best = max(report["peaks"].values())
        assert record["mfu"] == pytest.approx(record["useful_gflops"] / best)
    assert set(report["peaks"]) == {"peak[jax,float32]", "peak[jax,bfloat16]"}


def test_h_prints_the_flags_and_exits_0(capsys):
    from benchmarks import bench_model

    with pytest.raises(SystemExit) as exited:
        bench_model.parse_args(["-h"])
    assert exited.value.code == 0
    printed = capsys.readouterr().out
    assert printed.startswith("usage: python -m benchmarks.bench_model") and "--sizes" in printed
