"""The contrastive train step, built in one place: what `experiments.finetune_embeddings`
trains and `experiments.aot_compile` compiles for a TPU slice (one abstract state for both).

`make_train_step(config, module, mesh)` gives the optimizer (the fine-tuning recipe's:
clipping, AdamW, linear warmup over `warmup_proportion`, linear decay to 0), the train
state born sharded on the mesh (or, without params, its abstract twin with the same
shardings), the jitted step `(state, batch, rng) -> (state, metrics)` with explicit in/out
shardings and the state donated, and the batch it takes as `ShapeDtypeStruct`s: every key
split over the mesh's data axes, at `max_seq_length` (the longest a run pads to).

The step must be traced under `sharding.activation_context(mesh)` (the training loop and
the ahead-of-time compile both run it there): the model's activation constraints and the
splash attention's `shard_map` read the ambient mesh.

Model FLOPs (`flops_per_step`): every text (query, positive, hard negatives) is one sequence
of `max_seq_length` token slots through the encoder (a query `query_max_seq_length`'s where
set); forward + backward is 3 forward passes (6 x matmul params x tokens, plus attention),
and the cached chunks (GradCache) run the forward a second time in the backward pass: 4
forward passes of hardware work.

With `mlm_weight` > 0 (coCondenser's way, Gao & Callan 2022) the loss is contrastive +
mlm_weight x the masked-LM loss of the positives masked BERT's way (`MLM_KEYS`), through a
forward of their own of the same encoder and pretraining's MLM head (`heads.MaskedLMHead`,
`losses.weighted_cross_entropy`), the head trained beside the encoder (the state holds
`mlm_module`'s params) and left out of the saved embedding model. That forward runs the
whole batch at once (no cached chunks) and is not in `flops_per_step`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import optax

from bert_jax import checkpointing, embeddings, sharding, telemetry
from bert_jax.config import BertConfig, ConfigError, preset_fields
from bert_jax.train_state import TrainState, make_step, sharded_state, state_shardings

# The batch keys a step reads (`experiments.finetune_embeddings.tokenize_pairs`): (B, T)
# token ids and masks, (B, K, T) with K hard negatives per pair, (B,) ids of equal positives.
PAIR_KEYS = ("query_tokens", "query_mask", "positive_tokens", "positive_mask")
NEGATIVE_KEYS = ("negative_tokens", "negative_mask")
POSITIVE_IDS = "positive_ids"
# With `mlm_weight` > 0 (`data_pipelines.crop_pairs.masked_lm_rows`): the positives masked
# BERT's way, (B, T), and their (B, P) predictions (P: `mlm_predictions`).
MLM_KEYS = ("mlm_tokens", "mlm_positions", "mlm_ids", "mlm_weights")


class ContrastiveStep(NamedTuple):
    """Everything one contrastive train step needs, for training and for compiling it."""

    state: TrainState  # step 0, born sharded; without params: ShapeDtypeStructs, same shardings
    shardings: TrainState
    step: Callable  # jitted (state, batch, rng) -> (state, metrics); the state is donated
    batch: dict[str, jax.ShapeDtypeStruct]  # the global batch at max_seq_length, sharded
    rng: jax.ShapeDtypeStruct  # the dropout key, replicated
    tx: optax.GradientTransformation
    schedule: optax.Schedule


def optimizer(config: ml_collections.ConfigDict):
    """(tx, schedule) of a fine-tuning config (`finetune_common.make_optimizer`)."""
    from bert_jax.finetune_common import make_optimizer

    return make_optimizer(
        config.learning_rate, config.num_train_steps, warmup_proportion=config.warmup_proportion,
        weight_decay=config.weight_decay, max_grad_norm=config.max_grad_norm,
        name=config.optimizer,
    )  # fmt: skip


def batch_spec(
    config: ml_collections.ConfigDict, mesh, negatives: int = 0
) -> dict[str, jax.ShapeDtypeStruct]:
    """The global batch of `global_batch_size` pairs with `negatives` hard negatives each, at
    `max_seq_length` (queries at `query_max_seq_length` where set), every key split over the
    mesh's data axes (`sharding.batch_sharding`)."""
    b, t, data = config.global_batch_size, config.max_seq_length, sharding.batch_sharding(mesh)
    shapes = dict.fromkeys(PAIR_KEYS, (b, t))
    if tq := config.get("query_max_seq_length", 0):  # questions are not run at a passage's T
        shapes |= dict.fromkeys(PAIR_KEYS[:2], (b, tq))
    if negatives:
        shapes |= dict.fromkeys(NEGATIVE_KEYS, (b, negatives, t))
    shapes[POSITIVE_IDS] = (b,)
    if p := mlm_predictions(config):
        shapes |= {"mlm_tokens": (b, t)} | dict.fromkeys(MLM_KEYS[1:], (b, p))
    return {k: jax.ShapeDtypeStruct(s, jnp.float32 if k == "mlm_weights" else jnp.int32,
                                    sharding=data) for k, s in shapes.items()}  # fmt: skip


