"""Knowledge distillation: the losses against scipy/numpy, the frozen teacher, short runs.

Tiny random BERTs (1-2 layers, H=16/32) on 8 fake CPU devices; the end-to-end run uses the
GLUE SST-2 fixture with a teacher fine-tuned by `experiments.finetune_classification`.
"""

import functools
import json
import subprocess
import sys
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from finetune_fixtures import TINY, minilm_vocab, pretrained_params, write_all
from scipy.special import log_softmax, softmax
from scipy.stats import entropy

from bert_jax import distill
from bert_jax import finetune_common as common
from bert_jax.config import BertConfig
from bert_jax.heads import BertForPreTraining, BertForSequenceClassification
from bert_jax.train_state import TrainState, make_step

REPO = Path(__file__).parent.parent
GLUE_DIR = Path(__file__).parent / "fixtures" / "tasks" / "glue"
SMALL = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                   intermediate_size=64, max_position_embeddings=32)  # fmt: skip
STUDENT = SMALL.replace(hidden_size=16, num_hidden_layers=1, intermediate_size=32)


def _scipy_soft_kl(student, teacher, temperature):
    """T^2 * KL(softmax(t/T) || softmax(s/T)) per row, by scipy."""
    p, q = softmax(teacher / temperature, axis=-1), softmax(student / temperature, axis=-1)
    return temperature**2 * entropy(p, q, axis=-1)


@pytest.mark.parametrize("temperature", [1.0, 2.0, 5.0])
def test_soft_kl_matches_scipy_and_scales_with_t_squared(temperature):
    rng = np.random.default_rng(0)
    student, teacher = rng.normal(size=(2, 6, 5)) * 3
    ours = np.asarray(distill.soft_kl(student, teacher, temperature))
    np.testing.assert_allclose(ours, _scipy_soft_kl(student, teacher, temperature), rtol=1e-5)
    assert (ours > 0).all()
    # The T^2 factor: the same softened distributions, scaled once by T^2.
    unscaled = entropy(
        softmax(teacher / temperature, -1), softmax(student / temperature, -1), axis=-1
    )
    np.testing.assert_allclose(ours / temperature**2, unscaled, rtol=1e-5)


def test_soft_kl_is_zero_when_the_student_is_the_teacher():
    logits = np.random.default_rng(1).normal(size=(4, 3)) * 5
    np.testing.assert_allclose(np.asarray(distill.soft_kl(logits, logits, 2.0)), 0.0, atol=1e-6)
    # A constant shift per row is the same distribution.
    shifted = logits + np.arange(4)[:, None]
    np.testing.assert_allclose(np.asarray(distill.soft_kl(shifted, logits, 2.0)), 0.0, atol=1e-5)


@pytest.mark.parametrize("alpha", [0.0, 0.3, 1.0])
def test_classification_loss_mixes_soft_and_hard(alpha):
    rng = np.random.default_rng(2)
    student, teacher = rng.normal(size=(2, 8, 3)).astype(np.float32)
    labels = rng.integers(0, 3, size=8)
    loss, metrics = distill.classification_loss(
        student, teacher, labels, temperature=3.0, alpha=alpha
    )
    hard = -np.mean(log_softmax(student, -1)[np.arange(8), labels])
    soft = np.mean(_scipy_soft_kl(student, teacher, 3.0))
    assert float(loss) == pytest.approx(alpha * soft + (1 - alpha) * hard, rel=1e-5)
    assert float(metrics["hard_loss"]) == pytest.approx(hard, rel=1e-5)


