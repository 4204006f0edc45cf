"""Reading checkpoints: HF safetensors, Google TF, params-only Orbax, pretraining train states.

`open_source(path)` finds the format (`detect_format`) and returns a `Source`: tensor
names and shapes, with values read one at a time (so a BERT-Large import never holds two
copies of the weights), plus the config and vocab.txt found beside them (a HF config.json is
read as its `model_type`'s family reads it: `families`). `save_params` / `load_params` are
this project's params-only Orbax format: `params/` (an Orbax StandardCheckpointer directory) +
`config.json` (+ `vocab.txt` and the tokenizer files a HF directory had).
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import logging
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np

from bert_jax.config import BertConfig
from bert_jax.convert import families, locations
from bert_jax.convert.locations import copy_files, tokenizer_files  # noqa: F401 (its API)
from bert_jax.convert.names import (
    IGNORED_NAMES,
    ConversionError,
    Params,
    TensorSpec,
    as_numpy,
    flatten,
    with_layout,
)
from bert_jax.convert.output_dir import writing_dir

log = logging.getLogger(__name__)


class Source:
    """The named tensors of one checkpoint; remembers which names were read."""

    def __init__(
        self,
        location: str,
        naming: str,  # "hf", "tf" or "ours": which TensorSpec name and layout apply
        shapes: dict[str, tuple[int, ...]],
        read: Callable[[str], np.ndarray],
        config: BertConfig | None,
        vocab_file: str | None,
        display: Callable[[str], str] = str,  # a name as the checkpoint spells it
    ):
        self.display = display
        self.location = location
        self.naming = naming
        self.shapes = shapes
        self._read = read
        self.config = config
        self.config_file: str | None = None  # the file `config` was read from, if one
        self.vocab_file = vocab_file
        self.step: int | None = None  # of a pretraining train state: the checkpoint step read
        self.taken: set[str] = set()
        # True lets NaN or infinite weights through (`load_source(allow_non_finite=True)`).
        self.allow_non_finite = False

    def name(self, spec: TensorSpec) -> str:
        return {"hf": spec.hf, "tf": spec.tf, "ours": spec.ours}[self.naming]

    def has(self, spec: TensorSpec) -> bool:
        return self.name(spec) in self.shapes

    def read(self, name: str) -> np.ndarray:
        self.taken.add(name)
        with _reading(self.location, f"a readable tensor {self.display(name)!r}"):
            return np.asarray(self._read(name))

    def take(self, spec: TensorSpec, shape: tuple[int, ...], dtype) -> np.ndarray:
        """Our parameter for `spec`, of `shape`; names the tensor if it is absent or wrong."""
        if self.naming == "hf" and spec.hf_fill is not None:  # a tensor HF does not have
            return np.full(shape, spec.hf_fill, dtype)
        name = self.name(spec)
        expected = spec.stored_shape(shape, self.naming)
        if name not in self.shapes:
            raise ConversionError(
                f"{self.location}: missing tensor {self.display(name)!r} (expected shape "
                f"{expected}, for {spec.ours})"
            )
        found = tuple(self.shapes[name])
        if found != expected:
            raise ConversionError(
                f"{self.location}: tensor {self.display(name)!r} has shape {found} but the "
                f"model config expects {expected} (for {spec.ours} of shape {tuple(shape)}); "
                "does the config "
                "(vocab_size, hidden_size, intermediate_size, max_position_embeddings, "
                "type_vocab_size) match the checkpoint?"
            )
        value = self.read(name)
        _check_weights(value, f"{self.location}: tensor {self.display(name)!r}",
                       self.allow_non_finite)  # fmt: skip
        if self.naming == "hf":
            value = spec.from_hf(value, shape)
        else:
            value = (value.T if self.naming == "tf" and spec.tf_t else value).reshape(shape)
        return np.ascontiguousarray(value.astype(dtype))

    def leftover(self) -> list[str]:
        """Names never read, less buffers and optimiser slots."""
        names = (n for n in self.shapes if n not in self.taken and not IGNORED_NAMES.search(n))
        return sorted(self.display(n) for n in names)


def _check_weights(value: np.ndarray, what: str, allow_non_finite: bool) -> None:
    """Refuses a weight that is not floating point (an int tensor cast to float would load
    as something else than it is) or, unless `allow_non_finite`, one holding NaN or inf."""
    dtype = np.asarray(value).dtype
    if not np.issubdtype(dtype, np.floating) and dtype.name != "bfloat16":
        raise ConversionError(f"{what} is {dtype}, not floating point: not a weight")
    if not allow_non_finite:
        check_finite(value, what)


def check_finite(value, what: str) -> None:
    """Raises ConversionError naming `what` when `value` holds NaN or inf (a diverged or
    damaged model: it would import, or export, without a word and compute NaN)."""
    array = np.asarray(value, dtype=np.float32)
    if not np.isfinite(array).all():
        bad = int(array.size - np.isfinite(array).sum())
        raise ConversionError(
            f"{what} holds {bad} non-finite value(s) (NaN or inf); pass "
            "allow_non_finite=True to take it anyway"
        )


def check_vocab(vocab_file: str | None, config: BertConfig) -> None:
    """Refuses a tokenizer file with more tokens than the model has embedding rows.

    Its ids past `vocab_size` would gather nothing (NaN features) or be written beside a
    model that cannot embed them. Fewer tokens are fine: embedding tables are often padded
    (e.g. to a multiple of 8) beyond the vocabulary.
    """
    if not vocab_file:
        return
    from data_pipelines import tokenization

    try:  # any kind: a vocab.txt, a sentencepiece .model, a tokenizer.json
        size = tokenization.vocab_size_of(vocab_file)
    except tokenization.VocabError as error:
        raise ConversionError(str(error)) from None
    if size > config.vocab_size:
        raise ConversionError(
            f"{vocab_file}: {size} tokens but the model's vocab_size is {config.vocab_size}"
        )


@contextlib.contextmanager
def _reading(location: str, expected: str) -> Iterator[None]:
    """Turns a library's error while reading `location` into a ConversionError naming it and
    what was expected there: safetensors, TensorFlow's checkpoint reader ("not an sstable")
    and Orbax name neither the file nor the format they wanted (a BertConfig's errors and
    `bert_jax.checkpointing`'s name their files already)."""
    try:
        yield
    except ConversionError:
        raise
    except Exception as error:  # noqa: BLE001 - any failure to read: corrupt or foreign file
        reason = f"{type(error).__name__}: {error}".splitlines()[0]
        raise ConversionError(
            f"{location}: expected {expected}; reading it failed: {reason}"
        ) from error


def _found(directory: str, name: str) -> str | None:
    """`directory/name` if it is there; never a link out of the directory (`locations`)."""
    return locations.model_file(directory, name)


def _found_vocab(directory: str) -> str | None:
    """The tokenizer file of a model directory: vocab.txt, else tokenizer.json (ModernBERT's
    has no vocab.txt), else its one sentencepiece `.model`; never a link out of it."""
    from data_pipelines import tokenization

    directory = directory or "."  # a checkpoint prefix in the working directory
    if not os.path.isdir(directory):
        return None
    for name in (tokenization.VOCAB_NAME, tokenization.HF_NAME):
        locations.model_file(directory, name)  # a link out is refused, not passed over
    found = tokenization.find_tokenizer_file(directory)
    return found and locations.check_inside(directory, found)


def _hf_source(directory: str) -> Source:
    from safetensors import safe_open

    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.lexists(index):
        locations.check_inside(directory, index)
        expected = "a safetensors index (JSON with a weight_map)"
        with _reading(index, expected), open(index, encoding="utf-8") as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        for fname in files:
            locations.check_index_entry(directory, fname, index)
    else:
        files = ["model.safetensors"]
        locations.check_inside(directory, os.path.join(directory, files[0]))
    shapes, where = {}, {}
    for fname in files:
        path = os.path.join(directory, fname)
        expected = "a safetensors file (the weights of a Hugging Face directory)"
        with _reading(path, expected), safe_open(path, framework="np") as handle:
            for key in handle.keys():
                view = handle.get_slice(key)
                shapes[key] = tuple(view.get_shape())
                where[key] = (path, view.get_dtype())
    # BertModel (ModernBertModel) keys have no prefix, BertFor* (ModernBertFor*) models put
    # `bert.` (`model.`) before the encoder's; old checkpoints call the LayerNorm parameters
    # gamma and beta.
    original = {}
    for key in shapes:
        name = families.HF_PREFIX.sub("", key)
        name = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", name)
        name = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name)
        if name in original:
            raise ConversionError(f"{directory}: tensors {original[name]!r} and {key!r} collide")
        original[name] = key

    def read(name: str) -> np.ndarray:
        path, dtype = where[original[name]]
        # numpy has no bfloat16: such tensors come through jax (ml_dtypes) instead.
        with safe_open(path, framework="flax" if dtype == "BF16" else "np") as handle:
            return np.asarray(handle.get_tensor(original[name]))

    # Name absent tensors as this checkpoint would: with `bert.` (`model.`) if its encoder has it.
    prefix = next((m.group(1) for k in shapes if (m := families.HF_PREFIX.match(k))), "")

    def display(name: str) -> str:
        if name in original:
            return original[name]
        return name if name.startswith(families.HEAD_KEYS) else prefix + name

    config_file = _found(directory, "config.json")
    source = Source(
        directory,
        "hf",
        {name: shapes[key] for name, key in original.items()},
        read,
        families.read_config(config_file) if config_file else None,
        _found_vocab(directory),
        display,
    )
    source.config_file = config_file
    return source


