"""The ablation runner's bookkeeping: sizes, held-out records, the tables and the verdicts on
the paper's directions (the runs themselves are the pretraining and fine-tuning scripts',
tested in their own files)."""

import json
import math
import types

import pytest
from absl import app

from bert_jax import train
from experiments import ablations
from experiments.configs import bert_tiny_cpu


def test_direction_needs_a_change_larger_than_the_noise():
    assert ablations.direction(0.70, 0.75, -1.0, noise=0.01) == "yes"  # fell, as in the paper
    assert ablations.direction(0.80, 0.75, -1.0, noise=0.01) == "no"  # rose instead
    assert ablations.direction(0.755, 0.75, -1.0, noise=0.01) == "within noise"
    assert ablations.direction(0.80, 0.75, +1.0, noise=0.0) == "yes"


def test_mean_std_is_the_sample_deviation():
    mean, std = ablations.mean_std([1.0, 2.0, 3.0])
    assert mean == 2.0 and std == pytest.approx(1.0)
    assert ablations.mean_std([0.5]) == (0.5, 0.0)


def test_sizes_parse_and_bad_ones_name_the_flag():
    assert ablations.parse_size("4/256/4") == (4, 256, 4)
    for bad in ("4/256", "4/250/4", "0/128/2", "a/b/c"):
        with pytest.raises(app.UsageError, match="--sizes"):
            ablations.parse_size(bad)


def test_a_size_override_changes_the_tiny_model_and_nothing_else():
    config = bert_tiny_cpu.get_config()
    default = train.model_config(config, 8000)
    assert (default.num_hidden_layers, default.hidden_size) == (2, 128)  # the preset's
    config.model.num_hidden_layers, config.model.hidden_size = 6, 256
    config.model.num_attention_heads, config.model.intermediate_size = 4, 1024
    sized = train.model_config(config, 8000)
    assert (sized.num_hidden_layers, sized.hidden_size, sized.num_attention_heads) == (6, 256, 4)
    assert sized.intermediate_size == 1024
    assert sized.replace(num_hidden_layers=2, hidden_size=128, num_attention_heads=2,
                         intermediate_size=512) == default  # fmt: skip