def test_mlm_loss_counts_only_the_masked_positions():
    rng = np.random.default_rng(3)
    student, teacher = rng.normal(size=(2, 2, 4, 10)).astype(np.float32)  # (B, P, V)
    labels = rng.integers(0, 10, size=(2, 4))
    weights = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], np.float32)
    loss, metrics = distill.mlm_loss(student, teacher, labels, weights, temperature=2.0, alpha=0.5)
    real = weights.astype(bool)
    soft = np.mean(_scipy_soft_kl(student, teacher, 2.0)[real])
    hard = -np.mean(
        np.take_along_axis(log_softmax(student, -1), labels[..., None], -1)[..., 0][real]
    )
    assert float(metrics["soft_loss"]) == pytest.approx(soft, rel=1e-4)
    assert float(metrics["mlm_loss"]) == pytest.approx(hard, rel=1e-4)
    assert float(loss) == pytest.approx(0.5 * soft + 0.5 * hard, rel=1e-4)
    garbage = teacher.copy()
    garbage[~real] = 100.0  # padding predictions must not matter
    again, _ = distill.mlm_loss(student, garbage, labels, weights, temperature=2.0, alpha=0.5)
    assert float(again) == pytest.approx(float(loss), rel=1e-6)


def test_cosine_hidden_loss_matches_numpy_over_real_tokens():
    rng = np.random.default_rng(4)
    a, b = rng.normal(size=(2, 2, 5, 8)).astype(np.float32)
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    cos = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
    expected = (1 - cos)[mask.astype(bool)].mean()
    assert float(distill.cosine_hidden_loss(a, b, mask)) == pytest.approx(expected, rel=1e-5)
    assert float(distill.cosine_hidden_loss(a, a, mask)) == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError, match="equal widths"):
        distill.cosine_hidden_loss(a, b[..., :4], mask)


# --- steps ------------------------------------------------------------------------------


def _unboxed_init(module, rng, *inputs):
    return jax.jit(lambda r: nn.unbox(module.init(r, *inputs)["params"]))(rng)


def _batch(b=8, t=12, vocab=64, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, vocab, size=(b, t)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[:, t - 3 :] = 0
    return {"input_ids": ids, "input_mask": mask, "segment_ids": np.zeros_like(ids),
            "labels": rng.integers(0, 3, size=b).astype(np.int32)}  # fmt: skip


ALPHA = 0.7


@pytest.fixture(scope="module")
def pair():
    """A confident random teacher, a smaller student, and the student step (compiled once)."""
    teacher = BertForSequenceClassification(SMALL, 3)
    ids = jnp.zeros((1, 4), jnp.int32)
    teacher_params = _unboxed_init(teacher, jax.random.key(1), ids, ids, ids)
    # Large logits, so that the soft labels differ from uniform and carry information.
    teacher_params["classifier"]["kernel"] = teacher_params["classifier"]["kernel"] * 200.0
    student = BertForSequenceClassification(STUDENT, 3)
    student_params = _unboxed_init(student, jax.random.key(0), ids, ids, ids)
    tx, schedule = common.make_optimizer(3e-3, 100, warmup_proportion=0.0)

    def step(teacher):  # teacher None: its logits come precomputed in the batch
        loss = functools.partial(distill.classification_train_loss, student=student,
                                 teacher=teacher, temperature=2.0, alpha=ALPHA)  # fmt: skip
        return jax.jit(make_step(loss, tx, schedule))

    in_step, precomputed = step(teacher), step(None)
    batch = _batch()
    # Hard labels that agree with the teacher: soft and hard terms pull the same way.
    logits = distill.teacher_classifier_logits(teacher, teacher_params, batch)
    batch["labels"] = np.asarray(logits.argmax(-1), np.int32)

    def fresh_state():
        return TrainState(jnp.zeros((), jnp.int32), student_params, tx.init(student_params))

    return teacher, teacher_params, batch, fresh_state, in_step, precomputed


def test_teacher_gets_no_gradient(pair):
    teacher, teacher_params, batch, fresh_state, in_step, _ = pair

    def soft(teacher_params, frozen):
        if frozen:
            t_logits = distill.teacher_classifier_logits(teacher, teacher_params, batch)
        else:  # what the step would do without stop_gradient: the check below can fail
            inputs = (batch[k] for k in distill.INPUT_KEYS)
            t_logits = teacher.apply({"params": teacher_params}, *inputs)
        return jnp.mean(distill.soft_kl(jnp.zeros_like(t_logits), t_logits, 2.0))

    frozen_grads = jax.grad(soft)(teacher_params, True)
    assert all(not np.any(np.asarray(g)) for g in jax.tree.leaves(frozen_grads))
    live_grads = jax.grad(soft)(teacher_params, False)
    assert any(np.any(np.asarray(g)) for g in jax.tree.leaves(live_grads))

    # The step differentiates the student only and leaves the teacher's params as they were.
    before = jax.tree.map(np.array, teacher_params)
    state, metrics = in_step(fresh_state(), batch, jax.random.key(0), teacher_params)
    assert jax.tree.structure(state.params) != jax.tree.structure(teacher_params)
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(teacher_params), strict=True):
        np.testing.assert_array_equal(a, np.asarray(b))
    assert float(metrics["soft_loss"]) > 0


