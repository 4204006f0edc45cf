"""BERT tokenizers: the original WordPiece rules on the Rust `tokenizers` library; sentencepiece.

`WordPieceTokenizer` reproduces google-research/bert's `FullTokenizer` (basic tokenization,
then greedy longest-match-first WordPiece) token for token, but runs as one Hugging Face
`tokenizers` pipeline, so batches are encoded in Rust, off the GIL and on every core.

The stock `BertNormalizer` + `BertPreTokenizer` pair is close to the original but not equal
to it: its Unicode tables are older than Python's, it deletes private-use characters (the
original keeps them, as [UNK]), one CJK range has a typo (U+2B820..U+2B91F are not isolated),
and it lower-cases a final capital sigma to 'σ' where Python's `str.lower` gives 'ς'. So the
pipeline here is composed of generic `Replace`/`Split` steps whose character classes are read
from the running Python's `unicodedata`, which is what the original consults:

    normalizer     drop NUL, U+FFFD and Cc/Cf (except \\t \\n \\r); Zs and \\t \\n \\r -> ' '
                   if do_lower_case: final Σ -> ς, lower-case, NFD, drop Mn
    pre-tokenizer  split on whitespace; isolate every punctuation and CJK ideograph
    model          WordPiece, '##' continuations, words over 200 characters -> [UNK]

Lower-casing and NFD come from the Rust standard library and crates; on every code point
that Python's Unicode database assigns they agree with Python (checked against the original
over all of Unicode). Code points Python does not know yet (assigned in a later Unicode
version) are never in a vocabulary and come out as [UNK] either way.

Forked workers: batch calls run on a Rust thread pool, which does not survive `fork`. The
pinned `tokenizers` (0.22) handles this itself and silently: a child forked after a parallel
batch call encodes sequentially (earlier releases printed a warning each time). So workers
forked from a process that tokenized are safe with no setting; setting TOKENIZERS_PARALLELISM
to a true value overrides that guard and can deadlock such children, so leave it unset (or
"false") in programs that fork. The module itself sets nothing at import.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import itertools
import json
import os
import sys
import unicodedata
from collections.abc import Iterable, Sequence

import sentencepiece as spm
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers

PAD_TOKEN = "[PAD]"
UNK_TOKEN = "[UNK]"
CLS_TOKEN = "[CLS]"
SEP_TOKEN = "[SEP]"
MASK_TOKEN = "[MASK]"
SPECIAL_TOKENS = (PAD_TOKEN, UNK_TOKEN, CLS_TOKEN, SEP_TOKEN, MASK_TOKEN)

# The original BERT's limit (transformers' BertTokenizer uses 100).
MAX_INPUT_CHARS_PER_WORD = 200

# The "Chinese character" blocks of the original `_is_chinese_char`, typo-free.
_CJK_RANGES = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)


class VocabError(ValueError):
    """A vocabulary (or sentencepiece model) that cannot serve as a BERT tokenizer's."""


# ----------------------------------------------------------------------------- Unicode classes


def _class_body(code_points: Iterable[int]) -> str:
    """Sorted code points -> the inside of an Oniguruma bracket expression, as ranges."""
    parts: list[str] = []
    start = prev = None
    for cp in code_points:
        if prev is not None and cp == prev + 1:
            prev = cp
            continue
        if start is not None:
            parts.append(_range_text(start, prev))
        start = prev = cp
    if start is not None:
        parts.append(_range_text(start, prev))
    return "".join(parts)


def _range_text(lo: int, hi: int) -> str:
    return f"\\x{{{lo:X}}}" if lo == hi else f"\\x{{{lo:X}}}-\\x{{{hi:X}}}"


