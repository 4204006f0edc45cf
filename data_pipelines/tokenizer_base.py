"""What every tokenizer of `data_pipelines.tokenization` shares: the id maps, the special ids,
the ids masking may put in at random, how one text or a pair becomes a model's input, and
the errors a bad tokenizer file gets.

The three kinds (WordPiece vocab.txt, sentencepiece .model, Hugging Face tokenizer.json) live
in `tokenization` and `hf_tokenizer`; this module is below both.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable, Sequence

import numpy as np

PAD_TOKEN = "[PAD]"
UNK_TOKEN = "[UNK]"
CLS_TOKEN = "[CLS]"
SEP_TOKEN = "[SEP]"
MASK_TOKEN = "[MASK]"
SPECIAL_TOKENS = (PAD_TOKEN, UNK_TOKEN, CLS_TOKEN, SEP_TOKEN, MASK_TOKEN)

# Said by every error about a file that is no tokenizer, so the user learns what would do.
ACCEPTED_KINDS = (
    "expected a WordPiece vocab.txt (UTF-8, one token per line), a sentencepiece .model, "
    "a Hugging Face tokenizer.json, or a directory holding one"
)

# Reserved slots ([unused0] in BERT's vocabularies and ours, <unused0> in Gemma's): never
# seen in training text, so no random replacement should put them in.
_UNUSED = re.compile(r"\[unused\d+\]|<unused\d+>")


# One slot of a model input's template: a special token's id, or "A" / "B" for the pieces of
# the first / second text; with the token type id the slot's tokens get.
Slot = tuple[int | str, int]


class VocabError(ValueError):
    """A vocabulary (or tokenizer file) that cannot serve as a BERT tokenizer's."""


def read_bytes(path: str, what: str) -> bytes:
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


def check_texts(texts: Sequence[str]) -> None:
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


def truncate_pair(a: list[int], b: list[int], max_length: int) -> None:
    """The original BERT's pair truncation: pops the last piece of the longer list (B on
    ties) until both fit, in place."""
    while len(a) + len(b) > max_length:
        (a if len(a) > len(b) else b).pop()


def check_id(token_id: int, vocab_size: int) -> int:
    token_id = int(token_id)
    if not 0 <= token_id < vocab_size:
        raise IndexError(f"token id {token_id} is outside the vocabulary [0, {vocab_size})")
    return token_id


