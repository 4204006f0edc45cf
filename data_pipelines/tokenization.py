"""BERT tokenizers of three kinds behind one interface, and `load_tokenizer` to pick one.

* `WordPieceTokenizer`: a WordPiece vocab.txt under the original BERT's rules, token for
  token (`wordpiece_rules` builds them as one Rust `tokenizers` pipeline).
* `SentencePieceTokenizer`: a sentencepiece `.model` with [CLS] [SEP] [MASK] pieces.
* `hf_tokenizer.HFTokenizer`: any Hugging Face `tokenizer.json` (byte-level BPE as
  ModernBERT's and RoBERTa's, Unigram, WordPiece), its special tokens named by the file
  and its `tokenizer_config.json` / `special_tokens_map.json`.

`load_tokenizer` takes a file of any kind or a directory holding one, and tells the kind
by the file's content as well as its name, so a misnamed file gets one line naming it and
the accepted kinds instead of a confusing error from the wrong reader.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Sequence

import sentencepiece as spm

from data_pipelines import wordpiece_rules
from data_pipelines.tokenizer_base import (
    ACCEPTED_KINDS,
    CLS_TOKEN,
    MASK_TOKEN,
    PAD_TOKEN,
    SEP_TOKEN,
    SPECIAL_TOKENS,
    UNK_TOKEN,
    Tokenizer,
    VocabError,
    check_texts,
    read_bytes,
)

__all__ = [
    "ACCEPTED_KINDS",
    "SPECIAL_TOKENS",
    "FullTokenizer",
    "SentencePieceTokenizer",
    "VocabError",
    "WordPieceTokenizer",
    "find_tokenizer_file",
    "load_tokenizer",
    "load_vocab",
    "resolve_tokenizer_file",
    "vocab_size_of",
]

# ----------------------------------------------------------------------------------- vocab files


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
    data = read_bytes(vocab_file, "vocab file")
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


# ------------------------------------------------------------------------------- tokenizers


class WordPieceTokenizer(Tokenizer):
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
        max_input_chars_per_word: int = wordpiece_rules.MAX_INPUT_CHARS_PER_WORD,
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
        self._rust = wordpiece_rules.build_pipeline(self.vocab, do_lower_case, max_chars)

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
            check_texts(texts)
            raise
        return [e.ids for e in encodings]

    def _encode_one(self, text: str):
        try:
            return self._rust.encode(text, add_special_tokens=False)
        except TypeError:
            check_texts([text])
            raise

    def is_continuation(self, token: str) -> bool:
        """True for a piece that continues a word ('##ing'); whole-word masking groups them."""
        return token.startswith("##")


# The original's name, for scripts ported from google-research/bert.
FullTokenizer = WordPieceTokenizer


_WORD_START = "\u2581"  # sentencepiece's '▁', which begins every piece that starts a word


class SentencePieceTokenizer(Tokenizer):
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
        proto = read_bytes(model_file, "sentencepiece model")
        self.vocab_file = model_file
        self._setup(proto, do_lower_case)

    def _setup(self, proto: bytes, do_lower_case: bool) -> None:
        name = self.vocab_file
        try:
            self._sp = spm.SentencePieceProcessor(model_proto=proto)
        except (RuntimeError, OSError) as e:
            raise VocabError(f"{name}: not a sentencepiece model ({e}); {ACCEPTED_KINDS}") from e
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

    def pieces_text(self, pieces: Sequence[str]) -> str:
        """The text the pieces spell: each '▁' is the space before a word."""
        return " ".join("".join(pieces).replace(_WORD_START, " ").split())

    def is_continuation(self, token: str) -> bool:
        """True for a piece inside a word: it does not start with '▁' and is not special."""
        return not token.startswith(_WORD_START) and self.vocab.get(token) not in self.special_ids


# A directory's tokenizer, in the order looked for: vocab.txt first, so that a BERT directory
# (which often has a tokenizer.json too) keeps the original's rules.
VOCAB_NAME = "vocab.txt"
HF_NAME = "tokenizer.json"
SENTENCEPIECE_SUFFIX = ".model"

AnyTokenizer = Tokenizer  # WordPieceTokenizer | SentencePieceTokenizer | HFTokenizer


def find_tokenizer_file(directory: str) -> str | None:
    """The tokenizer file in a local `directory`: vocab.txt, else tokenizer.json, else its
    one `*.model`; None when it holds none of them (or several `.model` files)."""
    for name in (VOCAB_NAME, HF_NAME):
        if os.path.isfile(os.path.join(directory, name)):
            return os.path.join(directory, name)
    models = sorted(n for n in os.listdir(directory) if n.endswith(SENTENCEPIECE_SUFFIX))
    return os.path.join(directory, models[0]) if len(models) == 1 else None


def _is_directory(path: str) -> bool:
    if "://" in path:
        import tensorflow as tf  # only for URLs

        return tf.io.gfile.isdir(path)
    return os.path.isdir(path)


def _find_in_directory(path: str) -> str | None:
    """`find_tokenizer_file`, for URLs (gs://...) by the two fixed names alone."""
    if "://" not in path:
        return find_tokenizer_file(path)
    import tensorflow as tf

    for name in (VOCAB_NAME, HF_NAME):
        if tf.io.gfile.exists(candidate := path.rstrip("/") + "/" + name):
            return candidate
    return None


def resolve_tokenizer_file(path: str) -> str:
    """`path`, or for a directory the tokenizer file in it (`find_tokenizer_file`)."""
    if not _is_directory(path):
        return path
    found = _find_in_directory(path)
    if found is None:
        raise VocabError(f"{path}: a directory with no tokenizer in it; {ACCEPTED_KINDS}")
    return found


def tokenizer_kind(path: str, data: bytes) -> str:
    """ "wordpiece", "sentencepiece" or "hf" for the file at `path` holding `data`.

    Raises:
        VocabError: a file of none of the kinds, or a sentencepiece model under another name
            (tools that copy tokenizer files, and transformers, go by the name).
    """
    if path.endswith(SENTENCEPIECE_SUFFIX):
        return "sentencepiece"
    if data.lstrip()[:1] == b"{":
        try:
            parsed = json.loads(data)
        except json.JSONDecodeError as error:
            if path.endswith(".json"):  # cut short or edited by hand: say where
                raise VocabError(
                    f"{path}: not valid JSON ({error.msg} at line {error.lineno} column "
                    f"{error.colno}): a damaged or truncated tokenizer.json"
                ) from None
            parsed = None
        except (UnicodeDecodeError, ValueError):
            parsed = None
        if isinstance(parsed, dict) and "model" in parsed:
            return "hf"
        if path.endswith(".json"):
            raise VocabError(f"{path}: a JSON file but not a tokenizer.json (no 'model'); "
                             f"{ACCEPTED_KINDS}")  # fmt: skip
    text = True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        text = False
    if text and b"\0" not in data:
        return "wordpiece"
    try:
        spm.SentencePieceProcessor(model_proto=data)
    except (RuntimeError, OSError, TypeError):
        raise VocabError(f"{path}: not a tokenizer file; {ACCEPTED_KINDS}") from None
    raise VocabError(
        f"{path}: a sentencepiece model in a file not named *{SENTENCEPIECE_SUFFIX}: rename it; "
        f"{ACCEPTED_KINDS}"
    )


def load_tokenizer(vocab_file: str, do_lower_case: bool = True) -> AnyTokenizer:
    """The tokenizer of `vocab_file`: a vocab.txt, a `.model`, a tokenizer.json or a directory.

    Args:
        vocab_file: a local path or a URL that `tf.io.gfile` reads (gs://...). A directory
            gives its vocab.txt, else its tokenizer.json, else its one `.model` file.
        do_lower_case: lower-case the text first (vocab.txt and `.model`). A tokenizer.json
            carries its own normalizer, which alone decides, as in transformers.

    Raises:
        FileNotFoundError: no such file.
        VocabError: a file of none of the kinds (one line naming it and the accepted kinds),
            or a tokenizer without the special tokens BERT needs (naming what is missing).
    """
    path = resolve_tokenizer_file(vocab_file)
    data = read_bytes(path, "vocab file")
    kind = tokenizer_kind(path, data)
    if kind == "sentencepiece":
        return SentencePieceTokenizer(path, do_lower_case=do_lower_case)
    if kind == "hf":
        from data_pipelines import hf_tokenizer

        return hf_tokenizer.HFTokenizer(path, data)
    return WordPieceTokenizer(path, do_lower_case=do_lower_case)


def vocab_size_of(vocab_file: str) -> int:
    """The number of ids of a tokenizer file of any kind (a vocab.txt's lines, as counted
    before its special tokens are checked), without building the tokenizer.

    Raises:
        VocabError: a file of none of the kinds (one line naming it and the accepted kinds).
    """
    vocab_file = resolve_tokenizer_file(vocab_file)
    data = read_bytes(vocab_file, "vocab file")
    kind = tokenizer_kind(vocab_file, data)
    if kind == "sentencepiece":
        try:
            return spm.SentencePieceProcessor(model_proto=data).get_piece_size()
        except (RuntimeError, OSError) as e:
            message = f"{vocab_file}: not a sentencepiece model ({e}); {ACCEPTED_KINDS}"
            raise VocabError(message) from None
    if kind == "hf":
        from data_pipelines import hf_tokenizer

        return hf_tokenizer.HFTokenizer(vocab_file, data).vocab_size
    return data.count(b"\n") + (not data.endswith(b"\n") and bool(data))


def files_to_copy(vocab_file: str) -> list[tuple[str, str]]:
    """(source, name in a model directory) for the tokenizer of `vocab_file`: a vocab.txt as
    vocab.txt, a `.model` under its name, a tokenizer.json with the config files beside it
    that name its special tokens (transformers needs them to know its [MASK])."""
    vocab_file = resolve_tokenizer_file(vocab_file)
    kind = tokenizer_kind(vocab_file, read_bytes(vocab_file, "vocab file"))
    if kind == "wordpiece":
        return [(vocab_file, VOCAB_NAME)]
    if kind == "sentencepiece":
        return [(vocab_file, os.path.basename(vocab_file))]
    from data_pipelines import hf_tokenizer

    beside = [os.path.join(os.path.dirname(vocab_file), n) for n in hf_tokenizer.CONFIG_FILES]
    return [(vocab_file, HF_NAME)] + [(p, os.path.basename(p)) for p in beside if os.path.isfile(p)]
