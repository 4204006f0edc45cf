"""Documents -> tokenized chunks: every token of a chunk in flat arrays, with word starts.

`DocumentTokenizer` tokenizes a chunk of documents in batches (in Rust) and marks for
whole-word masking the tokens that start a word (`word_starts`): 1 on the first token of a
word, 0 on the pieces after it. Where a word is comes from, first found:

* a word segmentation the document carries (Chinese, `Document.words`): each segmented
  word is tokenized on its own and its first token starts it;
* the tokenizer's own pre-tokenization, for a Hugging Face tokenizer.json (byte-level BPE,
  Unigram, WordPiece alike): a token starts a word when its pre-tokenized word differs
  from the previous token's (`encode_batch_with_word_starts`);
* otherwise the token itself: a WordPiece continuation ('##ing') or a sentencepiece piece
  without the leading '▁' continues a word (`is_continuation`).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from data_pipelines import ascii_words
from data_pipelines.corpora import Document

# A segment (a tokenized sentence) as (start, length) in its chunk's flat token array.
Segment = tuple[int, int]


class Tokenizer(Protocol):
    """What instance creation needs from `data_pipelines.tokenization`'s tokenizers."""

    cls_id: int
    sep_id: int
    vocab_size: int

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]: ...

    def is_continuation(self, token: str) -> bool: ...


@dataclasses.dataclass
class TokenizedChunk:
    """The tokenized documents of one chunk: all tokens in flat arrays, sentences as ranges.

    Keeping tokens in two flat arrays and documents as (start, length) ranges makes the
    pairing algorithm move a few integers per sentence instead of copying token lists,
    and lets `assemble` build the padded instances with vectorised gathers.
    """

    token_ids: np.ndarray  # (S,) int32, every token of the chunk
    word_starts: np.ndarray  # (S,) int32, 1 where a token starts a word
    documents: list[list[Segment]]  # per document, its non-empty sentences


@dataclasses.dataclass
class InstanceStats:
    """Counts for the stats JSON."""

    documents: int = 0
    sentences: int = 0
    tokens: int = 0  # tokens in the tokenized documents (one pass, before duplication)
    # Sentences with more tokens than fit in one instance (max_seq_length - 3): their
    # tokens get truncated wherever they are used.
    overlong_sentences: int = 0
    one_sentence_documents: int = 0
    # Documents dropped because no sentence of theirs has a token.
    empty_documents: int = 0
    instances: int = 0
    random_next: int = 0
    # Random-next instances that had no choice: a single sentence was accumulated (the end
    # of a document, or one sentence at least as long as the target), as in the original.
    forced_random_next: int = 0
    truncated_instances: int = 0
    truncated_tokens: int = 0
    # Instance tokens (including [CLS]/[SEP]), summed over instances.
    instance_tokens: int = 0

    def merge(self, other: InstanceStats) -> None:
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))


def chunk_from_token_lists(
    documents: Sequence[Sequence[Sequence[int]]],
    word_starts: Sequence[Sequence[Sequence[int]]] | None = None,
) -> TokenizedChunk:
    """A chunk from documents given as lists of sentences of token ids (drops empties).

    Args:
        documents: per document, per sentence, the token ids.
        word_starts: the same nesting of word-start flags; all ones when None.
    """
    flat_ids: list[int] = []
    flat_starts: list[int] = []
    chunk_documents: list[list[Segment]] = []
    for d, document in enumerate(documents):
        segments = []
        for s, ids in enumerate(document):
            if not len(ids):
                continue
            segments.append((len(flat_ids), len(ids)))
            flat_ids.extend(ids)
            flat_starts.extend(word_starts[d][s] if word_starts is not None else [1] * len(ids))
        if segments:
            chunk_documents.append(segments)
    return TokenizedChunk(
        np.asarray(flat_ids, np.int32).reshape(-1),
        np.asarray(flat_starts, np.int32).reshape(-1),
        chunk_documents,
    )