class Tokenizer:
    """What all tokenizers share: the id <-> token maps and the special ids.

    A subclass sets `vocab` (token -> id), `inv_vocab` (id -> token), `vocab_size`,
    `vocab_file`, `do_lower_case` and `special_ids` (ids of tokens that are not text); the
    role ids (`cls_id` ...) default to the BERT names [CLS] [SEP] [MASK] [PAD] [UNK].
    """

    _UNIT = "token"  # what an error calls one entry of the vocabulary

    vocab: dict[str, int]
    inv_vocab: list[str]
    vocab_size: int
    vocab_file: str
    do_lower_case: bool | None
    special_ids: frozenset[int]

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
        return [self.inv_vocab[check_id(i, self.vocab_size)] for i in ids]

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

    def encode_words(self, words: Sequence[str], after_space: bool = False) -> list[list[int]]:
        """Each word's ids (no special tokens) as the word tokenizes inside the text
        `" ".join(words)`, preceded by a space when `after_space` (an answer inside its
        context); for word-level tasks (SQuAD's whitespace words, a tagger's words).

        WordPiece splits a text at spaces before anything else, and sentencepiece's dummy
        prefix '▁' stands for the space before every word, so a word alone gives the
        pieces it has in the text: this is `encode_batch(words)`.
        """
        del after_space
        return self.encode_batch(words)

    @functools.cached_property
    def replacement_ids(self) -> np.ndarray:
        """(R,) int32, ascending: the ids masking's 10% random replacement draws from.

        Real tokens only: a special token ([CLS], [MASK], <pad> ...) or a reserved slot
        ([unusedN], the padding of a vocabulary to a multiple of 64) in the input teaches
        the model nothing about text, and those slots' embeddings are never trained
        otherwise. (The original BERT drew from the whole vocabulary.)
        """
        special = self.special_ids
        ids = [
            i for i, t in enumerate(self.inv_vocab) if i not in special and not _UNUSED.fullmatch(t)
        ]
        return np.asarray(ids, np.int32)

    # --- model inputs: one text or a pair with the special tokens the model was trained on ---

    def template(self, pair: bool) -> tuple[Slot, ...]:
        """The slots of a model input (`Slot`): BERT's `[CLS] A [SEP]`, and for a pair
        `[CLS] A [SEP] B [SEP]` with token types 0 up to the first [SEP], 1 after it."""
        cls, sep = self.cls_id, self.sep_id
        if pair:
            return ((cls, 0), ("A", 0), (sep, 0), ("B", 1), (sep, 1))
        return ((cls, 0), ("A", 0), (sep, 0))

    def num_special_tokens(self, pair: bool) -> int:
        """Special tokens `template(pair)` adds to the text's pieces."""
        return sum(not isinstance(token, str) for token, _ in self.template(pair))

    def with_special_tokens(
        self, a: Sequence[int], b: Sequence[int] | None = None
    ) -> tuple[list[int], list[int], int]:
        """(input ids, token type ids, index of B's first piece; len(ids) without B) of the
        pieces `a` (and `b`) laid out by `template`."""
        ids: list[int] = []
        type_ids: list[int] = []
        b_start = None
        for token, type_id in self.template(b is not None):
            if token == "B":
                b_start = len(ids)
            pieces = a if token == "A" else b if token == "B" else (token,)
            ids += pieces
            type_ids += [type_id] * len(pieces)
        return ids, type_ids, len(ids) if b_start is None else b_start

    def encode_for_model_batch(
        self, texts: Sequence[str], pairs: Sequence[str | None] | None, max_length: int
    ) -> list[tuple[list[int], list[int], bool]]:
        """(input ids, token type ids, whether it was cut) of each text, or of each pair
        where `pairs` has a second text (None: a single text there), cut to `max_length`
        tokens in all: a single text keeps its first pieces, a pair loses pieces as the
        original BERT's `truncate_pair` says (transformers' slow BertTokenizer's
        `truncation=True` alike; its fast one gives the extra piece to B on an odd tie)."""
        pairs = self._check_room(texts, pairs, max_length)
        pieces_a = self.encode_batch(texts)
        pieces_b = self.encode_batch([p or "" for p in pairs])
        out = []
        for a, b, pair in zip(pieces_a, pieces_b, pairs, strict=True):
            room = max_length - self.num_special_tokens(pair is not None)
            if pair is None:
                cut = len(a) > room
                ids, type_ids, _ = self.with_special_tokens(a[:room])
            else:
                cut = len(a) + len(b) > room
                truncate_pair(a, b, room)
                ids, type_ids, _ = self.with_special_tokens(a, b)
            out.append((ids, type_ids, cut))
        return out

    def _check_room(
        self, texts: Sequence[str], pairs: Sequence[str | None] | None, max_length: int
    ) -> list[str | None]:
        """`pairs` as a list (None: all single texts), once `max_length` leaves room for
        text beside the special tokens of each kind of input present."""
        pairs = [None] * len(texts) if pairs is None else list(pairs)
        if len(pairs) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(pairs)} second texts")
        for pair in sorted({p is not None for p in pairs}):
            if max_length <= self.num_special_tokens(pair):
                raise ValueError(
                    f"max_length={max_length} leaves no room for text beside the "
                    f"{self.num_special_tokens(pair)} special tokens of a "
                    f"{'pair' if pair else 'single text'}"
                )
        return pairs