def _tf_source(prefix: str, config_file: str | None) -> Source:
    import tensorflow as tf  # only this format needs TensorFlow

    expected = "a TF checkpoint index (an sstable, as tf.train.Saver writes it)"
    with _reading(prefix + ".index", expected):
        reader = tf.train.load_checkpoint(prefix)
    shapes = {k: tuple(v) for k, v in reader.get_variable_to_shape_map().items()}
    if "bert/embeddings/word_embeddings" not in shapes:
        raise ConversionError(
            f"{prefix}: no variable 'bert/embeddings/word_embeddings'; this is not a "
            "google-research/bert (TF1 name-based) checkpoint"
        )
    directory = os.path.dirname(prefix)
    config_file = config_file or _found(directory, "bert_config.json")
    source = Source(
        prefix,
        "tf",
        shapes,
        reader.get_tensor,
        # Google's "gelu" is the tanh form its checkpoints were trained with.
        BertConfig.from_json_file(config_file, flavour="google") if config_file else None,
        _found_vocab(directory),
    )
    source.config_file = config_file
    return source


def _ours_source(
    location: str, config: BertConfig, params: Params, vocab_file: str | None
) -> Source:
    """A Source over params already in our layout (either encoder layout)."""
    params = with_layout(params, scan_layers=False, num_layers=config.num_hidden_layers)
    # Encoder names are relative to the encoder (as in `encoder_specs`), heads to the root.
    tensors = {"/".join(p): v for p, v in flatten(params.get("bert", params))}
    if "bert" in params:
        tensors.update(("/".join(p), v) for p, v in flatten(params) if p[0] != "bert")
    shapes = {name: value.shape for name, value in tensors.items()}
    return Source(location, "ours", shapes, tensors.__getitem__, config, vocab_file)


