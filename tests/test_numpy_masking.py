"""The masking rules as invariants and their draws' statistics, in both modes; static seeding.

The 80/10/10 split and the masked fraction on >= 100k tokens of Shakespeare, worker-count
independence of the written bytes and whole-word masking on People's Daily are checked end
to end in tests/test_create_pretraining_data*.py; this file checks `mask_batch` row by row
against the rules, computed independently in plain Python, for static masking
(`numpy_masking`) and dynamic masking (`masking`) alike, and the static mode's streams.
"""

from __future__ import annotations

import masking_modes
import numpy as np
import pytest

from data_pipelines import masking_rules, numpy_masking

CLS, SEP, MASK, VOCAB = 101, 102, 103, 30522


def _random_batch(rng: np.random.Generator, batch: int, length: int):
    """[CLS] A [SEP] B [SEP] rows of random ids, zero-padded, with random word starts."""
    lengths = rng.integers(3, length + 1, batch)
    ids = rng.integers(5, 30000, (batch, length)).astype(np.int32)
    ids[:, 0] = CLS
    rows = np.arange(batch)
    ids[rows, lengths - 1] = SEP
    ids[rows, np.clip(rng.integers(1, length, batch), 1, np.maximum(lengths - 2, 1))] = SEP
    ids[np.arange(length)[None, :] >= lengths[:, None]] = 0
    starts = (rng.random((batch, length)) < 0.6).astype(np.int32)
    return ids, starts, lengths


def _units(ids_row, starts_row, n) -> list[list[int]]:
    """The maskable units of one row, in plain Python: single pieces or whole words.

    A word is a start piece and the non-start pieces after it; a special token ends it, and
    a non-start piece right after a special token starts a new one.
    """
    units: list[list[int]] = []
    previous_candidate = False
    for position in range(n):
        if ids_row[position] in (CLS, SEP):
            previous_candidate = False
            continue
        if starts_row[position] or not previous_candidate:
            units.append([position])
        else:
            units[-1].append(position)
        previous_candidate = True
    return units


def _check_row(ids, starts, n, out, row, *, prob, predictions, whole_word):
    """Asserts the masking rules on one row of `mask_batch`'s output."""
    k = int(out["masked_lm_weights"][row].sum())
    positions = out["masked_lm_positions"][row, :k].tolist()
    # Weights: k ones then zeros; positions ascend, then zero padding.
    assert out["masked_lm_weights"][row, :k].tolist() == [1.0] * k
    assert not out["masked_lm_weights"][row, k:].any()
    assert not out["masked_lm_positions"][row, k:].any()
    assert not out["masked_lm_ids"][row, k:].any()
    assert positions == sorted(set(positions))
    # Only real, non-special tokens; the labels are the original ids.
    assert all(0 < p < n - 1 and ids[row, p] not in (CLS, SEP) for p in positions)
    assert out["masked_lm_ids"][row, :k].tolist() == [int(ids[row, p]) for p in positions]
    # Every other token is untouched; a chosen one is [MASK], itself or a vocabulary id.
    untouched = np.ones(ids.shape[1], bool)
    untouched[positions] = False
    assert (out["input_ids"][row, untouched] == ids[row, untouched]).all()
    assert all(0 <= int(out["input_ids"][row, p]) < VOCAB for p in positions)
    # The count: min(P, max(1, round(n * prob))), Python's rounding, as in the original.
    budget = min(predictions, max(1, round(n * prob)))
    units = _units(ids[row], starts[row] if whole_word else np.ones_like(starts[row]), n)
    chosen = set(positions)
    taken = [u for u in units if set(u) <= chosen]
    # Units are taken whole: the chosen positions are exactly a union of units.
    assert sorted(p for u in taken for p in u) == positions
    assert k <= budget
    if not whole_word:
        assert k == min(budget, len(units))
    else:
        # Greedy over a random order: a unit left out did not fit in what was left.
        assert all(len(u) > budget - k for u in units if u not in taken)
    return k


