"""benchmarks/accelerator_run.sh rehearsed on the CPU at tiny sizes, as a lent GPU would run it.

The GPU machine's Python has no TensorFlow and no ml_collections. Every Python process of the
rehearsal (the orchestrator and each row's) starts with an import hook, a `sitecustomize` on
PYTHONPATH, under which both are absent and any import of them is noted in a file, which must
stay empty: a code path that needs them fails here, not on the GPU. One T (32), to keep the
rehearsal near a minute: each row is a process that compiles its own step. No time is
asserted, only that every planned row ran (or was skipped for the reason it should be) and
that the rates agree with the counts.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys

import pytest
from conftest import FAST_COMPILE

from benchmarks import accelerator_bench as bench
from benchmarks import accelerator_rows
from bert_jax import telemetry
from bert_jax.config import BertConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCKER = """
import builtins
import importlib
import os
import sys

BLOCKED = ("tensorflow", "ml_collections")


def blocked(name):
    return name.partition(".")[0] in BLOCKED


def note(name):
    with open(os.environ["BLOCKED_IMPORTS_LOG"], "a") as f:
        f.write(f"{os.getpid()} {name}\\n")


class Hiding:
    # A finder of sys.meta_path that never finds the blocked packages: absent, as there.

    def __init__(self, finder):
        self.finder = finder

    def __getattr__(self, attribute):
        return getattr(self.finder, attribute)

    def find_spec(self, name, path=None, target=None):
        return None if blocked(name) else self.finder.find_spec(name, path, target)


sys.meta_path[:] = [Hiding(finder) for finder in sys.meta_path]
# An import of them (a probe, `importlib.util.find_spec`, just finds nothing) is noted, even
# one whose ImportError is caught.
import_statement, import_module = builtins.__import__, importlib.import_module


def noting_import(name, globals=None, locals=None, fromlist=(), level=0):
    if level == 0 and blocked(name):
        note(name)
    return import_statement(name, globals, locals, fromlist, level)


def noting_import_module(name, package=None):
    if not name.startswith(".") and blocked(name):
        note(name)
    return import_module(name, package)