def read_train_state(path: str) -> tuple[BertConfig, Params, dict, str | None, int]:
    """(model config, params, saved experiment config, vocab file or None, step) of the train
    state `path` names (`checkpointing.find_checkpoints`: a step directory, else the newest
    whose params read), never its optimizer state.

    The config is the one the experiment config saved beside the state describes (its
    `objective` too: an "ltr" run's model is causal, and fine-tunes causal); a vocab_size
    left to the vocab file is read off the embedding table. An "electra" run's params hold
    the generator beside the discriminator (`bert_jax.electra`); the config is the
    discriminator's.
    """
    from bert_jax import checkpointing

    directory, step = checkpointing.find_checkpoints(path)
    params, experiment, step = _readable_params(directory, step)
    model = {k: v for k, v in (experiment.get("model") or {}).items() if k in _MODEL_KEYS}
    if "preset" not in model:
        raise ConversionError(f"{directory}: no model.preset in the saved experiment config")
    table = params.get("bert", params)["embeddings"]["word_embeddings"]["embedding"]
    objective = experiment.get("objective") or "mlm_nsp"  # configs older than the key
    config = BertConfig.from_experiment(model, vocab_size=table.shape[0], objective=objective)
    vocab_file = _saved_vocab(directory, experiment, table.shape[0])
    return config, params, experiment, vocab_file, step


