"""What the fine-tuning scripts share: a pretrained encoder under a fresh head, the
optimizer of the original recipe, batching, the epoch loop, result files.

Each script (`experiments/finetune_*.py`) keeps its own loss (made a train step by
`train_state.make_step`), evaluation and outputs; only the plumbing below is common.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from collections.abc import Iterator
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec
from tqdm import tqdm

from bert_jax import convert, optim, sharding, train_state
from bert_jax.config import BertConfig

# SIGTERM and Ctrl-C: their own module; the names callers have always used here.
from bert_jax.finetune_signals import Stopped, final_save, stopping_on_signals  # noqa: F401
from bert_jax.host_progress import FinishedSteps
from bert_jax.train_state import TrainState, make_step, nonfinite, sharded_state

log = logging.getLogger(__name__)


def run_keys(config: ml_collections.ConfigDict) -> tuple[jax.Array, jax.Array]:
    """(init key, dropout key) of a run, as pretraining makes them (`train_state.run_keys`).

    The init key seeds the fresh head (`load_model`), the dropout key every step's masks
    (`train_epoch` folds the step in), in `config.prng_impl`; `config.seed` fixes both.
    """
    return train_state.run_keys(config.seed, config.prng_impl)


def load_model(
    module: nn.Module,
    init_from: str,
    *,
    from_scratch: bool = False,
    bert_config_file: str | None = None,
    rng: jax.Array | None = None,
    **config_overrides: Any,
) -> tuple[nn.Module, BertConfig, Any, str | None]:
    """A head model whose encoder comes from `init_from`, its head freshly initialised.

    Args:
        module: a `bert_jax.heads` model (encoder named `bert`); its config is replaced by
            the checkpoint's.
        init_from: any model location (`bert_jax.convert.locations.resolve`): a
            pretraining or fine-tuning workdir of this project or its checkpoint directory,
            a params-only Orbax dir, a Google TF checkpoint, a Hugging Face or
            sentence-transformers directory.
        from_scratch: keep only the checkpoint's config and vocab; initialise every weight
            randomly (the baseline a pretrained encoder is compared with).
        bert_config_file: a config that replaces the one found beside the checkpoint.
        rng: the key of the head's (or, from scratch, every) initialisation: the init key
            of `run_keys` (default: seed 0's).
        **config_overrides: BertConfig fields to change that do not alter the weights'
            shapes (e.g. hidden_dropout_prob).

    Returns:
        (module with the final config, config, params as numpy/jax arrays, vocab file or None).
    """
    module, config, params, vocab_file, _ = _load_model(
        module, init_from, from_scratch, bert_config_file, rng, config_overrides
    )
    return module, config, params, vocab_file


def _load_model(module, init_from, from_scratch, bert_config_file, rng, config_overrides):
    """`load_model`, and the pretraining checkpoint step `init_from` gave (None for other
    formats): a workdir whose newest checkpoint does not read gives an older one."""
    if rng is None:
        rng, _ = train_state.run_keys(0)
    source = convert.open_source(init_from, bert_config_file)
    config, params, vocab_file = convert.load_source(source, model=module, rng=rng)
    step = "" if source.step is None else f" step {source.step}"
    config = config.replace(**config_overrides)
    module = module.clone(config=config)
    if from_scratch:
        del params
        ids = jnp.zeros((1, 2), jnp.int32)
        params = jax.jit(lambda r: nn.unbox(module.init(r, ids, ids, ids)["params"]))(rng)
        log.info("Initialised every weight from scratch (config and vocab from %s%s)",
                 init_from, step)  # fmt: skip
    elif getattr(module, "has_head", True):
        log.info("Encoder from %s%s; head initialised fresh", init_from, step)
    else:  # an embedding model: the encoder and a pooling, no head
        log.info("Encoder from %s%s", init_from, step)
    return module, config, params, vocab_file, source.step


class TaskModel(NamedTuple):
    """A fine-tuning config's head model, ready to train, and the tokenizer of its vocab."""

    module: nn.Module  # the head model with the checkpoint's (overridden) config
    config: BertConfig
    params: Any  # encoder from `init_from`, head fresh (every weight fresh from scratch)
    tokenizer: Any  # `data_pipelines.tokenization.load_tokenizer` of `vocab_file`
    vocab_file: str
    # The pretraining checkpoint step the encoder (or, from scratch, the config) came from,
    # recorded beside `init_from`: a workdir whose newest checkpoint does not read gives an
    # older one. None where `init_from` is no train state (HF, TF, params-only Orbax).
    init_step: int | None = None


def load_task_model(config: ml_collections.ConfigDict, module: nn.Module) -> TaskModel:
    """`load_model` of a fine-tuning config and the tokenizer its vocab gives.

    Reads `init_from`, `from_scratch`, `bert_config_file`, `model_overrides` (None values
    keep the checkpoint's), `vocab_file` (default: the one beside the checkpoint),
    `do_lower_case` (None: the encoder's, `encoder_vocab.resolve_casing`; the casing used
    is written back to it), and `seed`/`prng_impl` through the init key of `run_keys`.

    Raises:
        ValueError: no vocab found, or one with more tokens than the model has embeddings
            (their ids would read past the table).
        vocab_fingerprint.VocabMismatchError: another vocabulary or casing than the
            encoder's.
    """
    from bert_jax import encoder_vocab
    from data_pipelines import vocab_fingerprint
    from data_pipelines.tokenization import load_tokenizer

    overrides = {k: v for k, v in config.model_overrides.items() if v is not None}
    module, bert_config, params, found_vocab, init_step = _load_model(
        module,
        config.init_from,
        config.from_scratch,
        config.bert_config_file or None,
        run_keys(config)[0],
        overrides,
    )
    vocab_file = config.vocab_file or found_vocab
    if not vocab_file:
        raise ValueError(
            f"no vocab.txt, tokenizer.json or .model beside {config.init_from}; set "
            "--config.vocab_file"
        )
    check_seq_length(config.get("max_seq_length"), bert_config, config.init_from)
    # The encoder's casing (its fingerprint, tokenizer_config.json, finetuned.json), a flag
    # that says otherwise refused; written back so every result file records the one used.
    config.do_lower_case = encoder_vocab.resolve_casing(
        config.init_from, config.do_lower_case, vocab_file, "--config.do_lower_case"
    )
    tokenizer = load_tokenizer(vocab_file, do_lower_case=config.do_lower_case)
    if tokenizer.vocab_size > bert_config.vocab_size:
        raise vocab_fingerprint.VocabMismatchError(
            f"{vocab_file} has {tokenizer.vocab_size} tokens > the model's vocab_size "
            f"{bert_config.vocab_size}: its ids past the table would embed nothing"
        )
    # What the final save checks, checked before training: a vocab it cannot copy fails now.
    convert.check_vocab(vocab_file, bert_config)
    # The encoder's embedding rows are its own vocabulary's ids: the one it saved.
    made_with = encoder_vocab.saved_fingerprint(config.init_from) if config.vocab_file else None
    if made_with is None and config.vocab_file and found_vocab:
        made_with = vocab_fingerprint.fingerprint(found_vocab)
    if made_with is not None and not config.from_scratch:
        vocab_fingerprint.check_same_vocab(
            made_with,
            vocab_file,
            f"the encoder in {config.init_from}",
            "allow_vocab_change",
            config.get("allow_vocab_change", False),  # configs older than the key: refused
        )
    return TaskModel(module, bert_config, params, tokenizer, vocab_file, init_step)


def check_seq_length(max_seq_length: int | None, bert_config: BertConfig, source: str) -> None:
    """Refuses a `max_seq_length` past the learned position table of the encoder (a Flax
    shape error deep in the first step otherwise), naming the flag and both numbers.

    Raises:
        ConfigError: `--config.max_seq_length` > the encoder's `max_position_embeddings`.
    """
    from bert_jax.config import ConfigError

    positions = bert_config.max_position_embeddings
    if max_seq_length and bert_config.position_encoding == "learned" and max_seq_length > positions:
        raise ConfigError(
            f"--config.max_seq_length={max_seq_length} is past the {positions} positions the "
            f"encoder in {source} has (max_position_embeddings): give at most {positions}"
        )


OPTIMIZERS = ("adamw", "adamw_bias_corrected")  # a fine-tuning config's `optimizer`


def make_optimizer(
    learning_rate: float,
    num_train_steps: int,
    *,
    warmup_proportion: float = 0.1,
    weight_decay: float = 0.01,
    max_grad_norm: float = 1.0,
    name: str = "adamw",
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """The fine-tuning optimizer: clip, AdamW (`name`, see `make_tx`), linear warmup over
    `warmup_proportion` of the steps then linear decay to 0 (the original recipe's)."""
    warmup = int(num_train_steps * warmup_proportion)
    schedule = optim.warmup_polynomial_decay(learning_rate, warmup, num_train_steps)
    return make_tx(name, schedule, weight_decay, max_grad_norm), schedule


def make_tx(
    name: str, learning_rate: optax.ScalarOrSchedule, weight_decay: float, max_grad_norm: float
) -> optax.GradientTransformation:
    """Global-norm clipping (none at 0), then AdamW with decay off LayerNorm and biases.

    `name` "adamw" is the original BERT optimizer, without Adam's bias correction: over the
    first few hundred steps its updates are up to (1 - b1^t) / sqrt(1 - b2^t) times too
    large, which Zhang et al. 2021 ("Revisiting Few-sample BERT Fine-tuning") found
    destabilises short fine-tuning runs; "adamw_bias_corrected" is Adam's own form.

    Raises:
        ValueError: an unknown `name`.
    """
    if name == "adamw":
        tx = optim.bert_adamw(learning_rate, weight_decay)
    elif name == "adamw_bias_corrected":
        tx = optim.adamw_bias_corrected(learning_rate, weight_decay)
    else:
        raise ValueError(f"fine-tuning optimizer {name!r} is not one of {OPTIMIZERS}")
    if max_grad_norm:
        tx = optax.chain(optax.clip_by_global_norm(max_grad_norm), tx)
    return tx


class Setup(NamedTuple):
    """What a fine-tuning run trains and predicts with, once its model and data are known."""

    mesh: Any
    state: TrainState  # step 0, born sharded from the given params
    num_steps: int
    train_step: Any  # jitted (state, batch, rng) -> (state, metrics), state donated
    predict_step: Any  # jitted (params, inputs) -> outputs, replicated


def setup(
    config: ml_collections.ConfigDict,
    model: nn.Module,
    params: Any,
    num_train: int,
    train_loss,
    train_keys: tuple[str, ...],
    predict_step,
    input_keys: tuple[str, ...],
    what: str = "training examples",
    sample_inputs: tuple | None = None,
) -> Setup:
    """The mesh, the original recipe's optimizer over `config.num_epochs` epochs of
    `num_train` examples, the sharded state and the jitted steps of a fine-tuning config.

    `train_loss(params, batch, dropout_rng)` is the task's loss (`make_step` adds the
    update); `predict_step(params, inputs)` its forward pass. `params` are copied.
    `sample_inputs` are positional inputs of `model` for one example (default: the three
    (1, max_seq_length) token arrays of a `bert_jax.heads` model).
    """
    mesh = sharding.create_mesh(config.mesh_shape)
    check_batch_size(config.train_batch_size, mesh, "train_batch_size")
    check_batch_size(config.eval_batch_size, mesh, "eval_batch_size")
    per_epoch = steps_per_epoch(num_train, config.train_batch_size)
    if per_epoch == 0:
        from bert_jax.config import ConfigError

        raise ConfigError(
            f"{num_train} {what} < --config.train_batch_size={config.train_batch_size}: not "
            "one full batch to train on (a partial batch is dropped); give a smaller batch"
        )
    num_steps = per_epoch * config.num_epochs
    tx, schedule = make_optimizer(
        config.learning_rate, num_steps, warmup_proportion=config.warmup_proportion,
        weight_decay=config.weight_decay, max_grad_norm=config.max_grad_norm,
        name=config.optimizer,
    )  # fmt: skip
    sample = sample_inputs or [jnp.zeros((1, config.max_seq_length), jnp.int32)] * 3
    state, shardings = sharded_state(model, tx, mesh, sample, params=params)
    data = sharding.batch_sharding(mesh)
    train_step = jax.jit(
        make_step(train_loss, tx, schedule),
        in_shardings=(shardings, {k: data for k in train_keys}, replicated(mesh)),
        out_shardings=(shardings, replicated(mesh)),
        donate_argnums=0,
    )
    predict = jax.jit(
        predict_step,
        in_shardings=(shardings.params, {k: data for k in input_keys}),
        out_shardings=replicated(mesh),
    )
    return Setup(mesh, state, num_steps, train_step, predict)


def replicated(mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def data_parallel_size(mesh) -> int:
    """How many ways a batch is split (the `data` x `fsdp` axes)."""
    return mesh.shape["data"] * mesh.shape["fsdp"]


def check_batch_size(batch_size: int, mesh, name: str) -> None:
    if batch_size % data_parallel_size(mesh):
        raise ValueError(
            f"{name}={batch_size} does not divide over the {data_parallel_size(mesh)} "
            "data-parallel devices of the mesh"
        )


def train_batches(
    lengths: np.ndarray, batch_size: int, seed: int, epoch: int, *, group: int = 50
) -> list[np.ndarray]:
    """Index batches of one epoch: shuffled, each holding examples of similar length.

    The epoch's permutation (from `seed` and `epoch`) is cut into runs of `group` batches,
    each run is sorted by length and split into batches, and the batches are shuffled: so
    padding to each batch's longest example (`pad_length`) wastes little compute, while the
    batches still mix the data. The last partial batch is dropped, as in the original.
    """
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(lengths))
    order = order[: len(order) // batch_size * batch_size]
    run = batch_size * group
    runs = [order[i : i + run] for i in range(0, len(order), run)]
    order = np.concatenate([r[np.argsort(lengths[r], kind="stable")] for r in runs] or [order])
    batches = order.reshape(-1, batch_size)
    return list(batches[rng.permutation(len(batches))])


def steps_per_epoch(num_examples: int, batch_size: int) -> int:
    return num_examples // batch_size


def eval_batches(lengths: np.ndarray, batch_size: int) -> Iterator[tuple[np.ndarray, int]]:
    """(indices, number of real rows) over every example, shortest first.

    A short last batch is filled up with its last index repeated; callers keep the first
    `real` rows and put results back by index.
    """
    order = np.argsort(lengths, kind="stable")
    for start in range(0, len(order), batch_size):
        indices = order[start : start + batch_size]
        real = len(indices)
        if real < batch_size:
            indices = np.concatenate([indices, np.full(batch_size - real, indices[-1])])
        yield indices, real


def num_batches(num_examples: int, batch_size: int) -> int:
    return math.ceil(num_examples / batch_size)


def pad_length(lengths: np.ndarray, max_length: int, multiple: int = 16) -> int:
    """The longest of `lengths` rounded up to `multiple` (few distinct shapes to compile)."""
    return min(max_length, int(math.ceil(max(int(lengths.max()), 1) / multiple) * multiple))


def sequence_lengths(input_mask: np.ndarray) -> np.ndarray:
    """(N,) real tokens per example: of its longest sequence for (N, K, T) choices."""
    return input_mask.reshape(len(input_mask), -1, input_mask.shape[-1]).sum(-1).max(-1)


def take(arrays: dict[str, np.ndarray], indices: np.ndarray, length: int | None = None):
    """Rows `indices` of every array; (N, ..., T) arrays are cut to their first `length`
    positions (the last axis).

    Cutting only drops padding (attention never reads masked positions), so the outputs on
    real tokens are those of the full-length batch.
    """
    out = {}
    for key, value in arrays.items():
        rows = value[indices]
        out[key] = rows[..., :length] if length is not None and rows.ndim >= 2 else rows
    return out


def train_epoch(
    step_fn,
    state: TrainState,
    rng: jax.Array,
    arrays: dict[str, np.ndarray],
    *,
    epoch: int,
    config: ml_collections.ConfigDict,
    mesh,
    log_file,
    step_args: tuple = (),
    desc: str | None = None,
    show_progress: bool = True,
    take_fn=None,
) -> tuple[TrainState, float]:
    """Trains one epoch over `arrays`; returns (state, the epoch's mean train loss).

    The batches are `train_batches` of `config.train_batch_size` (shuffled by `config.seed`
    and `epoch`), each cut to its longest example (`pad_length`). Every `config.log_every`
    steps and at the run's last, the steps not yet checked are checked for a non-finite loss,
    gradient norm or param norm (as pretraining does), and `log_file` gets one JSON line: the
    step, the epoch (fractional), each metric's mean over this epoch's last `log_every` steps
    and the current learning rate.

    Args:
        step_fn: the jitted `(state, batch, rng, *step_args) -> (state, metrics)`.
        rng: the run's dropout key (`run_keys`; the step folds in the step number).
        arrays: the training features by name, `(N, ...)` each, `input_mask` among them.
        config: `train_batch_size seed max_seq_length num_epochs log_every`.
        desc: the progress bar's label (default `epoch E/N`).
        take_fn: `(arrays, indices, length) -> host batch` (default `take`): a task whose
            inputs are not all (N, ..., T) arrays adds them here (e.g. cached features).
    """
    take_fn = take_fn or take
    lengths = sequence_lengths(arrays["input_mask"])
    per_epoch = steps_per_epoch(len(lengths), config.train_batch_size)
    num_steps = per_epoch * config.num_epochs
    batches = train_batches(lengths, config.train_batch_size, config.seed, epoch)
    desc = desc or f"epoch {epoch}/{config.num_epochs}"
    first_step = int(state.step) + 1
    history, checked = [], []  # this epoch's metrics: on device, and fetched and checked
    progress = tqdm(total=len(batches), desc=desc, disable=not show_progress)
    finished = FinishedSteps(progress.update)  # the bar counts steps done, not dispatched
    for indices in batches:
        length = pad_length(lengths[indices], config.max_seq_length)
        batch = sharding.global_batch(take_fn(arrays, indices, length), mesh)
        state, metrics = step_fn(state, batch, rng, *step_args)
        history.append(metrics)
        finished.add(metrics)
        step = int(state.step)
        if step % config.log_every == 0 or step == num_steps:
            checked += fetch_finite(history[len(checked) :], first_step + len(checked))
            window = checked[-config.log_every :]
            record = {k: float(np.mean([m[k] for m in window])) for k in window[-1]}
            record["learning_rate"] = float(window[-1]["learning_rate"])
            log_file.write(json.dumps({"step": step, "epoch": step / per_epoch, **record}) + "\n")
            log_file.flush()
            progress.set_postfix(loss=f"{record['loss']:.4f}")
    checked += fetch_finite(history[len(checked) :], first_step + len(checked))
    finished.drain()
    progress.close()
    return state, float(np.mean([m["loss"] for m in checked]))


def fetch_finite(metrics: list[dict], first_step: int) -> list[dict]:
    """The host values of consecutive steps' metrics; raises on a non-finite one."""
    fetched = jax.device_get(metrics)
    for step, values in enumerate(fetched, first_step):
        if bad := nonfinite(values):
            raise FloatingPointError(f"non-finite {bad} at step {step}")
    return fetched


def write_json(path: str, data: Any) -> None:
    """Writes JSON through a temporary file, so a half-written file never looks complete."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True, ensure_ascii=False, default=_jsonable)
        f.write("\n")
    os.replace(tmp, path)


def _jsonable(value):
    if isinstance(value, np.generic | np.ndarray | jax.Array):
        return np.asarray(value).tolist()
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


FINETUNED_FILE = "finetuned.json"  # what a fine-tuned checkpoint adds to `convert.save_params`


def save_finetuned(
    directory: str, config: BertConfig, params: Any, *, vocab_file: str | None, metadata: dict
) -> str:
    """Saves a fine-tuned model (encoder and head) so that it can be reloaded to predict.

    The directory is a params-only Orbax checkpoint (`convert.save_params`: `params/`,
    `config.json`, `vocab.txt`) plus `finetuned.json` holding `metadata` (the task, its
    labels, `num_outputs`, ...). Everything is written under one temporary name beside it
    and renamed when complete, replacing an older checkpoint there (a kill leaves only that
    temporary, which the next save removes).
    """
    from bert_jax import encoder_vocab
    from bert_jax.convert import readers

    readers.check_orbax_output(directory)
    convert.check_vocab(vocab_file, config)
    # The casing the model reads text with, recorded for embed, convert and transformers.
    metadata = encoder_vocab.with_casing(metadata, vocab_file)
    with convert.writing_dir(directory, overwrite=True) as tmp:
        readers.write_params(tmp, config, params, vocab_file=vocab_file)
        write_json(os.path.join(tmp, FINETUNED_FILE), metadata)
        encoder_vocab.write_casing(tmp, metadata.get("do_lower_case"))
    log.info("Saved the fine-tuned model to %s", directory)
    return directory


def check_can_save(workdir: str, command: str) -> None:
    """For a script's main, before training: exits with one line where `save_finetuned`
    could not replace `<workdir>/checkpoint` at the end (it is there and not an export)."""
    try:
        convert.output_dir.check_output(os.path.join(workdir, "checkpoint"), overwrite=True)
    except FileExistsError as error:
        raise SystemExit(f"{command}: {error}") from None


def load_finetuned(directory: str) -> tuple[BertConfig, Any, str | None, dict]:
    """Reads a `save_finetuned` directory: (config, numpy params, vocab file, metadata);
    a finetuned.json that links out of it is refused (`convert.locations.model_file`)."""
    from bert_jax.convert import locations

    meta_path = locations.model_file(directory, FINETUNED_FILE)
    if meta_path is None or not os.path.isfile(meta_path):
        raise FileNotFoundError(
            f"{directory}: not a fine-tuned checkpoint (no {FINETUNED_FILE}); fine-tuning "
            "scripts write one to <workdir>/checkpoint"
        )
    with open(meta_path, encoding="utf-8") as f:
        metadata = json.load(f)
    config, params, vocab_file = convert.load_params(directory)
    return config, params, vocab_file, metadata