def test_held_out_reads_the_last_evaluation(tmp_path):
    records = [
        {"split": "train", "step": 100, "loss": 5.0},
        {"split": "eval", "step": 100, "mlm_loss": 6.0, "mlm_accuracy": 0.1},
        {"split": "eval", "step": 200, "mlm_loss": 5.5, "mlm_accuracy": 0.2},
        {"split": "train", "step": 200, "loss": 4.0},
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    assert ablations.held_out(str(tmp_path))["mlm_accuracy"] == 0.2
    (tmp_path / "metrics.jsonl").write_text(json.dumps(records[0]) + "\n")
    with pytest.raises(ValueError, match="no held-out evaluation"):
        ablations.held_out(str(tmp_path))


def test_read_json_ignores_a_run_that_did_not_finish(tmp_path):
    path = tmp_path / "metrics.json"
    assert ablations.read_json(str(path)) is None
    path.write_text(json.dumps({"epochs": []}))  # written after an epoch, run cut short
    assert ablations.read_json(str(path)) is None
    path.write_text(json.dumps({"epochs": [], "wall_time_s": 3.0}))
    assert ablations.read_json(str(path)) == {"epochs": [], "wall_time_s": 3.0}


def test_objectives_table_has_the_paper_rows_and_our_verdicts():
    scores = {
        "polarity": {
            "mlm_nsp": [0.78, 0.79, 0.80],
            "mlm": [0.70, 0.71, 0.72],  # clearly lower: the paper's direction
            "ltr": [0.78, 0.80, 0.82],  # within noise of BERT
            "scratch": [0.77, 0.77, 0.77],
        },
        # 1.5 points lower with a seed spread of 1.0: more than one standard deviation, less
        # than two standard errors of the difference of the means (1.63): not a verdict.
        "vitaminc": {
            "mlm_nsp": [0.78, 0.79, 0.80],
            "mlm": [0.765, 0.775, 0.785],
            "ltr": [0.78, 0.79, 0.80],
            "scratch": [0.77, 0.77, 0.77],
        },
    }
    held_out = {"mlm_nsp": {"mlm_accuracy": 0.25}, "mlm": {"mlm_accuracy": 0.27},
                "ltr": {"mlm_accuracy": 0.20}}  # fmt: skip
    text = ablations.format_objectives(scores, held_out)
    bert, no_nsp = "84.4 / 88.4 / 86.7 / 92.7 / 88.5", "83.9 / 84.9 / 86.5 / 92.6 / 87.9"
    assert f"| BERT (MLM + NSP) | {bert} | 79.0 ± 1.0 | 79.0 ± 1.0 | 25.0 |" in text
    assert f"| No NSP | {no_nsp} | 71.0 ± 1.0 | 77.5 ± 1.0 | 27.0 |" in text
    assert "| no pretraining (random weights) | - | 77.0 ± 0.0 | 77.0 ± 0.0 | - |" in text
    assert "- No NSP, polarity: -8.0 points (yes)" in text
    assert "- LTR & No NSP, polarity: +1.0 points (within noise)" in text
    assert "- No NSP, vitaminc: -1.5 points (within noise)" in text


def test_size_table_says_whether_perplexity_falls():
    sizes = [(2, 128, 2), (4, 256, 4)]
    scores = {"polarity": {"L2_H128_A2": [0.7], "L4_H256_A4": [0.75]}}
    falling = {"L2_H128_A2": {"mlm_loss": 6.0}, "L4_H256_A4": {"mlm_loss": 5.0}}
    text = ablations.format_sizes(sizes, falling, scores)
    assert f"| 2 | 128 | 2 | {math.exp(6.0):.2f} | 70.0 ± 0.0 |" in text
    assert "yes: it falls with every size" in text
    assert "- 24 / 1024 / 16: 3.23, 86.6 / 87.8 / 93.7" in text
    rising = {"L2_H128_A2": {"mlm_loss": 5.0}, "L4_H256_A4": {"mlm_loss": 5.2}}
    assert "no: it does not fall" in ablations.format_sizes(sizes, rising, scores)


def _f1(dev, test):
    return {"dev": {"f1": dev}, "test": {"f1": test}}


def test_features_table_checks_the_papers_three_directions():
    results = {
        "finetune": _f1(0.50, 0.45),
        "embeddings": _f1(0.20, 0.18),
        "last": _f1(0.40, 0.38),
        "concat_last_4": _f1(0.44, 0.41),
    }
    text = ablations.format_features(results)
    assert "| fine-tune all layers | 96.4 | 50.0 | 45.0 |" in text
    assert "| concat_last_4 | 96.1 | 44.0 | 41.0 |" in text
    assert "fine-tuning beats every feature-based row: yes (best feature-based: concat_last_4)" in (
        text
    )
    assert "the embeddings alone are the weakest features: yes" in text
    assert "concatenating the last four beats the last layer: yes" in text
    results["last"] = _f1(0.55, 0.5)
    text = ablations.format_features(results)
    assert "fine-tuning beats every feature-based row: no (best feature-based: last)" in text
    assert "concatenating the last four beats the last layer: no" in text


def test_a_workdir_made_with_other_flags_is_refused(tmp_path):
    names = {name for table in ablations.RUN_FLAGS.values() for name in table}
    opts = types.SimpleNamespace(**{name: 1 for name in names})
    for table in ablations.TABLES:
        (tmp_path / table).mkdir()
        ablations.check_workdir(opts, str(tmp_path / table), table)  # first run: records
        ablations.check_workdir(opts, str(tmp_path / table), table)  # the same: resumes
    opts.pretrain_steps = 2
    with pytest.raises(app.UsageError, match=r"--pretrain_steps=1 \(now 2\); use another"):
        ablations.check_workdir(opts, str(tmp_path / "objectives"), "objectives")
    # Only the objectives table pretrains for --pretrain_steps; the others resume.
    ablations.check_workdir(opts, str(tmp_path / "size"), "size")
    ablations.check_workdir(opts, str(tmp_path / "features"), "features")
    opts.seed = 2
    with pytest.raises(app.UsageError, match=r"--seed=1 \(now 2\)"):
        ablations.check_workdir(opts, str(tmp_path / "features"), "features")
