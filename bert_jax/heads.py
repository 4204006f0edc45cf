"""Task heads on top of `BertModel`: pretraining (MLM + NSP, or MLM alone), classification,
tagging, QA, multiple choice.

Each model keeps the encoder under the name `bert`, so that an encoder checkpoint
restores into any of them and a fresh head is the only thing left to initialise.
"""

from __future__ import annotations

from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.config import BertConfig
from bert_jax.model import (
    BertModel,
    BertOutput,
    activation,
    constrain,
    dense,
    layer_norm,
    matmul,
    zeros_init,
)


def gather_positions(sequence: jax.Array, positions: jax.Array) -> jax.Array:
    """(B, T, H) states, (B, P) indices -> (B, P, H) states at those positions."""
    return jnp.take_along_axis(sequence, positions[..., None].astype(jnp.int32), axis=1)


class MaskedLMHead(nn.Module):
    """dense + GELU + LayerNorm transform, then the decoder tied to the word embeddings.

    The transform maps H to the table's width E (`config.embedding_width`), as ELECTRA's
    generator head does when its embeddings are narrower or wider than its hidden states.
    Its bias and the norm's follow `linear_bias` and `norm_bias`; the decoder's output bias
    is always there (as ModernBERT's `decoder_bias`).
    """

    config: BertConfig

    @nn.compact
    def __call__(self, states: jax.Array, word_table: jax.Array) -> jax.Array:
        cfg = self.config
        transform = dense(
            cfg, cfg.embedding_width, ("embed", "mlp"), "transform", bias=cfg.linear_bias
        )
        h = transform(states)
        h = activation(cfg)(h)
        # (B, P, E) with E whole, as the encoder's activations. Left to XLA, the transform's
        # `mlp` (tensor) split reaches the decoder's input, and on a mesh with fsdp and tensor
        # both > 1 and P >= 8 the SPMD partitioner (jax 0.10.2) then swaps the batch shards
        # of the logits' gradient between devices (a collective-permute no later op undoes):
        # same loss, wrong gradients (test_train's P = 10 case on (2, 2, 2)).
        h = constrain(layer_norm(cfg, "layer_norm")(h), ("batch", "length", "embed"))
        bias = self.param("output_bias", zeros_init(("vocab",)), (cfg.vocab_size,), cfg.param_dtype)
        # (B, P, E) @ (E, V): the tied table's gradient stays f32 (`model.matmul`).
        logits = matmul(h, word_table.T, 1, cfg.dtype)  # (B, P, V)
        return constrain(logits + bias, ("batch", "length", "vocab"))


class PreTrainingOutput(NamedTuple):
    mlm_logits: jax.Array  # (B, P, V) at the gathered masked_lm_positions only
    nsp_logits: jax.Array | None  # (B, 2) 0 = B follows A, 1 = B is random (the original
    # labels); (B, I, 2) for packed rows, one per instance slot; None without the NSP head


class BertForPreTraining(nn.Module):
    """Encoder + MLM head (only at `masked_lm_positions`) + next-sentence head.

    Packed rows (`data_pipelines.packing`) add `position_ids`, `instance_ids` and
    `cls_positions` (see `BertModel`): NSP is then predicted at each instance's [CLS].

    `next_sentence=False` (the "mlm" and "ltr" objectives, `bert_jax.train`) has no NSP head
    and no pooler either: only NSP trains the pooler, which would otherwise sit at its init
    while weight decay shrinks it; a classifier fine-tuned from such a checkpoint starts its
    pooler fresh, as transformers' BertForMaskedLM and BertLMHeadModel (no pooler) do. The
    "ltr" objective's next-token predictions go through the same MLM head (the positions
    and targets are the input pipeline's, `data_pipelines.input_pipeline`).
    """

    config: BertConfig
    next_sentence: bool = True  # the NSP head (and the pooler it reads)

    def setup(self):
        self.bert = BertModel(self.config, add_pooling_layer=self.next_sentence)
        self.mlm = MaskedLMHead(self.config)
        if self.next_sentence:
            self.nsp = dense(self.config, 2, ("embed", None), "nsp")

    def __call__(
        self,
        input_ids,
        input_mask,
        token_type_ids,
        masked_lm_positions,  # (B, P) int
        *,
        deterministic: bool = True,
        position_ids=None,  # (B, T) packed rows only
        instance_ids=None,  # (B, T) packed rows only
        cls_positions=None,  # (B, I) packed rows only
    ) -> PreTrainingOutput:
        out = self.bert(
            input_ids,
            input_mask,
            token_type_ids,
            deterministic=deterministic,
            position_ids=position_ids,
            instance_ids=instance_ids,
            cls_positions=cls_positions,
        )
        masked_states = gather_positions(out.sequence_output, masked_lm_positions)
        mlm_logits = self.mlm(masked_states, self.bert.embeddings.word_table())
        nsp_logits = self.nsp(out.pooled_output) if self.next_sentence else None
        return PreTrainingOutput(mlm_logits, nsp_logits)

    def encode(self, input_ids, input_mask, token_type_ids, **kwargs) -> BertOutput:
        """The encoder alone (e.g. for feature extraction from a pretraining model)."""
        return self.bert(input_ids, input_mask, token_type_ids, **kwargs)


