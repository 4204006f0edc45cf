"""Knowledge distillation: a frozen teacher BERT trains a smaller student on soft labels.

The soft-label term is Hinton et al.'s (2015): KL(p_teacher || q_student) between the
temperature-softened distributions, scaled by T^2 so that its gradient keeps the same size
as the temperature changes. It is mixed with the hard-label cross-entropy by `alpha`:

    loss = alpha * T^2 * KL(softmax(t / T) || softmax(s / T)) + (1 - alpha) * CE(s, y)

For masked-LM distillation (DistilBERT, Sanh et al. 2019) the same mix is taken at the
masked positions only, optionally plus a cosine loss between the teacher's and the
student's last hidden states when their widths match.

The teacher's outputs are computed inside the student's jitted step from teacher params
that are an argument of the step, under `stop_gradient`, and the gradient is taken with
respect to the student's params only: the teacher never receives an update. For large
teachers the classification logits can instead be computed once and passed in the batch
(`teacher_logits`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from bert_jax.config import BertConfig
from bert_jax.losses import weighted_cross_entropy

INPUT_KEYS = ("input_ids", "input_mask", "segment_ids")


# --- losses -----------------------------------------------------------------------------


def soft_kl(student_logits: jax.Array, teacher_logits: jax.Array, temperature: float) -> jax.Array:
    """T^2 * KL(softmax(teacher / T) || softmax(student / T)) per row: (..., C) -> (...)."""
    log_q = jax.nn.log_softmax(student_logits.astype(jnp.float32) / temperature, axis=-1)
    log_p = jax.nn.log_softmax(teacher_logits.astype(jnp.float32) / temperature, axis=-1)
    return temperature**2 * optax.losses.kl_divergence_with_log_targets(log_q, log_p)


def classification_loss(
    student_logits: jax.Array,  # (B, C)
    teacher_logits: jax.Array | None,  # (B, C); None only with alpha == 0
    labels: jax.Array,  # (B,) int
    *,
    temperature: float,
    alpha: float,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """alpha * soft KL + (1 - alpha) * hard CE, both means over the batch; and metrics."""
    student_logits = student_logits.astype(jnp.float32)
    hard = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(student_logits, labels))
    metrics = {"hard_loss": hard}
    if alpha == 0.0:  # no teacher: plain fine-tuning, the baseline
        return hard, metrics | {"loss": hard}
    soft = jnp.mean(soft_kl(student_logits, teacher_logits, temperature))
    loss = alpha * soft + (1.0 - alpha) * hard
    agreement = jnp.mean(student_logits.argmax(-1) == teacher_logits.argmax(-1))
    return loss, metrics | {"loss": loss, "soft_loss": soft, "teacher_agreement": agreement}


def cosine_hidden_loss(
    student_states: jax.Array, teacher_states: jax.Array, input_mask: jax.Array
) -> jax.Array:
    """Mean (1 - cos) between (B, T, H) hidden states over the real tokens of `input_mask`."""
    if student_states.shape[-1] != teacher_states.shape[-1]:
        raise ValueError(
            f"cosine loss needs equal widths: student H={student_states.shape[-1]}, "
            f"teacher H={teacher_states.shape[-1]} (set cosine_weight=0)"
        )
    distance = optax.losses.cosine_distance(
        student_states.astype(jnp.float32), teacher_states.astype(jnp.float32), epsilon=1e-8
    )  # (B, T)
    mask = input_mask.astype(jnp.float32)
    return jnp.sum(distance * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def mlm_loss(
    student_logits: jax.Array,  # (B, P, V) at the masked positions
    teacher_logits: jax.Array,  # (B, P, V)
    labels: jax.Array,  # (B, P) original token ids
    weights: jax.Array,  # (B, P) 1 for real predictions, 0 for padding
    *,
    temperature: float,
    alpha: float,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """alpha * soft KL + (1 - alpha) * MLM CE, both averaged over the real masked positions."""
    weights = weights.astype(jnp.float32)
    hard, accuracy = weighted_cross_entropy(student_logits, labels, weights)
    kl = soft_kl(student_logits, teacher_logits, temperature)  # (B, P)
    soft = jnp.sum(kl * weights) / (jnp.sum(weights) + 1e-5)
    loss = alpha * soft + (1.0 - alpha) * hard
    return loss, {"loss": loss, "soft_loss": soft, "mlm_loss": hard, "mlm_accuracy": accuracy}


# --- the train losses ---------------------------------------------------------------------


def _mlm_logits_and_states(module, input_ids, input_mask, segment_ids, positions, deterministic):
    """A `BertForPreTraining` method: (B, P, V) MLM logits and the (B, T, H) last states."""
    out = module.encode(input_ids, input_mask, segment_ids, deterministic=deterministic)
    masked = jnp.take_along_axis(
        out.sequence_output, positions[..., None].astype(jnp.int32), axis=1
    )  # (B, P, H)
    return module.mlm(masked, module.bert.word_table()), out.sequence_output


def teacher_classifier_logits(teacher: nn.Module, teacher_params: Any, batch) -> jax.Array:
    """(B, C) float32 logits of the frozen teacher (no dropout, no gradient)."""
    teacher_params = jax.lax.stop_gradient(teacher_params)
    logits = teacher.apply({"params": teacher_params}, *(batch[k] for k in INPUT_KEYS))
    return jax.lax.stop_gradient(logits.astype(jnp.float32))


def classification_train_loss(
    params: Any,
    batch: Mapping[str, jax.Array],
    dropout_rng: jax.Array,
    teacher_params: Any,
    *,
    student: nn.Module,
    teacher: nn.Module | None,
    temperature: float,
    alpha: float,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The student's loss on (soft teacher labels, hard labels): `make_step`'s `loss_fn`.

    Args:
        params: the student's params (the only ones differentiated).
        batch: `input_ids input_mask segment_ids labels`, plus `teacher_logits` (B, C)
            when `teacher` is None and alpha > 0 (precomputed soft labels).
        dropout_rng: the student's dropout key.
        teacher_params: the teacher's params (ignored when `teacher` is None).
        student, teacher: sequence classifiers (`bert_jax.heads`) over the same labels.
    """
    if alpha == 0.0:
        teacher_logits = None
    elif teacher is not None:
        teacher_logits = teacher_classifier_logits(teacher, teacher_params, batch)
    else:
        teacher_logits = batch["teacher_logits"]
    logits = student.apply(
        {"params": params},
        *(batch[k] for k in INPUT_KEYS),
        deterministic=False,
        rngs={"dropout": dropout_rng},
    )  # (B, C)
    return classification_loss(
        logits, teacher_logits, batch["labels"], temperature=temperature, alpha=alpha
    )


