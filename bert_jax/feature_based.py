"""The feature-based approach (BERT paper, section 5.3, Table 7): a frozen encoder's hidden
states, combined as a flag says, feed a randomly initialised two-layer BiLSTM tagger.

The encoder is run once over every example, deterministically (no dropout), and only what
the tagger reads is kept (`FeatureCache`: each example's real tokens, no padding). The
tagger (`BiLSTMTagger`) is a separate model with its own params: nothing of the encoder is
in its train state, so no update can reach it.

Layer combinations (`COMBINATIONS`), over the encoder's `hidden_states` = (embedding
output, layer 1, ..., layer L):

- `embeddings`: the embedding layer's output (hidden_states[0]);
- `last`, `second_to_last`: layer L, layer L-1;
- `sum_last_4`: layers L-3 + L-2 + L-1 + L;
- `concat_last_4`: [layer L-3; L-2; L-1; L] on the feature axis (4H wide, bottom first);
- `sum_all`: layers 1 + ... + L (the paper's "sum all 12 layers": not the embeddings);
- `scalar_mix`: ELMo's gamma * sum_j softmax(s)_j h_j over the embeddings and every
  layer, s and gamma learned with the tagger (`ScalarMix`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from bert_jax import finetune_common as common
from bert_jax import sharding
from bert_jax.model import BertModel

COMBINATIONS = (
    "embeddings",
    "last",
    "second_to_last",
    "sum_last_4",
    "concat_last_4",
    "sum_all",
    "scalar_mix",
)
# Combinations reading the last four layers.
_LAST_4 = ("sum_last_4", "concat_last_4")


def check_combination(combination: str, num_layers: int | None = None) -> None:
    """Raises ValueError naming `config.layers` when `combination` is unknown or needs more
    layers than the encoder's `num_layers` (when given)."""
    if combination not in COMBINATIONS:
        raise ValueError(f"config.layers={combination!r}: expected one of {COMBINATIONS}")
    if num_layers is None:
        return
    needed = 4 if combination in _LAST_4 else 2 if combination == "second_to_last" else 1
    if num_layers < needed:
        raise ValueError(
            f"config.layers={combination!r} needs {needed} encoder layers; the encoder has "
            f"{num_layers}"
        )


def frozen_features(hidden_states: Sequence[jax.Array], combination: str) -> jax.Array:
    """What the tagger reads of one batch, from `BertOutput.hidden_states`.

    Args:
        hidden_states: L+1 x (B, T, H): the embedding output, then every layer's output.
        combination: one of `COMBINATIONS`.

    Returns:
        (B, T, D) for a fixed combination (D = 4H for `concat_last_4`, else H); for
        `scalar_mix` the (B, T, L+1, H) stack that `ScalarMix` weighs while training.
    """
    check_combination(combination, len(hidden_states) - 1)
    embeddings, layers = hidden_states[0], hidden_states[1:]
    if combination == "embeddings":
        return embeddings
    if combination == "last":
        return layers[-1]
    if combination == "second_to_last":
        return layers[-2]
    if combination == "sum_last_4":
        return sum(layers[-4:])
    if combination == "concat_last_4":
        return jnp.concatenate(layers[-4:], axis=-1)  # (B, T, 4H), layer L-3 first
    if combination == "sum_all":
        return sum(layers)
    return jnp.stack(hidden_states, axis=-2)  # scalar_mix: (B, T, L+1, H)


class ScalarMix(nn.Module):
    """ELMo's layer mix: gamma * sum_j softmax(s)_j h_j, with s (K,) and gamma learned.

    s starts at zero (the mean of the layers) and gamma at one.
    """

    @nn.compact
    def __call__(self, layers: jax.Array) -> jax.Array:  # (B, T, K, H)
        logits = self.param("layer_logits", nn.initializers.zeros, (layers.shape[-2],))
        gamma = self.param("gamma", nn.initializers.ones, ())
        weights = jax.nn.softmax(logits)  # (K,), positive, summing to one
        return gamma * jnp.einsum("btkh,k->bth", layers, weights)  # (B, T, H)


def scalar_mix_weights(params: Any) -> dict[str, Any] | None:
    """{"weights": softmax(s) per layer (embeddings first), "gamma": gamma} of a tagger's
    params; None when it has no `ScalarMix`."""
    if "scalar_mix" not in params:
        return None
    mix = jax.device_get(params["scalar_mix"])
    weights = jax.nn.softmax(np.asarray(mix["layer_logits"], np.float32))
    return {"weights": np.asarray(weights).tolist(), "gamma": float(mix["gamma"])}


class BiLSTM(nn.Module):
    """One bidirectional LSTM layer: the two directions' outputs concatenated."""

    size: int  # units per direction

    @nn.compact
    def __call__(self, x: jax.Array, lengths: jax.Array) -> jax.Array:  # (B, T, D), (B,)
        return nn.Bidirectional(
            nn.RNN(nn.OptimizedLSTMCell(self.size), name="forward"),
            nn.RNN(nn.OptimizedLSTMCell(self.size), name="backward"),
        )(x, seq_lengths=lengths)  # (B, T, 2 x size)


