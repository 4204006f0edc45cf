"""Pretraining: the loss, the jitted train/eval steps and their setup.

The step is one pure function `(state, batch, rng) -> (state, metrics)`
(`train_state.make_step` of the pretraining loss), jitted once with explicit shardings
and the state donated. Dropout randomness is `fold_in(rng, state.step)` (`rng` in the
PRNG implementation `config.prng_impl` names), so a resumed run repeats the uninterrupted
one exactly. `setup` builds the model, optimizer, abstract sharded state and steps of a
config, for training (`bert_jax.train_loop`) and the ahead-of-time check alike.

The pretraining objective is `config.objective` (`bert_jax.config.OBJECTIVES`, the paper's
Table 5): "mlm_nsp" (BERT: masked LM + next sentence prediction, the default), "mlm" (masked
LM alone: no NSP head, no pooler, no NSP loss; train on single-segment records,
`create_pretraining_data --next_sentence=false`) or "ltr" (a left-to-right LM: causal
attention, the loss predicts each next token through the MLM head; it reads unmasked
single-segment records, `--masking=dynamic --next_sentence=false`, with
`data.dynamic_masking=True` and `data.max_predictions_per_seq` equal to
`data.max_seq_length`). "electra" is replaced-token detection (`bert_jax.electra`): the model
is the discriminator, a generator trains beside it on the same masked records (static or
dynamic masking), unpacked; its loss and evaluation are `bert_jax.electra`'s, the step the
same. `check_objective` names the config key of a combination that cannot work.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import optax
from absl import logging
from jax.sharding import NamedSharding, PartitionSpec

from bert_jax import electra, optim, pretraining_input, sharding, telemetry
from bert_jax.config import OBJECTIVES, BertConfig, ConfigError, objective
from bert_jax.heads import BertForPreTraining
from bert_jax.losses import pretraining_loss
from bert_jax.train_state import (
    TrainState,
    UpdateLayout,
    gather_params,
    make_step,
    state_shardings,
)
from data_pipelines import records, tfrecord_files

# The batch features BertForPreTraining takes, in the order of its positional arguments.
MODEL_INPUTS = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions")
# The keyword inputs it takes from a packed batch only; an unpacked step never sees them.
PACKING_INPUTS = ("position_ids", "instance_ids", "cls_positions")


def check_objective(config: ml_collections.ConfigDict) -> None:
    """Refuses a config whose data cannot train its objective, naming the keys.

    Raises:
        ConfigError: an unknown objective, "ltr" without unmasked records
            (`data.dynamic_masking`) or with `data.max_predictions_per_seq` !=
            `data.max_seq_length` (the next-token targets fill one slot per position), or
            "electra" on packed rows (`data.pack`).
    """
    name, data = objective(config), config.data
    if name not in OBJECTIVES:
        raise ConfigError(f"config.objective must be one of {OBJECTIVES}, got {name!r}")
    if name == "electra" and data.get("pack", False):
        # The generator and the discriminator read unpacked rows (`ElectraForPreTraining`
        # takes no position_ids or instance_ids): packed instances would attend each other.
        raise ConfigError(
            "config.objective='electra' trains on unpacked rows: set config.data.pack=False"
        )
    if name != "ltr":
        return
    if not data.dynamic_masking:
        raise ConfigError(
            "config.objective='ltr' reads unmasked records (create_pretraining_data "
            "--masking=dynamic --next_sentence=false) and makes next-token targets from them: "
            "set config.data.dynamic_masking=True"
        )
    if data.max_predictions_per_seq != data.max_seq_length:
        raise ConfigError(
            f"config.objective='ltr' predicts the next token at every position: "
            f"config.data.max_predictions_per_seq must equal config.data.max_seq_length "
            f"({data.max_seq_length}), got {data.max_predictions_per_seq}"
        )


# config.grad_reduce_dtype -> the dtype the step sums the matmul kernels' gradients over the
# data-parallel devices in (`train_state.make_step`); None: f32.
GRAD_REDUCE_DTYPES = {"float32": None, "bfloat16": jnp.bfloat16}


def grad_reduce_dtype(config: ml_collections.ConfigDict):
    """The `make_step` gradient-reduction dtype of `config` (absent key: "float32", None).

    Raises:
        ConfigError: a name not in GRAD_REDUCE_DTYPES, or "bfloat16" on a model that does not
            compute in bf16 (the kernels it would read in bf16 would change its forward pass).
    """
    name = config.get("grad_reduce_dtype", "float32")
    if name not in GRAD_REDUCE_DTYPES:
        raise ConfigError(
            f"config.grad_reduce_dtype must be one of {tuple(GRAD_REDUCE_DTYPES)}, got {name!r}"
        )
    if name != "float32" and config.model.dtype != name:
        raise ConfigError(
            f"config.grad_reduce_dtype={name!r} reads the matmul kernels in {name}, which "
            f"only a model computing in it multiplies unchanged: set config.model.dtype="
            f"{name!r} (got {config.model.dtype!r}) or config.grad_reduce_dtype='float32'"
        )
    return GRAD_REDUCE_DTYPES[name]


def check_records_kind(config: ml_collections.ConfigDict) -> None:
    """Refuses training NSP on single-segment records, as far as their stats JSON tells.

    `create_pretraining_data` writes `<first output file>.stats.json` saying whether it
    made sentence pairs (`next_sentence`); records made without it carry NSP labels that
    are all 0, on which "mlm_nsp" would learn nothing. (The other way round, "mlm" or "ltr"
    on sentence pairs, trains: the pairs are read as text; a warning says so.)

    Raises:
        ConfigError: config.objective "mlm_nsp" with records a stats JSON calls single segments.
    """
    from data_pipelines import input_pipeline

    name = objective(config)
    # The stats of every set a file belongs to (one glob per directory, not one look per
    # shard: thousands of them in a bucket).
    stats, _ = tfrecord_files.stats_of(input_pipeline.list_files(config.data.train_files))
    for stats_path, contents in stats.items():
        path = stats_path.removesuffix(tfrecord_files.STATS_SUFFIX)
        pairs = contents.get("next_sentence", True)  # older stats: always pairs
        if name == "mlm_nsp" and not pairs:
            raise ConfigError(
                f"config.objective='mlm_nsp' trains next sentence prediction, but {path} holds "
                "single segments (create_pretraining_data --next_sentence=false): set "
                "config.objective='mlm' (or make sentence-pair records)"
            )
        if name != "mlm_nsp" and pairs:
            logging.warning(
                "config.objective=%r on sentence-pair records (%s): the pairs, random B "
                "segments included, are read as text; --next_sentence=false makes the "
                "single segments this objective is defined on",
                name,
                path,
            )


def model_config(config: ml_collections.ConfigDict, vocab_size: int | None = None) -> BertConfig:
    """The frozen model config an experiment's `config.model` block describes (causal for
    the "ltr" objective)."""
    return BertConfig.from_experiment(config.model, vocab_size, objective(config))


def pretraining_model(config: ml_collections.ConfigDict, cfg: BertConfig):
    """The pretraining model of `config.objective`: with the NSP head for "mlm_nsp" only;
    ELECTRA's generator and discriminator (`cfg`) for "electra"."""
    if objective(config) == "electra":
        return electra.ElectraForPreTraining(cfg, electra.experiment_generator(config, cfg))
    return BertForPreTraining(cfg, next_sentence=objective(config) == "mlm_nsp")


