"""Pretraining: the loss, the jitted train/eval steps, their setup, and the loop.

The step is one pure function `(state, batch, rng) -> (state, metrics)`
(`train_state.make_step` of the pretraining loss), jitted once with explicit shardings
and the state donated. Dropout randomness is `fold_in(rng, state.step)` (`rng` in the
PRNG implementation `config.prng_impl` names), so a resumed run repeats the uninterrupted
one exactly. `setup` builds the model, optimizer, abstract sharded state and steps of a
config, for training and the ahead-of-time check alike.

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

Resume order (first that applies): a checkpoint in `<workdir>/checkpoints`, else
`config.resume_from` (a full train state: params, optimizer, step), else
`config.init_from` (params only: this project's checkpoint, a Google TF checkpoint or a
Hugging Face directory), else a fresh initialisation. A full train state resumes only into the
model it was trained with (`_check_model`; `config.allow_model_change` overrides). With
`config.rollback.enabled`, a loss spike rolls the run back to its last checkpoint
(`bert_jax.rollback`).
"""

from __future__ import annotations

import functools
import json
import os
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging
from jax.sharding import NamedSharding, PartitionSpec
from tqdm import tqdm

from bert_jax import (
    checkpointing,
    electra,
    optim,
    pretraining_input,
    rollback,
    sharding,
    telemetry,
)
from bert_jax.config import (
    MISSING,
    OBJECTIVES,
    BertConfig,
    ConfigError,
    ModelChangeError,
    model_changes,
    objective,
)
from bert_jax.heads import BertForPreTraining
from bert_jax.losses import pretraining_loss
from bert_jax.train_state import (
    TrainState,
    UpdateLayout,
    gather_params,
    make_step,
    nonfinite,
    run_keys,
    sharded_state,
    state_shardings,
)
from data_pipelines import records

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


