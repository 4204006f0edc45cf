"""Positive pairs from unlabelled text, for contrastive pretraining (issue 81).

No labels: each pair is made from one passage of a raw corpus (the pretraining format: one
sentence a line, a blank line between documents), by one of two rules:

* **independent cropping** (Contriever, Izacard et al. 2022, section 3.1): two spans of the
  passage's pieces, each of a length drawn uniformly between `crop_min_ratio` and
  `crop_max_ratio` of the passage and placed uniformly at random, independently of each
  other (they may overlap or not); each piece of a span is then dropped with probability
  `token_deletion` (Contriever's optional 10%).
* **sentence -> the rest of its passage** (the inverse cloze task of ORQA, Lee et al. 2019,
  a rule of the corpus's structure): the query is one sentence of the passage, the positive
  the passage without it, or with it left in with probability `keep_sentence` (ORQA's 10%,
  so the model also learns plain word overlap). A question about a paragraph reads like one
  of its sentences: this is the rule that fits passage retrieval.

A pair takes the sentence rule with probability `sentence_fraction` when its passage has two
sentences or more, else a crop. Passages are documents' consecutive sentences packed up to
`passage_pieces` pieces (a longer sentence is cut).

Which passages share a batch: with `passages_per_document` = 1 (Contriever's way) every
passage is seen once an epoch, in the order of a permutation from (seed, epoch), so a
batch's negatives are passages of other documents, mostly on other topics. With k > 1 a
batch is B / k documents of k passages or more, k distinct passages of each: every query
then has k - 1 negatives from its own document, on its own topic, which only finer matching
(the words the passage holds) tells apart. Retrieval among the paragraphs of one article
(SQuAD: 43 a dev article) asks for exactly that. Every random draw of a batch comes from
(seed, step, ...), so a batch is a function of the step alone: a run resumed at step s
reads what the uninterrupted run read, on any number of hosts.

Each host makes only its own rows (`PairStream.batch(step, rows)`): which passages a batch
holds is drawn for the whole batch (cheap), the pair of row r from (seed, step, r) alone, and
the batch's width from the longest text its passages can give (`PairStream.longest`), so
the hosts' rows, put end to end, are the one-host batch bit for bit.

With `mlm_predictions` (the loss's masked-LM term, `mlm_weight`) each positive is also
masked BERT's way (`masked_lm_rows`: pretraining's rules and draws, `numpy_masking`), row r
from (seed, step, r) alone, as its pair.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

import numpy as np

from data_pipelines import numpy_masking
from data_pipelines.tasks.formats import TaskDataError

# A passage shorter than this many pieces is dropped: its 10% crops would be one piece.
MIN_PASSAGE_PIECES = 8


@dataclasses.dataclass(frozen=True)
class PairRules:
    """How a pair is made from a passage (the module docstring; config keys of the same
    names in experiments/configs/embeddings_contrastive_pretraining.py)."""

    crop_min_ratio: float = 0.1  # a crop's length as a share of its passage: at least
    crop_max_ratio: float = 0.5  # ... and at most (Contriever's 10-50%)
    token_deletion: float = 0.0  # each cropped piece dropped with this probability
    sentence_fraction: float = 0.5  # share of pairs made by sentence -> rest of passage
    keep_sentence: float = 0.1  # that sentence left in its positive with this probability
    passages_per_document: int = 1  # k passages of one document in a batch (1: at random)

    def check(self) -> None:
        """One line naming the first key out of its range."""
        low, high = self.crop_min_ratio, self.crop_max_ratio
        if not 0 < low <= 1:
            raise ValueError(f"--config.crop_min_ratio={low}: a share of the passage in (0, 1]")
        if not 0 < high <= 1:
            raise ValueError(f"--config.crop_max_ratio={high}: a share of the passage in (0, 1]")
        if low > high:
            raise ValueError(f"--config.crop_min_ratio={low} > --config.crop_max_ratio={high}")
        if self.passages_per_document < 1:
            raise ValueError(f"--config.passages_per_document={self.passages_per_document}: "
                             "1 (passages at random) or more")  # fmt: skip
        for name in ("token_deletion", "sentence_fraction", "keep_sentence"):
            value = getattr(self, name)
            upper = 1.0 if name != "token_deletion" else 0.9
            if not 0 <= value <= upper:
                raise ValueError(f"--config.{name}={value}: a probability in [0, {upper}]")


def read_documents(path: str | os.PathLike) -> list[list[str]]:
    """The documents of a corpus file: one sentence a line, blank lines between documents.

    Raises:
        FileNotFoundError / IsADirectoryError naming the path; TaskDataError naming the file
        and line of text that is not UTF-8, or a file with no text.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path} is a directory; a corpus is a text file (one "
                                "sentence a line, a blank line between documents)")  # fmt: skip
    documents: list[list[str]] = [[]]
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8-sig" if number == 1 else "utf-8").strip()
            except UnicodeDecodeError as error:
                raise TaskDataError(f"{path}:{number}: not UTF-8 ({error.reason} at byte "
                                    f"{error.start})") from None  # fmt: skip
            if line:
                documents[-1].append(line)
            elif documents[-1]:
                documents.append([])
    documents = [d for d in documents if d]
    if not documents:
        raise TaskDataError(f"{path}: no text (one sentence a line, blank lines between "
                            "documents)")  # fmt: skip
    return documents


