"""BERT's masked-LM rules, written once for static and dynamic masking.

The rules are those of `create_masked_lm_predictions` in google-research/bert:

* the number of predictions is `min(max_predictions_per_seq, max(1, round(n * prob)))`,
  where `n` counts every real token including `[CLS]`/`[SEP]` and `round` is Python's
  (half to even);
* candidates are the real tokens that are not special (`[CLS]`, `[SEP]`, padding);
* candidate *units* (single tokens, or with `whole_word` a word start and the continuation
  pieces after it; for Chinese the words of the segmenter, as `word_starts` marks them) are
  visited in a uniformly random order and taken greedily; a unit that would overshoot the
  number of predictions is skipped and the next one is tried;
* every chosen token becomes `[MASK]` with probability 0.8, a token drawn uniformly from
  the whole vocabulary with probability 0.1, and stays unchanged with probability 0.1;
* the predictions are listed by ascending position and zero-padded (weight 0.0) to
  `max_predictions_per_seq`.

One deliberate difference: the original attaches a `##` piece to the previous word even
across a `[SEP]` (a segment B that truncation made start mid-word). Here a unit never
spans a special token: such a piece starts its own unit.

Nothing here draws random numbers: `mask` (`choose`, then `mask_chosen`) takes the draws as
arguments, so static and dynamic masking differ only in where the draws come from. Static masking
(`numpy_masking`, when `create_pretraining_data` writes records, without TensorFlow) draws
from numpy's PCG64; dynamic masking (`masking`, inside tf.data) draws with TensorFlow's
stateless Philox and calls these functions through `tf.numpy_function`. Same rules, same
distribution, different numbers.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

# The 80/10/10 split of a uniform draw in [0, 1): [MASK] below 0.8, a random id in
# [0.8, 0.9), unchanged above.
MASK_BELOW = 0.8
RANDOM_BELOW = 0.9


def check_parameters(
    word_starts,
    *,
    vocab_size: int,
    max_predictions_per_seq: int,
    masked_lm_prob: float,
    whole_word: bool,
) -> None:
    """Raises ValueError on masking parameters the rules cannot follow."""
    if whole_word and word_starts is None:
        raise ValueError("mask_batch(whole_word=True) needs word_starts")
    if max_predictions_per_seq < 1 or not 0.0 < masked_lm_prob <= 1.0 or vocab_size < 1:
        raise ValueError(
            f"bad masking parameters: max_predictions_per_seq={max_predictions_per_seq}, "
            f"masked_lm_prob={masked_lm_prob}, vocab_size={vocab_size}"
        )


def check_replacement_ids(replacement_ids, vocab_size: int) -> np.ndarray | None:
    """The replacement table as a (R,) int32 array (None stays None); raises ValueError on
    an empty one or ids outside [0, vocab_size)."""
    if replacement_ids is None:
        return None
    table = np.asarray(replacement_ids, np.int32).reshape(-1)
    if not table.size or table.min() < 0 or table.max() >= vocab_size:
        raise ValueError(
            f"replacement_ids must be a non-empty set of ids in [0, {vocab_size}), got "
            f"{table.size} ids" + (f" in [{table.min()}, {table.max()}]" if table.size else "")
        )
    return table


def num_to_predict(num_tokens, masked_lm_prob: float, limit: int) -> np.ndarray:
    """min(limit, max(1, round(n * prob))) with Python's half-to-even rounding, (B,) int32."""
    # float64 multiplication and np.round (half to even) reproduce Python's
    # `int(round(len(tokens) * masked_lm_prob))` exactly.
    expected = np.round(np.asarray(num_tokens, np.float64) * np.float64(masked_lm_prob))
    return np.minimum(limit, np.maximum(1, expected.astype(np.int32))).astype(np.int32)


def mask(
    input_ids: np.ndarray,
    real: np.ndarray,
    special: np.ndarray,
    word_starts: np.ndarray | None,
    scores: np.ndarray,
    draw_replacements: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]],
    *,
    mask_id: int,
    max_predictions_per_seq: int,
    masked_lm_prob: float,
    whole_word: bool,
) -> dict[str, np.ndarray]:
    """Chooses the tokens to predict and masks them: `choose`, then `mask_chosen`.

    Args:
        input_ids: (B, T) integer ids.
        real, special, word_starts, scores: as `choose` takes them.
        draw_replacements: maps the (B, T) bool choice to the `action` and `random_ids`
            draws of `mask_chosen`, one per chosen token in row-major order.
        mask_id, max_predictions_per_seq: as `mask_chosen` takes them.
        masked_lm_prob, whole_word: as `choose` takes them.

    Returns:
        As `mask_chosen`.
    """
    chosen = choose(
        real,
        special,
        word_starts,
        scores,
        max_predictions_per_seq=max_predictions_per_seq,
        masked_lm_prob=masked_lm_prob,
        whole_word=whole_word,
    )
    action, random_ids = draw_replacements(chosen)
    return mask_chosen(
        input_ids,
        chosen,
        action,
        random_ids,
        mask_id=mask_id,
        max_predictions_per_seq=max_predictions_per_seq,
    )