@dataclasses.dataclass(frozen=True)
class _CharClasses:
    """Bracket-expression bodies for the original's character predicates."""

    removed: str  # NUL, U+FFFD, Cc and Cf except \t \n \r: deleted by `_clean_text`
    whitespace: str  # \t, \n, \r and Zs but ' ': turned into ' ' by `_clean_text`
    punctuation: str  # ASCII non-alphanumeric symbols and Unicode P*: split off alone
    cjk: str  # the CJK ideograph blocks: split off alone
    nonspacing_marks: str  # Mn: dropped after NFD when lower-casing
    cased: str  # Cased and not Case_Ignorable (Python's final-sigma rule, see below)
    case_ignorable: str  # Case_Ignorable


def _code_points_to_scan() -> Iterable[int]:
    """Every code point that can be in a class: all but those known to be in none.

    Planes 15-16 are private use (Co) and noncharacters (Cn) by Unicode's stability policy,
    and planes 4-13 have no assigned character up to Unicode 16.0; an unassigned or
    private-use code point is in no class. Skipping them makes the scan ~3x faster. A
    Python with a later Unicode database scans everything.
    """
    if int(unicodedata.unidata_version.split(".")[0]) > 16:
        return range(sys.maxunicode + 1)
    return itertools.chain(range(0x40000), range(0xE0000, 0xF0000))


# Class tables for the Unicode versions of the supported Pythons, written by
# `python -m data_pipelines.tokenization` and checked against the scan by the tests: the
# scan costs ~0.2 s, paid before any worker can start. Other versions are scanned.
_CLASS_TABLE_DIR = os.path.join(os.path.dirname(__file__), "unicode_classes")


def _class_table_path(unidata_version: str) -> str:
    return os.path.join(_CLASS_TABLE_DIR, f"unicode-{unidata_version}.json")


@functools.cache
def _char_classes() -> _CharClasses:
    """The classes for this interpreter's `unicodedata` (once per process)."""
    path = _class_table_path(unicodedata.unidata_version)
    try:
        with open(path, encoding="utf-8") as f:
            return _CharClasses(**json.load(f))
    except FileNotFoundError:
        return _scan_char_classes()


def _scan_char_classes() -> _CharClasses:
    """Reads the classes from this interpreter's `unicodedata`."""
    removed, whitespace, punctuation, marks, probe = [], [], [], [], []
    for cp in _code_points_to_scan():
        char = chr(cp)
        cat = unicodedata.category(char)
        if cp == 0 or cp == 0xFFFD or (cat in ("Cc", "Cf") and char not in "\t\n\r"):
            removed.append(cp)
        elif (cat == "Zs" or char in "\t\n\r") and char != " ":
            whitespace.append(cp)  # ' ' itself needs no replacing
        if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
            punctuation.append(cp)
        elif cat[0] == "P":
            punctuation.append(cp)
        if cat == "Mn":
            marks.append(cp)
        if cat not in ("Cn", "Co", "Cs"):
            probe.append(cp)
    # Python lower-cases 'Σ' to 'ς' when the first non-case-ignorable character before it is
    # cased and the first one after it is not (Unicode's Final_Sigma). `unicodedata` does not
    # expose Cased/Case_Ignorable, so ask `str.lower` itself: with an uncased '1' in front,
    # 'Σ' after c is final iff c is cased and not ignorable; with a cased 'A' in front it is
    # final iff c is cased or ignorable.
    cased, ignorable = [], []
    for cp in probe:
        char = chr(cp)
        if ("1" + char + "Σ").lower()[-1] == "ς":
            cased.append(cp)
        elif ("A" + char + "Σ").lower()[-1] == "ς":
            ignorable.append(cp)  # includes the few characters that are also cased
    cjk = (cp for lo, hi in sorted(_CJK_RANGES) for cp in range(lo, hi + 1))
    return _CharClasses(
        removed=_class_body(removed),
        whitespace=_class_body(whitespace),
        punctuation=_class_body(punctuation),
        cjk=_class_body(cjk),
        nonspacing_marks=_class_body(marks),
        cased=_class_body(cased),
        case_ignorable=_class_body(ignorable),
    )