def test_a_few_steps_reduce_the_kl_to_the_teacher(pair):
    _, teacher_params, batch, fresh_state, in_step, _ = pair
    state, kls = fresh_state(), []
    for _ in range(15):
        state, metrics = in_step(state, batch, jax.random.key(0), teacher_params)
        kls.append(float(metrics["soft_loss"]))
    assert kls[-1] < 0.5 * kls[0], kls


def test_precomputed_teacher_logits_give_the_in_step_update(pair):
    teacher, teacher_params, batch, fresh_state, in_step, precomputed = pair
    logits = distill.teacher_classifier_logits(teacher, teacher_params, batch)
    a, ma = in_step(fresh_state(), batch, jax.random.key(0), teacher_params)
    b, mb = precomputed(fresh_state(), {**batch, "teacher_logits": logits}, jax.random.key(0), None)
    assert float(ma["loss"]) == pytest.approx(float(mb["loss"]), rel=1e-6)
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-7)


def test_mlm_steps_reduce_the_soft_loss_with_the_cosine_term():
    teacher = BertForPreTraining(SMALL)
    student = BertForPreTraining(SMALL.replace(num_hidden_layers=1))  # same width: cosine
    rng = np.random.default_rng(5)
    batch = _batch(vocab=SMALL.vocab_size)
    batch.pop("labels")
    batch |= {"masked_lm_positions": rng.integers(1, 9, size=(8, 3)).astype(np.int32),
              "masked_lm_ids": rng.integers(5, 64, size=(8, 3)).astype(np.int32),
              "masked_lm_weights": np.ones((8, 3), np.float32)}  # fmt: skip
    inputs = [batch[k] for k in (*distill.INPUT_KEYS, "masked_lm_positions")]
    teacher_params = _unboxed_init(teacher, jax.random.key(1), *inputs)
    # A peaked teacher distribution (a random init is nearly uniform over the vocabulary).
    bias = np.random.default_rng(6).normal(size=SMALL.vocab_size) * 4
    teacher_params["mlm"]["output_bias"] = jnp.asarray(bias, jnp.float32)
    params = _unboxed_init(student, jax.random.key(0), *inputs)
    tx, schedule = common.make_optimizer(3e-3, 100, warmup_proportion=0.0)
    state = TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))
    loss = functools.partial(distill.mlm_train_loss, student=student, teacher=teacher,
                             temperature=2.0, alpha=0.5, cosine_weight=1.0)  # fmt: skip
    step = jax.jit(make_step(loss, tx, schedule))
    history = []
    for _ in range(12):
        state, metrics = step(state, batch, jax.random.key(0), teacher_params)
        history.append({k: float(v) for k, v in metrics.items()})
    assert history[-1]["soft_loss"] < 0.7 * history[0]["soft_loss"], history
    assert history[-1]["cosine_loss"] < history[0]["cosine_loss"], history


# --- students and bad configs --------------------------------------------------------------


