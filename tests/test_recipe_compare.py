"""The demo's pretraining recipes (experiments/configs/demo_arms.py), the warmup-stable-decay
schedule (against transformers' own), and experiments.recipe_compare: the equal-time
arithmetic, the timing of a run's log, the report's schema and paired intervals, and (extended
tier) a tiny comparison end to end."""

import json
import subprocess
import sys
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from conftest import run_captured

from bert_jax import optim, train
from bert_jax.config import BertConfig
from bert_jax.heads import BertForPreTraining
from data_pipelines import recipe
from experiments import demo, demo_finetune, recipe_compare, recipe_report
from experiments.configs import demo_arms

REPO = Path(__file__).parent.parent


# ------------------------------------------------------------------------------ schedule


@pytest.mark.parametrize("total,warmup,fraction", [(100, 10, 0.2), (57, 3, 0.5), (40, 0, 1.0)])
def test_warmup_stable_decay_is_transformers_wsd_schedule(total, warmup, fraction):
    torch = pytest.importorskip("torch")
    from transformers.optimization import get_wsd_schedule

    peak = 2e-3
    decay = round(total * fraction)
    sgd = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=peak)
    scheduler = get_wsd_schedule(sgd, num_warmup_steps=warmup, num_decay_steps=decay,
                                 num_training_steps=total, decay_type="linear")  # fmt: skip
    expected = []
    for _ in range(total + 1):
        expected.append(sgd.param_groups[0]["lr"])
        sgd.step()
        scheduler.step()
    config = ml_collections.ConfigDict(
        {"learning_rate": peak, "warmup_steps": warmup, "schedule": "wsd",
         "decay_fraction": fraction}
    )  # fmt: skip
    schedule = optim.learning_rate_schedule(config, total)
    ours = [float(schedule(step)) for step in range(total + 1)]
    np.testing.assert_allclose(ours, expected, rtol=1e-6, atol=1e-12)


def test_the_linear_schedule_stays_the_default_and_a_bad_name_is_refused():
    config = ml_collections.ConfigDict({"learning_rate": 1e-4, "warmup_steps": 10})
    linear = optim.learning_rate_schedule(config, 100)
    np.testing.assert_allclose(float(linear(10)), 1e-4 * 0.9, rtol=1e-6)  # BERT's, from step 0
    config.schedule = "cosine"
    with pytest.raises(ValueError, match=r"config.optimizer.schedule must be one of"):
        optim.learning_rate_schedule(config, 100)
    config.schedule, config.decay_fraction = "wsd", 0.0
    with pytest.raises(ValueError, match=r"decay_fraction must be in \(0, 1\]"):
        optim.learning_rate_schedule(config, 100)


# ---------------------------------------------------------------------------------- arms


def _model_config(arm: str) -> BertConfig:
    return train.model_config(demo_arms.get_config(arm), vocab_size=5555)


def _param_count(config: BertConfig) -> int:
    module = BertForPreTraining(config, next_sentence=False)
    ids = jnp.zeros((1, 8), jnp.int32)
    positions = jnp.zeros((1, 2), jnp.int32)
    shapes = jax.eval_shape(module.init, jax.random.key(0), ids, ids, jnp.ones_like(ids), positions)
    return sum(np.prod(x.shape) for x in jax.tree.leaves(shapes))