class BertForSequenceClassification(nn.Module):
    """Pooled [CLS] -> dropout -> dense; `num_labels=1` is regression.

    `pooling="mean"` classifies the mean of the last layer over the input's tokens instead
    (the pooler's weights stay, unused, so checkpoints keep one layout).
    """

    config: BertConfig
    num_labels: int
    pooling: str = "cls"  # "cls": BERT's tanh pooler on [CLS]; "mean": mean over tokens

    @nn.compact
    def __call__(self, input_ids, input_mask, token_type_ids, *, deterministic: bool = True):
        out = BertModel(self.config, name="bert")(
            input_ids, input_mask, token_type_ids, deterministic=deterministic
        )
        if self.pooling == "cls":
            pooled = out.pooled_output
        elif self.pooling == "mean":
            mask = input_mask[..., None].astype(jnp.float32)  # (B, S, 1)
            hidden = out.sequence_output.astype(jnp.float32)
            pooled = (hidden * mask).sum(1) / jnp.maximum(mask.sum(1), 1.0)  # (B, H)
        else:
            raise ValueError(f"pooling must be 'cls' or 'mean', not {self.pooling!r}")
        x = nn.Dropout(self.config.hidden_dropout_prob)(pooled, deterministic)
        return dense(self.config, self.num_labels, ("embed", None), "classifier")(x)  # (B, C)


class BertForMultipleChoice(nn.Module):
    """Each choice's pooled [CLS] -> dropout -> one score; softmax over the choices.

    The paper's SWAG head: inputs are (B, K, T), one `[CLS] context [SEP] ending [SEP]`
    sequence per choice, encoded as one batch of B*K; the output is (B, K) logits. Any
    leading shape works the same way ((B, T) inputs give (B,) scores, as when the model is
    initialised from single sequences); the weights are those of a one-output classifier.
    """

    config: BertConfig

    @nn.compact
    def __call__(self, input_ids, input_mask, token_type_ids, *, deterministic: bool = True):
        leading, length = input_ids.shape[:-1], input_ids.shape[-1]
        out = BertModel(self.config, name="bert")(
            input_ids.reshape(-1, length),  # (B*K, T)
            input_mask.reshape(-1, length),
            token_type_ids.reshape(-1, length),
            deterministic=deterministic,
        )
        x = nn.Dropout(self.config.hidden_dropout_prob)(out.pooled_output, deterministic)
        scores = dense(self.config, 1, ("embed", None), "classifier")(x)  # (B*K, 1)
        return scores.reshape(leading)  # (B, K)


class BertForTokenClassification(nn.Module):
    """Every position -> dropout -> dense (labels are read at each word's first piece)."""

    config: BertConfig
    num_labels: int

    @nn.compact
    def __call__(self, input_ids, input_mask, token_type_ids, *, deterministic: bool = True):
        out = BertModel(self.config, add_pooling_layer=False, name="bert")(
            input_ids, input_mask, token_type_ids, deterministic=deterministic
        )
        x = nn.Dropout(self.config.hidden_dropout_prob)(out.sequence_output, deterministic)
        return dense(self.config, self.num_labels, ("embed", None), "classifier")(x)  # (B, T, C)


class BertForQuestionAnswering(nn.Module):
    """Start and end logits of an answer span over every position."""

    config: BertConfig

    @nn.compact
    def __call__(self, input_ids, input_mask, token_type_ids, *, deterministic: bool = True):
        out = BertModel(self.config, add_pooling_layer=False, name="bert")(
            input_ids, input_mask, token_type_ids, deterministic=deterministic
        )
        logits = dense(self.config, 2, ("embed", None), "qa_outputs")(out.sequence_output)
        return logits[..., 0], logits[..., 1]  # (B, T) start, (B, T) end