def losses(config: ml_collections.ConfigDict) -> tuple:
    """(train loss, eval step) of `config.objective`, both taking `model=`: the one step
    (`make_step`) and the one loop run either."""
    if objective(config) != "electra":
        return train_loss, eval_step
    weight = electra.experiment_settings(config)["disc_weight"]
    return (
        functools.partial(electra.train_loss, disc_weight=weight),
        functools.partial(electra.eval_step, disc_weight=weight),
    )


def flops_per_step(config: ml_collections.ConfigDict, cfg: BertConfig) -> float:
    """Model FLOPs of one train step of `config` (`telemetry.train_flops_per_step`), behind
    the logged MFU and the AOT check's projection."""
    generator = None
    if objective(config) == "electra":
        generator = electra.experiment_generator(config, cfg)
    data = config.data
    return telemetry.train_flops_per_step(
        cfg, config.global_batch_size, data.max_seq_length, data.max_predictions_per_seq, generator
    )


def example_batch(
    batch_size: int, seq_len: int, predictions: int, instances: int | None = None
) -> dict[str, jax.Array]:
    """Zeros with the shapes and dtypes of a training batch (packed with `instances`)."""
    layout = records.batch_spec(batch_size, seq_len, predictions, instances)
    return {k: jnp.zeros(shape, dtype) for k, (shape, dtype) in layout.items()}


def _apply(model, params, batch, **kwargs):
    packed = {k: batch[k] for k in PACKING_INPUTS if k in batch}
    return model.apply({"params": params}, *init_inputs(batch), **packed, **kwargs)


def init_inputs(batch: dict[str, jax.Array]) -> list[jax.Array]:
    """The positional inputs of `BertForPreTraining` in `batch`, as `init` and `apply` take them."""
    return [batch[k] for k in MODEL_INPUTS]