def test_layers_from_teacher_copies_the_named_layers(pair):
    params = pair[1]
    config, student = distill.layers_from_teacher(params, SMALL, [1])
    assert config.num_hidden_layers == 1 and config.hidden_size == SMALL.hidden_size
    assert set(student["bert"]["encoder"]) == {"layer_0"}
    copied = jax.tree.leaves(student["bert"]["encoder"]["layer_0"])
    for a, b in zip(copied, jax.tree.leaves(params["bert"]["encoder"]["layer_1"]), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(student["classifier"]["kernel"], params["classifier"]["kernel"])
    # The result is a working model of the new depth.
    batch = _batch()
    BertForSequenceClassification(config, 3).apply(
        {"params": student}, *(batch[k] for k in distill.INPUT_KEYS)
    )
    with pytest.raises(ValueError, match="teacher_layers"):
        distill.layers_from_teacher(params, SMALL, [0, 2])


def test_vocabulary_mismatch_is_a_clear_error(tmp_path):
    other = tmp_path / "vocab.txt"
    tokens = Path(minilm_vocab()).read_text().split("\n")
    tokens[2000] = "changed"
    other.write_text("\n".join(tokens))
    with pytest.raises(ValueError, match=r"vocab\.txt.*line 2001"):
        distill.check_same_vocab(minilm_vocab(), TINY, str(other), TINY, what="--config.x=y")
    with pytest.raises(ValueError, match="vocab_size 30522.*--config.x=y.*8000"):
        distill.check_same_vocab(minilm_vocab(), TINY, None, TINY.replace(vocab_size=8000),
                                 what="--config.x=y")  # fmt: skip
    distill.check_same_vocab(minilm_vocab(), TINY, minilm_vocab(), TINY, what="same")


# --- the script ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sst2_teacher(tmp_path_factory):
    """A tiny classifier fine-tuned on the SST-2 fixture by experiments.finetune_classification."""
    from experiments import finetune_classification as ftc
    from experiments.configs import finetune_glue

    root = tmp_path_factory.mktemp("teacher")
    checkpoints = write_all(root / "pretrained", pretrained_params(seed=1))
    config = finetune_glue.get_config("sst2")
    config.unlock()
    config.update(data_dir=str(GLUE_DIR / "SST-2"), init_from=str(checkpoints["orbax"]),
                  max_seq_length=32, train_batch_size=8, eval_batch_size=8, num_epochs=1,
                  learning_rate=1e-3)  # fmt: skip
    ftc.finetune(config, str(root / "teacher"))
    return root


def _distill_config(teacher, **changes):
    from experiments.configs import distill_polarity

    config = distill_polarity.get_config()
    config.update(task="glue/sst2", data_dir=str(GLUE_DIR / "SST-2"), teacher=str(teacher),
                  max_seq_length=32, train_batch_size=8, eval_batch_size=8, num_epochs=1,
                  benchmark=False, learning_rate=1e-3)  # fmt: skip
    config.update(changes)
    return config


def test_distill_classifier_end_to_end(sst2_teacher, tmp_path):
    from experiments import distill_classification as dc

    config = _distill_config(sst2_teacher / "teacher", teacher_layers="1", teacher_logits="step",
                             benchmark=True, bench_repeats=1)  # fmt: skip
    results = dc.distill_classifier(config, str(tmp_path))
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["teacher"]["params"] > saved["student"]["params"] == saved["no_teacher"]["params"]
    assert saved["student"]["alpha"] == 0.9 and saved["no_teacher"]["alpha"] == 0.0
    assert saved["student"]["student_init"] == "teacher layers [1]"
    assert 0 <= saved["student"]["final"]["dev"]["accuracy"] <= 1
    assert saved["inference"]["student_seq_per_s"] > 0
    assert results["teacher"]["dev"] == saved["teacher"]["dev"]
    report = (tmp_path / "results.md").read_text()
    assert "| teacher |" in report and "no teacher (alpha=0)" in report
    # Each student is a checkpoint the fine-tuning loader (and so bench_distill) reads.
    from experiments.finetune_classification import load_classifier

    model, config_, _, _, meta = load_classifier(str(tmp_path / "student" / "checkpoint"))
    assert config_.num_hidden_layers == 1 and meta["distilled_from"].endswith("checkpoint")


def test_missing_teacher_checkpoint_is_a_clear_error(tmp_path):
    from experiments import distill_classification as dc

    with pytest.raises(FileNotFoundError, match=r"--config.teacher=.*nowhere"):
        dc.distill_classifier(_distill_config(tmp_path / "nowhere"), str(tmp_path / "out"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="finetuned.json"):
        dc.distill_classifier(_distill_config(tmp_path / "empty"), str(tmp_path / "out"))


def test_student_from_a_checkpoint_with_another_vocabulary_is_refused(sst2_teacher, tmp_path):
    from bert_jax import convert
    from experiments import distill_classification as dc

    small = TINY.replace(vocab_size=100)
    ids = jnp.zeros((1, 4), jnp.int32)
    params = _unboxed_init(BertForPreTraining(small), jax.random.key(0), ids, ids, ids, ids)
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                               + [f"w{i}" for i in range(95)]) + "\n")  # fmt: skip
    other = convert.save_params(tmp_path / "other", small, params, vocab_file=str(vocab))
    config = _distill_config(sst2_teacher / "teacher", student_init_from=other)
    with pytest.raises(ValueError, match=r"vocabulary mismatch.*--config.student_init_from="):
        dc.distill_classifier(config, str(tmp_path / "out"))


