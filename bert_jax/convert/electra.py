"""ELECTRA params (`bert_jax.electra.ElectraForPreTraining`) as transformers' Electra models.

The discriminator becomes an `ElectraForPreTraining`, the generator an `ElectraForMaskedLM`;
both get a copy of the shared embeddings (transformers has no sharing between two models,
and its conversion of Google's ELECTRA checkpoints copies them the same way). The encoder
layers have BERT's names (`bert_jax.convert.names.layer_specs`) under `electra.`.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from typing import Any

import numpy as np

from bert_jax import electra
from bert_jax.config import BertConfig, ConfigError
from bert_jax.convert.names import (
    PROJECT_SPECS,
    ConversionError,
    TensorSpec,
    _dense,
    _layer_norm,
    as_numpy,
    embedding_specs,
    get_path,
    layer_specs,
    unstack_layers,
)
from bert_jax.convert.readers import check_vocab, detect_format, read_train_state, writing_dir

# What transformers loads each directory as: the discriminator, then the generator.
ARCHITECTURES = ("ElectraForPreTraining", "ElectraForMaskedLM")

DISCRIMINATOR_HEAD_SPECS = [
    *_dense(("rtd", "transform"), "discriminator_predictions.dense", ""),
    *_dense(("rtd", "output"), "discriminator_predictions.dense_prediction", ""),
]
GENERATOR_HEAD_SPECS = [
    *_dense(("mlm", "transform"), "generator_predictions.dense", ""),
    *_layer_norm(("mlm", "layer_norm"), "generator_predictions.LayerNorm", ""),
    TensorSpec(("mlm", "output_bias"), "generator_lm_head.bias", ""),
]


def hf_electra_config(config: BertConfig, architecture: str) -> dict[str, Any]:
    """A transformers `ElectraConfig`'s config.json for one of the two models.

    Raises:
        ConfigError: a generator with the tanh GELU: transformers' generator head always
            applies the erf GELU, so the exported model would compute something else.
    """
    if architecture == "ElectraForMaskedLM" and config.hidden_act != "gelu":
        raise ConfigError(
            f"hidden_act {config.hidden_act!r}: transformers' ElectraForMaskedLM head applies "
            "the erf GELU whatever the config says; only a 'gelu' generator exports exactly"
        )
    return {
        "architectures": [architecture],
        "model_type": "electra",
        "attention_probs_dropout_prob": config.attention_probs_dropout_prob,
        "embedding_size": config.embedding_width,
        "hidden_act": "gelu_new" if config.hidden_act == "gelu_tanh" else "gelu",
        "hidden_dropout_prob": config.hidden_dropout_prob,
        "hidden_size": config.hidden_size,
        "initializer_range": config.initializer_range,
        "intermediate_size": config.intermediate_size,
        "layer_norm_eps": config.layer_norm_eps,
        "max_position_embeddings": config.max_position_embeddings,
        "num_attention_heads": config.num_attention_heads,
        "num_hidden_layers": config.num_hidden_layers,
        "pad_token_id": 0,
        "position_embedding_type": "absolute",
        "torch_dtype": "float32",
        "type_vocab_size": config.type_vocab_size,
        "vocab_size": config.vocab_size,
    }


def _tensors(parts) -> dict[str, np.ndarray]:
    state = {}
    for key, tree, spec in parts:
        try:
            value = np.asarray(get_path(tree, spec.path), dtype=np.float32)
        except KeyError:
            raise ConversionError(f"ELECTRA params have no {spec.ours!r}") from None
        value = value.reshape(spec.flat_shape(value.shape))
        state[key + spec.hf] = np.ascontiguousarray(value.T if spec.hf_t else value)
    return state


def _encoder(config: BertConfig) -> list[TensorSpec]:
    specs = [spec for i in range(config.num_hidden_layers) for spec in layer_specs(i)]
    return specs + (PROJECT_SPECS if config.embedding_width != config.hidden_size else [])


def to_hf_electra_state_dicts(
    config: BertConfig, generator: BertConfig, params: Mapping
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Our ELECTRA params (looped or scanned) -> (discriminator, generator) HF state dicts.

    Keys are those of `ElectraForPreTraining` and `ElectraForMaskedLM`, float32, with the
    generator's tied `generator_lm_head.weight` written out (the word table).
    """
    params = as_numpy(params)
    disc = {**params["bert"], "encoder": unstack_layers(params["bert"]["encoder"])}
    gen = {**params["generator"], "encoder": unstack_layers(params["generator"]["encoder"])}
    shared = [("electra.", disc, spec) for spec in embedding_specs()]
    disc_state = _tensors(
        shared
        + [("electra.", disc, spec) for spec in _encoder(config)]
        + [("", params, spec) for spec in DISCRIMINATOR_HEAD_SPECS]
    )
    gen_state = _tensors(
        shared
        + [("electra.", gen, spec) for spec in _encoder(generator)]
        + [("", gen, spec) for spec in GENERATOR_HEAD_SPECS]
    )
    gen_state["generator_lm_head.weight"] = gen_state["electra.embeddings.word_embeddings.weight"]
    leaves = sum(1 for _ in _flat(params))
    # Every tensor of ours has an HF name: the embeddings twice, the word table once more.
    if len(disc_state) + len(gen_state) - len(shared) - 1 != leaves:
        raise ConversionError(
            f"ELECTRA params have {leaves} tensors, {len(disc_state)} + {len(gen_state)} HF "
            "names: more layers than the configs say?"
        )
    return disc_state, gen_state


