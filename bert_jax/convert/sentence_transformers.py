"""The sentence-transformers directory layout: read its pooling, write it from our models.

A sentence-transformers model directory is a pipeline of modules named in `modules.json`:
a `Transformer` (a Hugging Face model directory, at the root or in a subfolder, with
`sentence_bert_config.json` giving its max length), a `Pooling` (`<path>/config.json`:
which of its `pooling_mode_*` is on) and optionally `Normalize` (L2, no files). Those three
are what an embedding model of ours is (`bert_jax.embeddings.BertForEmbedding`); a pipeline
with other modules (Dense projections, max pooling, ...) is refused by name rather than read
as something it is not.

`read_settings(dir)` gives the pooling, normalisation, max length and where the HF files
are; `write_modules(tmp, ...)` writes the module files beside an HF export (`save_hf`
writes the weights and tokenizer), so `SentenceTransformer(dir)` loads it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os

from bert_jax.convert.names import ConversionError
from data_pipelines import paths

log = logging.getLogger("bert_jax.convert")

MODULES_FILE = "modules.json"
# sentence-transformers 5.1.2 reads truncate_dim only from `SentenceTransformer(...,
# truncate_dim=N)`; an export writes it here too, where `experiments.embed` reads it.
CONFIG_FILE = "config_sentence_transformers.json"
_TRANSFORMER = "sentence_transformers.models.Transformer"
_POOLING = "sentence_transformers.models.Pooling"
_NORMALIZE = "sentence_transformers.models.Normalize"
# Pooling config key -> our pooling name (bert_jax.embeddings.POOLINGS).
_MODES = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_lasttoken": "last",
}
_UNSUPPORTED_MODES = (
    "pooling_mode_max_tokens",
    "pooling_mode_mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens",
)


@dataclasses.dataclass(frozen=True)
class Settings:
    """What a sentence-transformers directory says about its embeddings."""

    pooling: str  # "mean" | "cls" | "last"
    normalize: bool
    max_seq_length: int | None  # sentence_bert_config.json's; None: the model's own
    model_dir: str  # the Transformer module's HF directory
    truncate_dim: int | None = None  # config_sentence_transformers.json's (ours; Matryoshka)


def is_sentence_transformers(path: str) -> bool:
    return os.path.isfile(os.path.join(path, MODULES_FILE))


def _json(path: str):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as error:
        raise ConversionError(
            f"{path}: not valid JSON (line {error.lineno}, column {error.colno}: {error.msg})"
        ) from None
    except OSError as error:
        raise ConversionError(f"{path}: cannot be read ({error.strerror})") from None


def _check_inside(directory: str, path: str, what: str | None = None) -> str:
    # `locations.check_inside`, taken from below: `locations.resolve` imports this module.
    return paths.check_inside(directory, path, what, error=ConversionError)


def _inside(root: str, relative: str, what: str) -> str:
    """`root/relative`, refused when `relative` leaves `root` (absolute, `..`, a link out
    but into a Hugging Face cache's blobs/: `data_pipelines.paths.check_inside`)."""
    if not isinstance(relative, str) or os.path.isabs(relative) or ".." in relative.split("/"):
        raise ConversionError(f"{what}: path {relative!r} is outside {root}")
    path = os.path.join(root, relative)
    _check_inside(root, path, f"{what}: path {relative!r} ({path})")
    return os.path.normpath(path)


def check_max_seq_length(value: object, what: str) -> int | None:
    """`max_seq_length` as sentence_bert_config.json gives it: None (the model's own) or a
    whole number >= 1; 0, a fraction, a string or a bool is refused naming `what`."""
    if value is None:
        return None
    whole = isinstance(value, int) and not isinstance(value, bool)
    if not whole or value < 1:
        raise ConversionError(
            f"{what}: max_seq_length {value!r} is not a whole number of tokens >= 1"
        )
    return value


def read_settings(path: str) -> Settings | None:
    """The settings of the sentence-transformers directory `path`; None if it is none."""
    if not is_sentence_transformers(path):
        return None
    modules_file = _check_inside(path, os.path.join(path, MODULES_FILE))
    modules = _json(modules_file)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise ConversionError(f"{modules_file}: expected a list of module entries")
    kinds = [m.get("type", "") for m in modules]
    unknown = [k for k in kinds if k not in (_TRANSFORMER, _POOLING, _NORMALIZE)]
    if unknown or kinds[:2] != [_TRANSFORMER, _POOLING] or len(kinds) > 3:
        raise ConversionError(
            f"{modules_file}: modules {kinds} are not Transformer, Pooling[, Normalize]; "
            f"only that pipeline is read here (not {unknown or 'this order'})"
        )
    model_dir = _inside(path, modules[0].get("path", ""), modules_file)
    pooling_dir = _inside(path, modules[1].get("path", ""), modules_file)
    pooling_file = _check_inside(path, os.path.join(pooling_dir, "config.json"))
    pooling_config = _json(pooling_file)
    if not isinstance(pooling_config, dict):
        raise ConversionError(f"{pooling_file}: expected a JSON object of pooling_mode_* keys")
    on = [key for key, value in pooling_config.items() if key.startswith("pooling_mode_") and value]
    if len(on) != 1 or on[0] in _UNSUPPORTED_MODES or on[0] not in _MODES:
        raise ConversionError(
            f"{pooling_file}: pooling {on or 'none'} is not supported; exactly one of "
            f"{', '.join(_MODES)} must be true"
        )
    max_length = None
    st_config = os.path.join(model_dir, "sentence_bert_config.json")
    if os.path.lexists(st_config):
        _check_inside(path, st_config)
        found = _json(st_config)
        if not isinstance(found, dict):
            raise ConversionError(f"{st_config}: expected a JSON object")
        max_length = check_max_seq_length(found.get("max_seq_length"), st_config)
    truncate_dim = None
    st_model = os.path.join(path, CONFIG_FILE)
    if os.path.lexists(st_model):
        found = _json(_check_inside(path, st_model))
        truncate_dim = found.get("truncate_dim") if isinstance(found, dict) else None
        if truncate_dim is not None and (
            isinstance(truncate_dim, bool) or not isinstance(truncate_dim, int) or truncate_dim < 1
        ):
            raise ConversionError(f"{st_model}: truncate_dim {truncate_dim!r} is not a whole "
                                  "number of dimensions >= 1")  # fmt: skip
    return Settings(_MODES[on[0]], _NORMALIZE in kinds, max_length, model_dir, truncate_dim)


def module_files(
    pooling: str,
    normalize: bool,
    hidden_size: int,
    max_seq_length: int,
    *,
    pooler_left_out: bool = False,
    card: str | None = None,
    truncate_dim: int | None = None,
) -> dict[str, object]:
    """The JSON files (relative path -> content) that make an HF export a
    sentence-transformers directory with the Transformer at its root, and its README.md
    (`card`, text; `model_card`). `pooler_left_out`: a BERT encoder exported without its
    pooler, which sentence-transformers is told not to build (transformers would initialise
    one at random, say so, and serve it as `pooler_output`)."""
    modes = {key: False for key in (*_MODES, *_UNSUPPORTED_MODES)}
    modes[{v: k for k, v in _MODES.items()}[pooling]] = True
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": _TRANSFORMER},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": _POOLING},
    ]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": _NORMALIZE})
    st_config: dict[str, object] = {"max_seq_length": max_seq_length, "do_lower_case": False}
    if pooler_left_out:  # sentence-transformers passes model_args to from_pretrained
        st_config["model_args"] = {"add_pooling_layer": False}
    return {
        MODULES_FILE: modules,
        # do_lower_case here is sentence-transformers' own extra lower-casing, off: the
        # tokenizer (tokenizer_config.json) does what the vocabulary needs.
        "sentence_bert_config.json": st_config,
        "1_Pooling/config.json": {
            "word_embedding_dimension": hidden_size,
            **modes,
            "include_prompt": True,
        },
        CONFIG_FILE: {
            "similarity_fn_name": "cosine",
            **({"truncate_dim": truncate_dim} if truncate_dim else {}),
        },  # fmt: skip
        **({README: card} if card is not None else {}),
    }


