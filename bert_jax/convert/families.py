"""The model families the converter knows (`names.Family`), which one a config or a
config.json is, and the config.json of our own params-only directories.

BERT (`names.BERT`) is every config BERT's formats describe (`BertConfig.non_bert_fields`
empty); any other is named by the ModernBERT table (`modernbert.MODERNBERT`), which covers
our paths for every switch and transformers' names for ModernBERT's own combination.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re

from bert_jax.config import BertConfig, ConfigError
from bert_jax.convert.modernbert import MODERNBERT
from bert_jax.convert.names import BERT, Family

FAMILIES = (BERT, MODERNBERT)
# The encoder-key prefixes of HF task models, stripped when a directory is read.
HF_PREFIX = re.compile("^(" + "|".join(re.escape(f.hf_prefix) for f in FAMILIES) + ")")
# How HF head keys begin in any family (they stay outside the encoder prefix).
HEAD_KEYS = tuple(key for family in FAMILIES for key in family.head_keys)

# The model_type of the config.json that `ours_config_dict` writes for a config BERT's
# formats cannot describe: every field under its own name (no transformers class reads it).
OURS = "bert_jax"
# How a weight is stored and computed, not what the network is: not in our config.json (nor
# in BERT's, `BertConfig.to_hf_dict`).
_NOT_WRITTEN = (
    "dtype",
    "param_dtype",
    "activation_dtype",
    "residual_dtype",
    "scan_layers",
    "remat_policy",
    "attention_implementation",
    "splash_block_q",
    "splash_block_kv",
    "splash_local_block",
    "splash_fused_backward",
)


def family_of(config: BertConfig) -> Family:
    """BERT for what BERT's formats describe, else the ModernBERT table."""
    return MODERNBERT if config.non_bert_fields() else BERT


def hf_family(data: dict, source: str = "<dict>") -> Family:
    """The family of a HF config.json's contents, by its `model_type` (BERT's by default)."""
    model_type = data.get("model_type", "bert")
    for family in FAMILIES:
        if family.model_type == model_type:
            return family
    known = [family.model_type for family in FAMILIES]
    raise ConfigError(f"{source}: model_type {model_type!r} is not one of {known}")


def read_config(path: str | os.PathLike) -> BertConfig:
    """Our config of a config.json: a HF one read as its `model_type`'s family reads it, or
    ours (`ours_config_dict`)."""
    path = os.fspath(path)
    data = _json(path)
    check_size_bounds(data, path)
    if data.get("model_type") != OURS:
        return hf_family(data, path).from_hf_config(data, path)
    names = {f.name for f in dataclasses.fields(BertConfig)} - set(_NOT_WRITTEN)
    try:
        return BertConfig(**{k: v for k, v in data.items() if k in names})
    except (ConfigError, TypeError) as error:
        raise ConfigError(f"{path}: {error}") from None


# The sizes a config.json gives; each is an array axis, indexed in int32.
SIZE_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
             "intermediate_size", "max_position_embeddings", "type_vocab_size")  # fmt: skip
SIZE_MAX = 2**31 - 1


def check_size_bounds(data: dict, path: str) -> None:
    """Refuses a size past `SIZE_MAX` (e.g. vocab_size 10**12) in one line naming the file and
    key, before anything is built of it."""
    for key in SIZE_KEYS:
        value = data.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > SIZE_MAX:
            raise ConfigError(
                f"{path}: {key} {value} is past {SIZE_MAX} (2**31 - 1), the largest size "
                "an array axis indexed in int32 takes"
            )


def _json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


def ours_config_dict(config: BertConfig) -> dict:
    """The config.json of our params-only directories: transformers' BertConfig where BERT's
    formats describe the model (as before modern configs existed), else every field under
    its own name with model_type `OURS` (`read_config` reads both)."""
    if family_of(config) is BERT:
        return config.to_hf_dict()
    fields = dataclasses.asdict(config)
    return {"model_type": OURS, **{k: v for k, v in fields.items() if k not in _NOT_WRITTEN}}
