"""Import: a checkpoint's tensors (a `readers.Source`) as the params of one of our models."""

from __future__ import annotations

import logging
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.config import BertConfig
from bert_jax.convert.families import family_of
from bert_jax.convert.names import (
    LAYER_INDEX,
    WORD_EMBEDDINGS,
    ConversionError,
    Family,
    Params,
    get_path,
    set_path,
    stack_layers,
)
from bert_jax.convert.readers import Source, check_vocab, open_source
from bert_jax.heads import BertForPreTraining
from bert_jax.model import BertModel

log = logging.getLogger(__name__)


def _module_for(model: str | nn.Module, config: BertConfig, family: Family) -> nn.Module:
    if model == "pretraining":
        return BertForPreTraining(config)
    if model == "encoder":  # with a pooler where the family has one (BERT's)
        return BertModel(config, add_pooling_layer=bool(family.pooler))
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


def _check_tied(source: Source, family: Family) -> None:
    for copy, original in family.tied.items():
        if copy in source.shapes and original in source.shapes:
            if not np.array_equal(source.read(copy), source.read(original)):
                raise ConversionError(
                    f"{source.location}: {source.display(copy)!r} differs from "
                    f"{source.display(original)!r}; only an MLM "
                    "decoder tied to the word embeddings is supported"
                )


def _fill(source: Source, module: nn.Module, config: BertConfig, family: Family, rng) -> Params:
    """Our looped params for `module`, from `source` where it has them, else fresh."""
    shapes = jax.eval_shape(lambda r: module.init(r, *_init_args(module)), jax.random.key(0))
    template = nn.meta.unbox(shapes["params"])
    dtype = jnp.dtype(config.param_dtype)
    enc_prefix = ("bert",) if "bert" in template else ()
    enc_template = get_path(template, enc_prefix)

    params: Params = {}
    for spec in family.encoder(config):
        value = source.take(spec, get_path(enc_template, spec.path).shape, dtype)
        set_path(params, (*enc_prefix, *spec.path), value)

    # Parts a checkpoint may lack: the pooler (token-level models drop it) and the heads.
    optional = [(enc_prefix, "pooler", family.pooler)] if "pooler" in enc_template else []
    if enc_prefix:  # everything beside `bert` is a head
        heads = family.heads(config)
        optional += [((), head, heads.get(head, [])) for head in template if head != "bert"]
    missing = []
    for root, name, specs in optional:
        if not any(source.has(spec) for spec in specs):
            missing.append((*root, name))
            continue
        for spec in specs:
            shape = get_path(get_path(template, root), spec.path).shape
            set_path(params, (*root, *spec.path), source.take(spec, shape, dtype))
    if source.naming == "hf":
        _check_tied(source, family)

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


def check_sizes(source: Source, config: BertConfig, family: Family, where: str) -> None:
    """Refuses a config whose layer count, width or vocabulary disagrees with the weights of
    `source`, from their shapes alone (a safetensors header, a TF index, checkpoint
    metadata), before a template of the model is built: a config saying 1,000,000 layers
    would otherwise build for hours before the first tensor is compared.

    Raises:
      ConversionError: one line naming the config (`where`: its file) and key, its value and
        what the weights hold.
    """
    layers = {int(m.group(2)) for name in source.shapes if (m := LAYER_INDEX.search(name))}
    if layers and max(layers) + 1 != config.num_hidden_layers:
        found = max(layers) + 1
        beyond = sorted(i for i in layers if i >= config.num_hidden_layers)[:4]
        detail = f": layer(s) {beyond} beyond num_hidden_layers" if beyond else ""
        raise ConversionError(
            f"{where}: num_hidden_layers={config.num_hidden_layers} but the weights in "
            f"{source.location} hold {found} encoder layer(s){detail}"
        )
    # The word-embedding table, stored (rows, width) in every format, gives vocab_size and
    # the embedding width (hidden_size, or embedding_size where it differs).
    one_layer = config.replace(num_hidden_layers=1)
    spec = next(s for s in family.encoder(one_layer) if s.path == WORD_EMBEDDINGS)
    if not source.has(spec) or len(source.shapes[source.name(spec)]) != 2:
        return  # a missing or odd table: `Source.take` names it
    name = source.name(spec)
    rows, width = source.shapes[name]
    width_key = "embedding_size" if config.embedding_size else "hidden_size"
    for key, value, held in (("vocab_size", config.vocab_size, rows),
                             (width_key, config.embedding_width, width)):  # fmt: skip
        if value != held:
            raise ConversionError(
                f"{where}: {key}={value} but the weights in {source.location} hold {held} "
                f"({source.display(name)!r} has shape {(rows, width)}, the config's "
                f"{(config.vocab_size, config.embedding_width)})"
            )