# sentence-transformers reads README.md before any module: where a directory has none, a
# relative path ("my-embedder") is also a valid hub name, looked up online (5 retries,
# ~23 s offline) before the local files are used.
README = "README.md"


def _provenance(location: str) -> tuple[dict, dict]:
    """(finetuned.json, metrics.json) of the run `location` comes from: a workdir or its
    checkpoint/ (`experiments.finetune_embeddings`); ({}, {}) for anything else."""
    for checkpoint in (os.path.join(location, "checkpoint"), location):
        meta_file = os.path.join(checkpoint, "finetuned.json")
        if os.path.isfile(meta_file):
            workdir = location if checkpoint != location else os.path.dirname(location)
            metrics_file = os.path.join(workdir, "metrics.json")
            try:  # the scores are a nicety: an export is not refused for want of them
                metrics = _json(metrics_file) if os.path.isfile(metrics_file) else {}
            except ConversionError as error:
                log.warning("README.md without scores: %s", error)
                metrics = {}
            meta = _json(meta_file)
            return (meta if isinstance(meta, dict) else {},
                    metrics if isinstance(metrics, dict) else {})  # fmt: skip
    return {}, {}


def model_card(
    name: str,
    location: str,
    pooling: str,
    normalize: bool,
    hidden_size: int,
    max_seq_length: int,
    *,
    pooler_left_out: bool = False,
    truncate_dim: int | None = None,
) -> str:
    """The README.md of an export of `location`: what the model is (base model, training
    data and objective where the run saved them, pooling, Matryoshka sizes), its dev scores
    where the run measured them (`metrics.json`), and how to load it (with `truncate_dim`:
    the first that many dimensions, which sentence-transformers takes from its constructor
    alone)."""
    meta, metrics = _provenance(location)
    block = meta.get("embedding") if isinstance(meta.get("embedding"), dict) else {}
    trained = block.get("matryoshka_dims")
    base = meta.get("init_from") or ("none: trained from scratch" if meta.get("from_scratch")
                                     else None)  # fmt: skip
    rows = [
        ("converted from", f"`{os.path.abspath(location)}`"),
        ("base model", base and f"`{base}`"),
        ("training data", meta.get("train_file") and f"`{meta['train_file']}`"),
        ("objective", meta.get("objective")),
        ("embedding", f"{hidden_size} dimensions, {pooling} pooling"
                      + (", L2-normalised (a dot product is the cosine)" if normalize else "")),
        ("max length", f"{max_seq_length} tokens (longer texts are cut)"),
        ("Matryoshka", trained and "trained at " + ", ".join(map(str, trained))
                       + " dimensions: a prefix of that size is an embedding of its own"),
        ("truncated", truncate_dim and f"to the first {truncate_dim} dimensions"),
    ]  # fmt: skip
    lines = [
        "---",
        "library_name: sentence-transformers",
        "pipeline_tag: sentence-similarity",
        "tags: [sentence-transformers, feature-extraction, sentence-similarity, bert_jax]",
        "---",
        "",
        f"# {name}",
        "",
        "A sentence-embedding model exported by bert_jax "
        "(`python -m bert_jax.convert --format=sentence-transformers`).",
        "",
        "| | |",
        "| --- | --- |",
        *(f"| {key} | {value} |" for key, value in rows if value),
    ]
    scored = [(when, metrics[when]) for when in ("before", "after")
              if isinstance(metrics.get(when), dict)]  # fmt: skip
    by_dim = metrics.get("after_dims") if isinstance(metrics.get("after_dims"), dict) else {}
    scored += [(f"after, first {d} dimensions", s) for d, s in by_dim.items()
               if isinstance(s, dict)]  # fmt: skip
    if scored:
        numbers = (k for _, s in scored for k, v in s.items() if isinstance(v, int | float))
        keys = list(dict.fromkeys(numbers))  # nDCG@10, MRR@10, R@1, ... in the run's order
        lines += [
            "",
            "## Scores",
            "",
            "The run's `dev_file`: each distinct dev query against every distinct dev positive "
            "(`metrics.json`), before and after fine-tuning (and at each Matryoshka size, the "
            "embeddings cut to it).",
            "",
            f"| | {' | '.join(keys)} |",
            f"| --- |{' --- |' * len(keys)}",
            *(f"| {when} | " + " | ".join(_score(s.get(k)) for k in keys) + " |"
              for when, s in scored),
        ]  # fmt: skip
    lines += [
        "",
        "## Use",
        "",
        "```python",
        "from sentence_transformers import SentenceTransformer",
        "",
        f'model = SentenceTransformer("{name}"{_truncated(truncate_dim)})  # this directory',
        'embeddings = model.encode(["a sentence to embed"])',
        "```",
        "",
        f"or `python -m experiments.embed --model={name} --input_file=texts.txt "
        "--output_file=embeddings.npy` (bert_jax).",
    ]
    if pooler_left_out:
        lines += [
            "",
            "The encoder has no pooler (`pooler_output`): it was not trained, and the Pooling "
            "module above makes the embedding. transformers reads the weights with "
            f'`AutoModel.from_pretrained("{name}", add_pooling_layer=False)`.',
        ]
    return "\n".join(lines) + "\n"


def _truncated(dim: int | None) -> str:
    # sentence-transformers 5.1.2 does not read config_sentence_transformers.json's.
    return f", truncate_dim={dim}" if dim else ""


def _score(value) -> str:
    return f"{value:.4f}" if isinstance(value, int | float) else ""