def _build_pipeline(
    vocab: dict[str, int], do_lower_case: bool, max_input_chars_per_word: int
) -> Tokenizer:
    """The original BasicTokenizer + WordpieceTokenizer as one Rust `Tokenizer`."""
    classes = _char_classes()
    steps = [
        normalizers.Replace(Regex(f"[{classes.removed}]"), ""),
        normalizers.Replace(Regex(f"[{classes.whitespace}]"), " "),
    ]
    if do_lower_case:
        # `Lowercase` maps characters one by one; Python's `str.lower` (the original's) turns
        # a word-final capital sigma into 'ς'. `\K` keeps the context out of the replacement.
        cased, ignorable = classes.cased, classes.case_ignorable
        final_sigma = f"[{cased}][{ignorable}]*\\K\\x{{3A3}}(?![{ignorable}]*[{cased}])"
        steps += [
            normalizers.Replace(Regex(final_sigma), "\u03c2"),
            normalizers.Lowercase(),
            normalizers.NFD(),
            normalizers.Replace(Regex(f"[{classes.nonspacing_marks}]"), ""),
        ]
    tokenizer = Tokenizer(
        models.WordPiece(
            vocab,
            unk_token=UNK_TOKEN,
            max_input_chars_per_word=max_input_chars_per_word,
            continuing_subword_prefix="##",
        )
    )
    tokenizer.normalizer = normalizers.Sequence(steps)
    # Splitting after lower-casing is equivalent to the original's order (isolate CJK, split
    # on whitespace, lower-case each word, split punctuation): lower-casing and NFD neither
    # create nor remove whitespace or punctuation, and NFD maps CJK ideographs to CJK ideographs.
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Split(
                Regex(f"[{classes.punctuation}{classes.cjk}]"), behavior="isolated"
            ),
        ]
    )
    return tokenizer


# ----------------------------------------------------------------------------------- vocab files


def _read_bytes(path: str, what: str) -> bytes:
    """A local file's bytes, or through `tf.io.gfile` a URL's (gs://..., file://...)."""
    if "://" in path:
        import tensorflow as tf  # only for URLs: local files need no TensorFlow import

        if not tf.io.gfile.exists(path) or tf.io.gfile.isdir(path):
            raise FileNotFoundError(f"{what} not found: {path}")
        with tf.io.gfile.GFile(path, "rb") as f:
            return f.read()
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{what} not found: {path}")
    with open(path, "rb") as f:
        return f.read()


def load_vocab(vocab_file: str) -> list[str]:
    """Reads a WordPiece vocab: one token per line, id = line number - 1.

    Like the original, each line is stripped of surrounding whitespace and kept otherwise
    intact (a blank line is the token ''); only '\\n' ends a line. A UTF-8 byte-order mark is
    dropped (the original would keep it glued to the first token, which no text can match).

    Args:
        vocab_file: path to vocab.txt: local, or a URL `tf.io.gfile` reads (gs://...).

    Returns:
        The tokens in id order.

    Raises:
        FileNotFoundError: the file does not exist.
        VocabError: the file is not UTF-8, is empty, repeats a token, or lacks one of
            [PAD] [UNK] [CLS] [SEP] [MASK].
    """
    data = _read_bytes(vocab_file, "vocab file")
    tokens: list[str] = []
    first_line: dict[str, int] = {}
    with io.BytesIO(data) as f:  # lines end at b"\n" only, as when iterating a binary file
        for line_no, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise VocabError(f"{vocab_file}:{line_no}: not valid UTF-8 ({e.reason})") from e
            if line_no == 1:
                line = line.removeprefix("\ufeff")
            token = line.strip()
            if token in first_line:
                raise VocabError(
                    f"{vocab_file}:{line_no}: duplicate token {token!r} "
                    f"(first on line {first_line[token]})"
                )
            first_line[token] = line_no
            tokens.append(token)
    if not tokens:
        raise VocabError(f"vocab file is empty: {vocab_file}")
    missing = [t for t in SPECIAL_TOKENS if t not in first_line]
    if missing:
        raise VocabError(f"{vocab_file}: missing special tokens {' '.join(missing)}")
    return tokens