def train_loss(params, batch, dropout_rng, *, model) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The pretraining loss of one batch under dropout: what the train step differentiates."""
    outputs = _apply(model, params, batch, deterministic=False, rngs={"dropout": dropout_rng})
    return pretraining_loss(outputs, batch)


def eval_step(params, batch, *, model, layout=None):
    """Held-out metrics of one batch (no dropout); params stored split by the sharded weight
    update are first gathered (`layout`)."""
    if layout is not None:
        params = gather_params(params, layout)
    _, step_metrics = pretraining_loss(_apply(model, params, batch), batch)
    return step_metrics


def jit_steps(
    model,
    tx,
    schedule,
    mesh,
    shardings,
    accum_steps: int = 1,
    rules=sharding.DEFAULT_RULES,
    batch_keys=records.BATCH,
    layout: UpdateLayout | None = None,
    objective_losses: tuple = (train_loss, eval_step),
    grad_reduce_dtype=None,
):
    """The jitted train and eval steps with explicit in/out shardings, for batches of
    `batch_keys` (`records.PACKED_BATCH` for packed batches); `layout` for a state stored
    with the sharded weight update and `grad_reduce_dtype` for kernel gradients summed in
    bf16 (`make_step`); `objective_losses` the objective's (train loss, eval step) (`losses`)."""
    loss_fn, eval_fn = objective_losses
    replicated = NamedSharding(mesh, PartitionSpec())
    data = sharding.batch_sharding(mesh, rules)
    batch_shardings = {k: data for k in batch_keys}
    step = jax.jit(
        make_step(
            functools.partial(loss_fn, model=model),
            tx,
            schedule,
            accum_steps,
            layout,
            grad_reduce_dtype,
        ),
        in_shardings=(shardings, batch_shardings, replicated),
        out_shardings=(shardings, replicated),
        donate_argnums=0,
    )
    evaluate = jax.jit(
        functools.partial(eval_fn, model=model, layout=layout),
        in_shardings=(shardings.params, batch_shardings),
        out_shardings=replicated,
    )
    return step, evaluate


class Setup(NamedTuple):
    """What a run of an experiment config trains, before anything is allocated."""

    model_config: BertConfig
    model: Any  # BertForPreTraining, or ElectraForPreTraining ("electra")
    tx: optax.GradientTransformation
    inputs: list[jax.Array]  # example model inputs: one example of the data's shapes
    abstract_state: TrainState  # shapes and dtypes (the restore target's)
    shardings: TrainState  # where every leaf of the state lives on the mesh
    train_step: Any  # jitted (state, batch, rng) -> (state, metrics), state donated
    eval_step: Any  # jitted (params, batch) -> metrics
    rules: tuple  # the logical-axis rule table (`config.sharding_rules`)
    layout: UpdateLayout | None  # the params' two placements, with `shard_weight_update`


def setup(config: ml_collections.ConfigDict, mesh, vocab_size: int | None = None) -> Setup:
    """The model, optimizer, abstract sharded state and jitted steps of `config` on `mesh`.

    Training and the ahead-of-time check (`experiments.aot_compile`) both build from here,
    so the check compiles exactly the steps that training runs.
    """
    check_objective(config)
    reduce = grad_reduce_dtype(config)  # checked before anything is built
    cfg = model_config(config, vocab_size)
    model = pretraining_model(config, cfg)
    accum = config.optimizer.get("grad_accum_steps", 1)
    tx = optim.make_optimizer(config.optimizer, config.num_train_steps // accum)
    schedule = optim.learning_rate_schedule(config.optimizer, config.num_train_steps // accum)
    data = config.data
    # Param shapes do not depend on the batch: init on one example, not a global batch that
    # the init closure would keep alive on device 0 for the whole run.
    example = example_batch(1, data.max_seq_length, data.max_predictions_per_seq)
    if objective(config) == "electra":  # the sample key's value does not reach the params
        inputs = electra.model_inputs(example, jax.random.key(0))
    else:
        inputs = init_inputs(example)
    rules = sharding.rules_of(config)
    abstract_state, shardings = state_shardings(model, tx, mesh, inputs, rules)
    layout = None
    if config.get("shard_weight_update", False):  # the rule table's placement is the compute one
        compute = shardings.params
        spread = config.get("shard_weight_update_spread", False)
        shardings = sharding.update_shardings(abstract_state, shardings, rules, spread)
        explicit = config.get("shard_weight_update_explicit_gather", False)
        gather = jnp.dtype(config.model.get("dtype", "float32")) if explicit else None
        layout = UpdateLayout(compute, shardings.params, gather)
    keys = (
        records.BATCH
        if pretraining_input.max_instances_per_row(config) is None
        else records.PACKED_BATCH
    )
    step_fn, eval_fn = jit_steps(
        model, tx, schedule, mesh, shardings, accum, rules, keys, layout, losses(config), reduce
    )
    return Setup(cfg, model, tx, inputs, abstract_state, shardings, step_fn, eval_fn, rules, layout)