def _flat(tree):
    for value in tree.values():
        if isinstance(value, Mapping):
            yield from _flat(value)
        else:
            yield value


def save_hf_electra(
    output_dir: str | os.PathLike,
    config: BertConfig,
    generator: BertConfig,
    params: Mapping,
    *,
    vocab_file: str | None = None,
    overwrite: bool = False,
) -> str:
    """Writes the discriminator to `output_dir` and the generator to `output_dir/generator`.

    `transformers.ElectraForPreTraining.from_pretrained(output_dir)` and
    `ElectraForMaskedLM.from_pretrained(output_dir + "/generator")` load them with no missing
    or unexpected keys; vocab.txt, when given, is copied into both.
    """
    from safetensors.numpy import save_file

    output_dir = os.fspath(output_dir)
    check_vocab(vocab_file, config)
    states = to_hf_electra_state_dicts(config, generator, params)
    models = zip(("", "generator"), (config, generator), ARCHITECTURES, states, strict=True)
    with writing_dir(output_dir, overwrite) as tmp:
        for sub, model_config, architecture, state in models:
            directory = os.path.join(tmp, sub)
            os.makedirs(directory, exist_ok=True)
            weights = os.path.join(directory, "model.safetensors")
            save_file(state, weights, metadata={"format": "pt"})
            hf_config = hf_electra_config(model_config, architecture)
            with open(os.path.join(directory, "config.json"), "w", encoding="utf-8") as f:
                json.dump(hf_config, f, indent=2, sort_keys=True)
            if vocab_file:
                shutil.copyfile(vocab_file, os.path.join(directory, "vocab.txt"))
    return output_dir


def read_electra_train_state(
    path: str | os.PathLike,
) -> tuple[BertConfig, BertConfig, Mapping, str | None] | None:
    """(discriminator config, generator config, params, vocab file or None) of the newest
    checkpoint of an "electra" pretraining run at `path` (a workdir or its checkpoints); None
    for any other checkpoint. The generator is the one the saved experiment config's
    `electra` block describes, as the run built it (`bert_jax.electra.experiment_generator`).
    """
    path = os.fspath(path)
    if "://" not in path:  # Orbax refuses (and misreads) relative local directories
        path = os.path.abspath(path)
    if detect_format(path) != "train_state":
        return None
    config, params, experiment, vocab_file, _ = read_train_state(path)
    if experiment.get("objective") != "electra":
        return None
    return config, electra.experiment_generator(experiment, config), params, vocab_file