@dataclasses.dataclass(frozen=True)
class Passages:
    """Each passage as its sentences' piece ids (no special tokens), and its document's
    index."""

    sentences: list[list[np.ndarray]]
    documents: list[int]

    def __len__(self) -> int:
        return len(self.sentences)


def make_passages(documents: Sequence[Sequence[str]], tokenizer, passage_pieces: int) -> Passages:
    """Documents' consecutive sentences packed into passages of at most `passage_pieces`
    pieces; passages under MIN_PASSAGE_PIECES pieces dropped."""
    flat = [s for d in documents for s in d]
    encoded = iter(tokenizer.encode_batch(flat))
    passages: list[tuple[list[np.ndarray], int]] = []
    for d, document in enumerate(documents):
        current: list[np.ndarray] = []
        size = 0
        for _ in document:
            ids = np.asarray(next(encoded), np.int32)[:passage_pieces]
            if not len(ids):
                continue
            if current and size + len(ids) > passage_pieces:
                passages.append((current, d))
                current, size = [], 0
            current.append(ids)
            size += len(ids)
        if current:
            passages.append((current, d))
    kept = [(p, d) for p, d in passages if sum(map(len, p)) >= MIN_PASSAGE_PIECES]
    return Passages([p for p, _ in kept], [d for _, d in kept])


def _crop(rng: np.random.Generator, pieces: np.ndarray, rules: PairRules) -> np.ndarray:
    n = len(pieces)
    ratio = rng.uniform(rules.crop_min_ratio, rules.crop_max_ratio)
    length = min(n, max(1, int(round(ratio * n))))
    start = int(rng.integers(0, n - length + 1))
    span = pieces[start : start + length]
    if rules.token_deletion:
        kept = span[rng.random(len(span)) >= rules.token_deletion]
        span = kept if len(kept) else span[:1]
    return span


def make_pair(
    rng: np.random.Generator, sentences: list[np.ndarray], rules: PairRules
) -> tuple[np.ndarray, np.ndarray, str]:
    """(query pieces, positive pieces, rule) of one passage by `rules`."""
    if len(sentences) >= 2 and rng.random() < rules.sentence_fraction:
        i = int(rng.integers(len(sentences)))
        keep = rng.random() < rules.keep_sentence
        rest = [s for j, s in enumerate(sentences) if keep or j != i]
        return sentences[i], np.concatenate(rest), "sentence"
    pieces = np.concatenate(sentences)
    return _crop(rng, pieces, rules), _crop(rng, pieces, rules), "crop"