@pytest.mark.parametrize("mode", masking_modes.MODES)
@pytest.mark.parametrize("whole_word", [False, True])
def test_mask_batch_follows_the_rules(whole_word, mode):
    rng = np.random.default_rng(7 + whole_word)
    masked_rows = 0
    for trial in range(10):
        batch, length = int(rng.integers(1, 120)), int(rng.integers(5, 140))
        predictions = int(rng.integers(1, 30))
        prob = float(rng.choice([0.15, 0.2, 0.5, 1.0]))
        ids, starts, lengths = _random_batch(rng, batch, length)
        out = masking_modes.mask_batch(
            mode,
            (trial, 1, 2),
            ids,
            starts,
            [CLS, SEP],
            lengths,
            vocab_size=VOCAB,
            mask_id=MASK,
            max_predictions_per_seq=predictions,
            masked_lm_prob=prob,
            whole_word=whole_word,
        )
        assert sorted(out) == [
            "input_ids",
            "masked_lm_ids",
            "masked_lm_positions",
            "masked_lm_weights",
        ]
        assert out["input_ids"].dtype == np.int32 and out["input_ids"].shape == ids.shape
        for name in ("masked_lm_positions", "masked_lm_ids"):
            assert out[name].dtype == np.int32 and out[name].shape == (batch, predictions)
        assert out["masked_lm_weights"].dtype == np.float32
        for row in range(batch):
            k = _check_row(
                ids,
                starts,
                int(lengths[row]),
                out,
                row,
                prob=prob,
                predictions=predictions,
                whole_word=whole_word,
            )
            masked_rows += k > 0
    assert masked_rows > 100  # not vacuous


def _uniform_batch(rows: int):
    """`rows` copies of one 64-token row: [CLS] 1..29 [SEP] 31..62 [SEP], each a word."""
    ids = np.arange(64, dtype=np.int32)[None, :].repeat(rows, 0) + 1000
    ids[:, 0], ids[:, 30], ids[:, 63] = CLS, SEP, SEP
    return ids, np.ones_like(ids), np.full(rows, 64)