def choose(
    real: np.ndarray,
    special: np.ndarray,
    word_starts: np.ndarray | None,
    scores: np.ndarray,
    *,
    max_predictions_per_seq: int,
    masked_lm_prob: float,
    whole_word: bool,
) -> np.ndarray:
    """The tokens to predict: (B, T) bool.

    Args:
        real: (B, T) bool, the real (non-padding) tokens.
        special: (B, T) bool, the tokens never to mask.
        word_starts: (B, T), nonzero where a token starts a word; read with `whole_word`.
        scores: (B, T) int64 random scores: the u-th unit of a row is visited in descending
            order of `scores[:, u]` (on a tie, the lower u first: probability ~T^2 / 2^64
            for uniform 64-bit scores, which make every order equally likely).
        max_predictions_per_seq: at most this many tokens per row.
        masked_lm_prob: fraction of all real tokens to predict.
        whole_word: units are whole words instead of single pieces.
    """
    batch, length = real.shape
    positions = np.arange(length)[None, :]  # (1, T)
    candidate = real & ~special  # (B, T)
    budget = num_to_predict(real.sum(1), masked_lm_prob, max_predictions_per_seq)  # (B,)

    # Units: every candidate token, or with whole_word a word start plus its continuation
    # pieces. A piece right after a non-candidate (special token) starts a unit of its own.
    if whole_word:
        previous_candidate = np.zeros_like(candidate)
        previous_candidate[:, 1:] = candidate[:, :-1]
        unit_start = candidate & (np.asarray(word_starts).astype(bool) | ~previous_candidate)
    else:
        unit_start = candidate
    unit_of_token = np.maximum(np.cumsum(unit_start, axis=1, dtype=np.int32) - 1, 0)  # (B, T)
    num_units = unit_start.sum(1)  # (B,)

    # Visiting order: descending scores, invalid units last (a stable sort puts a valid unit
    # that draws the minimum before them). `~x` reverses int64 order without overflow, so an
    # ascending stable sort of ~scores is a descending stable sort of scores.
    scores = np.where(positions < num_units[:, None], scores, np.iinfo(np.int64).min)  # (B, U=T)
    if not whole_word:
        # Single-token units always fit until the budget is spent: the first k in the
        # visiting order are taken, whatever their order among themselves.
        unit_taken = first_in_order(scores, np.minimum(budget, num_units))  # (B, U)
    else:
        order = np.argsort(~scores, axis=1, kind="stable")  # (B, U)
        rank_of_unit = np.empty_like(order)
        np.put_along_axis(rank_of_unit, order, np.broadcast_to(positions, order.shape), axis=1)
        rows = np.repeat(np.arange(batch), length)
        unit_sizes = np.bincount(
            (rows * length + unit_of_token.reshape(-1))[candidate.reshape(-1)],
            minlength=batch * length,
        ).reshape(batch, length)  # (B, U)
        taken_in_order = _greedy_take(
            np.take_along_axis(unit_sizes, order, axis=1), num_units, budget
        )
        unit_taken = np.take_along_axis(taken_in_order, rank_of_unit, axis=1)  # (B, U)
    return candidate & np.take_along_axis(unit_taken, unit_of_token, axis=1)  # (B, T)