def check_records_kind(config: ml_collections.ConfigDict) -> None:
    """Refuses training NSP on single-segment records, as far as their stats JSON tells.

    `create_pretraining_data` writes `<first output file>.stats.json` saying whether it
    made sentence pairs (`next_sentence`); records made without it carry NSP labels that
    are all 0, on which "mlm_nsp" would learn nothing. (The other way round, "mlm" or "ltr"
    on sentence pairs, trains: the pairs are read as text; a warning says so.)

    Raises:
        ConfigError: config.objective "mlm_nsp" with records a stats JSON calls single segments.
    """
    import tensorflow as tf

    from data_pipelines import input_pipeline

    name = objective(config)
    # The stats sit beside a run's first shard: one look per directory, not one per shard
    # (thousands of them in a bucket).
    firsts = {}
    for path in input_pipeline.list_files(config.data.train_files):
        firsts.setdefault(os.path.dirname(path), path)
    for path in firsts.values():
        stats_path = path + ".stats.json"
        if not tf.io.gfile.exists(stats_path):
            continue
        with tf.io.gfile.GFile(stats_path) as f:
            pairs = json.load(f).get("next_sentence", True)  # older stats: always pairs
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
):
    """The jitted train and eval steps with explicit in/out shardings, for batches of
    `batch_keys` (`records.PACKED_BATCH` for packed batches); `layout` for a state stored
    with the sharded weight update (`make_step`); `objective_losses` the objective's
    (train loss, eval step) (`losses`)."""
    loss_fn, eval_fn = objective_losses
    replicated = NamedSharding(mesh, PartitionSpec())
    data = sharding.batch_sharding(mesh, rules)
    batch_shardings = {k: data for k in batch_keys}
    step = jax.jit(
        make_step(functools.partial(loss_fn, model=model), tx, schedule, accum_steps, layout),
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
        shardings = sharding.update_shardings(abstract_state, shardings, rules)
        layout = UpdateLayout(compute, shardings.params)
    keys = (
        records.BATCH
        if pretraining_input.max_instances_per_row(config) is None
        else records.PACKED_BATCH
    )
    step_fn, eval_fn = jit_steps(
        model, tx, schedule, mesh, shardings, accum, rules, keys, layout, losses(config)
    )
    return Setup(cfg, model, tx, inputs, abstract_state, shardings, step_fn, eval_fn, rules, layout)


# --- the loop ------------------------------------------------------------------------------


def _load_init_params(path: str, model: BertForPreTraining, abstract_params, rng):
    """Params for `init_from`: our checkpoint dir, a TF checkpoint or a HF directory.

    Heads the source lacks (a "mlm" or "ltr" checkpoint has no pooler or NSP head, which a
    "mlm_nsp" run needs) are initialised from `rng`, each named in the log.
    """
    if checkpointing.is_checkpoint_dir(path):
        missing = checkpointing.missing_params(path, abstract_params)
        if not missing:
            params, _ = checkpointing.restore_params(path, abstract_params)
            return params
        logging.info("init_from %s lacks %d params (%s, ...)", path, len(missing), missing[0])
    if isinstance(model, electra.ElectraForPreTraining):  # the importers build BERT models
        raise ConfigError(
            f"config.init_from={path!r}: config.objective='electra' starts only from an "
            "electra checkpoint of this project with every param of this config's model"
        )
    from bert_jax import convert

    _, params, _ = convert.load_pretrained(path, config=model.config, model=model, rng=rng)
    return params


def _restore(config, workdir, abstract_state, shardings, vocab_size: int | None = None):
    """Applies the resume order; returns (state or None, data position or None, source).

    A full train state (own checkpoints, `resume_from`) is first checked to have been trained
    with the model the run describes (`_check_model`; `vocab_size`: the vocab file's).
    """
    target = checkpointing.abstract_like(abstract_state, shardings)
    own = checkpointing.make_manager(os.path.join(workdir, "checkpoints"), async_save=False)
    if own.latest_step() is not None:
        _check_model(config, checkpointing.saved_config(own), own.directory, vocab_size)
        # An unreadable newest checkpoint is named, set aside, and the one before restored.
        state, positions, _ = checkpointing.restore(own, None, target, set_aside=True)
        return (
            state,
            pretraining_input.data_position(positions),
            f"{own.directory} step {int(state.step)}",
        )
    if config.resume_from:  # only read: it may be another run's, or read-only
        other = checkpointing.make_manager(config.resume_from, async_save=False, create=False)
        _check_model(config, checkpointing.saved_config(other), config.resume_from, vocab_size)
        state, positions, saved = checkpointing.restore(other, None, target)
        same_data = saved.get("data_identity") == pretraining_input.data_identity(config)
        position = pretraining_input.data_position(positions) if same_data else None
        _check_start_step(config, int(state.step), f"resume_from {config.resume_from}")
        return state, position, f"resume_from {config.resume_from} step {int(state.step)}"
    _check_start_step(config, 0, "a run that starts from step 0 (no resume_from)")
    return None, None, None


def _check_model(config, saved: dict, source: str, vocab_size: int | None) -> None:
    """Refuses to resume the checkpoints in `source`, whose experiment config was `saved`,
    with a model that computes something else (`bert_jax.config.model_changes`), unless
    `config.allow_model_change`: then a warning names each difference and the run goes on.

    Raises:
        ModelChangeError: naming each key with its saved value and its value now.
    """
    changes = model_changes(saved, config, vocab_size)
    if not changes:
        return
    listed = "; ".join(
        f"{key}: saved {was if was is MISSING else repr(was)}, now {now!r}"
        for key, was, now in changes
    )
    if config.get("allow_model_change", False):  # configs older than the key: refused
        logging.warning("resuming %s with another model (allow_model_change): %s", source, listed)
        return
    raise ModelChangeError(
        f"the checkpoints in {source} were trained with another model: {listed}. Set "
        "config.allow_model_change=True to resume them with the model this config describes"
    )


def _check_start_step(config, step: int, source: str) -> None:
    """The step a phase begins at (`config.start_step`, which the AOT check's time
    projection counts from) must be the step the run really begins at."""
    start = config.get("start_step")
    if start is not None and start != step:
        raise ValueError(f"config.start_step is {start} but {source} is at step {step}")


def _roll_back(spike, history, config, run, manager, mask_config, workdir):
    """Restores the newest checkpoint and skips `config.rollback.skip_batches` batches of the
    data after its position (`bert_jax.rollback`); logs what it skipped, in the log and in
    `<workdir>/rollbacks.jsonl`. Returns (state, train data iterator).

    Raises:
        RollbackError: one spike too many within the window, or no checkpoint yet.
    """
    checkpointing.finish_saves(manager)
    history.check(spike, manager.latest_step(), manager.directory)
    target = checkpointing.abstract_like(run.abstract_state, run.shardings)
    state, positions, _ = checkpointing.restore(manager, None, target)
    train_data = pretraining_input.train_input(
        config, pretraining_input.data_position(positions), mask_config
    )
    for _ in range(config.rollback.skip_batches):
        next(train_data)
    skipped = config.rollback.skip_batches
    resumed_at = pretraining_input.gather_positions(train_data.position)
    record = history.record(spike, int(state.step), skipped, positions, resumed_at)
    logging.warning(
        "%s: rolled back to step %d, skipped %d batches (data position %s -> %s); rollback %d",
        spike,
        int(state.step),
        skipped,
        positions,
        resumed_at,
        len(history.records),
    )
    telemetry.append_record(workdir, "rollbacks.jsonl", record)
    return state, train_data


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
    """Pretrains as `config` says, checkpointing into `workdir`; returns the last metrics."""
    from data_pipelines.tokenization import load_tokenizer

    tokenizer = load_tokenizer(config.data.vocab_file, do_lower_case=config.data.do_lower_case)
    mesh = sharding.create_mesh(config.mesh_shape)
    run = setup(config, mesh, tokenizer.vocab_size)  # checks the objective's config keys
    check_records_kind(config)
    cfg, shardings = run.model_config, run.shardings
    if cfg.vocab_size < tokenizer.vocab_size:
        raise ValueError(
            f"config.model.vocab_size {cfg.vocab_size} < {tokenizer.vocab_size} tokens in "
            f"{config.data.vocab_file}"
        )
    data = config.data
    step_fn, eval_fn = run.train_step, run.eval_step

    # Two streams from the seed: the initialisation and the dropout masks (folded per step,
    # in config.prng_impl; "electra" splits each step's key into dropout and the generator's
    # samples). Neither is stored: a resumed run derives the same keys again.
    init_rng, dropout_rng = run_keys(config.seed, config.prng_impl)
    state, position, source = _restore(
        config, workdir, run.abstract_state, shardings, tokenizer.vocab_size
    )
    if state is None:
        # A fresh state in the run's layout: params from `init_from`, else initialised.
        born = functools.partial(
            sharded_state,
            run.model,
            run.tx,
            mesh,
            run.inputs,
            rules=run.rules,
            shard_update=run.layout is not None,
        )
        if config.init_from:
            abstract_params = run.abstract_state.params
            state, _ = born(
                params=_load_init_params(config.init_from, run.model, abstract_params, init_rng)
            )
            source = f"init_from {config.init_from} (params only)"
        else:
            state, _ = born(rng=init_rng)
            source = "scratch"
    logging.info("train state from %s; mesh %s", source, dict(mesh.shape))

    mask_config = pretraining_input.masking_config(config, tokenizer)
    train_data = pretraining_input.train_input(config, position, mask_config)
    manager = checkpointing.make_manager(
        os.path.join(workdir, "checkpoints"), max_to_keep=config.keep_checkpoints
    )
    # A restart repeats the steps after the restored one (all of them from scratch): what an
    # interrupted run logged for those is cut, so metrics.jsonl reads as one run.
    writer = telemetry.MetricsWriter(workdir, last_step=int(state.step) or -1)
    watcher = checkpointing.PreemptionWatcher(manager)
    config_json = checkpointing.config_to_json(config) | {
        "data_identity": pretraining_input.data_identity(config)
    }
    flops = flops_per_step(config, cfg)
    peak = telemetry.peak_flops_per_device(cfg.dtype) * jax.device_count()
    guard = config.get("rollback")  # configs older than the block: none
    spikes = history = None
    if guard is not None and guard.enabled:
        spikes = rollback.SpikeDetector(guard.spike_factor, guard.median_window)
        history = rollback.Rollbacks(guard.max_rollbacks, guard.window_steps)

    def save(step):
        checkpointing.save(
            manager,
            step,
            state,
            pretraining_input.gather_positions(train_data.position),
            config_json,
        )

    def evaluate(step):
        if not data.eval_files:
            return {}
        eval_data = pretraining_input.make_input(
            config, None, files=data.eval_files, seed=0, mask_config=mask_config
        )
        totals = []
        for _ in range(config.eval_steps):
            totals.append(
                eval_fn(state.params, sharding.global_batch(next(eval_data), mesh, run.rules))
            )
        result = {k: float(np.mean([t[k] for t in totals])) for k in totals[0]}
        writer.write(step, result, prefix="eval")
        logging.info("eval at step %d: %s", step, _fmt(result))
        return result

    start = int(state.step)
    stop = config.get("stop_at_step") or config.num_train_steps
    pending: list[tuple[int, dict]] = []
    last: dict[str, float] = {}
    saving = False  # a background save not yet known to have landed
    progress = tqdm(total=stop, initial=start, disable=jax.process_index() != 0, desc="pretrain")
    timer = (time.perf_counter(), start)
    try:
        with sharding.activation_context(mesh, run.rules):
            if start == 0:
                evaluate(0)
            step = start
            while step < stop:  # not a range: a rollback takes `step` back
                step += 1
                inputs = sharding.global_batch(next(train_data), mesh, run.rules)
                state, step_metrics = step_fn(state, inputs, dropout_rng)
                pending.append((step, step_metrics))
                progress.update(1)
                if step == start + 1:  # keep compilation out of the throughput figures
                    jax.block_until_ready(state.step)
                    timer = (time.perf_counter(), step)
                if saving and not manager.is_saving_in_progress():
                    # A failed save stops the run now, not at the next save (or at exit).
                    checkpointing.finish_saves(manager)
                    saving = False
                stopping = watcher.should_stop(step)
                checkpoint_now = step % config.checkpoint_every == 0 or step == stop or stopping
                if step % config.log_every == 0 or checkpoint_now:
                    # Checked before any save, so a checkpoint never holds a non-finite state.
                    try:
                        last = _flush(
                            pending, writer, timer, step, flops, peak, config, manager, spikes
                        )
                    except rollback.LossSpike as spike:  # raised with config.rollback only
                        state = None  # the diverged state: freed before the restore allocates
                        state, train_data = _roll_back(
                            spike, history, config, run, manager, mask_config, workdir
                        )
                        step = int(state.step)
                        writer.cut(step)  # the steps after it are done again, logged again
                        pending, saving, timer = [], False, (time.perf_counter(), step)
                        progress.n = step
                        continue
                    timer = (time.perf_counter(), step)
                    progress.set_postfix(
                        loss=f"{last['loss']:.3f}", mlm_acc=f"{last['mlm_accuracy']:.3f}"
                    )
                    pending = []
                if config.eval_every and step % config.eval_every == 0:
                    last |= {f"eval_{k}": v for k, v in evaluate(step).items()}
                if checkpoint_now:
                    save(step)
                    saving = True
                if stopping:
                    checkpointing.finish_saves(manager)  # claim the checkpoint once it landed
                    logging.warning(
                        "stopped by SIGTERM after step %d (checkpoint saved in %s)",
                        step,
                        manager.directory,
                    )
                    break
        checkpointing.finish_saves(manager)
        manager.close()
    finally:
        progress.close()
        watcher.close()
        writer.close()
    return last


def _flush(
    pending, writer, timer, step, flops, peak, config, manager, spikes=None
) -> dict[str, float]:
    """Fetches the pending metrics, stops on a non-finite loss, writes the averages.

    With `spikes` (a `rollback.SpikeDetector`: `config.rollback.enabled`) the first step with
    a non-finite metric or a loss spike raises `rollback.LossSpike` instead, and nothing of
    these steps is written: the loop rolls back and does them again.
    """
    fetched = jax.device_get([m for _, m in pending])
    for (s, _), m in zip(pending, fetched, strict=True):
        bad = nonfinite(m)
        if spikes is not None:
            reason = f"non-finite {bad}" if bad else spikes.check(float(m["loss"]))
            if reason:
                raise rollback.LossSpike(s, float(m["loss"]), reason)
        elif bad:
            checkpointing.finish_saves(manager)
            good = manager.latest_step()
            where = (
                f"the last good checkpoint is step {good} in {manager.directory}"
                if good is not None
                else f"no checkpoint was saved yet in {manager.directory}"
            )
            raise FloatingPointError(f"non-finite {bad} at step {s}; {where}")
    elapsed = time.perf_counter() - timer[0]
    steps = step - timer[1]
    averaged = {k: float(np.mean([m[k] for m in fetched])) for k in fetched[-1]}
    averaged["learning_rate"] = float(fetched[-1]["learning_rate"])
    if steps:  # the first step of a run only compiles: it is not timed (log_every=1)
        averaged["steps_per_second"] = steps / elapsed
        averaged["sequences_per_second"] = steps * config.global_batch_size / elapsed
        averaged["tokens_per_second"] = (
            averaged["sequences_per_second"] * config.data.max_seq_length
        )
        averaged["mfu"] = flops * averaged["steps_per_second"] / peak
    writer.write(step, averaged)
    logging.info("step %d: %s", step, _fmt(averaged))
    return averaged


def _fmt(values: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:.4g}" for k, v in values.items())