def _check_texts(texts: Sequence[str]) -> None:
    """Explains the Rust binding's bare TypeError on a non-str or a lone surrogate."""
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"text {i} is a {type(text).__name__}, expected str")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(
                f"text {i} holds a lone surrogate at character {e.start}: not valid Unicode"
            ) from e


# ------------------------------------------------------------------------------- tokenizers


class _Tokenizer:
    """What both tokenizers share: the id <-> token maps and the special ids.

    A subclass sets `vocab` (token -> id, with [PAD] [UNK] [CLS] [SEP] [MASK]), `inv_vocab`
    (id -> token), `vocab_size`, `vocab_file` and `do_lower_case`.
    """

    _UNIT = "token"  # what an error calls one entry of the vocabulary

    vocab: dict[str, int]
    inv_vocab: list[str]
    vocab_size: int
    vocab_file: str
    do_lower_case: bool

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.vocab_file!r}, do_lower_case={self.do_lower_case}, "
            f"vocab_size={self.vocab_size})"
        )

    def convert_tokens_to_ids(self, tokens: Iterable[str]) -> list[int]:
        """Tokens -> ids; an unknown token is a KeyError, as in the original."""
        vocab = self.vocab
        try:
            return [vocab[t] for t in tokens]
        except KeyError as e:
            raise KeyError(f"{self._UNIT} {e.args[0]!r} is not in {self.vocab_file}") from None

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        """Ids -> tokens; an id outside [0, vocab_size) is an IndexError."""
        return [self.inv_vocab[_check_id(i, self.vocab_size)] for i in ids]

    @property
    def pad_id(self) -> int:
        return self.vocab[PAD_TOKEN]

    @property
    def unk_id(self) -> int:
        return self.vocab[UNK_TOKEN]

    @property
    def cls_id(self) -> int:
        return self.vocab[CLS_TOKEN]

    @property
    def sep_id(self) -> int:
        return self.vocab[SEP_TOKEN]

    @property
    def mask_id(self) -> int:
        return self.vocab[MASK_TOKEN]


def _check_id(token_id: int, vocab_size: int) -> int:
    token_id = int(token_id)
    if not 0 <= token_id < vocab_size:
        raise IndexError(f"token id {token_id} is outside the vocabulary [0, {vocab_size})")
    return token_id


