"""experiments.electra_compare: the equal-compute budget, the wall-time arm, paired runs, the
report (units), and the whole comparison on a tiny budget (slow tier)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import types

import pytest
from absl import app

from bert_jax import train
from experiments import electra_compare as ec

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _opts(**overrides):
    values = dict(
        pretrain_steps=3_600, pretrain_batch_size=64, max_seq_length=64, seed=0, subsets=3,
        label_budgets=["250", "1000", "all"], same_time_tolerance=0.03, min_steps=300,
    )  # fmt: skip
    values.update(overrides)
    return types.SimpleNamespace(**values)


@pytest.fixture
def vocab(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("".join(f"piece{i}\n" for i in range(8000)))
    return str(path)


def _write_run(path, steps: int, rates: list[float]) -> str:
    os.makedirs(path, exist_ok=True)
    records = [
        {"step": 50 * (i + 1), "split": "train", "loss": 1.0, "steps_per_second": r}
        for i, r in enumerate(rates)
    ]
    records += [{"step": steps, "split": "eval", "mlm_accuracy": 0.2, "disc_accuracy": 0.9}]
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    return str(path)


def test_equal_flops_steps_spend_the_mlm_budget(vocab):
    opts = _opts()
    steps = ec.equal_flops_steps(opts, vocab)
    flops = {arm: ec.flops_per_step(opts, arm, vocab) for arm in ec.ARMS}
    budget = opts.pretrain_steps * flops["mlm"]
    assert steps["mlm"] == opts.pretrain_steps
    # ELECTRA's step costs more (generator, projections, a head on every token): fewer steps.
    assert flops["electra"] > flops["mlm"] and steps["electra"] < steps["mlm"]
    for arm in ec.ARMS:
        assert abs(steps[arm] * flops[arm] - budget) <= flops[arm] / 2
    # The count is the training loop's own (the one behind the logged MFU).
    config = ec.run_config(opts, "electra")
    assert flops["electra"] == train.flops_per_step(config, train.model_config(config, 8000))


def test_seconds_per_step_is_the_median_after_the_compiling_interval(tmp_path):
    run = _write_run(tmp_path / "run", 200, [0.1, 2.0, 4.0, 5.0])
    assert ec.seconds_per_step(run) == pytest.approx(1 / 4.0)
    _write_run(tmp_path / "none", 200, [1.0])
    with pytest.raises(ValueError, match="no steps_per_second"):
        ec.seconds_per_step(str(tmp_path / "none"))


@pytest.mark.parametrize("electra_rate, arm_added", [(2.0, True), (4.0 * 3312 / 3600, False)])
def test_the_wall_time_arm_exists_when_rates_differ_from_flops(
    tmp_path, vocab, electra_rate, arm_added
):
    opts = _opts()
    steps = ec.equal_flops_steps(opts, vocab)
    _write_run(tmp_path / "pretrain" / "mlm", steps["mlm"], [1.0, 4.0, 4.0])
    _write_run(
        tmp_path / "pretrain" / "electra", steps["electra"], [1.0, electra_rate, electra_rate]
    )
    present, planned = ec.pretrain_arms(opts, str(tmp_path), vocab, ())
    assert set(present) == {"mlm", "electra"}  # the others never ran, nothing was started
    assert planned[ec.PAIRS_ARM] == planned["electra"]
    if arm_added:
        # mlm's 3,600 steps at 4/s last 900 s: ELECTRA at 2/s does 1,800 steps in them.
        assert planned[ec.TIME_ARM] == 1_800
    else:
        assert ec.TIME_ARM not in planned


def test_fine_tuning_runs_are_paired_over_arms():
    jobs = ec.finetune_jobs(_opts(subsets=2), 8568, ["mlm_nsp", "mlm", "electra", "scratch"])
    assert len(jobs) == 3 * 2 * 4
    for labels in (250, 1000, 8568):
        for seed in (0, 1):  # a subset is the seed's: every arm and scratch train on it
            arms = [a for n, a, s in jobs if n == labels and s == seed]
            assert arms == ["mlm_nsp", "mlm", "electra", "scratch"]
    halves = jobs[0::2] + jobs[1::2]  # --part=1/2 and 2/2 split the runs, none twice
    assert sorted(halves) == sorted(jobs)
    with pytest.raises(app.UsageError, match="9000 is not in 1..8568"):
        ec.finetune_jobs(_opts(label_budgets=["9000"]), 8568, ["mlm"])


def test_prior_gap_is_zero_for_a_discriminator_that_knows_only_the_prior():
    r = 0.145
    prior = -(r * math.log(r) + (1 - r) * math.log(1 - r))  # 0.414 nats
    assert ec.prior_gap({"replaced_fraction": r, "disc_loss": prior}) == pytest.approx(0)
    assert ec.prior_gap({"replaced_fraction": r, "disc_loss": 0.2}) == pytest.approx(prior - 0.2)


def test_parse_part():
    assert ec.parse_part("2/3") == (1, 3)
    for bad in ("0/2", "3/2", "half"):
        with pytest.raises(app.UsageError, match="--part"):
            ec.parse_part(bad)


def test_report_gives_paired_differences():
    seeds = (0, 1, 2)
    scores = {}
    for s in seeds:
        base = 0.6 + 0.01 * s  # subsets differ; ELECTRA is 2 points up on each one
        for arm, shift in (("mlm_nsp", 0.0), ("mlm", -0.01), ("electra", 0.02), ("scratch", 0.0)):
            scores[250, arm, s] = base + shift
    steps = {"mlm_nsp": 3600, "mlm": 3600, "electra": 3312}
    flops = {"mlm_nsp": 14.47e9, "mlm": 14.47e9, "electra": 15.73e9}
    timing = {"mlm_nsp": 0.3, "mlm": 0.3, "electra": 0.5}
    held = {arm: [{"step": steps[arm], "mlm_accuracy": 0.2, "disc_accuracy": 0.9}] for arm in steps}
    text = ec.report(_opts(), steps, flops, timing, held, scores)
    assert "| ELECTRA (equal FLOPs) | 3,312 | 15.73 | 52.1 | 0.500 | 27.6 |" in text
    assert "| 250 | 61.0 ± 1.0 | 60.0 ± 1.0 | 63.0 ± 1.0 | 61.0 ± 1.0 |" in text
    assert "250 labels, ELECTRA (equal FLOPs) - MLM alone: +3.0 [+3.0, +3.0]" in text
    assert "250 labels, ELECTRA (equal FLOPs) - BERT (MLM + NSP): +2.0 [+2.0, +2.0]" in text
    assert "| 3,312 | 1.00 | - | - | 0.900 | - | - | 0.200 |" in text  # ELECTRA's curve


@pytest.mark.slow
def test_the_whole_comparison_on_a_tiny_budget(tmp_path):
    """Records, three pretrainings, the wall-time arm, paired fine-tuning and the report:
    the command the docs give, on 30 steps and 50 labels."""
    corpus = tmp_path / "imdb"
    command = [
        sys.executable, "-m", "experiments.electra_compare", f"--workdir={tmp_path / 'w'}",
        f"--corpus_dir={corpus}", "--pretrain_steps=30", "--label_budgets=50", "--subsets=2",
        "--min_steps=4", "--same_time_tolerance=0", "--vocab_size=2000",
    ]  # fmt: skip
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads((tmp_path / "w" / "results.json").read_text())
    assert data["steps"]["mlm"] == 30 and data["steps"]["electra"] < 30
    assert ec.TIME_ARM in data["steps"]  # tolerance 0: any measured difference adds it
    arms = {r["arm"] for r in data["scores"]}
    assert arms == {"mlm_nsp", "mlm", "electra", ec.TIME_ARM, ec.PAIRS_ARM, "scratch"}
    assert len(data["scores"]) == 2 * len(arms)
    for arm in ("mlm", "electra"):
        assert data["held_out"][arm][-1]["step"] == data["steps"][arm]
    assert "paired differences" in (tmp_path / "w" / "results.md").read_text()