class BiLSTMTagger(nn.Module):
    """Frozen features -> (ScalarMix) -> `num_layers` BiLSTMs -> a linear tag layer.

    Dropout is applied to the BiLSTMs' inputs and to the tag layer's. `seq_lengths` keeps
    each backward LSTM from starting in the padding, so the outputs at real positions never
    depend on what the padding holds (the forward LSTM only reads what precedes).
    """

    num_tags: int
    lstm_size: int = 256  # hidden units per direction
    num_layers: int = 2
    dropout_rate: float = 0.2
    scalar_mix: bool = False  # True: the features are (B, T, K, H) layers to mix

    @nn.compact
    def __call__(
        self,
        features: jax.Array,  # (B, T, D), or (B, T, K, H) with scalar_mix
        input_mask: jax.Array,  # (B, T) 1 for tokens, 0 for padding
        *,
        deterministic: bool = True,
    ) -> jax.Array:
        x = ScalarMix(name="scalar_mix")(features) if self.scalar_mix else features  # (B, T, D)
        x = x.astype(jnp.float32)
        lengths = jnp.sum(input_mask, axis=-1).astype(jnp.int32)  # (B,)
        for i in range(self.num_layers):
            x = nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)
            x = BiLSTM(self.lstm_size, name=f"bilstm_{i}")(x, lengths)  # (B, T, 2 x lstm_size)
        x = nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)
        return nn.Dense(self.num_tags, name="tags")(x)  # (B, T, C)


class FeatureCache(NamedTuple):
    """Every example's frozen features, real tokens only, back to back."""

    values: np.ndarray  # (total real tokens, *feature_shape) float32
    offsets: np.ndarray  # (N + 1,) example i is values[offsets[i]:offsets[i + 1]]

    @property
    def lengths(self) -> np.ndarray:  # (N,)
        return np.diff(self.offsets)

    @property
    def feature_shape(self) -> tuple[int, ...]:  # (D,) or (K, H)
        return self.values.shape[1:]

    def padded(self, indices: np.ndarray, length: int) -> np.ndarray:
        """(B, length, *feature_shape) rows `indices`, zeros past each example's end."""
        out = np.zeros((len(indices), length, *self.feature_shape), self.values.dtype)
        for row, i in enumerate(indices):
            start, end = self.offsets[i], self.offsets[i + 1]
            n = min(end - start, length)
            out[row, :n] = self.values[start : start + n]
        return out


@functools.partial(jax.jit, static_argnames=("encoder", "combination"))
def _features(params, batch, *, encoder: BertModel, combination: str) -> jax.Array:
    """(B, T, ...) float32 `frozen_features` of one batch; compiled once per encoder,
    combination and batch shape (modules hash by their fields)."""
    keys = ("input_ids", "input_mask", "segment_ids")
    out = encoder.apply({"params": params}, *(batch[k] for k in keys), output_hidden_states=True)
    return frozen_features(out.hidden_states, combination).astype(jnp.float32)  # no dropout


def compute_features(
    encoder: BertModel,
    params: Any,
    arrays: dict[str, np.ndarray],
    combination: str,
    *,
    batch_size: int,
    mesh,
    desc: str = "features",
) -> FeatureCache:
    """One deterministic forward pass of the frozen `encoder` over every example.

    Args:
        encoder: a `BertModel` (no pooler needed) with `params`.
        arrays: `input_ids input_mask segment_ids`, (N, T) each.
        combination: one of `COMBINATIONS` (`frozen_features` of each batch is kept).
        batch_size: examples per forward pass (divides over the mesh's data axes).

    Returns:
        The features of each example's real tokens (its `input_mask` ones, which come first).
    """
    check_combination(combination, encoder.config.num_hidden_layers)
    common.check_batch_size(batch_size, mesh, "eval_batch_size")
    keys = ("input_ids", "input_mask", "segment_ids")
    lengths = arrays["input_mask"].sum(1).astype(np.int64)
    if not len(lengths):
        raise ValueError(f"{desc}: no examples")
    offsets = np.concatenate([[0], np.cumsum(lengths)])

    params = jax.device_put(params, common.replicated(mesh))
    values = None
    batches = common.eval_batches(lengths, batch_size)
    total = common.num_batches(len(lengths), batch_size)
    with sharding.activation_context(mesh):
        for indices, real in tqdm(batches, total=total, desc=desc, leave=False):
            length = common.pad_length(lengths[indices], arrays["input_ids"].shape[1])
            batch = common.take({k: arrays[k] for k in keys}, indices, length)
            batch = sharding.global_batch(batch, mesh)  # split over the data axes
            out = np.asarray(_features(params, batch, encoder=encoder, combination=combination))
            if values is None:
                values = np.zeros((offsets[-1], *out.shape[2:]), np.float32)
            for row, i in enumerate(indices[:real]):
                values[offsets[i] : offsets[i + 1]] = out[row, : lengths[i]]
    return FeatureCache(values, offsets)
