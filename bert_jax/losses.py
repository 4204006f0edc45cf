"""Pretraining losses and accuracies: MLM over `masked_lm_weights`, NSP over the batch.

Without the NSP head (`nsp_logits` None: the "mlm" and "ltr" objectives) the loss is the MLM
term alone and the metrics have no nsp_* keys. For "ltr" the MLM term is the left-to-right
LM's: the input pipeline puts the next token of every real position in masked_lm_ids.

Both average per instance as if unpacked, so a packed batch has the loss of the same
instances unpacked: MLM is one weighted mean over every prediction of the batch, wherever
they sit, and NSP the mean over real instances (`instance_weights` of a packed batch).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from bert_jax.heads import PreTrainingOutput


def weighted_cross_entropy(logits, labels, weights):
    """Σ w·CE / (Σ w + 1e-5), the original's MLM loss; also returns weighted accuracy."""
    logits = logits.astype(jnp.float32)
    per_example = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    weights = weights.astype(jnp.float32)
    denominator = jnp.sum(weights) + 1e-5
    loss = jnp.sum(per_example * weights) / denominator
    correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
    accuracy = jnp.sum(correct * weights) / denominator
    return loss, accuracy


def pretraining_loss(
    outputs: PreTrainingOutput, batch: dict[str, jax.Array]
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Total loss = MLM loss + NSP loss, as in the original `run_pretraining.py`."""
    mlm_loss, mlm_accuracy = weighted_cross_entropy(
        outputs.mlm_logits, batch["masked_lm_ids"], batch["masked_lm_weights"]
    )
    if outputs.nsp_logits is None:  # no NSP head: the MLM (or LTR) term is the whole loss
        return mlm_loss, {"loss": mlm_loss, "mlm_loss": mlm_loss, "mlm_accuracy": mlm_accuracy}
    nsp_logits = outputs.nsp_logits.astype(jnp.float32)
    if "instance_weights" in batch:  # packed: (B, I) instance slots, the empty ones weigh 0
        nsp_labels = batch["instance_next_sentence_labels"]
        weights = batch["instance_weights"].astype(jnp.float32)
        count = jnp.maximum(jnp.sum(weights), 1.0)  # real instances
        nsp_ce = optax.softmax_cross_entropy_with_integer_labels(nsp_logits, nsp_labels)
        nsp_loss = jnp.sum(nsp_ce * weights) / count
        nsp_correct = (jnp.argmax(nsp_logits, axis=-1) == nsp_labels).astype(jnp.float32)
        nsp_accuracy = jnp.sum(nsp_correct * weights) / count
    else:
        nsp_labels = batch["next_sentence_labels"].reshape(-1)
        nsp_ce = optax.softmax_cross_entropy_with_integer_labels(nsp_logits, nsp_labels)
        nsp_loss = jnp.mean(nsp_ce)
        nsp_correct = (jnp.argmax(nsp_logits, axis=-1) == nsp_labels).astype(jnp.float32)
        nsp_accuracy = jnp.mean(nsp_correct)
    loss = mlm_loss + nsp_loss
    metrics = {
        "loss": loss,
        "mlm_loss": mlm_loss,
        "mlm_accuracy": mlm_accuracy,
        "nsp_loss": nsp_loss,
        "nsp_accuracy": nsp_accuracy,
    }
    return loss, metrics