builtins.__import__, importlib.import_module = noting_import, noting_import_module
"""
VOCAB = bench.SIZES["tiny"][1]["vocab_size"]
# Each row is a process compiling its own step (~7 s here): the rehearsal runs one of each
# path (unpacked and packed rows, the einsum and a fused attention, both torch peers, a cuDNN
# row skipped off a GPU), not all seven variants of both families. In the order they run: the
# ModernBERT rows after the BERT ones.
REHEARSED = (
    "ours/tiny/T32/unpacked/einsum",
    "ours/tiny/T32/unpacked/cudnn",
    "torch/tiny/T32/unpacked/sdpa",
    "torch/modern_tiny/T32/unpacked/sdpa",
    "ours/modern_tiny/T32/packed/xla",
)


# Extended tier: a rehearsal of a benchmark tool for a lent GPU (five row processes, each
# compiling its step: ~32 s of make test's budget). make test keeps the plan, the rates and
# the batches below, in this process, and the command line answering -h.
@pytest.mark.extended
def test_tiny_rehearsal_runs_every_row_without_tensorflow(tmp_path):
    hooks, out = tmp_path / "hooks", tmp_path / "out"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(BLOCKER)
    blocked = tmp_path / "blocked.txt"
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(hooks), ROOT]),
        BLOCKED_IMPORTS_LOG=str(blocked),
        PYTHON=sys.executable,
        OUT=str(out),
        JAX_PLATFORMS="cpu",
    )
    env["XLA_FLAGS"] = FAST_COMPILE  # one CPU device, as the GPU machine has one GPU
    command = ["bash", "benchmarks/accelerator_run.sh", "--sizes=tiny,modern_tiny",
               "--seq_lens=32", "--steps=2", "--warmup=1", "--time_budget_s=600",
               f"--rows={','.join(REHEARSED)}", "--profile=ours/*/unpacked/einsum"]  # fmt: skip
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert not blocked.exists(), blocked.read_text()

    report = json.loads((out / "results.json").read_text())
    rows = report["rows"]
    assert [r["id"] for r in rows] == list(REHEARSED)
    assert report["meta"]["platform"] == "cpu"
    assert report["meta"]["peak_tflops"] is None  # no published peak for a CPU: no MFU
    for row in rows:
        batch, seq_len = row["batch"], row["seq_len"]
        if row["attention"] == "cudnn":
            assert row["status"] == "skipped" and "GPU" in row["error"], row
            continue
        if row["peer"] == "torch" and row["status"] == "skipped":
            assert "torch" in row["error"]  # only where torch or transformers is missing
            continue
        assert row["status"] == "ok", row
        assert batch == 4 and len(row["step_times_s"]) == 2
        assert math.isfinite(row["seq_per_s"]) and row["seq_per_s"] > 0
        assert row["tokens_per_s"] == pytest.approx(row["real_tokens"] / row["step_s"])
        assert 0 < row["real_tokens"] <= batch * seq_len
        if row["packed"]:  # every row is filled first, so at least one instance each
            assert row["instances"] >= batch
        else:
            assert row["instances"] == batch and row["seq_per_s"] == row["rows_per_s"]
        assert row["mfu"] is None and row["tflops"] > 0
        # Fresh weights predict ~uniformly: MLM ln(V), + NSP ln(2) where BERT trains it.
        nsp = math.log(2) if row["objective"] == "mlm_nsp" else 0.0
        assert row["first_loss"] == pytest.approx(math.log(VOCAB) + nsp, abs=0.3)
        if row["peer"] == "ours":
            assert row["compile_s"] > 0
            bert_einsum = row["attention"] == "einsum" and row["family"] == "bert"
            expected_dropout = 0.1 if bert_einsum else 0.0
            assert row["attn_dropout"] == row["config"]["attention_probs_dropout_prob"]
            assert row["attn_dropout"] == expected_dropout
    # The one profiled row: its trace beside the table, its busiest ops in the report.
    profiled = [r for r in rows if r.get("profile")]
    assert [r["id"] for r in profiled] == ["ours/tiny/T32/unpacked/einsum"]
    profile = profiled[0]["profile"]
    assert (out / "profile-ours-tiny-T32-unpacked-einsum.json.gz").stat().st_size > 0
    assert profile["steps"] == 3 and profile["lines"]
    for timeline in profile["lines"]:
        assert timeline["ms_per_step"] > 0 and timeline["ops"]
        assert sum(ms for _, ms in timeline["ops"]) <= timeline["ms_per_step"] * (1 + 1e-9)
    table = (out / "results.md").read_text()
    assert "## Profile: ours/tiny/T32/unpacked/einsum" in table
    assert "| " + " | ".join(bench.TABLE_COLUMNS) + " |" in table
    assert sum(line.startswith("| tiny") for line in table.splitlines()) == len(rows)
    assert (out / "rows.log").stat().st_size > 0 and (out / "run.log").stat().st_size > 0


def test_mfu_is_against_the_chips_bf16_peak():
    assert bench.known_peak_flops("NVIDIA H100 80GB HBM3", None) == 989e12
    assert bench.known_peak_flops("NVIDIA H200", None) == 989e12
    assert bench.known_peak_flops("cpu", None) is None
    assert bench.known_peak_flops("cpu", 2.0) == 2e12
    row = dict(
        peer="ours",
        batch=256,
        seq_len=128,
        predictions=20,
        config=dataclasses.asdict(bench.model_config(_args(), "base", "cudnn")),
    )
    times = [0.2, 0.1, 0.3]
    result = dict(status="ok", times=times, instances=256, real_tokens=256 * 100)
    bench.add_rates(row, result, 989e12)
    flops = telemetry.train_flops_per_step(BertConfig(**row["config"]), 256, 128, 20)
    assert row["step_s"] == 0.2
    assert row["mfu"] == pytest.approx(flops / 0.2 / 989e12)
    assert 0 < row["mfu"] <= 1
    assert row["tokens_per_s"] == pytest.approx(256 * 100 / 0.2)


def test_plan_orders_rounds_and_overrides_batches():
    args = _args("--batch=base:512=16", "--peer=none", "--attention=einsum,cudnn")
    rows = bench.build_plan(args, "gpu")
    firsts = [(r["size"], r["seq_len"]) for r in rows[:4]]
    assert firsts == [("base", 128), ("large", 128), ("base", 512), ("large", 512)]
    assert all(r["attention"] == "einsum" and not r["packed"] for r in rows[:4])
    assert {r["attention"] for r in rows} == {"einsum", "cudnn"}
    assert not any("status" in r for r in rows)  # cudnn runs on a GPU
    batches = {(r["size"], r["seq_len"]): r["batch"] for r in rows}
    assert batches == {("base", 128): 256, ("base", 512): 16, ("large", 128): 128,
                       ("large", 512): 32, ("modern", 1024): 32}  # fmt: skip
    assert {r["predictions"] for r in rows if r["seq_len"] == 512} == {80}
    # The default plan's ModernBERT rows come after every BERT row, in rounds of their own.
    families = [r["family"] for r in rows]
    assert families == sorted(families, key=lambda f: f != "bert") and families[-1] == "modernbert"
    modern = [r for r in rows if r["family"] == "modernbert"]
    assert [r["id"] for r in modern] == [
        "ours/modern/T1024/unpacked/einsum",
        "ours/modern/T1024/unpacked/cudnn",
        "ours/modern/T1024/packed/cudnn",
        "ours/modern/T1024/packed/einsum",
    ]
    assert {(r["objective"], r["predictions"], r["attn_dropout"]) for r in modern} == {
        ("mlm", 320, 0.0)
    }
    assert bench.BertConfig(**modern[0]["config"]).local_attention_window == 128


def test_rows_and_profile_flags_pick_rows_by_id():
    args = _args("--rows=ours/large/*/unpacked/cudnn,torch/*", "--profile=*/T128/*",
                 "--output_dir=/tmp/x")  # fmt: skip
    rows = bench.build_plan(args, "gpu")
    assert [r["id"] for r in rows] == [
        "ours/large/T128/unpacked/cudnn",
        "ours/large/T512/unpacked/cudnn",
        "torch/base/T128/unpacked/sdpa",
        "torch/large/T128/unpacked/sdpa",
        "torch/base/T512/unpacked/sdpa",
        "torch/large/T512/unpacked/sdpa",
        "torch/modern/T1024/unpacked/sdpa",
    ]
    # Only our rows are traced (the peer has no jax profile).
    traced = {r["id"]: r["profile_path"] for r in rows if "profile_path" in r}
    assert traced == {
        "ours/large/T128/unpacked/cudnn": "/tmp/x/profile-ours-large-T128-unpacked-cudnn.json.gz"
    }
    only_modern = bench.build_plan(_args("--sizes=modern"), "gpu")
    assert len(only_modern) == len(bench.VARIANTS)
    assert {r["model"] for r in only_modern} == {"ModernBERT-base"}


def test_modern_instances_are_single_segments_with_30_percent_masked():
    row = bench.build_plan(_args("--sizes=modern", "--rows=ours/*/unpacked/einsum"), "gpu")[0]
    spec = dict(row, max_instances_per_row=4, full_fraction=1.0, seed=0)
    batch = accelerator_rows.make_batch(dict(spec, batch=2))
    assert batch["input_ids"].max() < 50368 and not batch["segment_ids"].any()
    assert not batch["next_sentence_labels"].any()
    assert (batch["input_ids"] == accelerator_rows.SEP).sum(axis=1).tolist() == [1, 1]
    assert batch["masked_lm_weights"].sum(axis=1).tolist() == [round(0.3 * 1024)] * 2


def test_h_prints_the_flags_and_exits_0(capsys):
    with pytest.raises(SystemExit) as exited:
        bench.parse_args(["-h"])
    assert exited.value.code == 0
    printed = capsys.readouterr().out
    assert printed.startswith("usage: ") and "--time_budget_s" in printed


def _args(*flags: str):
    return bench.parse_args(list(flags))