def test_each_arm_changes_only_what_it_names():
    bert = _model_config("bert")
    assert bert.non_bert_fields() == []  # the demo's BERT-tiny, exactly
    assert (bert.num_hidden_layers, bert.hidden_size, bert.num_attention_heads) == (2, 128, 2)
    for name, arm in demo_arms.ARMS.items():
        config = _model_config(name)
        changed = {
            f for f in BertConfig.__dataclass_fields__ if getattr(config, f) != getattr(bert, f)
        }
        assert changed == set(arm.model), name
        pretraining = demo_arms.get_config(name)
        assert pretraining.objective == arm.objective and pretraining.data.dynamic_masking
        assert pretraining.data.masked_lm_prob == arm.masked_lm_prob
        assert pretraining.data.eval_masked_lm_prob == 0.15  # every arm is scored alike
        assert pretraining.optimizer.learning_rate == arm.learning_rate
        assert pretraining.optimizer.schedule == arm.schedule
    modern = demo_arms.ARMS["modern"]
    singles = ("rotary", "geglu", "pre_ln")
    assert modern.model == {k: v for n in singles for k, v in demo_arms.ARMS[n].model.items()}
    assert modern.masked_lm_prob == demo_arms.ARMS["mask30"].masked_lm_prob == 0.30
    wsd = demo_arms.ARMS["wsd"]
    assert (modern.learning_rate, modern.schedule) == (wsd.learning_rate, wsd.schedule)
    # ELECTRA's arms: BERT's encoder and recipe, and the modern encoder and schedule, each at
    # ELECTRA's 15%; every other arm is masked LM.
    electra, electra_modern = demo_arms.ARMS["electra"], demo_arms.ARMS["electra_modern"]
    assert electra.model == {} and electra_modern.model == modern.model
    assert (electra_modern.learning_rate, electra_modern.schedule) == (wsd.learning_rate, "wsd")
    assert electra.masked_lm_prob == electra_modern.masked_lm_prob == 0.15
    objectives = {name: arm.objective for name, arm in demo_arms.ARMS.items()}
    assert {n for n, o in objectives.items() if o != "mlm"} == {"electra", "electra_modern"}


@pytest.mark.extended  # a short ELECTRA run, ~12 s of make test's budget; CI runs it
def test_the_modern_electra_arm_trains_the_modern_encoder_as_its_discriminator():
    """The discriminator is the modern arm's encoder (the same params), the generator the
    same kind of encoder at a quarter of the width; a few steps lower the loss. (ELECTRA with
    BERT's encoder: tests/test_electra.py.)"""
    from bert_jax import electra, sharding, train_state

    config = demo_arms.get_config("electra_modern")
    config.data.max_seq_length, config.data.max_predictions_per_seq = 16, 3
    config.global_batch_size, config.num_train_steps = 8, 20
    config.optimizer.warmup_steps = 1
    mesh = sharding.create_mesh((1, 1, 1), devices=jax.devices()[:1])
    run = train.setup(config, mesh, vocab_size=64)
    assert isinstance(run.model, electra.ElectraForPreTraining)
    modern = BertForPreTraining(_model_config("modern").replace(vocab_size=64), next_sentence=False)
    example = train.init_inputs(train.example_batch(1, 16, 3))
    mlm_params = nn.unbox(jax.eval_shape(modern.init, jax.random.key(0), *example))["params"]

    def shapes(tree):
        return {k: v.shape for k, v in jax.tree_util.tree_leaves_with_path(tree)}

    assert shapes(run.abstract_state.params["bert"]) == shapes(mlm_params["bert"])
    generator, encoder = run.model.generator_config, run.model_config
    assert generator.hidden_size == 32
    for field in ("position_encoding", "feed_forward", "norm_placement", "linear_bias"):
        assert getattr(generator, field) == getattr(encoder, field), field
    state, _ = train_state.sharded_state(run.model, run.tx, mesh, run.inputs,
                                         rng=jax.random.key(0), rules=run.rules)  # fmt: skip
    rng = np.random.default_rng(0)
    batch = {k: np.zeros(v.shape, v.dtype) for k, v in train.example_batch(8, 16, 3).items()}
    batch["input_ids"] = rng.integers(5, 64, (8, 16)).astype(np.int32)
    batch["input_mask"][:] = 1
    batch["masked_lm_positions"] = np.tile(np.array([2, 7, 11], np.int32), (8, 1))
    batch["masked_lm_ids"] = np.take_along_axis(batch["input_ids"], batch["masked_lm_positions"], 1)
    batch["masked_lm_weights"][:] = 1.0
    batch["input_ids"][np.arange(8)[:, None], batch["masked_lm_positions"]] = 4  # [MASK]
    losses = []
    for step in range(12):
        state, metrics = run.train_step(state, batch, jax.random.key(step))
        losses.append(float(metrics["loss"]))
    assert np.isfinite(losses).all() and losses[-1] < 0.8 * losses[0], losses