def _saved_vocab(directory: str, experiment: dict, rows: int) -> str | None:
    """The vocab file the experiment config saved with a checkpoint names, if it is the
    model's: its fingerprint the one saved with the checkpoint, else (checkpoints older than
    it) inside the workdir; its size the embedding rows (at most, where the config padded
    `model.vocab_size`). None otherwise, with a warning saying why: an export then carries
    no vocabulary but the one `--vocab_file` names, never one of any content from anywhere.
    """
    from data_pipelines import tokenization, vocab_fingerprint

    vocab_file = (experiment.get("data") or {}).get("vocab_file")
    if not (vocab_file and os.path.exists(vocab_file)):
        return None
    if os.path.isdir(vocab_file):  # a tokenizer directory: its file
        vocab_file = _found_vocab(vocab_file)
        if vocab_file is None:
            return None
    saved = experiment.get("vocab_fingerprint")
    workdir = directory.rstrip("/")
    workdir = os.path.dirname(workdir) if os.path.basename(workdir) == "checkpoints" else workdir
    reason = None
    if saved:
        if vocab_fingerprint.fingerprint(vocab_file)["sha256"] != saved.get("sha256"):
            reason = "is not the vocabulary this checkpoint was trained with (sha256 differs)"
    elif not os.path.realpath(vocab_file).startswith(os.path.realpath(workdir) + os.sep):
        reason = "is outside the workdir and no vocabulary fingerprint was saved to check it by"
    if reason is None:
        try:
            size = tokenization.vocab_size_of(vocab_file)
        except tokenization.VocabError as error:
            size, reason = None, f"does not read ({error})"
        padded = (experiment.get("model") or {}).get("vocab_size") is not None
        if size is not None and (size > rows or (size != rows and not padded)):
            reason = f"has {size} tokens, the model {rows} embedding rows"
    if reason:
        log.warning(
            "%s: the saved config's vocab file %s %s: not used (give --vocab_file)",
            directory,
            vocab_file,
            reason,
        )
        return None
    return vocab_file


def _readable_params(directory: str, step: int | None) -> tuple[Params, dict, int]:
    """(params, saved experiment config, step) of checkpoint `step` in `directory`, by default
    of the newest whose params read (`checkpointing.restore_params_and_step` warns of each
    newer one), with the step: a run that starts from an older checkpoint than the user may
    think says which."""
    from bert_jax import checkpointing

    try:
        return checkpointing.restore_params_and_step(directory, step=step)
    except checkpointing.CheckpointError as error:
        if step is not None:
            raise
        raise ConversionError(str(error)) from error


def _train_state_source(path: str) -> Source:
    """The params of a pretraining train state (`read_train_state`) as a Source. Of an
    "electra" run's, the discriminator's encoder alone: what fine-tuning and BERT's formats
    take (its generator and RTD head export with `bert_jax.convert.electra`)."""
    config, params, experiment, vocab_file, step = read_train_state(path)
    if experiment.get("objective") == "electra":
        params = {"bert": params["bert"]}
    source = _ours_source(path, config, params, vocab_file)
    source.step = step
    return source


# An experiment's `model` block: a preset and BertConfig fields (others, from older
# versions of the config, are not read).
_MODEL_KEYS = {"preset", *(f.name for f in dataclasses.fields(BertConfig))}