def mlm_weight(config: ml_collections.ConfigDict) -> float:
    """The masked-LM term's weight in the loss (`mlm_weight`; 0: contrastive alone)."""
    weight = float(config.get("mlm_weight", 0.0) or 0.0)
    if weight < 0:
        raise ConfigError(f"--config.mlm_weight={weight}: a weight >= 0 (0: no masked LM)")
    return weight


def mlm_predictions(config: ml_collections.ConfigDict) -> int:
    """P, the masked positions a passage has room for (pretraining's
    `max_predictions_per_seq` of `max_seq_length` at 15%); 0 without the masked-LM term."""
    from data_pipelines.recipe import predictions_per_seq

    return predictions_per_seq(config.max_seq_length) if mlm_weight(config) else 0


def mlm_module(module: embeddings.BertForEmbedding):
    """The pretraining model (encoder `bert`, MLM head `mlm`, no NSP) whose params are the
    embedding model's plus the head: what the joint loss trains and the train state holds."""
    from bert_jax.heads import BertForPreTraining

    return BertForPreTraining(module.config, next_sentence=False)


def pretrained_mlm_head(config: ml_collections.ConfigDict, bert: BertConfig):
    """`init_from`'s MLM head where it has one (a pretraining checkpoint), else None."""
    from bert_jax import convert

    if config.get("from_scratch") or not config.get("init_from"):
        return None
    source = convert.open_source(config.init_from, config.get("bert_config_file") or None)
    _, params, _ = convert.load_source(source, bert, model="auto")
    return params.get("mlm") if isinstance(params, dict) else None


def mlm_head_params(config: ml_collections.ConfigDict, bert: BertConfig):
    """A fresh MLM head as pretraining initialises it (`heads.MaskedLMHead`), from `seed`."""
    import flax.linen as nn

    from bert_jax.heads import MaskedLMHead

    states = jnp.zeros((1, 1, bert.hidden_size), bert.dtype)
    table = jnp.zeros((bert.vocab_size, bert.embedding_width), bert.dtype)
    key = jax.random.fold_in(jax.random.key(config.seed), 0x4D4C4D)  # "MLM"
    return nn.unbox(jax.jit(MaskedLMHead(bert).init)(key, states, table)["params"])


