"""Export: our params as a Hugging Face directory `transformers` loads."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence

import jax
import numpy as np

from bert_jax.config import BertConfig
from bert_jax.convert.families import family_of
from bert_jax.convert.locations import copy_files
from bert_jax.convert.names import (
    WORD_EMBEDDINGS,
    ConversionError,
    TensorSpec,
    as_numpy,
    get_path,
    with_layout,
)
from bert_jax.convert.readers import check_finite, check_vocab, writing_dir

log = logging.getLogger(__name__)


def to_hf_state_dict(config: BertConfig, params: Mapping) -> tuple[dict[str, np.ndarray], str]:
    """Our params (either layout) -> (HF state dict in float32, transformers class name), in
    the names of the config's family (`families.family_of`: BERT's or ModernBERT's)."""
    if config.embedding_width != config.hidden_size:
        raise ConversionError(
            f"embedding_size {config.embedding_size} != hidden_size {config.hidden_size}: "
            "transformers' Bert classes have no embedding projection (an ELECTRA model "
            "exports with bert_jax.convert.electra)"
        )
    family = family_of(config)
    params = with_layout(as_numpy(params), scan_layers=False, num_layers=config.num_hidden_layers)
    arch = family.architecture(params, config)
    enc = params.get("bert", params)
    prefix = family.hf_prefix if "bert" in params else ""
    encoder = family.encoder(config)
    parts = [(prefix, enc, spec) for spec in encoder]
    if "pooler" in enc:
        parts += [(prefix, enc, spec) for spec in family.pooler]
    heads = family.heads(config)
    for head in sorted(set(params) - {"bert"} if prefix else ()):
        parts += [("", params, spec) for spec in heads[head]]

    state: dict[str, np.ndarray] = {}
    fused: dict[str, dict[int, np.ndarray]] = {}  # key -> its blocks (ModernBERT's Wqkv)
    for key_prefix, tree, spec in parts:
        try:
            value = get_path(tree, spec.path)
        except KeyError:
            raise ConversionError(
                f"params have no {spec.ours!r} (config has {config.num_hidden_layers} layers)"
            ) from None
        if spec.hf_fill is not None:  # HF has no such tensor
            continue
        if spec.part:
            fused.setdefault(key_prefix + spec.hf, {})[spec.part[0]] = spec.to_hf(value)
        else:
            state[key_prefix + spec.hf] = spec.to_hf(value)
    for key, blocks in fused.items():
        state[key] = np.concatenate([blocks[i] for i in sorted(blocks)], axis=0)
    num_leaves = len(jax.tree_util.tree_leaves(params))
    if len(parts) != num_leaves:
        raise ConversionError(
            f"params have {num_leaves} tensors but {len(parts)} have HF names: more layers than "
            f"num_hidden_layers={config.num_hidden_layers}?"
        )
    word = state[prefix + _hf_name(encoder, WORD_EMBEDDINGS)]
    if word.shape != (config.vocab_size, config.hidden_size):
        raise ConversionError(
            f"word_embeddings has shape {word.shape} but the config says "
            f"({config.vocab_size}, {config.hidden_size})"
        )
    return state, arch


def _hf_name(specs: list[TensorSpec], path: tuple[str, ...]) -> str:
    return next(spec.hf for spec in specs if spec.path == path)


def _token_ids(vocab_file: str | None, hf_config: dict) -> dict[str, int]:
    """The special-token ids of config.json (ModernBERT's pad/cls/sep/bos/eos) from the
    tokenizer written beside it, where its family's defaults would name other tokens."""
    if not vocab_file:
        return {}
    from data_pipelines import tokenization

    try:
        tokenizer = tokenization.load_tokenizer(vocab_file)
    except tokenization.VocabError:  # a vocabulary without BERT's tokens: keep the defaults
        return {}
    roles = {"pad_token_id": "pad_id", "cls_token_id": "cls_id", "sep_token_id": "sep_id",
             "bos_token_id": "cls_id", "eos_token_id": "sep_id"}  # fmt: skip
    return {key: getattr(tokenizer, role) for key, role in roles.items() if key in hf_config}


# tokenizer_config.json's key for each role of ours (`Tokenizer.cls_id` ...).
_ROLES = {"cls_token": "cls_id", "sep_token": "sep_id", "pad_token": "pad_id",
          "mask_token": "mask_id", "unk_token": "unk_id"}  # fmt: skip