def _tf_prefix(path: str) -> str | None:
    """The checkpoint prefix of a TF checkpoint given as a prefix or a directory."""
    if os.path.exists(path + ".index"):
        return path
    if os.path.isdir(path):
        indexes = glob.glob(os.path.join(glob.escape(path), "*.index"))
        if len(indexes) == 1:
            return indexes[0].removesuffix(".index")
        if indexes:
            import tensorflow as tf

            return tf.train.latest_checkpoint(path)
    return None


def _given(path: str | os.PathLike) -> str:
    """`path` as a string; an empty one is an error (made absolute, it named the cwd)."""
    path = os.fspath(path)
    if not path.strip():
        raise ConversionError(
            "no checkpoint given (the path is empty): expected a Hugging Face directory, a "
            "Google TF checkpoint, a params-only Orbax directory or a pretraining workdir"
        )
    return path


def detect_format(path: str | os.PathLike) -> str:
    """'hf', 'tf', 'orbax' (params-only) or 'train_state' for a model location (of the
    directory `locations.resolve` finds there).

    Raises:
      ConversionError: when `path` is none of them.
    """
    path = locations.resolve(_given(path))  # a fine-tuning workdir: its checkpoint/, ...
    if "://" not in path and not os.path.exists(path) and not os.path.exists(path + ".index"):
        raise ConversionError(
            f"{path}: no such path (expected a Hugging Face directory, a Google TF checkpoint, "
            "a params-only Orbax directory or a pretraining workdir)"
        )
    if os.path.isdir(path):
        if os.path.exists(os.path.join(path, "params", "_CHECKPOINT_METADATA")):
            return "orbax"  # params-only (`save_params`)
        from bert_jax import checkpointing

        if checkpointing.find_checkpoints(path):
            return "train_state"  # `bert_jax.checkpointing` (pretraining runs)
        if glob.glob(os.path.join(glob.escape(path), "model.safetensors*")):
            return "hf"
        if os.path.exists(os.path.join(path, "pytorch_model.bin")):
            raise ConversionError(
                f"{path}: only pytorch_model.bin (a torch pickle) is here; re-save it as "
                "model.safetensors (transformers `save_pretrained(safe_serialization=True)`)"
            )
    if _tf_prefix(path):
        return "tf"
    # A pretraining workdir (or its checkpoints/) whose run has not saved a checkpoint yet.
    for directory in (os.path.join(path, "checkpoints"), path.rstrip("/")):
        if os.path.basename(directory) == "checkpoints" and os.path.isdir(directory):
            raise ConversionError(
                f"{path}: no checkpoint saved yet in {directory} (a pretraining run's "
                "complete checkpoints are numbered step directories there)"
            )
    raise ConversionError(
        f"{path}: not a Hugging Face directory (config.json + model.safetensors), a "
        "sentence-transformers directory (modules.json), a Google TF checkpoint "
        "(bert_model.ckpt prefix or its directory), a params-only Orbax directory, a "
        "pretraining workdir / checkpoint directory or a fine-tuning workdir (checkpoint/)"
    )


def open_source(path: str | os.PathLike, config_file: str | None = None) -> Source:
    """The named tensors, config and vocab of a checkpoint in any supported format.

    `config_file` replaces the config found beside the checkpoint (e.g. a TF checkpoint
    with no `bert_config.json` next to it).
    """
    path = locations.resolve(_given(path))
    if "://" not in path:  # Orbax refuses (and misreads) relative local directories
        path = os.path.abspath(path)
    fmt = detect_format(path)
    if fmt == "hf":
        source = _hf_source(path)
    elif fmt == "tf":
        prefix = _tf_prefix(path)
        if os.path.isdir(path):  # the checkpoint's files are the directory's own
            for name in glob.glob(glob.escape(prefix) + ".*"):
                locations.check_inside(path, name)
        return _tf_source(prefix, config_file)
    elif fmt == "train_state":
        source = _train_state_source(path)  # an unreadable step: CheckpointError names it
    else:
        expected = "a params-only Orbax directory (params/ + config.json, save_params)"
        with _reading(path, expected):
            config, params, vocab_file = load_params(path)
        source = _ours_source(path, config, params, vocab_file)
        source.config_file = os.path.join(path, "config.json")
    if config_file:
        source.config = families.read_config(config_file)
    source.config_file = config_file or source.config_file
    return source