class WordPieceTokenizer(_Tokenizer):
    """The original BERT `FullTokenizer` (basic + WordPiece) on a Rust pipeline.

    Attributes:
        vocab: token -> id.
        inv_vocab: id -> token.
        vocab_size: number of ids.
        do_lower_case: lower-case and strip accents before splitting (uncased models).
    """

    def __init__(
        self,
        vocab_file: str,
        do_lower_case: bool = True,
        max_input_chars_per_word: int = MAX_INPUT_CHARS_PER_WORD,
    ):
        """Loads vocab.txt and builds the pipeline.

        Args:
            vocab_file: one token per line; must contain [PAD] [UNK] [CLS] [SEP] [MASK].
            do_lower_case: True for uncased vocabularies, as the original flag.
            max_input_chars_per_word: longer words become [UNK] (200 in the original).
        """
        self.vocab_file = vocab_file
        self._setup(load_vocab(vocab_file), do_lower_case, max_input_chars_per_word)

    def _setup(self, tokens: list[str], do_lower_case: bool, max_chars: int) -> None:
        self.inv_vocab = tokens
        self.vocab = {token: i for i, token in enumerate(tokens)}
        self.vocab_size = len(tokens)
        self.do_lower_case = do_lower_case
        self.max_input_chars_per_word = max_chars
        self.special_ids = frozenset(self.vocab[t] for t in SPECIAL_TOKENS)
        self._rust = _build_pipeline(self.vocab, do_lower_case, max_chars)

    # Pickling (spawned workers) rebuilds the pipeline from the token list.
    def __getstate__(self) -> dict:
        return {
            "vocab_file": self.vocab_file,
            "tokens": self.inv_vocab,
            "do_lower_case": self.do_lower_case,
            "max_input_chars_per_word": self.max_input_chars_per_word,
        }

    def __setstate__(self, state: dict) -> None:
        self.vocab_file = state["vocab_file"]
        self._setup(state["tokens"], state["do_lower_case"], state["max_input_chars_per_word"])

    def tokenize(self, text: str) -> list[str]:
        """Text -> WordPiece tokens, as the original `FullTokenizer.tokenize`."""
        return self._encode_one(text).tokens

    def tokenize_batch(self, texts: Sequence[str]) -> list[list[str]]:
        """Many texts at once, encoded in parallel in Rust."""
        inv = self.inv_vocab
        return [[inv[i] for i in ids] for ids in self.encode_batch(texts)]

    def encode(self, text: str) -> list[int]:
        """Text -> token ids, without [CLS]/[SEP]."""
        return self._encode_one(text).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Many texts -> token ids, encoded in parallel in Rust."""
        texts = list(texts)
        try:
            encodings = self._rust.encode_batch_fast(texts, add_special_tokens=False)
        except TypeError:
            _check_texts(texts)
            raise
        return [e.ids for e in encodings]

    def _encode_one(self, text: str):
        try:
            return self._rust.encode(text, add_special_tokens=False)
        except TypeError:
            _check_texts([text])
            raise

    def is_continuation(self, token: str) -> bool:
        """True for a piece that continues a word ('##ing'); whole-word masking groups them."""
        return token.startswith("##")


# The original's name, for scripts ported from google-research/bert.
FullTokenizer = WordPieceTokenizer


_WORD_START = "\u2581"  # sentencepiece's '▁', which begins every piece that starts a word


class SentencePieceTokenizer(_Tokenizer):
    """A sentencepiece model behind the same interface as `WordPieceTokenizer`.

    The model must contain [CLS] [SEP] [MASK] as user-defined or control pieces (train with
    `user_defined_symbols=["[CLS]", "[SEP]", "[MASK]"]`) and have a pad id (`pad_id=...`);
    the names [PAD] and [UNK] map to the model's pad and unk ids. User-defined pieces are
    matched in raw text by sentencepiece, so a literal "[MASK]" in the input stays one piece.

    Attributes:
        vocab: piece -> id, plus the aliases [PAD] and [UNK] (so it may hold 2 more keys
            than vocab_size).
        inv_vocab: id -> piece.
        vocab_size: number of ids.
        do_lower_case: lower-case the text before encoding.
    """

    _UNIT = "piece"

    def __init__(self, model_file: str, do_lower_case: bool = True):
        """Loads a sentencepiece `.model` file.

        Args:
            model_file: path to the `.model` file.
            do_lower_case: apply `str.lower` to the text before encoding.
        """
        proto = _read_bytes(model_file, "sentencepiece model")
        self.vocab_file = model_file
        self._setup(proto, do_lower_case)

    def _setup(self, proto: bytes, do_lower_case: bool) -> None:
        name = self.vocab_file
        try:
            self._sp = spm.SentencePieceProcessor(model_proto=proto)
        except (RuntimeError, OSError) as e:
            raise VocabError(f"{name}: not a sentencepiece model ({e})") from e
        self._proto = proto
        self.do_lower_case = do_lower_case
        sp = self._sp
        self.vocab_size = sp.get_piece_size()
        self.inv_vocab = [sp.id_to_piece(i) for i in range(self.vocab_size)]
        self.vocab = {piece: i for i, piece in enumerate(self.inv_vocab)}
        if sp.pad_id() < 0:
            raise VocabError(f"{name}: the model has no pad piece (train with pad_id=...)")
        self.vocab.setdefault(PAD_TOKEN, sp.pad_id())
        self.vocab.setdefault(UNK_TOKEN, sp.unk_id())
        if self.vocab[PAD_TOKEN] != sp.pad_id() or self.vocab[UNK_TOKEN] != sp.unk_id():
            raise VocabError(f"{name}: [PAD]/[UNK] are pieces other than the pad/unk ids")
        missing = [t for t in (CLS_TOKEN, SEP_TOKEN, MASK_TOKEN) if not self._is_symbol(t)]
        if missing:
            raise VocabError(
                f"{name}: missing special tokens {' '.join(missing)} as user-defined or "
                "control pieces (train with user_defined_symbols=[...])"
            )
        self.special_ids = frozenset(self.vocab[t] for t in SPECIAL_TOKENS)

    def _is_symbol(self, piece: str) -> bool:
        """Whether `piece` is a control or user-defined piece (never produced by training)."""
        i = self.vocab.get(piece)
        if i is None:
            return False
        if self._sp.is_control(i):
            return True
        # The Python API has no is_user_defined; read the piece type from the model proto.
        from sentencepiece import sentencepiece_model_pb2  # protobuf; only needed here

        model = sentencepiece_model_pb2.ModelProto()
        model.ParseFromString(self._proto)
        return model.pieces[i].type == sentencepiece_model_pb2.ModelProto.SentencePiece.USER_DEFINED

    def __getstate__(self) -> dict:
        return {
            "vocab_file": self.vocab_file,
            "proto": self._proto,
            "do_lower_case": self.do_lower_case,
        }

    def __setstate__(self, state: dict) -> None:
        self.vocab_file = state["vocab_file"]
        self._setup(state["proto"], state["do_lower_case"])

    def _prepare(self, text: str) -> str:
        if not isinstance(text, str):
            raise TypeError(f"text is a {type(text).__name__}, expected str")
        return text.lower() if self.do_lower_case else text

    def tokenize(self, text: str) -> list[str]:
        """Text -> sentencepiece pieces."""
        return self._sp.encode(self._prepare(text), out_type=str)

    def tokenize_batch(self, texts: Sequence[str]) -> list[list[str]]:
        """Many texts -> pieces, on sentencepiece's thread pool."""
        return self._sp.encode([self._prepare(t) for t in texts], out_type=str)

    def encode(self, text: str) -> list[int]:
        """Text -> ids, without [CLS]/[SEP]."""
        return self._sp.encode(self._prepare(text), out_type=int)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Many texts -> ids, on sentencepiece's thread pool."""
        return self._sp.encode([self._prepare(t) for t in texts], out_type=int)

    def is_continuation(self, token: str) -> bool:
        """True for a piece inside a word: it does not start with '▁' and is not special."""
        return not token.startswith(_WORD_START) and self.vocab.get(token) not in self.special_ids


def load_tokenizer(
    vocab_file: str, do_lower_case: bool = True
) -> WordPieceTokenizer | SentencePieceTokenizer:
    """A `.model` file -> `SentencePieceTokenizer`, anything else -> `WordPieceTokenizer`.

    `vocab_file` is a local path or a URL that `tf.io.gfile` reads (gs://...).
    """
    if vocab_file.endswith(".model"):
        return SentencePieceTokenizer(vocab_file, do_lower_case=do_lower_case)
    return WordPieceTokenizer(vocab_file, do_lower_case=do_lower_case)


def write_class_table() -> str:
    """Scans this interpreter's Unicode classes and writes their table; returns its path."""
    path = _class_table_path(unicodedata.unidata_version)
    os.makedirs(_CLASS_TABLE_DIR, exist_ok=True)
    with open(path + ".incomplete", "w", encoding="utf-8") as f:
        json.dump(dataclasses.asdict(_scan_char_classes()), f, indent=1)
        f.write("\n")
    os.replace(path + ".incomplete", path)
    return path


if __name__ == "__main__":
    print(f"wrote {write_class_table()}")