def write_tokenizer_config(
    directory: str, vocab_file: str | None, config: BertConfig, do_lower_case: bool | None
) -> None:
    """tokenizer_config.json and special_tokens_map.json in `directory`, naming the special
    tokens this project resolved for `vocab_file` (`data_pipelines.tokenization`), the
    casing and the model's length, so that transformers' `AutoTokenizer` and pipelines
    (fill-mask needs the mask token) work on the export whatever the source held.

    A config copied from the source keeps its keys; only the roles it does not name, the
    length and an explicit `do_lower_case` are added. A vocab.txt's casing is
    `do_lower_case`, else the copied config's, else lower-cased (BERT's and transformers'
    default); a tokenizer.json's normaliser decides its own. Without a vocabulary only an
    explicit `do_lower_case` is written, as before.
    """
    from data_pipelines import tokenization

    path = os.path.join(directory, "tokenizer_config.json")
    existing = {}
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            existing = json.load(f)
    if not vocab_file:
        if do_lower_case is not None:
            existing |= {"do_lower_case": do_lower_case}
            existing.setdefault("tokenizer_class", "BertTokenizer")
            with open(path, "w", encoding="utf-8") as f:
                json.dump(existing, f, indent=2)
        return
    resolved = tokenization.resolve_tokenizer_file(vocab_file)
    kind = tokenization.tokenizer_kind(resolved, tokenization.read_bytes(resolved, "vocab file"))
    lower = do_lower_case if do_lower_case is not None else existing.get("do_lower_case", True)
    tokenizer = tokenization.load_tokenizer(vocab_file, do_lower_case=lower)
    specials = {}
    for key, role in _ROLES.items():
        try:
            token_id = getattr(tokenizer, role)
        except (KeyError, tokenization.VocabError):  # no such token (BPE may lack [UNK])
            continue
        if token_id is not None:
            specials[key] = tokenizer.convert_ids_to_tokens([token_id])[0]
    settings = {"model_max_length": config.max_position_embeddings, **specials}
    if kind == "wordpiece":
        settings |= {"tokenizer_class": "BertTokenizer", "do_lower_case": bool(lower)}
    elif kind == "hf":
        settings["tokenizer_class"] = "PreTrainedTokenizerFast"
    else:  # a sentencepiece .model: its class is the source's to say
        settings["do_lower_case"] = bool(lower)
    merged = {**settings, **existing}
    merged.update({k: v for k, v in specials.items() if k not in existing})
    if do_lower_case is not None:
        merged["do_lower_case"] = do_lower_case
    with open(path, "w", encoding="utf-8") as f:
        json.dump(merged, f, indent=2, ensure_ascii=False)
    special_map = os.path.join(directory, "special_tokens_map.json")
    current = {}
    if os.path.isfile(special_map):
        with open(special_map, encoding="utf-8") as f:
            current = json.load(f)
    with open(special_map, "w", encoding="utf-8") as f:
        json.dump({**specials, **current}, f, indent=2, ensure_ascii=False)


def save_hf(
    output_dir: str | os.PathLike,
    config: BertConfig,
    params: Mapping,
    *,
    vocab_file: str | None = None,
    tokenizer: Sequence[str] = (),
    do_lower_case: bool | None = None,
    overwrite: bool = False,
    extra_json: Mapping[str, object] | None = None,
    allow_non_finite: bool = False,
) -> str:
    """Writes config.json + model.safetensors (+ vocab.txt, the `tokenizer` files copied
    under their names, tokenizer_config.json from `do_lower_case`, and `extra_json`: a
    relative path -> content of JSON files written in the same directory, a str as text: the
    sentence-transformers modules and README.md of `sentence_transformers.module_files`).

    `transformers.BertForPreTraining.from_pretrained(output_dir)` loads it when `params`
    has MLM and NSP heads; an encoder alone is a BertModel, a fine-tuned head the
    matching BertFor* class (named in config.json's `architectures`); a causal model with
    an MLM head alone (the "ltr" objective) a `BertLMHeadModel`. A ModernBERT config
    (`families.family_of`) writes a `ModernBertModel`, or with the MLM head a
    `ModernBertForMaskedLM`. A tensor holding NaN or inf is refused, named, unless
    `allow_non_finite`.
    """
    from safetensors.numpy import save_file

    output_dir = os.fspath(output_dir)
    check_vocab(vocab_file, config)
    state, arch = to_hf_state_dict(config, params)
    if not allow_non_finite:
        for name, value in state.items():
            check_finite(value, f"tensor {name!r}")
    hf_config = {**family_of(config).hf_config(config), "architectures": [arch]}
    hf_config.update(_token_ids(vocab_file, hf_config))
    if arch in ("BertForSequenceClassification", "BertForTokenClassification"):
        labels = state["classifier.bias"].shape[0]
        hf_config["id2label"] = {str(i): f"LABEL_{i}" for i in range(labels)}
        hf_config["label2id"] = {f"LABEL_{i}": i for i in range(labels)}
    with writing_dir(output_dir, overwrite) as tmp:
        save_file(state, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
            json.dump(hf_config, f, indent=2, sort_keys=True)
        copy_files(tmp, vocab_file, tokenizer)
        write_tokenizer_config(tmp, vocab_file, config, do_lower_case)
        for name, content in (extra_json or {}).items():
            path = os.path.join(tmp, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                if isinstance(content, str):  # a text file (a README.md) as it is
                    f.write(content)
                else:
                    json.dump(content, f, indent=2)
    log.info("Wrote %s (%s, %d tensors)", output_dir, arch, len(state))
    return output_dir