def test_geglu_has_the_mlps_parameters_and_positions_cost_their_table():
    bert, geglu = _param_count(_model_config("bert")), _param_count(_model_config("geglu"))
    assert abs(geglu - bert) / bert < 0.005, (geglu, bert)
    rotary = _param_count(_model_config("rotary"))
    assert bert - rotary == 512 * 128  # the learned position table, and nothing else


def test_an_unknown_arm_names_the_arms():
    with pytest.raises(ValueError, match=r"no arm 'rope'.*bert, rotary, alibi"):
        demo_arms.get_config("rope")


def test_predictions_per_seq_follows_the_masking_rate():
    assert recipe.predictions_per_seq(128) == 20  # the original's
    assert recipe.predictions_per_seq(64) == 10
    assert recipe.predictions_per_seq(64, 0.30) == 20  # ceil(19.2)
    assert recipe.predictions_per_seq(512, 0.30) == 154


def test_the_demo_pretrains_with_its_recipe(monkeypatch, tmp_path, parse_demo_flags):
    calls = []
    monkeypatch.setattr(recipe, "run", lambda stage, args: calls.append(args))
    parse_demo_flags("--recipe=modern", "--pretrain_steps=100")
    assert demo.setting("pretrain_learning_rate") == 2e-3  # the recipe's peak
    demo.pretrain("records", "vocab.txt", str(tmp_path))
    args = calls[-1]
    assert "--config=experiments/configs/demo_arms.py:modern" in args
    assert "--config.data.max_predictions_per_seq=20" in args  # 30% of 64
    assert "--config.optimizer.learning_rate=0.002" in args
    assert "--config.eval_every=10" in args and "--config.checkpoint_every=20" in args
    demo.pretrain("records", "vocab.txt", str(tmp_path), timing=True)  # a calibration's
    assert "--config.eval_every=100" in calls[-1] and "--config.checkpoint_every=100" in calls[-1]
    parse_demo_flags("--recipe=modern", "--pretrain_learning_rate=5e-4")
    assert demo.setting("pretrain_learning_rate") == 5e-4  # a flag given wins
    assert demo.setting("pretrain_steps") == 6_550  # BERT's wall time (demo_arms)
    parse_demo_flags()
    assert demo.FLAGS.recipe == "modern"  # the default: measured best (docs/recipes.md)
    parse_demo_flags("--recipe=bert")
    assert demo.setting("pretrain_learning_rate") == 1e-3
    assert demo.setting("pretrain_steps") == 8_000
    parse_demo_flags("--task=polarity")
    demo.pretrain("records", "vocab.txt", str(tmp_path))
    assert "--config=experiments/configs/bert_tiny_cpu.py" in calls[-1]


# ------------------------------------------------------------------------------ harness


def test_equal_time_steps():
    steps = recipe_compare.equal_time_steps(8000, {"bert": 0.18, "modern": 0.22}, "bert")
    assert steps == {"bert": 8000, "modern": round(8000 * 0.18 / 0.22)}  # 6,545
    # wsd steps BERT's program (only the learning rates differ): BERT's steps, whatever
    # its timing says; mask30's larger MLM head is another program, timed.
    timed = {"bert": 0.22, "wsd": 0.20, "mask30": 0.24, "electra": 0.3}
    steps = recipe_compare.equal_time_steps(8000, timed, "bert")
    assert steps == {"bert": 8000, "wsd": 8000, "mask30": round(8000 * 0.22 / 0.24),
                     "electra": round(8000 * 0.22 / 0.3)}  # fmt: skip
    same = [n for n, a in demo_arms.ARMS.items() if demo_arms.same_step(a, demo_arms.ARMS["bert"])]
    assert same == ["bert", "wsd"]
    with pytest.raises(ValueError, match="reference arm 'bert' has no measured time"):
        recipe_compare.equal_time_steps(8000, {"modern": 0.2}, "bert")
    with pytest.raises(ValueError, match="must be positive"):
        recipe_compare.equal_time_steps(8000, {"bert": 0.2, "modern": 0.0}, "bert")