@pytest.mark.parametrize("mode", masking_modes.MODES)
def test_draws_are_uniform(mode):
    """Every candidate position is equally likely; the split is 80/10/10; ids are uniform."""
    rows, budget = 20_000, 10  # round(64 * 0.15) = 10 of the 61 candidates
    ids, starts, lengths = _uniform_batch(rows)
    out = masking_modes.mask_batch(
        mode,
        (12345, 0, 0),
        ids,
        starts,
        [CLS, SEP],
        lengths,
        vocab_size=VOCAB,
        mask_id=MASK,
        max_predictions_per_seq=20,
    )
    assert (out["masked_lm_weights"].sum(1) == budget).all()
    positions = out["masked_lm_positions"][:, :budget]
    frequency = np.bincount(positions.reshape(-1), minlength=64)
    assert frequency[[0, 30, 63]].sum() == 0
    # Binomial(20000, 10/61) per position: mean ~3279, sd ~52; 5 sd either side.
    expected = rows * budget / 61
    sd = np.sqrt(expected * (1 - budget / 61))
    candidates = np.delete(frequency, [0, 30, 63])
    assert np.abs(candidates - expected).max() < 5 * sd
    # 200k chosen tokens: +-0.5 points is > 5 sd for each share.
    placed = np.take_along_axis(out["input_ids"], positions, axis=1)
    labels = out["masked_lm_ids"][:, :budget]
    mask_share = float(np.mean(placed == MASK))
    same_share = float(np.mean(placed == labels))
    random_share = 1 - mask_share - same_share
    assert abs(mask_share - 0.8) < 0.005
    assert abs(same_share - 0.1) < 0.005  # a random id equal to the original: ~3e-6
    assert abs(random_share - 0.1) < 0.005
    # Random replacements cover the vocabulary evenly: each tenth holds ~10% of them.
    random_ids = placed[(placed != MASK) & (placed != labels)]
    tenths = np.bincount(random_ids * 10 // VOCAB, minlength=10) / len(random_ids)
    assert np.abs(tenths - 0.1).max() < 0.01


@pytest.mark.parametrize("mode", masking_modes.MODES)
def test_whole_words_are_masked_whole_and_uniformly(mode):
    """Words of 1, 2 and 3 pieces: each word as likely to start the visit as any other."""
    rows = 20_000
    ids, _, lengths = _uniform_batch(rows)
    # Words (by start piece): 1..9 single pieces, 10..29 in pairs, 31..62 in triples (and
    # a last pair): [CLS] and [SEP] are never part of a word.
    starts = np.zeros(64, np.int32)
    starts[list(range(1, 10)) + list(range(10, 30, 2)) + list(range(31, 63, 3))] = 1
    starts = np.broadcast_to(starts, ids.shape)
    out = masking_modes.mask_batch(
        mode,
        (3, 4, 5),
        ids,
        starts,
        [CLS, SEP],
        lengths,
        vocab_size=VOCAB,
        mask_id=MASK,
        max_predictions_per_seq=20,
        whole_word=True,
    )
    k = out["masked_lm_weights"].sum(1).astype(int)
    assert (k <= 10).all() and k.mean() > 9  # greedy fills the budget of 10 almost always
    chosen = np.zeros(ids.shape, bool)
    rows_index = np.arange(rows)[:, None].repeat(20, 1)
    real = out["masked_lm_weights"] > 0
    chosen[rows_index[real], out["masked_lm_positions"][real]] = True
    # Whole: every piece of a word shares its start's fate.
    word = np.cumsum(starts[0]) * (np.isin(np.arange(64), [0, 30, 63]) == 0)
    for w in range(1, word.max() + 1):
        members = np.flatnonzero(word == w)
        assert (chosen[:, members] == chosen[:, members[:1]]).all(), w
    # Single-piece words are all equally likely (they fill the last slots of a budget).
    singles = chosen[:, 1:10].mean(0)
    assert np.abs(singles - singles.mean()).max() < 0.02


def test_masking_rng_streams():
    def draws(*key):
        return numpy_masking.masking_rng(*key).integers(0, 2**63, 8).tolist()

    # One stream per (seed, chunk, batch), the same every time.
    assert draws(12345, 0, 0) == draws(12345, 0, 0)
    keys = [(12345, 0, 0), (12345, 0, 1), (12345, 1, 0), (12346, 0, 0), (0, 0, 0), (-1, 0, 0)]
    # Fixed-width entropy: a seed spilling into a second 32-bit word is not (chunk, batch).
    keys += [(2**32, 0, 0), (0, 1, 0), (2**32 + 1, 2, 0), (1, 1, 2)]
    assert len({tuple(draws(*key)) for key in keys}) == len(keys)
    # Not the stream of an unsalted SeedSequence on the same numbers.
    plain = np.random.default_rng([12345, 0, 0]).integers(0, 2**63, 8).tolist()
    assert plain != draws(12345, 0, 0)
    with pytest.raises(ValueError, match="random seed"):
        numpy_masking.masking_rng(2**64, 0)
    with pytest.raises(ValueError, match="indices"):
        numpy_masking.masking_rng(1, -1)


def test_mask_batch_is_a_function_of_the_stream():
    ids, starts, lengths = _random_batch(np.random.default_rng(0), 300, 128)
    kwargs = dict(vocab_size=VOCAB, mask_id=MASK, max_predictions_per_seq=20, whole_word=True)

    def run(*key):
        rng = numpy_masking.masking_rng(*key)
        return numpy_masking.mask_batch(ids, starts, [CLS, SEP], lengths, rng, **kwargs)

    first, again, other = run(1, 2, 3), run(1, 2, 3), run(1, 2, 4)
    for name in first:
        np.testing.assert_array_equal(first[name], again[name], err_msg=name)
    assert not np.array_equal(first["masked_lm_positions"], other["masked_lm_positions"])


def test_mask_batch_bad_arguments():
    ids = np.zeros((2, 8), np.int32)
    common = dict(vocab_size=9, mask_id=3)
    rng = numpy_masking.masking_rng(0, 0)
    lengths = np.array([4, 4])
    with pytest.raises(ValueError, match="word_starts"):
        numpy_masking.mask_batch(
            ids, None, [1], lengths, rng, max_predictions_per_seq=2, whole_word=True, **common
        )
    with pytest.raises(ValueError, match="max_predictions_per_seq=0"):
        numpy_masking.mask_batch(ids, None, [1], lengths, rng, max_predictions_per_seq=0, **common)
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        numpy_masking.mask_batch(
            ids[0], None, [1], np.array([4]), rng, max_predictions_per_seq=2, **common
        )


def test_first_in_order_matches_a_stable_sort_with_ties():
    rng = np.random.default_rng(3)
    for trial in range(200):
        batch, units = int(rng.integers(1, 20)), int(rng.integers(1, 40))
        # Few distinct values: many ties, inside, across and beyond the edge of the set.
        scores = rng.integers(-3, 3, (batch, units)).astype(np.int64)
        scores[rng.random((batch, units)) < 0.1] = np.iinfo(np.int64).min
        scores[rng.random((batch, units)) < 0.05] = np.iinfo(np.int64).max
        count = rng.integers(0, units + 1, batch)
        if trial % 3 == 0:
            count = np.minimum(count, 3)  # the partial-partition path
        order = np.argsort(~scores, axis=1, kind="stable")  # exact for int64 extremes
        expected = np.zeros((batch, units), bool)
        for row in range(batch):
            expected[row, order[row, : count[row]]] = True
        np.testing.assert_array_equal(masking_rules.first_in_order(scores, count), expected)