def mask_chosen(
    input_ids: np.ndarray,
    chosen: np.ndarray,
    action: np.ndarray,
    random_ids: np.ndarray,
    *,
    mask_id: int,
    max_predictions_per_seq: int,
) -> dict[str, np.ndarray]:
    """Applies the 80/10/10 rule to the chosen tokens and lists the predictions.

    Args:
        input_ids: (B, T) integer ids.
        chosen: (B, T) bool, from `choose`.
        action: (N,) uniform in [0, 1), one per chosen token in row-major order
            (`np.nonzero(chosen)`): [MASK] below `MASK_BELOW`, `random_ids` below
            `RANDOM_BELOW`, else unchanged.
        random_ids: (N,) ids uniform in [0, vocab_size), likewise one per chosen token.
        mask_id: id of `[MASK]`.
        max_predictions_per_seq: P, the padded length of the outputs.

    Returns:
        `input_ids` (B, T) with the replacements applied; `masked_lm_positions` and
        `masked_lm_ids` (B, P) in the dtype of `input_ids`, ascending positions then zeros;
        `masked_lm_weights` (B, P) float32, 1.0 exactly on real predictions.
    """
    batch = input_ids.shape[0]
    rows, cols = np.nonzero(chosen)
    original = input_ids[rows, cols]
    replaced = np.where(
        action < MASK_BELOW,
        np.asarray(mask_id, input_ids.dtype),
        np.where(action < RANDOM_BELOW, random_ids.astype(input_ids.dtype), original),
    )
    masked_ids = input_ids.copy()
    masked_ids[rows, cols] = replaced

    # Chosen positions ascending (np.nonzero is row-major), left-aligned, zero-padded.
    per_row = chosen.sum(1)
    slot = np.arange(len(rows)) - np.repeat(np.cumsum(per_row) - per_row, per_row)
    keep = slot < max_predictions_per_seq
    masked_positions = np.zeros((batch, max_predictions_per_seq), input_ids.dtype)
    labels = np.zeros((batch, max_predictions_per_seq), input_ids.dtype)
    weights = np.zeros((batch, max_predictions_per_seq), np.float32)
    masked_positions[rows[keep], slot[keep]] = cols[keep]
    labels[rows[keep], slot[keep]] = original[keep]
    weights[rows[keep], slot[keep]] = 1.0
    return {
        "input_ids": masked_ids,
        "masked_lm_positions": masked_positions,
        "masked_lm_ids": labels,
        "masked_lm_weights": weights,
    }


def _greedy_take(sizes: np.ndarray, num_units: np.ndarray, budget: np.ndarray) -> np.ndarray:
    """(B, U) bool: units (in visiting order) taken while they do not overshoot the budget."""
    batch, max_units = sizes.shape
    taken = np.zeros((batch, max_units), bool)
    count = np.zeros(batch, np.int64)
    for rank in range(max_units):
        open_rows = (count < budget) & (rank < num_units)
        if not open_rows.any():
            break
        take = (rank < num_units) & (count + sizes[:, rank] <= budget)
        count += np.where(take, sizes[:, rank], 0)
        taken[:, rank] = take
    return taken


def first_in_order(scores: np.ndarray, count: np.ndarray) -> np.ndarray:
    """(B, U) bool: per row, the `count[row]` units first in descending-score order.

    The order is that of a stable descending sort (on a tie, the lower index first), as
    `np.argsort(~scores, kind="stable")`. Only the set matters, so a partial partition finds it;
    a row where a tie across the edge of the set could change it (probability ~2^-64 for
    random 64-bit scores) falls back to the full sort.
    """
    batch, units = scores.shape
    reverse = ~scores  # ascending order of ~x is descending order of x, without overflow
    top = int(count.max()) if batch else 0
    if top >= units:  # the whole row may be taken: sort it all
        order = np.argsort(reverse, axis=1, kind="stable")
        return _first_of_order(order, count)
    # The top + 1 smallest of `reverse` per row, then sorted: the first count[row] of them
    # are the set, unless the next one ties with the last one taken.
    candidates = np.argpartition(reverse, top, axis=1)[:, : top + 1]  # (B, top + 1)
    values = np.take_along_axis(reverse, candidates, axis=1)
    order = np.argsort(values, axis=1, kind="stable")
    candidates = np.take_along_axis(candidates, order, axis=1)
    values = np.take_along_axis(values, order, axis=1)
    rows = np.arange(batch)
    # Ties inside the taken set or beyond it change nothing; one across its edge does.
    ties = (count > 0) & (values[rows, np.maximum(count - 1, 0)] == values[rows, count])
    taken = np.zeros((batch, units), bool)
    keep = np.arange(top + 1)[None, :] < count[:, None]
    taken[np.nonzero(keep)[0], candidates[keep]] = True
    if ties.any():
        order = np.argsort(reverse[ties], axis=1, kind="stable")
        taken[ties] = _first_of_order(order, count[ties])
    return taken


def _first_of_order(order: np.ndarray, count: np.ndarray) -> np.ndarray:
    """(B, U) bool: the units at ranks < count[row] of each row's `order`."""
    taken = np.zeros(order.shape, bool)
    keep = np.arange(order.shape[1])[None, :] < count[:, None]
    taken[np.nonzero(keep)[0], order[keep]] = True
    return taken
