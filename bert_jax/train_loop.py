"""The pretraining loop: resume, train, log, evaluate, checkpoint (`train_and_evaluate`).

The model, optimizer, sharded state and jitted steps come from `bert_jax.train.setup`; this
module decides where the state starts and runs the steps on the data, writing metrics
(`bert_jax.telemetry`) and checkpoints (`bert_jax.checkpointing`) as it goes.

Resume order (first that applies): a checkpoint in `<workdir>/checkpoints`, else
`config.resume_from` (a full train state: params, optimizer, step), else
`config.init_from` (params only: this project's checkpoint, a Google TF checkpoint or a
Hugging Face directory), else a fresh initialisation. A full train state resumes only into the
model it was trained with (`_check_model`; `config.allow_model_change` overrides), and a
workdir's own checkpoints only with the data their saved position describes (`_check_data`;
`config.data.on_change="restart"` reads the data from its beginning instead). With
`config.rollback.enabled`, a loss spike rolls the run back to its last checkpoint
(`bert_jax.rollback`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging
from tqdm import tqdm

from bert_jax import checkpointing, electra, pretraining_input, rollback, sharding, telemetry, train
from bert_jax.config import ConfigError
from bert_jax.heads import BertForPreTraining
from bert_jax.model_changes import MISSING, ModelChangeError, model_changes
from bert_jax.step_trace import StepTrace as _StepTrace
from bert_jax.train_state import StepHealth, run_keys, sharded_state
from data_pipelines import vocab_fingerprint


def _load_init_params(path: str, model: BertForPreTraining, abstract_params, rng, config=None):
    """Params for `init_from`: our checkpoint dir, a TF checkpoint or a HF directory.

    Heads the source lacks (a "mlm" or "ltr" checkpoint has no pooler or NSP head, which a
    "mlm_nsp" run needs) are initialised from `rng`, each named in the log. Our checkpoint's
    vocabulary fingerprint (saved with it) must be the run's `data.vocab_file`'s unless
    `data.allow_vocab_change`.
    """
    from bert_jax.convert import locations

    path = locations.resolve(path)  # any model location, read as every tool reads it
    if checkpointing.is_checkpoint_dir(path):
        if config is not None:
            _check_init_vocab(path, config)
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


def _check_init_vocab(path: str, config) -> None:
    """`init_from`'s embedding rows are ids of the vocabulary saved with it: another
    `data.vocab_file` is refused, naming both (`data.allow_vocab_change` lets it through);
    so is another `data.do_lower_case` than the one saved with it."""
    found = checkpointing.find_checkpoints(path)
    manager = checkpointing.make_manager(found[0], async_save=False, create=False)
    made_with = checkpointing.saved_config(manager, found[1]).get("vocab_fingerprint")
    lower = config.data.do_lower_case
    vocab_fingerprint.check_same_vocab(
        made_with, config.data.vocab_file, f"config.init_from={path}", "data.allow_vocab_change",
        config.data.get("allow_vocab_change", False), lower,
        f"Set --config.data.do_lower_case={not lower} (and make the records so) to go on from it",
    )  # fmt: skip


def _restore(
    config, workdir, abstract_state, shardings, identity: dict, vocab_size: int | None = None
):
    """Applies the resume order; returns (state or None, data position or None, source).

    A full train state (own checkpoints, `resume_from`) is first checked to have been trained
    with the model the run describes (`_check_model`; `vocab_size`: the vocab file's). Its
    data position is kept where the data it was saved with is `identity`
    (`pretraining_input.data_identity`): own checkpoints with other data are refused
    (`_check_data`), `resume_from` (a new phase, e.g. on longer records) then starts the data
    from its beginning.
    """
    target = checkpointing.abstract_like(abstract_state, shardings)
    own = checkpointing.make_manager(os.path.join(workdir, "checkpoints"), async_save=False)
    if own.latest_step() is not None:
        saved = checkpointing.saved_config(own)
        _check_model(config, saved, own.directory, vocab_size)
        changes = pretraining_input.data_changes(saved.get("data_identity"), identity)
        _check_data(config, changes, own.directory)
        # An unreadable newest checkpoint is named, set aside, and the one before restored.
        state, positions, _ = checkpointing.restore(own, None, target, set_aside=True)
        if changes:  # config.data.on_change="restart"
            logging.warning(
                "the data restarts from its beginning at step %d (on_change=restart)",
                int(state.step),
            )
        position = None if changes else pretraining_input.data_position(positions)
        return state, position, f"{own.directory} step {int(state.step)}"
    if config.resume_from:  # only read: it may be another run's, or read-only
        other = checkpointing.make_manager(config.resume_from, async_save=False, create=False)
        _check_model(config, checkpointing.saved_config(other), config.resume_from, vocab_size)
        state, positions, saved = checkpointing.restore(other, None, target)
        saved_identity = saved.get("data_identity")
        changes = pretraining_input.data_changes(saved_identity, identity)
        position = None
        if saved_identity is None or changes:
            logging.info(
                "resume_from %s: the data starts from its beginning at step %d (%s)",
                config.resume_from,
                int(state.step),
                pretraining_input.describe_changes(changes) or "no data identity saved",
            )
        else:
            position = pretraining_input.data_position(positions)
        _check_start_step(config, int(state.step), f"resume_from {config.resume_from}")
        return state, position, f"resume_from {config.resume_from} step {int(state.step)}"
    _check_start_step(config, 0, "a run that starts from step 0 (no resume_from)")
    return None, None, None


def _check_model(config, saved: dict, source: str, vocab_size: int | None) -> None:
    """Refuses to resume the checkpoints in `source`, whose experiment config was `saved`,
    with a model that computes something else (`bert_jax.model_changes`), unless
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


def _check_data(config, changes: list, source: str) -> None:
    """Refuses to resume the checkpoints in `source` with data their saved position does not
    describe (`changes`: `pretraining_input.data_changes`), unless
    `config.data.on_change="restart"`: then a warning names each change, and the caller
    starts the data from its beginning at the checkpoint's step.

    Raises:
        DataChangeError: naming each flag with its saved value and its value now.
        ConfigError: `config.data.on_change` is neither "refuse" nor "restart".
    """
    mode = config.data.get("on_change", "refuse")  # configs older than the key: refused
    if mode not in ("refuse", "restart"):
        raise ConfigError(f"--config.data.on_change={mode!r}: use 'refuse' or 'restart'")
    if not changes:
        return
    listed = pretraining_input.describe_changes(changes)
    if mode == "restart":
        logging.warning("resuming %s with other data (on_change=restart): %s", source, listed)
        return
    raise pretraining_input.DataChangeError(
        f"the checkpoints in {source} were saved reading other data: {listed}. Their data "
        "position (epoch, batch, stream offsets) describes that data only. Set "
        "--config.data.on_change=restart to resume the train state and read this data from "
        "its beginning"
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
    if jax.process_index() == 0:  # what the run writes, named before anything compiles
        telemetry.check_metrics_paths(workdir)
    built = _build(config)
    state, position, source = _restore_or_start(config, workdir, built)
    checkpointing.check_steps_left(int(state.step), config, source)  # a finished workdir
    logging.info("train state from %s; mesh %s", source, dict(built.mesh.shape))
    return _Pretraining(config, workdir, built, state, position).run()


@dataclasses.dataclass
class _Built:
    """What a run is made of before any state exists: the tokenizer, the mesh, `train.setup`'s
    model, optimizer and jitted steps, and the data's identity (what a resume compares)."""

    tokenizer: Any
    mesh: jax.sharding.Mesh
    run: Any  # train.setup's result
    identity: dict
    init_rng: jax.Array
    dropout_rng: jax.Array


def _build(config: ml_collections.ConfigDict) -> _Built:
    """The run's parts, each checked against the config (objective keys, record kind, vocab)."""
    from data_pipelines.tokenization import load_tokenizer

    tokenizer = load_tokenizer(config.data.vocab_file, do_lower_case=config.data.do_lower_case)
    mesh = sharding.create_mesh(config.mesh_shape)
    run = train.setup(config, mesh, tokenizer.vocab_size)  # checks the objective's config keys
    train.check_records_kind(config)
    pretraining_input.check_eval_apart(config)
    if run.model_config.vocab_size < tokenizer.vocab_size:
        raise ValueError(
            f"config.model.vocab_size {run.model_config.vocab_size} < {tokenizer.vocab_size} "
            f"tokens in {config.data.vocab_file}"
        )
    # Two streams from the seed: the initialisation and the dropout masks (folded per step,
    # in config.prng_impl; "electra" splits each step's key into dropout and the generator's
    # samples). Neither is stored: a resumed run derives the same keys again.
    init_rng, dropout_rng = run_keys(config.seed, config.prng_impl)
    identity = pretraining_input.data_identity(config)
    return _Built(tokenizer, mesh, run, identity, init_rng, dropout_rng)


def _restore_or_start(config, workdir: str, built: _Built):
    """The resume order (`_restore`), else a fresh state in the run's layout: params from
    `init_from`, else initialised. Returns (state, data position or None, source)."""
    run, vocab_size = built.run, built.tokenizer.vocab_size
    state, position, source = _restore(
        config, workdir, run.abstract_state, run.shardings, built.identity, vocab_size
    )
    if state is not None:
        return state, position, source
    born = functools.partial(
        sharded_state,
        run.model,
        run.tx,
        built.mesh,
        run.inputs,
        rules=run.rules,
        shard_update=run.layout is not None,
        spread=config.get("shard_weight_update_spread", False),
    )
    if config.init_from:
        abstract_params = run.abstract_state.params
        state, _ = born(
            params=_load_init_params(
                config.init_from, run.model, abstract_params, built.init_rng, config
            )
        )
        return state, None, f"init_from {config.init_from} (params only)"
    state, _ = born(rng=built.init_rng)
    return state, None, "scratch"


class _Pretraining:
    """The step loop of one run: it owns the state, the data iterator, the checkpoint manager
    and the metrics writer, and runs the steps from the state's step to the stop step
    (`run`), logging (`_log`), evaluating (`_evaluate`), checkpointing (`_save`) and rolling
    back a loss spike (`_roll_back_to_last_checkpoint`) as the config says."""

    def __init__(self, config, workdir: str, built: _Built, state, position):
        self.config, self.workdir, self.built, self.state = config, workdir, built, state
        run = built.run
        self.mask_config = pretraining_input.masking_config(config, built.tokenizer)
        self.train_data = pretraining_input.train_input(config, position, self.mask_config)
        self.manager = checkpointing.make_manager(
            os.path.join(workdir, "checkpoints"), max_to_keep=config.keep_checkpoints
        )
        # A restart repeats the steps after the restored one (all of them from scratch): what
        # an interrupted run logged for those is cut, so metrics.jsonl reads as one run.
        self.writer = telemetry.MetricsWriter(workdir, last_step=int(state.step) or -1)
        self.watcher = checkpointing.PreemptionWatcher(self.manager)
        # The streams the pipeline deals (a config's None: the saved position's, else the
        # process count), so a resume that names another count is refused.
        identity = built.identity | {"num_streams": self.train_data.spec.num_streams}
        self.config_json = checkpointing.config_to_json(config) | {
            "data_identity": identity,
            # Which vocabulary the embedding rows are ids of: what `convert`, `init_from` and
            # fine-tuning compare the vocab file they are given (or find) with.
            "vocab_fingerprint": vocab_fingerprint.fingerprint(
                config.data.vocab_file, config.data.do_lower_case
            ),  # fmt: skip
        }
        self.flops = train.flops_per_step(config, run.model_config)
        self.peak = telemetry.peak_flops_per_device(run.model_config.dtype) * jax.device_count()
        guard = config.get("rollback")  # configs older than the block: none
        self.health = StepHealth()  # non-finite metrics, and param or update norms that jump
        self.spikes = self.history = None
        if guard is not None and guard.enabled:
            self.spikes = rollback.SpikeDetector(guard.spike_factor, guard.median_window)
            self.history = rollback.Rollbacks(guard.max_rollbacks, guard.window_steps)
        self.start = self.step = int(state.step)
        self.stop = config.get("stop_at_step") or config.num_train_steps
        self.pending: list[tuple[int, dict]] = []
        self.last: dict[str, float] = {}
        self.saving = False  # a background save not yet known to have landed
        self.timer = (time.perf_counter(), self.start)

    def run(self) -> dict[str, float]:
        """Runs the steps; lands the last checkpoint; returns the last metrics."""
        config, manager = self.config, self.manager
        self.progress = tqdm(
            total=self.stop, initial=self.start, disable=jax.process_index() != 0, desc="pretrain"
        )
        trace = _StepTrace(config, self.workdir, self.start)
        try:
            with sharding.activation_context(self.built.mesh, self.built.run.rules):
                if config.data.eval_files and config.eval_every > config.num_train_steps:
                    logging.warning(
                        "eval_every=%d > the run's %d steps: the held-out set is evaluated at "
                        "step 0 and after the last step only", config.eval_every,
                        config.num_train_steps,
                    )  # fmt: skip
                if self.start == 0 and config.eval_every:  # 0: never
                    self._evaluate(0)
                while self.step < self.stop:  # not a range: a rollback takes `step` back
                    if self._train_one_step(trace):
                        break
            checkpointing.finish_saves(manager)
            manager.close()
        except BaseException as error:  # a reader error, the step's, Ctrl-C, a refused rollback
            _finish_after(error, manager, self.step)
            raise
        finally:
            trace.close(self.step)  # a trace cut short (an error, SIGTERM, the end) is kept
            self.progress.close()
            self.watcher.close()
            self.writer.close()
        return self.last

    def _train_one_step(self, trace: _StepTrace) -> bool:
        """One step, then its logging, evaluation and checkpoint; True when SIGTERM stops
        the run (after its checkpoint landed). The first Ctrl-C saves the same way, then
        raises `checkpointing.Interrupted`."""
        config, manager, run = self.config, self.manager, self.built.run
        self.step += 1
        step = self.step
        trace.before(step)
        # Marks the step for XProf's step view (a no-op while no trace runs).
        with jax.profiler.StepTraceAnnotation("train", step_num=step):
            inputs = sharding.global_batch(next(self.train_data), self.built.mesh, run.rules)
            self.state, step_metrics = run.train_step(self.state, inputs, self.built.dropout_rng)
        trace.after(step, self.state)
        self.pending.append((step, step_metrics))
        self._show_finished_steps()
        if step == self.start + 1:  # keep compilation out of the throughput figures
            jax.block_until_ready(self.state.step)
            self.timer = (time.perf_counter(), step)
        if self.saving and not manager.is_saving_in_progress():
            # A failed save stops the run now, not at the next save (or at exit).
            checkpointing.finish_saves(manager)
            self.saving = False
        stopping = self.watcher.should_stop(step)
        every = config.checkpoint_every  # 0: no periodic checkpoint; the final one is written
        checkpoint_now = (every > 0 and step % every == 0) or step == self.stop or stopping
        if (step % config.log_every == 0 or checkpoint_now) and not self._log(step):
            return False  # rolled back: the steps after the checkpoint are done again
        # The run's last step is always evaluated, whatever eval_every says (0: never); a
        # stage that stops early (stop_at_step) is not the end, so a resumed run's records
        # equal the uninterrupted one's.
        last = step == config.num_train_steps
        if config.eval_every and (step % config.eval_every == 0 or last):
            self.last |= {f"eval_{k}": v for k, v in self._evaluate(step).items()}
        if checkpoint_now:
            self._save(step)
            self.saving = True
        if stopping:
            checkpointing.finish_saves(manager)  # claim the checkpoint once it landed
            name = self.watcher.signal_name or "SIGTERM"  # multi-process: the sync service's
            message = (
                f"stopped by {name} after step {step} (checkpoint saved in {manager.directory})"
            )
            logging.warning("%s", message)
            if name == "SIGINT":  # Ctrl-C: the process ends non-zero, the step saved
                raise checkpointing.Interrupted(message)
        return stopping

    def _show_finished_steps(self) -> None:
        """Advances the bar to the last step whose results are on the host, not to the last
        dispatched: one step stays in flight (the next batch is prepared while it runs),
        the one before it is waited for. A bar counting dispatches runs ahead by the queue
        JAX lets the host build, then sits at 100% while the device catches up."""
        if len(self.pending) >= 2:
            done, metrics = self.pending[-2]
            jax.block_until_ready(metrics)
            self.progress.update(done - self.progress.n)

    def _log(self, step: int) -> bool:
        """Writes the pending steps' metrics; False when a loss spike rolled the run back.
        Checked before any save, so a checkpoint never holds an unhealthy state."""
        try:
            self.last = _flush(
                self.pending,
                self.writer,
                self.timer,
                step,
                self.flops,
                self.peak,
                self.config,
                self.manager,
                self.health,
                self.spikes,
            )
        except rollback.LossSpike as spike:  # raised with config.rollback only
            self._roll_back_to_last_checkpoint(spike)
            return False
        self.timer = (time.perf_counter(), step)
        self.progress.update(step - self.progress.n)  # its metrics are on the host now
        self.progress.set_postfix(
            loss=f"{self.last['loss']:.3f}", mlm_acc=f"{self.last['mlm_accuracy']:.3f}"
        )
        self.pending = []
        return True

    def _roll_back_to_last_checkpoint(self, spike: rollback.LossSpike) -> None:
        self.state = None  # the diverged state: freed before the restore allocates
        self.state, self.train_data = _roll_back(
            spike,
            self.history,
            self.config,
            self.built.run,
            self.manager,
            self.mask_config,
            self.workdir,
        )
        self.step = int(self.state.step)
        self.writer.cut(self.step)  # the steps after it are done again, logged again
        self.pending, self.saving = [], False
        self.timer = (time.perf_counter(), self.step)
        self.progress.n = self.step

    def _save(self, step: int) -> None:
        checkpointing.save(
            self.manager,
            step,
            self.state,
            pretraining_input.gather_positions(self.train_data.position),
            self.config_json,
        )

    def _evaluate(self, step: int) -> dict[str, float]:
        config, built = self.config, self.built
        if not config.data.eval_files:
            return {}
        eval_data = pretraining_input.eval_input(config, built.tokenizer)
        totals = []
        for _ in range(config.eval_steps):
            batch = sharding.global_batch(next(eval_data), built.mesh, built.run.rules)
            totals.append(built.run.eval_step(self.state.params, batch))
        result = {k: float(np.mean([t[k] for t in totals])) for k in totals[0]}
        self.writer.write(step, result, prefix="eval")
        logging.info("eval at step %d: %s", step, _fmt(result))
        return result


def _finish_after(error: BaseException, manager, step: int) -> None:
    """Lands the save in flight (a checkpoint abandoned mid-write would be left as a
    `*.orbax-checkpoint-tmp` directory, and the rerun would resume from the one before) and
    notes on `error`, and in the log, the step the run stopped at and the checkpoint a rerun
    resumes from."""
    try:
        checkpointing.finish_saves(manager)
    except checkpointing.CheckpointError as failed:  # the save in flight failed as well
        error.add_note(str(failed))
    if str(manager.directory) in str(error):  # the non-finite stop's own message names it
        return
    note = f"training stopped at step {step} ({type(error).__name__}); {_resume_point(manager)}"
    error.add_note(note)
    logging.error(note)


def _resume_point(manager, kind: str = "complete") -> str:
    """Where a rerun of a stopped run resumes: its last (`kind`) checkpoint, or none yet."""
    good = manager.latest_step()
    if good is None:
        return f"no checkpoint was saved yet in {manager.directory}"
    return f"the last {kind} checkpoint is step {good} in {manager.directory}"


def _flush(
    pending, writer, timer, step, flops, peak, config, manager, health, spikes=None
) -> dict[str, float]:
    """Fetches the pending metrics, stops on an unhealthy step (`health`, a
    `train_state.StepHealth`: a non-finite metric, a param or update norm that jumped),
    writes the averages.

    With `spikes` (a `rollback.SpikeDetector`: `config.rollback.enabled`) the first unhealthy
    step or loss spike raises `rollback.LossSpike` instead, and nothing of these steps is
    written: the loop rolls back and does them again.
    """
    fetched = jax.device_get([m for _, m in pending])
    for (s, _), m in zip(pending, fetched, strict=True):
        bad = health.check(m)
        if spikes is not None:
            reason = bad or spikes.check(float(m["loss"]))
            if reason:
                raise rollback.LossSpike(s, float(m["loss"]), reason)
        elif bad:
            checkpointing.finish_saves(manager)
            raise FloatingPointError(f"{bad} at step {s}; {_resume_point(manager, 'good')}")
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