def loss_fn(config: ml_collections.ConfigDict, module: embeddings.BertForEmbedding, mesh):
    """`(params, batch, rng) -> (loss, metrics)`: `contrastive_loss` of the config's scale,
    symmetry and chunks, the encoder under dropout, candidates gathered over `mesh`; with
    `matryoshka_dims`, the sum of the losses of those prefixes and the full embedding."""
    trained = module.clone(normalize=False)  # the loss takes cosines itself
    dims = matryoshka_dims(config, module.config.hidden_size)

    def embed(p, ids, mask, rng):
        return trained.apply({"params": p}, ids, mask, jnp.zeros_like(ids),
                             deterministic=False, rngs={"dropout": rng})  # fmt: skip

    def loss(p, batch, rng):
        return embeddings.contrastive_loss(
            embed, p, batch, rng, scale=config.scale, symmetric=config.symmetric,
            chunk_size=config.chunk_size, dims=dims, mesh=mesh,
        )  # fmt: skip

    weight = mlm_weight(config)
    if not weight:
        return loss
    from bert_jax.losses import weighted_cross_entropy

    pretrainer = mlm_module(module)

    def joint(p, batch, rng):
        """contrastive + weight x MLM of the masked positives (a forward of their own)."""
        contrastive, metrics = loss({"bert": p["bert"]}, batch, rng)
        out = pretrainer.apply(
            {"params": p}, batch["mlm_tokens"], batch["positive_mask"],
            jnp.zeros_like(batch["mlm_tokens"]), batch["mlm_positions"], deterministic=False,
            rngs={"dropout": jax.random.fold_in(rng, 1)},
        )  # fmt: skip
        # One weighted mean over every masked token of the global batch (the arrays are the
        # global batch's under jit, however split): one process's loss equals two's.
        mlm, accuracy = weighted_cross_entropy(out.mlm_logits, batch["mlm_ids"],
                                               batch["mlm_weights"])  # fmt: skip
        total = contrastive + weight * mlm
        return total, {**metrics, "loss": total, "contrastive_loss": contrastive,
                       "mlm_loss": mlm, "mlm_accuracy": accuracy}  # fmt: skip

    return joint


def matryoshka_dims(config: ml_collections.ConfigDict, hidden_size: int) -> tuple[int, ...]:
    """The prefix sizes the loss sums over: `matryoshka_dims` and the full `hidden_size`,
    largest first (sentence-transformers' MatryoshkaLoss trains only what it is given; the
    full size is always wanted); () where the key is empty (the plain loss).

    Raises:
        ConfigError: a size of `matryoshka_dims` above `hidden_size`.
    """
    from bert_jax.config_bounds import int_list

    dims = int_list(config.get("matryoshka_dims") or ())
    if not dims:
        return ()
    if max(dims) > hidden_size:
        raise ConfigError(f"--config.matryoshka_dims={config.matryoshka_dims!r}: the encoder's "
                          f"embeddings have {hidden_size} dimensions")  # fmt: skip
    return tuple(sorted({*dims, hidden_size}, reverse=True))


def make_train_step(
    config: ml_collections.ConfigDict,
    module: embeddings.BertForEmbedding,
    mesh,
    *,
    negatives: int = 0,
    params: Any = None,
) -> ContrastiveStep:
    """The contrastive step of `config` for `module` on `mesh` (see the module docstring).

    Args:
        negatives: hard negatives per pair in the batches (0: in-batch negatives only).
        params: the params to start from (copied, never donated); None: `state` is abstract.
            With `mlm_weight` > 0 the state holds them and an MLM head `mlm` (`mlm_module`):
            theirs where they have one, else a fresh one (`mlm_head_params`).
    """
    from bert_jax.finetune_common import replicated, run_keys

    tx, schedule = optimizer(config)
    sample = [jnp.zeros((1, config.max_seq_length), jnp.int32)] * 3
    holder = module  # the module whose params the state holds
    if mlm_weight(config):  # the MLM head trains beside the encoder
        holder, sample = mlm_module(module), [*sample, jnp.zeros((1, 1), jnp.int32)]
        if params is not None and "mlm" not in params:
            params = {**params, "mlm": mlm_head_params(config, module.config)}
    if params is None:
        abstract, shardings = state_shardings(holder, tx, mesh, sample)
        state = checkpointing.abstract_like(abstract, shardings)
    else:
        state, shardings = sharded_state(holder, tx, mesh, sample, params=params)
    batch = batch_spec(config, mesh, negatives)
    step = jax.jit(
        make_step(loss_fn(config, module, mesh), tx, schedule),
        in_shardings=(shardings, {k: v.sharding for k, v in batch.items()}, replicated(mesh)),
        out_shardings=(shardings, replicated(mesh)),
        donate_argnums=0,
    )
    key = jax.eval_shape(lambda: run_keys(config)[1])
    rng = jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=replicated(mesh))
    return ContrastiveStep(state, shardings, step, batch, rng, tx, schedule)