def test_arms_of_one_architecture_share_their_scratch_runs(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n的\n", encoding="utf-8")

    def scratch(arm, budgets=(100, 400), subsets=5):
        # an ELECTRA arm's: its discriminator
        config = train.model_config(demo_arms.get_config(arm), 6)
        return demo_finetune.architecture_id(config, str(vocab), list(budgets), subsets)

    # The learning rates, the masking rate and the objective do not change the fine-tuned model.
    assert {scratch(a) for a in ("bert", "wsd", "mask30", "electra")} == {scratch("bert")}
    assert scratch("electra_modern") == scratch("modern")
    models = ("bert", "rotary", "alibi", "geglu", "pre_ln", "modern")
    assert len({scratch(a) for a in models}) == len(models)
    assert scratch("bert", budgets=(100,)) != scratch("bert")  # other label subsets
    assert scratch("bert", subsets=4) != scratch("bert")
    before = scratch("bert")
    vocab.write_text(vocab.read_text(encoding="utf-8") + "一\n", encoding="utf-8")
    assert scratch("bert") != before  # another vocab, other ids


def test_seconds_per_step_weights_the_intervals_after_the_first():
    log = [
        {"split": "train", "step": 50, "steps_per_second": 1.0},  # compiles: left out
        {"split": "eval", "step": 50, "loss": 3.0},
        {"split": "train", "step": 100, "steps_per_second": 5.0},  # 50 steps in 10 s
        {"split": "train", "step": 300, "steps_per_second": 10.0},  # 200 steps in 20 s
    ]
    assert recipe_compare.seconds_per_step(log) == pytest.approx(30 / 250)
    with pytest.raises(ValueError, match="two logged intervals"):
        recipe_compare.seconds_per_step(log[:2])


def _run(pretrained, scratch, mlm):
    budgets = [{"labels": 100, "pretrained": pretrained[0], "scratch": scratch[0]},
               {"labels": 400, "pretrained": pretrained[1], "scratch": scratch[1]}]  # fmt: skip
    held = [{"step": 0, "mlm_accuracy": 0.0}, {"step": 100, "mlm_accuracy": mlm}]
    return {"label_budgets": budgets, "pretraining": {"held_out": held},
            "wall_time_s": {"pretrain": 60.0}}  # fmt: skip


def test_the_report_pairs_arms_by_seed_and_subset(tmp_path):
    runs = {
        ("bert", 0): _run(([0.10, 0.12], [0.3, 0.3]), ([0.05, 0.07], [0.2, 0.2]), 0.15),
        ("bert", 1): _run(([0.11, 0.13], [0.3, 0.3]), ([0.06, 0.08], [0.2, 0.2]), 0.14),
        ("modern", 0): _run(([0.20, 0.23], [0.4, 0.4]), ([0.05, 0.08], [0.2, 0.2]), 0.30),
        ("modern", 1): _run(([0.22, 0.25], [0.4, 0.5]), ([0.06, 0.07], [0.2, 0.2]), 0.31),
    }
    rows = [{"labels": 100, "linear": [0.2, 0.2]}, {"labels": 400, "linear": [0.4, 0.4]}]
    linear = {s: {"label_budgets": rows} for s in (0, 1)}
    arms = {
        arm: {"description": arm.upper(), "steps": steps, "flops_per_step": 1e12,
              "pretrain_flops": steps * 1e12}
        for arm, steps in (("bert", 8000), ("modern", 6550))
    }  # fmt: skip
    calibration = {"steps": 400, "arms": {"bert": {"seconds_per_step": 0.18, "load": 0.5}}}
    text = recipe_report.report(str(tmp_path), arms, runs, linear, "bert", calibration)

    # At 100 labels, pairs (seed, subset): modern minus its scratch 0.15, 0.15, 0.16, 0.18;
    # modern minus bert 0.10, 0.11, 0.11, 0.12; t(3) = 3.182446, half = t * std / sqrt(4).
    def interval(d):
        half = 3.182446 * np.std(d, ddof=1) / 2
        mean = np.mean(d)
        return f"{100 * mean:+.1f} [{100 * (mean - half):+.1f}, {100 * (mean + half):+.1f}]"

    gain, versus = interval([0.15, 0.15, 0.16, 0.18]), interval([0.10, 0.11, 0.11, 0.12])
    assert gain == "+16.0 [+13.7, +18.3]" and versus == "+11.0 [+9.7, +12.3]"
    row = f"| modern | 22.5 ± 2.1 | 6.5 ± 1.3 | {gain} | {versus} |"
    assert row in text, text
    assert "| bert | BERT | 8,000 | 8.00 | 0.180 | 15.0% / 14.0% |" in text
    assert "| modern | MODERN | 6,550 | 6.55 | - | 30.0% / 31.0% |" in text
    assert "bert minus linear: -8.5 [" in text  # 0.115 - 0.2 at 100 labels
    summary = json.loads((tmp_path / "comparison.json").read_text())
    assert summary["version"] == recipe_report.COMPARISON_VERSION
    assert summary["seeds"] == [0, 1] and summary["reference"] == "bert"
    cell = summary["budgets"][0]["arms"]["modern"]
    assert cell["pretrained"] == [0.20, 0.23, 0.22, 0.25]  # seed 0's subsets, then seed 1's
    assert cell["vs_reference"]["mean"] == pytest.approx(0.11)
    assert summary["budgets"][0]["arms"]["bert"]["vs_reference"] is None
    assert summary["arms"]["modern"]["held_out"]["1"][-1]["mlm_accuracy"] == 0.31
    assert summary["calibration"] == calibration
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_help():
    result = subprocess.run([sys.executable, "-m", "experiments.recipe_compare", "--help"],
                            capture_output=True, text=True, cwd=REPO, timeout=300)  # fmt: skip
    assert result.returncode == 0
    assert "--arms" in result.stdout and "--calibration_steps" in result.stdout
    assert "--label_budgets" in result.stdout  # the demo's flags pass on


@pytest.mark.extended  # a few minutes
def test_a_tiny_comparison_end_to_end(tmp_path):
    """Calibration, two arms' demos (the real corpus, 12 pretraining steps at most), the
    linear reference on the same subsets, the report; a rerun reads everything back."""
    workdir = tmp_path / "compare"
    command = [
        sys.executable, "-m", "experiments.recipe_compare", f"--workdir={workdir}",
        "--arms=bert,mask30", "--calibration_steps=10", "--pretrain_steps=12",
        "--pretrain_batch_size=8", "--label_budgets=16", "--subsets=2",
        "--min_finetune_steps=4", "--max_finetune_steps=4", "--finetune_batch_size=8",
        "--dev_sentences=40", "--test_sentences=100", "--finetune_learning_rates=1e-3",
    ]  # fmt: skip
    result = run_captured(command, timeout=2400, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    calibration = json.loads((workdir / "calibration.json").read_text())
    assert set(calibration["arms"]) == {"bert", "mask30"} and calibration["steps"] == 10
    summary = json.loads((workdir / "comparison.json").read_text())
    steps = {arm: info["steps"] for arm, info in summary["arms"].items()}
    assert steps == recipe_compare.equal_time_steps(
        12, {a: t["seconds_per_step"] for a, t in calibration["arms"].items()}, "bert"
    )
    for arm in ("bert", "mask30"):
        held = summary["arms"][arm]["held_out"]["0"]
        assert held[-1]["step"] == steps[arm]
        results = json.loads((workdir / f"{arm}_seed0" / "results.json").read_text())
        assert results["pretraining"]["recipe"] == arm
        assert len(summary["budgets"][0]["arms"][arm]["pretrained"]) == 2
    assert len(summary["budgets"][0]["linear"]) == 2
    # mask30 fine-tunes BERT's architecture: its scratch runs are bert's, stored once.
    cells = summary["budgets"][0]["arms"]
    assert cells["mask30"]["scratch"] == cells["bert"]["scratch"]
    (recipe_dir,) = (workdir / "scratch").iterdir()
    assert len(list(recipe_dir.iterdir())) == 1  # one architecture
    assert not list(workdir.glob("*_seed0/finetune/*/scratch"))
    assert "| mask30 |" in result.stdout and "bert minus linear" in result.stdout
    again = run_captured(command, timeout=600, cwd=REPO)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "[3/4 demo]" not in again.stderr  # every run read back
    assert json.loads((workdir / "comparison.json").read_text())["budgets"] == summary["budgets"]
