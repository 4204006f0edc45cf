"""benchmarks.studies.activation_precision: each run is the demo's pretraining with the precision's
model keys, and the verdict is the rule its docstring fixes (the runs themselves are a
benchmark, not a test)."""

import pytest

from benchmarks.studies import activation_precision as ap


def test_a_run_is_the_demos_pretraining_at_the_precision(parse_demo_flags):
    parse_demo_flags()
    argv = ap.command(
        "records", "vocab.txt", "out", "modern", "bf16_activations", 1, steps=1_000,
        launcher="cpu --slot",
    )  # fmt: skip
    assert argv[:2] == ["cpu", "--slot"]
    assert "--config=experiments/configs/demo_arms.py:modern" in argv
    assert "--config.seed=1" in argv and "--config.num_train_steps=1000" in argv
    assert "--config.data.max_predictions_per_seq=20" in argv  # modern masks 30% of 64
    assert argv[-3:] == [
        "--config.model.dtype=bfloat16",
        "--config.model.activation_dtype=bfloat16",
        "--config.model.residual_dtype=bfloat16",
    ]
    autocast = ap.command("records", "vocab.txt", "out", "modern", "bf16_autocast", 0, steps=500)
    assert autocast[-3:] == [
        "--config.model.dtype=bfloat16",
        "--config.model.activation_dtype=bfloat16",
        "--config.model.residual_dtype=float32",
    ]
    baseline = ap.command("records", "vocab.txt", "out", "bert", "f32", 0, steps=500)
    assert baseline[-3:] == [
        "--config.model.dtype=float32",
        "--config.model.activation_dtype=float32",
        "--config.model.residual_dtype=float32",
    ]
    assert "--config.optimizer.learning_rate=0.001" in baseline  # BERT's peak
    # The demo's own flags are left as they were.
    assert ap.demo.FLAGS.recipe == "modern" and ap.demo.FLAGS.pretrain_steps is None


@pytest.mark.parametrize(
    "proposal, passes",
    [
        ([0.315, 0.325], True),  # 0.005 from either mean
        ([0.300, 0.320], True),  # 0.005 below f32's mean, 0.015 below bf16_matmul's
        ([0.300, 0.308], False),  # 0.011 below f32's mean, but 0.021 below bf16_matmul's
        ([0.330, 0.342], False),  # 0.011 above bf16_matmul's mean, but 0.021 above f32's
    ],
)
def test_bf16_activations_pass_within_the_larger_seed_spread(proposal, passes):
    # Means 0.315 and 0.325; seed spreads 0.02 and 0.006: 0.02 is allowed.
    accuracy = {"f32": [0.305, 0.325], "bf16_matmul": [0.322, 0.328], "bf16_activations": proposal}
    verdict = ap.verdict(accuracy)
    assert verdict["allowed"] == pytest.approx(0.02)
    assert verdict["passes"] is passes