def masked_lm_rows(
    tokens: np.ndarray, mask: np.ndarray, rows: Sequence[int], tokenizer, *, seed: int,
    step: int, predictions: int,
) -> dict[str, np.ndarray]:  # fmt: skip
    """The (n, T) texts `tokens` (`mask` 1 on real tokens) of global rows `rows` masked as
    pretraining masks (`numpy_masking.mask_batch`: 15% of a row's tokens chosen, [CLS] and
    [SEP] never, 80% [MASK] / 10% a random real token / 10% kept), row r's draws from
    (seed, step, r) alone: `mlm_tokens` (n, T), `mlm_positions`, `mlm_ids` (n, P) and
    `mlm_weights` (n, P) float32, P = `predictions`."""
    keys = ("input_ids", "masked_lm_positions", "masked_lm_ids", "masked_lm_weights")
    out: dict[str, list[np.ndarray]] = {k: [] for k in keys}
    lengths = np.asarray(mask).sum(-1)
    for i, row in enumerate(rows):
        masked = numpy_masking.mask_batch(
            tokens[i : i + 1], None, [tokenizer.cls_id, tokenizer.sep_id], lengths[i : i + 1],
            numpy_masking.masking_rng(seed, step, row), vocab_size=tokenizer.vocab_size,
            mask_id=tokenizer.mask_id, max_predictions_per_seq=predictions,
            replacement_ids=tokenizer.replacement_ids,
        )  # fmt: skip
        for k in keys:
            out[k].append(masked[k])
    names = dict(zip(keys, ("mlm_tokens", "mlm_positions", "mlm_ids", "mlm_weights"), strict=True))
    dtypes = dict.fromkeys(keys, np.int32) | {"masked_lm_weights": np.float32}
    return {names[k]: np.concatenate(out[k]).astype(dtypes[k]) for k in keys}