class DocumentTokenizer:
    """Tokenizes chunks of documents, batched in Rust, into a `TokenizedChunk`.

    Word starts as the module docstring says.

    Args:
        tokenizer: from `data_pipelines.tokenization.load_tokenizer`.
    """

    def __init__(self, tokenizer: Tokenizer):
        self._tokenizer = tokenizer
        # A tokenizer that reports its pre-tokenized words (tokenizer.json) marks starts itself.
        self._with_starts = getattr(tokenizer, "encode_batch_with_word_starts", None)
        vocab = tokenizer.convert_ids_to_tokens(range(tokenizer.vocab_size))
        self._starts_by_id = np.asarray(
            [0 if tokenizer.is_continuation(t) else 1 for t in vocab], np.int32
        )
        self._words = ascii_words.AsciiWordCache.for_tokenizer(tokenizer)

    def __call__(
        self, documents: Sequence[Document], stats: InstanceStats, max_num_tokens: int
    ) -> TokenizedChunk:
        """Tokenizes documents; drops empty sentences and documents (counted in `stats`)."""
        if self._words is not None and all(d.words is None for d in documents):
            return self._tokenize_plain(documents, stats, max_num_tokens)
        plain = [s for d in documents if d.words is None for s in d.sentences]
        if self._with_starts is not None:
            plain_encoded = zip(*self._with_starts(plain), strict=True)
        else:
            plain_encoded = ((ids, None) for ids in self._tokenizer.encode_batch(plain))
        word_table = self._tokenize_words([d for d in documents if d.words is not None])

        # Sentence by sentence: (ids, starts or None for "look them up by id").
        sentences: list[tuple[list[int], list[int] | None]] = []
        doc_sizes: list[int] = []
        for document in documents:
            before = len(sentences)
            if document.words is not None:
                for words in document.words:
                    pieces = [word_table[w] for w in words]
                    ids = [i for word_ids, _ in pieces for i in word_ids]
                    if ids:
                        sentences.append((ids, [f for _, starts in pieces for f in starts]))
            else:
                for _ in document.sentences:
                    ids, starts = next(plain_encoded)
                    if ids:
                        sentences.append((ids, starts))
            doc_sizes.append(len(sentences) - before)

        lengths = np.fromiter((len(ids) for ids, _ in sentences), np.int64, len(sentences))
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        total = int(offsets[-1])
        token_ids = np.fromiter(
            itertools.chain.from_iterable(ids for ids, _ in sentences), np.int32, total
        )
        word_starts = self._starts_by_id[token_ids]
        for (_, starts), start, length in zip(sentences, offsets[:-1], lengths, strict=True):
            if starts is not None:
                word_starts[start : start + length] = starts

        chunk_documents: list[list[Segment]] = []
        index = 0
        for size in doc_sizes:
            segments = [(int(offsets[i]), int(lengths[i])) for i in range(index, index + size)]
            index += size
            if segments:
                chunk_documents.append(segments)
                stats.one_sentence_documents += size == 1
            else:
                stats.empty_documents += 1
        stats.documents += len(chunk_documents)
        stats.sentences += len(sentences)
        stats.tokens += total
        stats.overlong_sentences += int((lengths > max_num_tokens).sum())
        return TokenizedChunk(token_ids, word_starts, chunk_documents)

    def _tokenize_plain(
        self, documents: Sequence[Document], stats: InstanceStats, max_num_tokens: int
    ) -> TokenizedChunk:
        """`__call__` for documents without word segmentations, on flat arrays throughout."""
        assert self._words is not None
        token_ids, lengths = self._words.encode_flat([s for d in documents for s in d.sentences])
        starts = np.cumsum(lengths) - lengths
        chunk_documents: list[list[Segment]] = []
        index = 0
        for document in documents:
            end = index + len(document.sentences)
            segments = [
                (start, length)
                for start, length in zip(
                    starts[index:end].tolist(), lengths[index:end].tolist(), strict=True
                )
                if length
            ]
            index = end
            if segments:
                chunk_documents.append(segments)
                stats.one_sentence_documents += len(segments) == 1
            else:
                stats.empty_documents += 1
        stats.documents += len(chunk_documents)
        stats.sentences += int(np.count_nonzero(lengths))
        stats.tokens += len(token_ids)
        stats.overlong_sentences += int((lengths > max_num_tokens).sum())
        return TokenizedChunk(token_ids, self._starts_by_id[token_ids], chunk_documents)

    def _tokenize_words(self, documents: Sequence[Document]) -> dict[str, tuple[list, list]]:
        """Each distinct word of the documents -> (its ids, its starts: 1 then 0s)."""
        unique = sorted({w for d in documents for words in d.words or () for w in words})
        table = {}
        for word, ids in zip(unique, self._tokenizer.encode_batch(unique), strict=True):
            table[word] = (ids, [1] + [0] * (len(ids) - 1) if ids else [])
        return table