def _mlm_config(tmp_path, teacher, **changes):
    from synthetic_pretraining import PREDICTIONS, SEQ_LEN, write_records

    from experiments.configs import distill_mlm as distill_mlm_config

    records = str(tmp_path / "records")
    config = distill_mlm_config.get_config()
    config.update(teacher=str(teacher), max_seq_length=SEQ_LEN,
                  max_predictions_per_seq=PREDICTIONS, global_batch_size=8, num_train_steps=3,
                  eval_steps=1, log_every=1, teacher_layers="1",
                  train_files=write_records(records, "train", 1, 16, seed=0),
                  eval_files=write_records(records, "eval", 1, 8, seed=1))  # fmt: skip
    config.update(changes)
    return config


@pytest.mark.slow  # a TF input pipeline and two compiles: ~1-2 min of CPU; the MLM step is above
def test_distill_mlm_end_to_end(sst2_teacher, tmp_path):
    from bert_jax import convert
    from experiments import distill_mlm

    hf_teacher = sst2_teacher / "pretrained" / "hf"  # TINY with trained-format MLM/NSP heads
    results = distill_mlm.distill_mlm(_mlm_config(tmp_path, hf_teacher), str(tmp_path / "out"))
    log = [json.loads(x) for x in (tmp_path / "out" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3]
    assert all(r["cosine_loss"] >= 0 and r["soft_loss"] >= 0 for r in log)
    assert results["student_params"] < results["teacher_params"]
    assert 0 <= results["eval_student"]["mlm_accuracy"] <= 1
    config, params, vocab = convert.load_params(tmp_path / "out" / "student")
    assert config.num_hidden_layers == 1 and config.hidden_size == TINY.hidden_size
    assert Path(vocab).read_text() == Path(minilm_vocab()).read_text()
    assert "mlm" in params  # the student keeps an MLM head: it can be distilled again


def test_distill_mlm_bad_configs(tmp_path):
    from experiments import distill_mlm
    from experiments.configs.finetune_minilm_polarity import minilm_dir

    with pytest.raises(FileNotFoundError, match=r"--config.teacher=.*nowhere"):
        distill_mlm.distill_mlm(_mlm_config(tmp_path, tmp_path / "nowhere"), str(tmp_path / "o"))
    # all-MiniLM-L6-v2 is a sentence encoder: no MLM head to learn from.
    with pytest.raises(ValueError, match="has no MLM head"):
        distill_mlm.distill_mlm(_mlm_config(tmp_path, minilm_dir()), str(tmp_path / "o"))


@pytest.mark.parametrize(
    "module, text",
    [("experiments.distill_classification", "Distils a fine-tuned BERT classifier"),
     ("experiments.distill_mlm", "Masked-LM distillation"),
     ("benchmarks.bench_distill", "Inference sequences/s")],
)  # fmt: skip
def test_cli_help(module, text):
    result = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True,
                            text=True, cwd=REPO, timeout=300)  # fmt: skip
    assert text in result.stdout, result.stdout[-2000:] + result.stderr[-2000:]
    assert "--workdir" in result.stdout or "--teacher" in result.stdout  # absl / argparse