def mlm_train_loss(
    params: Any,
    batch: Mapping[str, jax.Array],
    dropout_rng: jax.Array,
    teacher_params: Any,
    *,
    student: nn.Module,
    teacher: nn.Module,
    temperature: float,
    alpha: float,
    cosine_weight: float,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """A `BertForPreTraining` student's loss on the teacher's MLM distribution.

    `batch` holds the pretraining features (`input_ids input_mask segment_ids
    masked_lm_positions masked_lm_ids masked_lm_weights`); NSP is not trained, as in
    DistilBERT. With `cosine_weight` > 0 the last hidden states are pulled together too.
    """
    inputs = [batch[k] for k in (*INPUT_KEYS, "masked_lm_positions")]
    frozen = jax.lax.stop_gradient(teacher_params)
    teacher_logits, teacher_states = jax.lax.stop_gradient(
        teacher.apply({"params": frozen}, *inputs, True, method=_mlm_logits_and_states)
    )
    logits, states = student.apply(
        {"params": params}, *inputs, False, method=_mlm_logits_and_states,
        rngs={"dropout": dropout_rng},
    )  # fmt: skip
    loss, metrics = mlm_loss(
        logits, teacher_logits, batch["masked_lm_ids"], batch["masked_lm_weights"],
        temperature=temperature, alpha=alpha,
    )  # fmt: skip
    if cosine_weight:
        cosine = cosine_hidden_loss(states, teacher_states, batch["input_mask"])
        loss = loss + cosine_weight * cosine
        metrics |= {"loss": loss, "cosine_loss": cosine}
    return loss, metrics


# --- setting up teacher and student -------------------------------------------------------


def check_same_vocab(
    teacher_vocab: str | None,
    teacher_config: BertConfig,
    student_vocab: str | None,
    student_config: BertConfig,
    *,
    what: str,
) -> None:
    """Raises ValueError unless teacher and student read the same token ids.

    Args:
        what: names the student's source (a path or flag) in the message.
    """
    if teacher_config.vocab_size != student_config.vocab_size:
        raise ValueError(
            f"vocabulary mismatch: the teacher has vocab_size {teacher_config.vocab_size} "
            f"({teacher_vocab}), the student from {what} has {student_config.vocab_size} "
            f"({student_vocab}); a student must use its teacher's vocabulary"
        )
    if teacher_vocab and student_vocab:
        with open(teacher_vocab, encoding="utf-8") as f:
            teacher_tokens = f.read().split("\n")
        with open(student_vocab, encoding="utf-8") as f:
            student_tokens = f.read().split("\n")
        if teacher_tokens != student_tokens:
            first = next(
                (
                    i
                    for i, (a, b) in enumerate(zip(teacher_tokens, student_tokens, strict=False))
                    if a != b
                ),
                min(len(teacher_tokens), len(student_tokens)),
            )
            raise ValueError(
                f"vocabulary mismatch: {student_vocab} (student, {what}) differs from the "
                f"teacher's {teacher_vocab} at line {first + 1}"
            )


def layers_from_teacher(
    teacher_params: Mapping, teacher_config: BertConfig, layers: Sequence[int]
) -> tuple[BertConfig, dict]:
    """A student of the teacher's width holding the teacher's `layers` (in that order).

    Student layer i is teacher layer `layers[i]`; the embeddings, the pooler and any head
    (everything outside the encoder) are copied as well. Looped (`layer_N`) layout.

    Returns:
        (the student's config, its params as numpy-compatible arrays).
    """
    layers = [int(i) for i in layers]
    if not layers or any(not 0 <= i < teacher_config.num_hidden_layers for i in layers):
        raise ValueError(
            f"teacher_layers {layers} must be indices of the teacher's "
            f"{teacher_config.num_hidden_layers} layers"
        )
    encoder_root = teacher_params["bert"] if "bert" in teacher_params else teacher_params
    if "layers" in encoder_root["encoder"]:
        raise ValueError("teacher_layers needs the teacher in the looped (layer_N) layout")
    encoder = {f"layer_{j}": encoder_root["encoder"][f"layer_{i}"] for j, i in enumerate(layers)}
    student_root = dict(encoder_root, encoder=encoder)
    if "bert" in teacher_params:
        params = dict(teacher_params, bert=student_root)
    else:
        params = student_root
    params = jax.tree.map(lambda x: x.copy(), params)  # never alias the teacher's buffers
    config = teacher_config.replace(num_hidden_layers=len(layers), scan_layers=False)
    return config, params


def param_count(params: Any) -> int:
    return int(sum(x.size for x in jax.tree.leaves(params)))