def padded_width(longest: int, max_length: int, multiple: int) -> int:
    """A batch's token width: its longest text rounded up to `multiple` (16; splash
    attention's tiles need 128: `bert_jax.embeddings_train.width_multiple`), at most
    `max_length`."""
    return min(max_length, -(-max(longest, 1) // multiple) * multiple)


class PairStream:
    """The contrastive batches of a corpus, a pure function of the step (module docstring).

    Args:
        passages: `make_passages`' output.
        tokenizer: gives the special tokens ([CLS] pieces [SEP]) and the pad id.
        rules: `PairRules`.
        batch_size: pairs a step (the global batch).
        query_length / passage_length: the longest query / positive in tokens, special
            tokens included; longer ones are cut.
        seed: the data order's and the draws' seed.
        multiple: a batch's widths are rounded up to a multiple of this (`padded_width`).
        mlm_predictions: P > 0: the positives also masked (`masked_lm_rows`); 0: not.
    """

    def __init__(
        self, passages: Passages, tokenizer, rules: PairRules, batch_size: int,
        query_length: int, passage_length: int, seed: int, source: str = "corpus",
        multiple: int = 16, mlm_predictions: int = 0,
    ):  # fmt: skip
        rules.check()
        k = rules.passages_per_document
        if len(passages) < batch_size:
            raise ValueError(
                f"{source}: {len(passages)} passages of {MIN_PASSAGE_PIECES}+ pieces, fewer "
                f"than --config.global_batch_size={batch_size} (each pair of a batch needs "
                "a passage of its own)"
            )
        if batch_size % k:
            raise ValueError(f"--config.passages_per_document={k} does not divide "
                             f"--config.global_batch_size={batch_size}")  # fmt: skip
        by_document: dict[int, list[int]] = {}
        for i, d in enumerate(passages.documents):
            by_document.setdefault(d, []).append(i)
        # The documents a batch can draw k passages from (k = 1 draws passages, not these).
        self.groups = [np.asarray(ids) for ids in by_document.values() if len(ids) >= k]
        if k > 1 and len(self.groups) < batch_size // k:
            raise ValueError(
                f"{source}: {len(self.groups)} documents hold {k}+ passages, fewer than the "
                f"{batch_size // k} a batch of {batch_size} needs at "
                f"--config.passages_per_document={k}"
            )
        self.passages, self.tokenizer, self.rules = passages, tokenizer, rules
        self.batch_size, self.seed, self.multiple = batch_size, seed, multiple
        self.mlm_predictions = mlm_predictions
        self.lengths = {"query": query_length, "positive": passage_length}
        units = len(passages) if k == 1 else len(self.groups)
        self.per_epoch = units // (batch_size // k)
        self.longest = self._longest()
        self._order: tuple[int, np.ndarray] | None = None  # the last epoch's permutation

    def _longest(self) -> dict[str, np.ndarray]:
        """The longest query and positive (tokens, special ones included, cut at their
        lengths) each passage can give under the rules: a batch's widths are rounded up from
        its passages' (`batch`), which every host knows without making the others' pairs."""
        rules, special = self.rules, self.tokenizer.num_special_tokens(False)
        longest: dict[str, list[int]] = {"query": [], "positive": []}
        for sentences in self.passages.sentences:
            sizes = [len(s) for s in sentences]
            n = sum(sizes)
            # A crop keeps round(ratio x n) pieces, ratio < crop_max_ratio (+1: float slack).
            query = positive = min(n, int(rules.crop_max_ratio * n + 0.5) + 1)
            if len(sizes) >= 2 and rules.sentence_fraction > 0:
                query = max(query, max(sizes))  # one sentence
                positive = max(positive, n if rules.keep_sentence > 0 else n - min(sizes))
            longest["query"].append(query)
            longest["positive"].append(positive)
        return {kind: np.minimum(np.asarray(sizes, np.int64) + special, self.lengths[kind])
                for kind, sizes in longest.items()}  # fmt: skip

    def passage_ids(self, step: int) -> np.ndarray:
        """The passages of step `step` (0-based): epoch e's permutation (from (seed, e)) of
        the passages, or of the documents, k passages of each drawn from (seed, step)."""
        k = self.rules.passages_per_document
        per_batch = self.batch_size // k
        epoch, index = divmod(step, self.per_epoch)
        if self._order is None or self._order[0] != epoch:
            units = len(self.passages) if k == 1 else len(self.groups)
            self._order = (epoch, np.random.default_rng([self.seed, epoch]).permutation(units))
        chosen = self._order[1][index * per_batch : (index + 1) * per_batch]
        if k == 1:
            return chosen
        rng = np.random.default_rng([self.seed, step, 11])
        return np.concatenate([rng.choice(self.groups[g], k, replace=False) for g in chosen])

    def batch(self, step: int, rows: slice = slice(None)) -> dict[str, np.ndarray]:
        """Rows `rows` (this host's: `bert_jax.sharding.process_rows`; all by default) of
        the global batch of `step`: (B, T) tokens and masks of queries and positives, each
        kind padded to the longest its batch's passages can give (`longest`) rounded up to
        `multiple`, and `positive_ids` (the passages: pairs of one passage are not each
        other's negatives). Only these rows' pairs are made; any split of the rows over
        hosts gives, end to end, the whole batch."""
        ids = self.passage_ids(step)
        mine = range(len(ids))[rows]  # the global row numbers: each row's draws
        out: dict[str, np.ndarray] = {"positive_ids": ids[rows].astype(np.int32)}
        room = {}
        for kind, length in self.lengths.items():
            width = padded_width(int(self.longest[kind][ids].max()), length, self.multiple)
            out[f"{kind}_tokens"] = np.full((len(mine), width), self.tokenizer.pad_id, np.int32)
            out[f"{kind}_mask"] = np.zeros((len(mine), width), np.int32)
            room[kind] = length - self.tokenizer.num_special_tokens(False)
        for i, row in enumerate(mine):
            rng = np.random.default_rng([self.seed, step, row, 7])
            query, positive, _ = make_pair(rng, self.passages.sentences[ids[row]], self.rules)
            for kind, pieces in (("query", query), ("positive", positive)):
                tokens = self.tokenizer.with_special_tokens(pieces[: room[kind]].tolist())[0]
                out[f"{kind}_tokens"][i, : len(tokens)] = tokens
                out[f"{kind}_mask"][i, : len(tokens)] = 1
        if self.mlm_predictions:
            out |= masked_lm_rows(out["positive_tokens"], out["positive_mask"], mine,
                                  self.tokenizer, seed=self.seed, step=step,
                                  predictions=self.mlm_predictions)  # fmt: skip
        return out