def load_pretrained(
    path: str | os.PathLike,
    config: BertConfig | None = None,
    *,
    model: str | nn.Module = "pretraining",
    rng: jax.Array | None = None,
    config_file: str | None = None,
    allow_non_finite: bool = False,
) -> tuple[BertConfig, Params, str | None]:
    """Imports a checkpoint as the `params` collection of one of our models.

    Args:
      path: a HF directory, a Google TF checkpoint (prefix or directory) or a params-only
        Orbax directory (see `detect_format`).
      config: the model config; None reads the source's own. Its `scan_layers` picks the
        layout (one `layers` subtree stacked on axis 0, or `layer_N`), its `param_dtype`
        the dtype. A config that disagrees with the tensors raises ConversionError.
      model: "pretraining" (BertForPreTraining), "encoder" (BertModel), "auto" (pretraining
        if the source has both MLM and NSP heads, pretraining without NSP (the "mlm" and "ltr"
        objectives' model) if it has the MLM head alone, else encoder), or a module from
        `bert_jax.heads` whose encoder is called `bert` (its config is replaced).
      rng: PRNG key for the heads the source lacks (default `jax.random.key(0)`).
      config_file: a config that replaces the one beside the checkpoint (for a TF
        checkpoint read as Google's `bert_config.json`, whose "gelu" is the tanh form).
      allow_non_finite: take weights that hold NaN or inf (refused by default, named).

    Returns:
      (config, params, vocab_file or None); run with `module.apply({"params": params}, ...)`.

    Raises:
      ConversionError: naming the tensor and both shapes when the source does not fit; a
        tensor that is not floating point, or (unless `allow_non_finite`) holds NaN or inf.
    """
    source = open_source(path, config_file)
    source.allow_non_finite = allow_non_finite
    return load_source(source, config, model=model, rng=rng)


def load_source(
    source: Source,
    config: BertConfig | None = None,
    *,
    model: str | nn.Module = "pretraining",
    rng: jax.Array | None = None,
) -> tuple[BertConfig, Params, str | None]:
    """`load_pretrained` of a source already open (`open_source`): what reads it can also
    ask the source which checkpoint step it held (`Source.step`)."""
    where = "the config given"
    if config is None:
        if source.config is None:
            raise ConversionError(f"{source.location}: no config file found; pass a config")
        config, where = source.config, source.config_file or "the config"
    check_vocab(source.vocab_file, config)
    family = family_of(config)
    check_sizes(source, config, family, where)
    if model == "auto":
        heads = family.heads(config)
        mlm, nsp = (any(source.has(s) for s in heads.get(h, [])) for h in ("mlm", "nsp"))
        if mlm and not nsp:
            model = BertForPreTraining(config, next_sentence=False)
        else:
            model = "pretraining" if mlm and nsp else "encoder"
    looped = config.replace(scan_layers=False)
    params = _fill(source, _module_for(model, looped, family), looped, family, rng)
    if config.scan_layers:
        root = params["bert"] if "bert" in params else params
        root["encoder"] = stack_layers(root["encoder"], config.num_hidden_layers)
    return config, params, source.vocab_file
