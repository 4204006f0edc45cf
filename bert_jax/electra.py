"""ELECTRA's replaced-token detection: a small MLM generator corrupts, the encoder detects.

Clark et al. (2020), as google-research/electra's `run_pretraining.py` computes it:

* the generator is a smaller BERT encoder with an MLM head, reading the masked input (our
  one set of masking rules: `masked_lm_positions/ids/weights` as for BERT's MLM);
* at each masked position a token is sampled from the generator's softmax (temperature 1,
  no gradient through the sample); the discriminator reads the original sequence with
  those samples in place and predicts, for every real token, whether it was replaced. A
  sample that happens to equal the original counts as original;
* loss = MLM(generator) + `disc_weight` (λ, 50 in the paper) · RTD(discriminator), the
  RTD term a sigmoid cross-entropy averaged over the real tokens (`input_mask`).

Sharing: the generator and the discriminator read the same embedding module, the word,
position and token-type tables and the embedding LayerNorm (google-research/electra's shared
`electra/embeddings` scope); each model projects the E-wide embeddings to its own hidden size
with its own `embeddings_project` where the widths differ. The generator's MLM decoder is
the shared word table (tied).

Parameter tree (`ElectraForPreTraining`):

    bert/        the discriminator: a `BertModel` without pooler (embeddings, the optional
                 embeddings_project, encoder), so fine-tuning restores it as any encoder
    generator/   embeddings_project (when E != its H), encoder, mlm (transform, layer_norm,
                 output_bias)
    rtd/         the discriminator head: transform (H -> H), output (H -> 1)

Pretraining (`config.objective = "electra"`, `bert_jax.train_loop`) trains it with the loop and
the step every objective shares: `train_loss` and `eval_step` here are the objective's loss
and held-out metrics, the experiment config's `electra` block (`experiment_settings`) sizes
the generator and weighs the discriminator's loss.
"""

from __future__ import annotations

from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from bert_jax.config import BertConfig, ConfigError
from bert_jax.heads import MaskedLMHead, gather_positions
from bert_jax.losses import weighted_cross_entropy
from bert_jax.model import BertModel, Encoder, activation, attention_mask, constrain, dense
from bert_jax.train_state import UpdateLayout, gather_params

# The discriminator loss weight λ of the paper (google-research/electra `disc_weight`).
DISC_WEIGHT = 50.0
# What the generator shares with the discriminator and must therefore agree on.
_SHARED_FIELDS = (
    "vocab_size",
    "max_position_embeddings",
    "type_vocab_size",
    "embedding_width",
    "layer_norm_eps",
    "hidden_dropout_prob",
    "dtype",
    "param_dtype",
)