PAD_MULTIPLE = 16  # a batch's texts are padded to their longest rounded up to this ...


def width_multiple(config: ml_collections.ConfigDict, encoder: BertConfig) -> int:
    """... or to 128 under splash attention (`config_bounds.SPLASH_TILE`: its tiles are
    multiples of 128 tokens; a width of 64 does not compile), and to a multiple of each
    splash tile shorter than `max_seq_length` (a width of 384 does not divide into tiles of
    256): the multiple a batch's token widths are rounded up to
    (`data_pipelines.crop_pairs.padded_width`), at most the configured lengths.

    Raises:
        ConfigError: under splash (the checkpoint's choice where `model_overrides` makes
            none), `max_seq_length` or `query_max_seq_length` not a multiple of 128.
    """
    import math

    from bert_jax.config_bounds import SPLASH_TILE, splash_widths

    for problem in splash_widths(config, encoder.attention_implementation):
        raise ConfigError(problem)
    if encoder.attention_implementation != "splash":
        return PAD_MULTIPLE
    tiles = [encoder.splash_block_q, encoder.splash_block_kv]
    if encoder.local_attention_window:  # local layers take their own tile
        tiles.append(encoder.splash_local_block)
    return math.lcm(SPLASH_TILE, *(t for t in tiles if t < config.max_seq_length))


def encoder_config(config: ml_collections.ConfigDict) -> BertConfig:
    """The encoder `config.encoder_preset` names with the config's `model_overrides`: what
    the ahead-of-time compile builds where `init_from` is not on the machine."""
    overrides = {k: v for k, v in config.model_overrides.items() if v is not None}
    return BertConfig.from_preset(config.encoder_preset, **overrides)


def check_encoder(config: ml_collections.ConfigDict, found: BertConfig) -> None:
    """Refuses an encoder from `init_from` that is not `config.encoder_preset`'s architecture
    (where the config names one): the step the ahead-of-time check compiled would not be
    the step this run trains.

    Raises:
        ConfigError: naming the preset, `init_from` and the first fields that differ.
    """
    name = config.get("encoder_preset")
    if not name:
        return
    overridden = {k for k, v in config.model_overrides.items() if v is not None}
    differ = [f"{k}={getattr(found, k)!r} (preset {v!r})" for k, v in preset_fields(name).items()
              if k not in overridden and getattr(found, k) != v]  # fmt: skip
    if differ:
        raise ConfigError(
            f"--config.init_from={config.init_from} is not --config.encoder_preset={name}: "
            f"{', '.join(differ[:3])}"
        )


def flops_per_step(
    cfg: BertConfig, pairs: int, negatives: int, seq_len: int, query_seq_len: int = 0
) -> dict[str, float]:
    """Model FLOPs of one contrastive step: `model` forward + backward (3 forward passes of
    every text's `seq_len` slots, the queries' `query_seq_len` where set, the convention of
    MFU), `with_recompute` adding the cached chunks' second forward (4 passes). The loss's
    (B, B(1+K)) similarity matrix is left out (under 0.1% of either)."""
    queries = pairs * telemetry._encoder_flops(cfg, query_seq_len or seq_len)
    others = pairs * (1 + negatives) * telemetry._encoder_flops(cfg, seq_len)
    forward = queries + others  # layers, attention included
    return {"model": 3.0 * forward, "with_recompute": 4.0 * forward}
