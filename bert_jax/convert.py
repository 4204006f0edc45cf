"""Weight conversion: Google TF checkpoints, Hugging Face directories and our params.

Import (`load_pretrained`) reads any of
  * a Hugging Face BERT directory: `config.json` + `model.safetensors` + `vocab.txt`
    (BertModel keys, or BertFor* keys under `bert.`; LayerNorm weight/bias or gamma/beta);
  * a google-research/bert TF1 checkpoint: the `bert_model.ckpt` prefix (or its directory)
    with `bert_config.json` and `vocab.txt` beside it (optimiser slots are skipped; the
    config's "gelu" is the original code's tanh GELU, `hidden_act="gelu_tanh"` here);
  * this project's params-only Orbax directory (`save_params`);
and returns the plain (unboxed) `params` of one of our models, looped or scanned as its
config says. Heads the source lacks start from our model's init, with a warning naming
each. Export: `save_hf` writes a directory `transformers` loads with no missing or
unexpected keys (`hidden_act` "gelu" or, for the tanh form, "gelu_new"); `save_params`
writes params-only Orbax. Numpy in, numpy out: no torch.

Usage:
    python -m bert_jax.convert --input=uncased_L-12_H-768_A-12/bert_model.ckpt \
        --output=/tmp/bert-base-uncased-hf --format=hf
    python -m bert_jax.convert --input=/path/to/hf_dir --output=/tmp/params --format=orbax
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.config import BertConfig
from bert_jax.heads import BertForPreTraining
from bert_jax.model import BertModel
from bert_jax.weight_names import (
    HEAD_SPECS,
    LAYER_INDEX,
    POOLER_SPECS,
    TIED_DECODER,
    ConversionError,
    Params,
    as_numpy,
    encoder_specs,
    get_path,
    set_path,
    stack_layers,
    unstack_layers,
    with_layout,
)
from bert_jax.weight_readers import (
    Source,
    check_vocab,
    detect_format,
    load_params,
    open_source,
    save_params,
    writing_dir,
)

__all__ = [
    "ConversionError",
    "check_vocab",
    "detect_format",
    "load_params",
    "load_pretrained",
    "save_hf",
    "save_params",
    "stack_layers",
    "to_hf_state_dict",
    "unstack_layers",
]

log = logging.getLogger(__name__)


# --- Import -----------------------------------------------------------------------------------


def _module_for(model: str | nn.Module, config: BertConfig) -> nn.Module:
    if model == "pretraining":
        return BertForPreTraining(config)
    if model == "encoder":
        return BertModel(config)
    if isinstance(model, nn.Module):
        return model.clone(config=config)
    raise ValueError(f"model must be 'pretraining', 'encoder', 'auto' or a flax Module: {model!r}")


def _init_args(module: nn.Module) -> tuple:
    ids = jnp.zeros((1, 2), jnp.int32)
    # input_ids, input_mask, token_type_ids (+ masked_lm_positions for pretraining)
    return (ids,) * (4 if isinstance(module, BertForPreTraining) else 3)


def _fresh(module: nn.Module, paths: list[tuple[str, ...]], rng: jax.Array) -> dict:
    """Our init of the subtrees at `paths` only (jit drops the rest of the init as dead)."""

    def init(rng):
        params = nn.meta.unbox(module.init(rng, *_init_args(module))["params"])
        return {"/".join(p): get_path(params, p) for p in paths}

    out = jax.jit(init)(rng)
    return {tuple(k.split("/")): jax.tree_util.tree_map(np.asarray, v) for k, v in out.items()}


def _check_tied(source: Source) -> None:
    for copy, original in TIED_DECODER.items():
        if copy in source.shapes and original in source.shapes:
            if not np.array_equal(source.read(copy), source.read(original)):
                raise ConversionError(
                    f"{source.location}: {source.display(copy)!r} differs from "
                    f"{source.display(original)!r}; only an MLM "
                    "decoder tied to the word embeddings is supported"
                )


def _fill(source: Source, module: nn.Module, config: BertConfig, rng) -> Params:
    """Our looped params for `module`, from `source` where it has them, else fresh."""
    shapes = jax.eval_shape(lambda r: module.init(r, *_init_args(module)), jax.random.key(0))
    template = nn.meta.unbox(shapes["params"])
    dtype = jnp.dtype(config.param_dtype)
    enc_prefix = ("bert",) if "bert" in template else ()
    enc_template = get_path(template, enc_prefix)

    params: Params = {}
    for spec in encoder_specs(config.num_hidden_layers):
        value = source.take(spec, get_path(enc_template, spec.path).shape, dtype)
        set_path(params, (*enc_prefix, *spec.path), value)

    # Parts a checkpoint may lack: the pooler (token-level models drop it) and the heads.
    optional = [(enc_prefix, "pooler", POOLER_SPECS)] if "pooler" in enc_template else []
    if enc_prefix:  # everything beside `bert` is a head
        optional += [((), head, HEAD_SPECS.get(head, [])) for head in template if head != "bert"]
    missing = []
    for root, name, specs in optional:
        if not any(source.has(spec) for spec in specs):
            missing.append((*root, name))
            continue
        for spec in specs:
            shape = get_path(get_path(template, root), spec.path).shape
            set_path(params, (*root, *spec.path), source.take(spec, shape, dtype))
    if source.naming == "hf":
        _check_tied(source)

    leftover = source.leftover()
    extra_layers = sorted({int(m.group(2)) for n in leftover if (m := LAYER_INDEX.search(n))})
    if extra_layers:
        raise ConversionError(
            f"{source.location}: has encoder layer(s) {extra_layers} beyond "
            f"num_hidden_layers={config.num_hidden_layers}"
        )
    if leftover:
        log.info("Not used from %s: %s", source.location, ", ".join(leftover))
    if missing:
        for path in missing:
            log.warning(
                "%s has no '%s' weights: initialising head '%s' from scratch",
                source.location,
                "/".join(path),
                "/".join(path),
            )
        rng = jax.random.key(0) if rng is None else rng
        for path, value in _fresh(module, missing, rng).items():
            set_path(params, path, jax.tree_util.tree_map(lambda x: x.astype(dtype), value))
    return params


def load_pretrained(
    path: str | os.PathLike,
    config: BertConfig | None = None,
    *,
    model: str | nn.Module = "pretraining",
    rng: jax.Array | None = None,
    config_file: str | None = None,
) -> tuple[BertConfig, Params, str | None]:
    """Imports a checkpoint as the `params` collection of one of our models.

    Args:
      path: a HF directory, a Google TF checkpoint (prefix or directory) or a params-only
        Orbax directory (see `detect_format`).
      config: the model config; None reads the source's own. Its `scan_layers` picks the
        layout (one `layers` subtree stacked on axis 0, or `layer_N`), its `param_dtype`
        the dtype. A config that disagrees with the tensors raises ConversionError.
      model: "pretraining" (BertForPreTraining), "encoder" (BertModel), "auto" (pretraining
        if the source has both MLM and NSP heads, else encoder), or a module from
        `bert_jax.heads` whose encoder is called `bert` (its config is replaced).
      rng: PRNG key for the heads the source lacks (default `jax.random.key(0)`).
      config_file: a config that replaces the one beside the checkpoint (for a TF
        checkpoint read as Google's `bert_config.json`, whose "gelu" is the tanh form).

    Returns:
      (config, params, vocab_file or None); run with `module.apply({"params": params}, ...)`.

    Raises:
      ConversionError: naming the tensor and both shapes when the source does not fit.
    """
    source = open_source(path, config_file)
    if config is None:
        if source.config is None:
            raise ConversionError(f"{source.location}: no config file found; pass a config")
        config = source.config
    check_vocab(source.vocab_file, config)
    if model == "auto":
        heads = all(any(source.has(s) for s in HEAD_SPECS[h]) for h in ("mlm", "nsp"))
        model = "pretraining" if heads else "encoder"
    looped = config.replace(scan_layers=False)
    params = _fill(source, _module_for(model, looped), looped, rng)
    if config.scan_layers:
        root = params["bert"] if "bert" in params else params
        root["encoder"] = stack_layers(root["encoder"], config.num_hidden_layers)
    return config, params, source.vocab_file


# --- Export -----------------------------------------------------------------------------------


def _hf_architecture(params: Params) -> str:
    heads = frozenset(params) - {"bert"} if "bert" in params else frozenset()
    if heads == {"classifier"}:
        pooled = "pooler" in params["bert"]
        return "BertForSequenceClassification" if pooled else "BertForTokenClassification"
    architectures = {
        frozenset(): "BertModel",
        frozenset({"mlm", "nsp"}): "BertForPreTraining",
        frozenset({"mlm"}): "BertForMaskedLM",
        frozenset({"nsp"}): "BertForNextSentencePrediction",
        frozenset({"qa_outputs"}): "BertForQuestionAnswering",
    }
    if heads not in architectures:
        raise ConversionError(f"no transformers model has exactly the heads {sorted(heads)}")
    return architectures[heads]


def to_hf_state_dict(config: BertConfig, params: Mapping) -> tuple[dict[str, np.ndarray], str]:
    """Our params (either layout) -> (HF state dict in float32, transformers class name)."""
    params = with_layout(as_numpy(params), scan_layers=False, num_layers=config.num_hidden_layers)
    arch = _hf_architecture(params)
    enc = params.get("bert", params)
    prefix = "bert." if "bert" in params else ""
    parts = [(prefix, enc, spec) for spec in encoder_specs(config.num_hidden_layers)]
    if "pooler" in enc:
        parts += [(prefix, enc, spec) for spec in POOLER_SPECS]
    for head in sorted(set(params) - {"bert"} if prefix else ()):
        parts += [("", params, spec) for spec in HEAD_SPECS[head]]

    state = {}
    for key_prefix, tree, spec in parts:
        try:
            value = np.asarray(get_path(tree, spec.path), dtype=np.float32)
        except KeyError:
            raise ConversionError(
                f"params have no {spec.ours!r} (config has {config.num_hidden_layers} layers)"
            ) from None
        value = value.reshape(spec.flat_shape(value.shape))
        state[key_prefix + spec.hf] = np.ascontiguousarray(value.T if spec.hf_t else value)
    num_leaves = len(jax.tree_util.tree_leaves(params))
    if len(state) != num_leaves:
        raise ConversionError(
            f"params have {num_leaves} tensors but {len(state)} have HF names: more layers than "
            f"num_hidden_layers={config.num_hidden_layers}?"
        )
    word = state[prefix + "embeddings.word_embeddings.weight"]
    if word.shape != (config.vocab_size, config.hidden_size):
        raise ConversionError(
            f"word_embeddings has shape {word.shape} but the config says "
            f"({config.vocab_size}, {config.hidden_size})"
        )
    return state, arch


def save_hf(
    output_dir: str | os.PathLike,
    config: BertConfig,
    params: Mapping,
    *,
    vocab_file: str | None = None,
    do_lower_case: bool | None = None,
    overwrite: bool = False,
) -> str:
    """Writes config.json + model.safetensors (+ vocab.txt, tokenizer_config.json).

    `transformers.BertForPreTraining.from_pretrained(output_dir)` loads it when `params`
    has MLM and NSP heads; an encoder alone is a BertModel, a fine-tuned head the
    matching BertFor* class (named in config.json's `architectures`).
    """
    from safetensors.numpy import save_file

    output_dir = os.fspath(output_dir)
    check_vocab(vocab_file, config)
    state, arch = to_hf_state_dict(config, params)
    hf_config = {**config.to_hf_dict(), "architectures": [arch]}
    if arch in ("BertForSequenceClassification", "BertForTokenClassification"):
        labels = state["classifier.bias"].shape[0]
        hf_config["id2label"] = {str(i): f"LABEL_{i}" for i in range(labels)}
        hf_config["label2id"] = {f"LABEL_{i}": i for i in range(labels)}
    with writing_dir(output_dir, overwrite) as tmp:
        save_file(state, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
            json.dump(hf_config, f, indent=2, sort_keys=True)
        if vocab_file:
            shutil.copyfile(vocab_file, os.path.join(tmp, "vocab.txt"))
        if do_lower_case is not None:
            with open(os.path.join(tmp, "tokenizer_config.json"), "w", encoding="utf-8") as f:
                json.dump({"do_lower_case": do_lower_case, "tokenizer_class": "BertTokenizer"}, f)
    log.info("Wrote %s (%s, %d tensors)", output_dir, arch, len(state))
    return output_dir


# --- CLI --------------------------------------------------------------------------------------


def _define_flags():
    from absl import flags

    flags.DEFINE_string(
        "input",
        None,
        "Google TF checkpoint (prefix or directory), HF directory or params-only Orbax directory.",
        required=True,
    )
    flags.DEFINE_string(
        "output", None, "Directory to write (must not exist, unless --overwrite).", required=True
    )
    flags.DEFINE_enum(
        "format",
        "hf",
        ["hf", "orbax"],
        "hf: config.json + model.safetensors "
        "+ vocab.txt; orbax: params-only Orbax + config.json + vocab.txt.",
    )
    flags.DEFINE_string(
        "bert_config_file",
        None,
        "Config to use instead of the one beside "
        "the input (e.g. for a TF checkpoint without bert_config.json).",
    )
    flags.DEFINE_string(
        "vocab_file", None, "vocab.txt to copy instead of the one beside the input."
    )
    flags.DEFINE_bool(
        "do_lower_case",
        None,
        "Write tokenizer_config.json with this "
        "do_lower_case (HF output); unset writes none (transformers then "
        "lower-cases).",
    )
    flags.DEFINE_bool("scan_layers", False, "Orbax output: stack the layers (scan layout).")
    flags.DEFINE_bool("overwrite", False, "Replace --output if it exists.")
    return flags.FLAGS


def main(argv) -> None:
    from absl import app, flags
    from absl import logging as absl_logging

    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    FLAGS = flags.FLAGS
    # Our progress at INFO; Orbax's per-file INFO lines (absl) only from --verbosity=0 on.
    if not FLAGS["verbosity"].present:
        absl_logging.set_verbosity(absl_logging.WARNING)
    for name in ("bert_jax", __name__):
        logging.getLogger(name).setLevel(logging.INFO)
    log.info("Reading %s (%s)", FLAGS.input, detect_format(FLAGS.input))
    config, params, vocab_file = load_pretrained(
        FLAGS.input, model="auto", config_file=FLAGS.bert_config_file
    )
    vocab_file = FLAGS.vocab_file or vocab_file
    if vocab_file is None:
        log.warning("No vocab.txt beside %s and no --vocab_file: none written", FLAGS.input)
    if FLAGS.format == "hf":
        save_hf(
            FLAGS.output,
            config,
            params,
            vocab_file=vocab_file,
            do_lower_case=FLAGS.do_lower_case,
            overwrite=FLAGS.overwrite,
        )
    else:
        config = config.replace(scan_layers=FLAGS.scan_layers)
        params = with_layout(params, FLAGS.scan_layers, config.num_hidden_layers)
        save_params(FLAGS.output, config, params, vocab_file=vocab_file, overwrite=FLAGS.overwrite)
    print(f"wrote {FLAGS.output}")


if __name__ == "__main__":
    from data_pipelines import cli

    _define_flags()
    cli.run(main)
