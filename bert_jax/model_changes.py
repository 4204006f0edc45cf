"""Where a resumed checkpoint's model differs from the run's: `model_changes`.

A run that resumes checkpoints (`bert_jax.train_loop`) compares the experiment config saved
with them to its own and refuses, naming each key, when the two models compute different
functions (`ModelChangeError`), unless `config.allow_model_change` says to go on. The model
itself is `bert_jax.config.BertConfig`; this module compares two experiment configs' views of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bert_jax.config import BertConfig, ConfigError, preset_fields
from bert_jax.presets import MODERN_PRESETS, PRESETS

# The BertConfig fields that change what the network computes, compared when a run resumes a
# checkpoint (`model_changes`); `causal` is compared through the objective that sets it. Not
# compared: initializer_range (a restored network is past its initialisation), scan_layers and
# remat_policy (how the same function is computed and stored), attention_implementation
# (einsum, XLA's and cuDNN's kernels compute the same attention; the fused two need
# attention_probs_dropout_prob=0, which is compared).
COMPARED_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "max_position_embeddings",
    "type_vocab_size",
    "layer_norm_eps",
    "dtype",
    "param_dtype",
    "embedding_size",
    "position_encoding",
    "rope_theta",
    "local_rope_theta",
    "feed_forward",
    "norm_placement",
    "linear_bias",
    "norm_bias",
    "local_attention_window",
    "global_attention_every",
)
# The fields every preset sets (`BertConfig.from_preset`).
_PRESET_SIZES = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size")
# The keys of an experiment's `electra` block that size the generator, with the defaults of
# configs without them (`bert_jax.electra.EXPERIMENT_DEFAULTS`, restated so that comparing two
# configs imports no model code; tests/test_electra_training.py checks that the two agree).
GENERATOR_SIZES = {"generator_hidden_fraction": 0.25, "generator_layer_fraction": 1.0}
# What `model_changes` reports for a field the saved config does not hold at all.
MISSING = "missing"


class ModelChangeError(ConfigError):
    """A checkpoint resumed into a run whose model computes something else."""


def model_changes(
    saved: Mapping[str, Any], now: Mapping[str, Any], vocab_size: int | None = None
) -> list[tuple[str, Any, Any]]:
    """Where the model of experiment config `now` differs from that of `saved`.

    Each side is resolved as `BertConfig.from_experiment` resolves it (a preset's sizes,
    vocab_size from the vocab file), with one exception: a field that `saved` leaves to the
    code's default (absent, or None) is unknown, since a default may have changed since the
    checkpoint was written (hidden_act's did). It is a change when `now` states the field,
    and is not compared when `now` leaves it to the default too.

    Args:
        saved: an experiment config as `bert_jax.checkpointing.config_to_json` saved it.
        now: the run's experiment config (a ConfigDict, or such JSON).
        vocab_size: the vocab file's size, where a model block leaves vocab_size to it (the
            restore checks the embedding table's shape in any case).

    Returns:
        [(key, saved value, value now)], e.g. ("model.hidden_act", "gelu", "gelu_tanh");
        the saved value is MISSING for a key the saved config lacks. Empty: the same model.
    """
    saved_model, model = dict(saved.get("model") or {}), now["model"]
    # The default of configs older than the objective key (`objective`).
    objectives = (saved.get("objective", "mlm_nsp"), now.get("objective", "mlm_nsp"))
    resolved = BertConfig.from_experiment(model, vocab_size, objectives[1])
    # What the saved config fixes without stating it: its preset's sizes, the vocab file's size.
    known = {"vocab_size": vocab_size or 30522}
    if saved_model.get("preset") in PRESETS or saved_model.get("preset") in MODERN_PRESETS:
        known |= {
            k: v for k, v in preset_fields(saved_model["preset"]).items() if k != "vocab_size"
        }
    now_preset = preset_fields(model["preset"])
    changes = [("objective", *objectives)] if objectives[0] != objectives[1] else []
    if objectives == ("electra", "electra"):
        # The generator's sizes (`bert_jax.electra.experiment_generator`); configs older than
        # the `electra` block trained the defaults that block states.
        saved_block, block = saved.get("electra") or {}, now.get("electra") or {}
        for name, default in GENERATOR_SIZES.items():
            was, value = saved_block.get(name, default), block.get(name, default)
            if was != value:
                changes.append((f"electra.{name}", was, value))
    for name in COMPARED_FIELDS:
        value = getattr(resolved, name)
        was = saved_model.get(name)
        if was is None:
            was = known.get(name)
        if was is None:
            # The default of its day, unknown: a change when `now` states the field (a preset
            # states the sizes, a ModernBERT one its architecture too), else both sides are
            # the default, which cannot be compared.
            if model.get(name) is not None or name in _PRESET_SIZES or name in now_preset:
                changes.append((f"model.{name}", saved_model.get(name, MISSING), value))
        elif was != value:
            changes.append((f"model.{name}", was, value))
    return changes
