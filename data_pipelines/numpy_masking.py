"""Static masking: BERT's masking rules (`masking_rules`) with draws from numpy's generator.

`create_pretraining_data` masks every instance once (static mode). Drawing with the
TensorFlow ops of dynamic masking (`data_pipelines.masking`) would cost each process a
TensorFlow import (several CPU seconds, more than masking itself), so static masks draw
from `np.random.Generator` (PCG64) seeded through `np.random.SeedSequence` by
`masking_rng(seed, chunk, batch)`, so a run's masks depend on its seed and on which
instances they mask, not on how many processes made them.

Static masks are not the same numbers as the dynamic masks `masking.mask_batch` draws in
the input pipeline (another generator, another mode; the same rules); a seed gives one
static output whatever the paths (local or `gs://`), because static masking always runs
here.
"""

from __future__ import annotations

import numpy as np

from data_pipelines import masking_rules

# First entropy word of every masking stream, so that no other use of the run seed with
# SeedSequence (now or later) draws the same numbers. "MASK" in ASCII.
_MASKING_SALT = 0x4D41534B
_INT64 = np.iinfo(np.int64)


def masking_rng(seed: int, *indices: int) -> np.random.Generator:
    """The generator of one masked batch: PCG64 seeded by (seed, *indices).

    Every value takes exactly 64 bits of the SeedSequence entropy, so no two different
    (seed, indices) tuples of the same length give the same entropy.

    Args:
        seed: the run's random seed, in [-2^63, 2^64).
        indices: identify the batch, e.g. (chunk index, batch index in the chunk); >= 0.

    Raises:
        ValueError: a value outside those ranges.
    """
    if not -(2**63) <= seed < 2**64:
        raise ValueError(f"random seed {seed} is outside [-2^63, 2^64)")
    if any(not 0 <= i < 2**64 for i in indices):
        raise ValueError(f"masking stream indices must be in [0, 2^64), got {indices}")
    entropy = np.array([_MASKING_SALT, seed % 2**64, *indices], dtype=np.uint64)
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy)))


def mask_batch(
    input_ids: np.ndarray,
    word_starts: np.ndarray | None,
    special_ids: list[int],
    lengths: np.ndarray,
    rng: np.random.Generator,
    *,
    vocab_size: int,
    mask_id: int,
    max_predictions_per_seq: int,
    masked_lm_prob: float = 0.15,
    whole_word: bool = False,
    replacement_ids: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Masks a (B, T) batch by `masking_rules`, with numpy's random draws.

    Args:
        input_ids: (B, T) integer ids, zero-padded after each sequence.
        word_starts: (B, T) 1 where a token starts a word (needed with `whole_word`).
        special_ids: ids never masked, e.g. `[cls_id, sep_id]`.
        lengths: (B,) real tokens per row.
        rng: the batch's generator (`masking_rng(seed, chunk, batch)`); it is advanced.
        vocab_size: random replacements are drawn from `[0, vocab_size)`.
        mask_id: id of `[MASK]`.
        max_predictions_per_seq: P, the padded length of the outputs.
        masked_lm_prob: fraction of all real tokens to predict.
        whole_word: mask whole words instead of single pieces.
        replacement_ids: draw random replacements from these ids instead (the tokenizer's
            real tokens, `replacement_ids`).

    Returns:
        As `masking_rules.mask`: `input_ids` (B, T) and `masked_lm_positions`,
        `masked_lm_ids` (B, P) in the dtype of `input_ids`, `masked_lm_weights` (B, P)
        float32.
    """
    masking_rules.check_parameters(
        word_starts,
        vocab_size=vocab_size,
        max_predictions_per_seq=max_predictions_per_seq,
        masked_lm_prob=masked_lm_prob,
        whole_word=whole_word,
    )
    table = masking_rules.check_replacement_ids(replacement_ids, vocab_size)
    input_ids = np.asarray(input_ids)
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must be (B, T), got shape {input_ids.shape}")
    batch, length = input_ids.shape
    real = np.arange(length)[None, :] < np.asarray(lengths)[:, None]  # (B, T)
    special = np.isin(input_ids, np.asarray(special_ids, input_ids.dtype))  # (B, T)

    # The draws, in this order: a 64-bit score per unit, then for each chosen token (in
    # row-major order) the 80/10/10 action and a replacement id.
    scores = rng.integers(_INT64.min, _INT64.max, (batch, length), np.int64, endpoint=True)

    def draw_replacements(chosen: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        num_chosen = int(np.count_nonzero(chosen))
        if table is None:
            return rng.random(num_chosen), rng.integers(0, vocab_size, num_chosen)
        return rng.random(num_chosen), table[rng.integers(0, len(table), num_chosen)]

    return masking_rules.mask(
        input_ids,
        real,
        special,
        word_starts,
        scores,
        draw_replacements,
        mask_id=mask_id,
        max_predictions_per_seq=max_predictions_per_seq,
        masked_lm_prob=masked_lm_prob,
        whole_word=whole_word,
    )
