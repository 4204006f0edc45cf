"""Export: our params as a Hugging Face directory `transformers` loads."""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Mapping

import jax
import numpy as np

from bert_jax.config import BertConfig
from bert_jax.convert.names import (
    HEAD_SPECS,
    POOLER_SPECS,
    ConversionError,
    Params,
    as_numpy,
    encoder_specs,
    get_path,
    with_layout,
)
from bert_jax.convert.readers import check_vocab, writing_dir

log = logging.getLogger(__name__)


def _hf_architecture(params: Params, causal: bool = False) -> str:
    heads = frozenset(params) - {"bert"} if "bert" in params else frozenset()
    if causal and heads == {"mlm"}:  # the "ltr" objective's model: a left-to-right LM
        return "BertLMHeadModel"
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
    if config.embedding_width != config.hidden_size:
        raise ConversionError(
            f"embedding_size {config.embedding_size} != hidden_size {config.hidden_size}: "
            "transformers' Bert classes have no embedding projection (an ELECTRA model "
            "exports with bert_jax.convert.electra)"
        )
    params = with_layout(as_numpy(params), scan_layers=False, num_layers=config.num_hidden_layers)
    arch = _hf_architecture(params, config.causal)
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
    matching BertFor* class (named in config.json's `architectures`); a causal model with
    an MLM head alone (the "ltr" objective) a `BertLMHeadModel`.
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