def generator_config(
    config: BertConfig, hidden_fraction: float = 0.25, layer_fraction: float = 1.0
) -> BertConfig:
    """The generator of discriminator `config`, as google-research/electra sizes it.

    Hidden size `round(H * hidden_fraction)`, `round(L * layer_fraction)` layers, FFN 4x its
    hidden size, one head per 64 dims (at least one), the discriminator's embedding width
    (shared tables). The default 1/4 is the released code's and the paper's choice for
    ELECTRA-Small and -Large (Table 6); the paper's ELECTRA-Base used 1/3.
    """
    hidden = round(config.hidden_size * hidden_fraction)
    return config.replace(
        hidden_size=hidden,
        num_hidden_layers=round(config.num_hidden_layers * layer_fraction),
        intermediate_size=4 * hidden,
        num_attention_heads=max(1, hidden // 64),
        embedding_size=config.embedding_width,
    )


def check_generator(config: BertConfig, generator: BertConfig) -> None:
    """Raises ConfigError where the generator cannot share the discriminator's embeddings."""
    problems = [
        f"{name}: discriminator {getattr(config, name)!r}, generator {getattr(generator, name)!r}"
        for name in _SHARED_FIELDS
        if getattr(config, name) != getattr(generator, name)
    ]
    if problems:
        raise ConfigError(
            "the generator shares the embeddings but differs in " + "; ".join(problems)
        )


class ElectraOutput(NamedTuple):
    """What `ElectraForPreTraining` computes; `electra_loss` turns it into the loss."""

    mlm_logits: jax.Array  # (B, P, V) the generator's, at masked_lm_positions
    sampled_ids: jax.Array  # (B, P) int the generator's samples at those positions
    replaced_ids: jax.Array  # (B, T) int the discriminator's input
    is_replaced: jax.Array  # (B, T) bool the RTD labels: the token differs from the original
    disc_logits: jax.Array  # (B, T) f32 the discriminator's "replaced" logits


def original_ids(input_ids, masked_lm_positions, masked_lm_ids, masked_lm_weights):
    """The uncorrupted sequence: `masked_lm_ids` written back at the real predictions.

    Padding predictions (weight 0, position 0 by convention) change nothing.
    """
    return _scatter(input_ids, masked_lm_positions, masked_lm_ids, masked_lm_weights)


def _scatter(ids, positions, values, weights):
    """(B, T) `ids` with (B, P) `values` at `positions` where `weights` > 0."""
    length = ids.shape[1]
    # (B, P, T) one-hot of the real predictions: a compare, not a scatter, so it shards
    # like any elementwise op along batch. Our masking never repeats a position.
    hits = (positions[..., None] == jnp.arange(length)) & (weights[..., None] > 0)
    written = jnp.any(hits, axis=1)  # (B, T)
    value = jnp.sum(jnp.where(hits, values[..., None], 0), axis=1)  # (B, T)
    return jnp.where(written, value, ids).astype(ids.dtype)


class Generator(nn.Module):
    """The generator from shared embeddings: its own projection, encoder and MLM head."""

    config: BertConfig

    def setup(self):
        cfg = self.config
        if cfg.embedding_width != cfg.hidden_size:
            self.embeddings_project = dense(
                cfg, cfg.hidden_size, ("embed", "mlp"), "embeddings_project"
            )
        self.encoder = Encoder(cfg)
        self.mlm = MaskedLMHead(cfg)

    def __call__(self, embedded, mask, masked_lm_positions, word_table, deterministic: bool):
        """(B, T, E) embedded masked input -> (B, P, V) MLM logits at the masked positions."""
        x = embedded
        if self.config.embedding_width != self.config.hidden_size:
            x = constrain(self.embeddings_project(x), ("batch", "length", "embed"))
        x, _ = self.encoder(x, mask, deterministic, False)  # (B, T, Hg)
        return self.mlm(gather_positions(x, masked_lm_positions), word_table)


class DiscriminatorHead(nn.Module):
    """dense H -> H, the encoder's GELU, dense H -> 1: one "replaced" logit per token."""

    config: BertConfig

    @nn.compact
    def __call__(self, states: jax.Array) -> jax.Array:
        cfg = self.config
        h = dense(cfg, cfg.hidden_size, ("embed", "mlp"), "transform")(states)  # (B, T, H)
        h = activation(cfg)(h)
        logits = dense(cfg, 1, ("mlp", None), "output")(h)  # (B, T, 1)
        return logits[..., 0].astype(jnp.float32)


class ElectraForPreTraining(nn.Module):
    """Generator + discriminator of replaced-token detection (see the module docstring).

    `config` is the discriminator's (the encoder being pretrained), `generator_config` the
    generator's (`generator_config()` derives the paper's); they must agree on what they
    share (`check_generator`). Rows are unpacked (one instance each): packed rows' inputs
    (`position_ids`, `instance_ids`) are not taken.
    """

    config: BertConfig
    generator_config: BertConfig

    def setup(self):
        check_generator(self.config, self.generator_config)
        # The discriminator's encoder is a BertModel under `bert`: the layout fine-tuning
        # restores. No pooler: nothing here trains it (as BERT's "mlm" objective).
        self.bert = BertModel(self.config, add_pooling_layer=False)
        self.generator = Generator(self.generator_config)
        self.rtd = DiscriminatorHead(self.config)

    def __call__(
        self,
        input_ids,  # (B, T) int the masked input, as for BERT's MLM
        input_mask,  # (B, T) 1 for tokens, 0 for padding
        token_type_ids,  # (B, T) segment ids
        masked_lm_positions,  # (B, P) int
        masked_lm_ids,  # (B, P) int the original tokens there
        masked_lm_weights,  # (B, P) 1.0 for real predictions, 0.0 for padding
        sample_key: jax.Array,  # PRNG key of the generator's samples
        *,
        deterministic: bool = True,
    ) -> ElectraOutput:
        mask = attention_mask(input_mask)
        embedded = self.bert.embeddings(input_ids, token_type_ids, deterministic)  # (B, T, E)
        word_table = self.bert.word_table()
        mlm_logits = self.generator(
            embedded, mask, masked_lm_positions, word_table, deterministic
        )  # (B, P, V)
        # Sampling is not differentiable and the paper does not try to make it so: the
        # discriminator's loss reaches the shared embeddings, never the generator's weights.
        logits = jax.lax.stop_gradient(mlm_logits).astype(jnp.float32)
        sampled = jax.random.categorical(sample_key, logits).astype(input_ids.dtype)  # (B, P)
        original = original_ids(input_ids, masked_lm_positions, masked_lm_ids, masked_lm_weights)
        replaced = _scatter(original, masked_lm_positions, sampled, masked_lm_weights)
        is_replaced = replaced != original  # a sample equal to the original is original
        states = self.bert(replaced, input_mask, token_type_ids, deterministic=deterministic)
        disc_logits = self.rtd(states.sequence_output)  # (B, T)
        return ElectraOutput(mlm_logits, sampled, replaced, is_replaced, disc_logits)


def rtd_loss(disc_logits, is_replaced, input_mask):
    """Sigmoid cross-entropy over real tokens, Σ mask·BCE / (Σ mask + 1e-6) as the paper."""
    weights = input_mask.astype(jnp.float32)
    per_token = optax.sigmoid_binary_cross_entropy(
        disc_logits.astype(jnp.float32), is_replaced.astype(jnp.float32)
    )
    return jnp.sum(per_token * weights) / (jnp.sum(weights) + 1e-6)


def electra_loss(
    outputs: ElectraOutput, batch: dict[str, jax.Array], disc_weight: float = DISC_WEIGHT
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """loss = MLM(generator) + disc_weight · RTD(discriminator), and the run's metrics.

    Metrics: the generator's MLM loss, accuracy (argmax) and sampled accuracy (how often its
    sample is the original); the discriminator's loss, accuracy over real tokens, and the
    precision and recall of "replaced" (0 when nothing is predicted or replaced), and the
    fraction of real tokens replaced.
    """
    mlm_loss, mlm_accuracy = weighted_cross_entropy(
        outputs.mlm_logits, batch["masked_lm_ids"], batch["masked_lm_weights"]
    )
    lm_weights = batch["masked_lm_weights"].astype(jnp.float32)
    sampled_right = (outputs.sampled_ids == batch["masked_lm_ids"]).astype(jnp.float32)
    sampled_accuracy = jnp.sum(sampled_right * lm_weights) / (jnp.sum(lm_weights) + 1e-5)

    disc_loss = rtd_loss(outputs.disc_logits, outputs.is_replaced, batch["input_mask"])
    real = batch["input_mask"].astype(jnp.float32)
    labels = outputs.is_replaced.astype(jnp.float32) * real
    preds = (outputs.disc_logits > 0).astype(jnp.float32) * real
    hits = jnp.sum(labels * preds)
    # Counts are whole numbers: max(count, 1) is the count itself, or 1 where it is 0.
    metrics = {
        "mlm_loss": mlm_loss,
        "mlm_accuracy": mlm_accuracy,
        "sampled_mlm_accuracy": sampled_accuracy,
        "disc_loss": disc_loss,
        "disc_accuracy": jnp.sum((labels == preds) * real) / jnp.maximum(jnp.sum(real), 1.0),
        "disc_precision": hits / jnp.maximum(jnp.sum(preds), 1.0),
        "disc_recall": hits / jnp.maximum(jnp.sum(labels), 1.0),
        "replaced_fraction": jnp.sum(labels) / jnp.maximum(jnp.sum(real), 1.0),
    }
    loss = mlm_loss + disc_weight * disc_loss
    return loss, {"loss": loss, **metrics}


# --- pretraining: the experiment config's block, the loss of the train step, evaluation --------

# The `electra` block of an experiment config (configs without it, or without a key: these;
# `bert_jax.model_changes` compares the generator's two when a run resumes).
EXPERIMENT_DEFAULTS = {
    "generator_hidden_fraction": 0.25,  # generator H / discriminator H (`generator_config`)
    "generator_layer_fraction": 1.0,  # generator L / discriminator L
    "disc_weight": DISC_WEIGHT,  # λ, the weight of the discriminator's loss
}
# The batch features `ElectraForPreTraining` takes, in the order of its positional arguments
# (the sample key follows them).
MODEL_INPUTS = (
    "input_ids",
    "input_mask",
    "segment_ids",
    "masked_lm_positions",
    "masked_lm_ids",
    "masked_lm_weights",
)
# The generator's samples in evaluation: one fixed key, so that each evaluation of the same
# held-out batches corrupts them alike and the metrics move with the params alone.
EVAL_SAMPLE_SEED = 0


def experiment_settings(config) -> dict:
    """The `electra` block of an experiment config (a ConfigDict, or such saved JSON)."""
    block = config.get("electra") or {}
    return {key: block.get(key, default) for key, default in EXPERIMENT_DEFAULTS.items()}


def experiment_generator(config, discriminator: BertConfig) -> BertConfig:
    """The generator an experiment config describes beside its model (the discriminator)."""
    settings = experiment_settings(config)
    return generator_config(
        discriminator,
        settings["generator_hidden_fraction"],
        settings["generator_layer_fraction"],
    )


def model_inputs(batch: dict[str, jax.Array], sample_key: jax.Array) -> list[jax.Array]:
    """The positional inputs of `ElectraForPreTraining` in `batch`, as `init` and `apply`
    take them."""
    return [batch[k] for k in MODEL_INPUTS] + [sample_key]


def train_loss(params, batch, rng, *, model, disc_weight: float = DISC_WEIGHT):
    """The ELECTRA loss of one batch under dropout: what the train step differentiates.

    `rng` is the step's key (`make_step`: `fold_in(run key, step)`); it splits into the
    dropout masks' key and the generator's sample key, two streams from (seed, step), so a
    resumed run draws the same samples as the uninterrupted one.
    """
    dropout_rng, sample_key = jax.random.split(rng)
    outputs = model.apply(
        {"params": params},
        *model_inputs(batch, sample_key),
        deterministic=False,
        rngs={"dropout": dropout_rng},
    )
    return electra_loss(outputs, batch, disc_weight)


def eval_step(
    params,
    batch,
    *,
    model,
    layout: UpdateLayout | None = None,
    disc_weight: float = DISC_WEIGHT,
):
    """Held-out metrics of one batch: no dropout, the samples of `EVAL_SAMPLE_SEED`; params
    stored split by the sharded weight update are first gathered (`layout`)."""
    if layout is not None:
        params = gather_params(params, layout)
    sample_key = jax.random.key(EVAL_SAMPLE_SEED)
    outputs = model.apply({"params": params}, *model_inputs(batch, sample_key))
    _, metrics = electra_loss(outputs, batch, disc_weight)
    return metrics
