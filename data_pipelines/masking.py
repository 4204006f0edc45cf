"""Dynamic masking: BERT's masking rules (`masking_rules`) inside tf.data.

`mask_features` masks the unmasked records that `create_pretraining_data --masking=dynamic`
writes, anew for every epoch, as a `tf.data` `map`. The random draws come only from
`tf.random.stateless_*` ops with the Philox algorithm (`RNG_ALG`), so one seed gives the
same masks on every machine and in every run: `random_draws` makes all of them for a batch
(a 64-bit score per unit, an 80/10/10 action and a replacement id per token), and
`masking_rules` decides, through `tf.numpy_function`, which tokens are predicted and what
they become.

Static records are masked by `data_pipelines.numpy_masking` under the same rules, drawing
from numpy's generator: same distribution, different draws.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np
import tensorflow as tf

from data_pipelines import masking_rules

# The stateless generator of the input pipeline (masks, file order, shuffling). Philox is
# counter-based and implemented identically on every device; "auto_select" may pick a
# different generator on a GPU, so it is never used here.
RNG_ALG = "philox"

# The keys of `mask_batch`'s result, in the order `tf.numpy_function` returns them.
_MASKED_KEYS = ("input_ids", "masked_lm_positions", "masked_lm_ids", "masked_lm_weights")


@dataclasses.dataclass(frozen=True)
class MaskingConfig:
    """The masking parameters, grouped for the input pipeline and the CLI."""

    vocab_size: int  # random replacement tokens are drawn from [0, vocab_size)
    mask_id: int  # id of [MASK]
    special_ids: tuple[int, ...]  # ids never masked, e.g. ([CLS], [SEP]); padding is excluded
    max_predictions_per_seq: int = 20  # fixed length of the masked_lm_* features
    masked_lm_prob: float = 0.15  # fraction of tokens (incl. [CLS]/[SEP]) to predict
    whole_word: bool = False  # mask whole words (word_starts) instead of single pieces
    # The ids random replacements are drawn from, uniformly (the tokenizer's real tokens,
    # `replacement_ids`); None: all of [0, vocab_size), as the original BERT.
    replacement_ids: tuple[int, ...] | None = dataclasses.field(default=None, repr=False)


def as_seed(seed: Any) -> tf.Tensor:
    """A stateless seed (int32[2]) from a Python int or an existing seed tensor."""
    if isinstance(seed, numbers.Integral):  # Python and numpy ints alike
        seed = int(seed)
        return tf.constant([seed & 0x7FFFFFFF, (seed >> 31) & 0x7FFFFFFF], tf.int32)
    seed = tf.convert_to_tensor(seed)
    if seed.shape.rank == 0:
        return tf.stack([tf.cast(seed, tf.int32), tf.constant(0, tf.int32)])
    return tf.cast(seed, tf.int32)


def example_seed(seed: Any, *indices: Any) -> tf.Tensor:
    """Derives a stateless seed for e.g. (epoch, file, record) by folding in each index."""
    seed = as_seed(seed)
    for index in indices:
        seed = tf.random.experimental.stateless_fold_in(seed, tf.cast(index, tf.int32), alg=RNG_ALG)
    return seed


def random_draws(
    seed: tf.Tensor, batch: Any, length: Any, vocab_size: int
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """All the randomness of one `mask_batch` call, as a function of its seed.

    Returns:
        `scores` (B, T) int64: unit u of a row is visited in descending order of
        `scores[:, u]`; `action` (B, T) float32 in [0, 1): a chosen token becomes [MASK]
        below 0.8, `random_ids` below 0.9, else stays; `random_ids` (B, T) int32 uniform in
        [0, vocab_size).
    """
    order_seed, action_seed, token_seed = tf.unstack(
        tf.random.experimental.stateless_split(seed, 3, alg=RNG_ALG)
    )
    shape = tf.stack([batch, length])
    scores = tf.random.stateless_uniform(
        shape, order_seed, minval=None, maxval=None, dtype=tf.int64, alg=RNG_ALG
    )
    action = tf.random.stateless_uniform(shape, action_seed, alg=RNG_ALG)
    random_ids = tf.random.stateless_uniform(
        shape, token_seed, minval=0, maxval=vocab_size, dtype=tf.int32, alg=RNG_ALG
    )
    return scores, action, random_ids


def _mask_batch(
    input_ids: tf.Tensor,
    word_starts: tf.Tensor,
    special: tf.Tensor,
    real: tf.Tensor,
    seed: tf.Tensor,
    *,
    vocab_size: int,
    mask_id: int,
    max_predictions_per_seq: int,
    masked_lm_prob: float,
    whole_word: bool,
    replacement_ids: np.ndarray | None,
) -> dict[str, tf.Tensor]:
    batch, length = tf.shape(input_ids)[0], tf.shape(input_ids)[1]
    # With a table, the draw is an index into it.
    draws = vocab_size if replacement_ids is None else len(replacement_ids)
    scores, action, random_ids = random_draws(seed, batch, length, draws)

    def apply_rules(input_ids, word_starts, special, real, scores, action, random_ids):
        if replacement_ids is not None:
            random_ids = replacement_ids[random_ids]
        masked = masking_rules.mask(
            input_ids,
            real,
            special,
            word_starts,
            scores,
            # The chosen tokens' draws, row-major as the rules expect.
            lambda chosen: (action[chosen], random_ids[chosen]),
            mask_id=mask_id,
            max_predictions_per_seq=max_predictions_per_seq,
            masked_lm_prob=masked_lm_prob,
            whole_word=whole_word,
        )
        return [masked[key] for key in _MASKED_KEYS]

    outputs = tf.numpy_function(
        apply_rules,
        [input_ids, word_starts, special, real, scores, action, random_ids],
        [input_ids.dtype, input_ids.dtype, input_ids.dtype, tf.float32],
        stateful=False,  # a function of its inputs: the randomness is in the draws
    )
    masked = dict(zip(_MASKED_KEYS, outputs, strict=True))
    masked["input_ids"].set_shape(input_ids.shape)  # (B, T)
    for key in _MASKED_KEYS[1:]:
        masked[key].set_shape([input_ids.shape[0], max_predictions_per_seq])  # (B, P)
    return masked


def mask_batch(
    input_ids: Any,
    word_starts: Any | None,
    special_mask_or_ids: Any,
    seed: Any,
    *,
    vocab_size: int,
    mask_id: int,
    max_predictions_per_seq: int,
    masked_lm_prob: float = 0.15,
    whole_word: bool = False,
    input_mask: Any | None = None,
    lengths: Any | None = None,
    replacement_ids: Any | None = None,
) -> dict[str, tf.Tensor]:
    """Chooses and applies masked-LM predictions on a padded batch.

    Works eagerly and inside `tf.data` `map` functions. A single unbatched sequence (rank 1)
    is accepted too.

    Args:
        input_ids: (B, T) integer ids, zero-padded after each sequence.
        word_starts: (B, T), 1 where a token starts a whole-word unit; used only with
            `whole_word=True` (may be None otherwise).
        special_mask_or_ids: a bool (B, T) mask of tokens never to mask, or a 1-D integer
            list of special ids (e.g. `[cls_id, sep_id]`).
        seed: stateless seed: an int32[2] tensor or a Python int. Same seed, same output.
        vocab_size: random replacements are drawn uniformly from `[0, vocab_size)`...
        mask_id: id of `[MASK]`.
        max_predictions_per_seq: P, the padded length of the outputs.
        masked_lm_prob: fraction of all real tokens to predict.
        whole_word: mask whole words instead of single pieces.
        input_mask: (B, T) 1 on real tokens; give this or `lengths`.
        lengths: (B,) real tokens per row; give this or `input_mask`.
        replacement_ids: ... or uniformly from these ids (the tokenizer's real tokens).

    Returns:
        `input_ids` (B, T) with the replacements applied; `masked_lm_positions` and
        `masked_lm_ids` (B, P) in the dtype of `input_ids`, ascending positions then zeros;
        `masked_lm_weights` (B, P) float32, 1.0 exactly on real predictions.

    Raises:
        ValueError: neither or both of `input_mask` and `lengths`; bad shapes or parameters.
    """
    if (input_mask is None) == (lengths is None):
        raise ValueError("mask_batch needs exactly one of input_mask or lengths")
    masking_rules.check_parameters(
        word_starts,
        vocab_size=vocab_size,
        max_predictions_per_seq=max_predictions_per_seq,
        masked_lm_prob=masked_lm_prob,
        whole_word=whole_word,
    )
    table = masking_rules.check_replacement_ids(replacement_ids, vocab_size)
    input_ids = tf.convert_to_tensor(input_ids)
    if not input_ids.dtype.is_integer:
        raise ValueError(f"input_ids must be integers, got {input_ids.dtype}")
    unbatched = input_ids.shape.rank == 1
    if input_ids.shape.rank not in (1, 2):
        raise ValueError(f"input_ids must be (T,) or (B, T), got shape {input_ids.shape}")

    def batched(x: Any) -> tf.Tensor:
        x = tf.convert_to_tensor(x)
        return x[None] if unbatched else x

    input_ids = batched(input_ids)
    positions = tf.range(tf.shape(input_ids)[1])[None, :]
    if input_mask is not None:
        real = tf.cast(batched(input_mask), tf.bool)
    else:
        real = positions < tf.cast(batched(lengths), tf.int32)[:, None]
    special = tf.convert_to_tensor(special_mask_or_ids)
    if special.dtype == tf.bool:
        special = batched(special)
    else:
        special_ids = tf.reshape(tf.cast(special, input_ids.dtype), [1, 1, -1])
        special = tf.reduce_any(input_ids[:, :, None] == special_ids, axis=-1)
    word_starts = tf.zeros_like(input_ids) if word_starts is None else batched(word_starts)

    out = _mask_batch(
        input_ids,
        word_starts,
        special,
        real,
        as_seed(seed),
        vocab_size=vocab_size,
        mask_id=mask_id,
        max_predictions_per_seq=max_predictions_per_seq,
        masked_lm_prob=masked_lm_prob,
        whole_word=whole_word,
        replacement_ids=table,
    )
    return {k: v[0] for k, v in out.items()} if unbatched else out


def mask_features(
    features: Mapping[str, tf.Tensor], seed: Any, config: MaskingConfig
) -> dict[str, tf.Tensor]:
    """Masks parsed unmasked records; for `tf.data` `map` (dynamic masking).

    Args:
        features: the `records.UNMASKED` features, as `records.parse` returns them (one
            record or a batch).
        seed: stateless seed for these records, e.g. `example_seed(base, epoch, index)`.
        config: the masking parameters.

    Returns:
        The features of a masked record (`records.MASKED`), the original BERT's.
    """
    masked = mask_batch(
        features["input_ids"],
        features["word_starts"],
        list(config.special_ids),
        seed,
        vocab_size=config.vocab_size,
        mask_id=config.mask_id,
        max_predictions_per_seq=config.max_predictions_per_seq,
        masked_lm_prob=config.masked_lm_prob,
        whole_word=config.whole_word,
        input_mask=features["input_mask"],
        replacement_ids=config.replacement_ids,
    )
    return {
        "input_ids": masked["input_ids"],
        "input_mask": features["input_mask"],
        "segment_ids": features["segment_ids"],
        "masked_lm_positions": masked["masked_lm_positions"],
        "masked_lm_ids": masked["masked_lm_ids"],
        "masked_lm_weights": masked["masked_lm_weights"],
        "next_sentence_labels": features["next_sentence_labels"],
    }