# --- Params-only Orbax ------------------------------------------------------------------------


def save_params(
    output_dir: str | os.PathLike,
    config: BertConfig,
    params: Mapping,
    *,
    vocab_file: str | None = None,
    tokenizer: Sequence[str] = (),
    overwrite: bool = False,
    allow_non_finite: bool = False,
) -> str:
    """Writes `params/` (Orbax StandardCheckpointer) + `config.json` (+ `vocab.txt`, and the
    `tokenizer` files copied under their names); params holding NaN or inf are refused,
    named, unless `allow_non_finite`."""
    output_dir = os.fspath(output_dir)
    check_orbax_output(output_dir)
    check_vocab(vocab_file, config)
    with writing_dir(output_dir, overwrite) as tmp:
        write_params(tmp, config, params, vocab_file=vocab_file, tokenizer=tokenizer,
                     allow_non_finite=allow_non_finite)  # fmt: skip
    return output_dir


def check_orbax_output(output_dir: str) -> None:
    """Refuses an Orbax output whose path holds glob characters (Orbax would write params
    there that it cannot read back: `data_pipelines.paths.check_no_glob`)."""
    from data_pipelines import paths

    try:
        paths.check_no_glob(output_dir, "--output")
    except paths.GlobCharactersError as error:
        raise ConversionError(str(error)) from None


def write_params(
    directory: str,
    config: BertConfig,
    params: Mapping,
    *,
    vocab_file: str | None = None,
    tokenizer: Sequence[str] = (),
    allow_non_finite: bool = False,
) -> None:
    """`save_params`'s files written straight into `directory` (a caller's `writing_dir`
    temporary: one temporary per save, none nested in another). A param holding NaN or inf
    is refused, named, unless `allow_non_finite`."""
    import orbax.checkpoint as ocp

    if not allow_non_finite:
        for path, value in flatten(params):
            check_finite(value, f"param {'/'.join(path)}")
    with open(os.path.join(directory, "config.json"), "w", encoding="utf-8") as f:
        json.dump(families.ours_config_dict(config), f, indent=2, sort_keys=True)
        f.write("\n")
    copy_files(directory, vocab_file, tokenizer)
    from bert_jax.checkpoint_reading import check_readable, tree_shapes

    written, numpy_params = os.path.join(directory, "params"), as_numpy(params)
    checkpointer = ocp.StandardCheckpointer(multiprocessing_options=_this_process_only())
    checkpointer.save(written, numpy_params)
    checkpointer.wait_until_finished()
    check_readable(written, tree_shapes(numpy_params))  # else the caller's temporary is dropped


def _this_process_only():
    """Host arrays are written by the process that holds them, with no barrier with the
    others: in a multi-process run only process 0 saves the model it gathered."""
    import jax
    import orbax.checkpoint as ocp

    me = jax.process_index()
    return ocp.options.MultiprocessingOptions(primary_host=me, active_processes={me})


def load_params(directory: str | os.PathLike) -> tuple[BertConfig, Params, str | None]:
    """Reads a `save_params` directory as numpy: (config, params as saved, vocab_file)."""
    import orbax.checkpoint as ocp

    directory = os.path.abspath(os.fspath(directory))
    locations.check_inside(directory, os.path.join(directory, "config.json"))
    locations.check_tree(directory, os.path.join(directory, "params"))
    config = families.read_config(os.path.join(directory, "config.json"))
    params = as_numpy(ocp.StandardCheckpointer().restore(os.path.join(directory, "params")))
    # config.json does not record the layout; the params do.
    scanned = "layers" in params.get("bert", params)["encoder"]
    return config.replace(scan_layers=scanned), params, _found_vocab(directory)
