"""The options of `create_pretraining_data`: what decides its output, checked in one place.

Its own module so that `create_pretraining_data` (the flags, the main process) and
`chunk_pipeline` (the workers, to which the options are pickled) both import it, and
neither imports the other. Like both, it imports no TensorFlow (see
`create_pretraining_data`'s docstring): a worker process does not pay that import.
"""

from __future__ import annotations

import dataclasses

CORPORA = ("shakespeare", "peoples_daily")  # the embedded corpora `corpus` may name


@dataclasses.dataclass(frozen=True)
class Options:
    """Everything that decides the output (picklable, sent to the worker processes)."""

    input_file: str  # comma-separated files/globs, or "tfds:NAME" entries
    output_file: str  # comma-separated output files (records go round-robin)
    vocab_file: str  # WordPiece vocab.txt or sentencepiece .model
    do_lower_case: bool = True  # lower-case (and strip accents) before WordPiece
    do_whole_word_mask: bool = False  # mask whole words instead of single pieces
    max_seq_length: int = 128  # [CLS] A [SEP] B [SEP] at most this long
    max_predictions_per_seq: int = 20  # masked positions per instance at most
    random_seed: int = 12345  # seeds instance creation and masking
    dupe_factor: int = 10  # passes over the corpus (with different masks)
    masked_lm_prob: float = 0.15  # fraction of tokens to predict
    short_seq_prob: float = 0.1  # probability of a shorter target length
    num_output_shards: int = 1  # shards made from a single --output_file
    num_workers: int = 1  # processes over chunks; 1 works in this process
    masking: str = "static"  # "static": masked records; "dynamic": unmasked + word_starts
    next_sentence: bool = True  # sentence pairs with NSP labels; False: [CLS] text [SEP]
    corpus: str = ""  # an embedded corpus instead of --input_file
    documents_per_chunk: int = 256  # documents shuffled/paired together
    split_sentences: bool = False  # input lines are paragraphs: split them with pysbd
    language: str = "en"  # pysbd language for sentence splitting
    word_boundary_files: bool = False  # read word segmentations from <input>.words
    max_undecodable_fraction: float = 0.5  # refuse a file with more of its lines not UTF-8
    tfds_data_dir: str = ""  # data_dir of "tfds:" inputs
    tfds_split: str = "train"  # split of "tfds:" inputs
    tfds_text_key: str = "text"  # text feature of "tfds:" inputs
    show_progress: bool = True  # tqdm progress bar

    def validate(self) -> None:
        """Raises ValueError naming the flag of any value out of range, and the value."""
        pairs = (
            "([CLS] A [SEP] B [SEP])"
            if self.next_sentence
            else "([CLS] text [SEP], text of 2 tokens or more)"
        )
        checks = [
            ("max_seq_length", self.max_seq_length >= (5 if self.next_sentence else 4),
             f"must be >= {5 if self.next_sentence else 4} {pairs}"),
            ("max_predictions_per_seq", self.max_predictions_per_seq >= 1, "must be >= 1"),
            ("dupe_factor", self.dupe_factor >= 1, "must be >= 1"),
            ("masked_lm_prob", 0.0 < self.masked_lm_prob <= 1.0, "must be in (0, 1]"),
            ("short_seq_prob", 0.0 <= self.short_seq_prob <= 1.0, "must be in [0, 1]"),
            ("num_workers", self.num_workers >= 1, "must be >= 1"),
            ("num_output_shards", self.num_output_shards >= 1, "must be >= 1"),
            ("documents_per_chunk", self.documents_per_chunk >= 2, "must be >= 2"),
            ("max_undecodable_fraction", 0.0 <= self.max_undecodable_fraction <= 1.0,
             "must be in [0, 1]"),
            ("masking", self.masking in ("static", "dynamic"), "must be static or dynamic"),
            ("corpus", self.corpus in ("", *CORPORA), f"must be one of {CORPORA}"),
        ]  # fmt: skip
        for name, ok, requirement in checks:
            if not ok:
                raise ValueError(f"--{name} {requirement}, got {getattr(self, name)!r}")
        if bool(self.corpus) == bool(self.input_file):
            raise ValueError("give --input_file or --corpus")
        for name in ("output_file", "vocab_file"):
            if not getattr(self, name):
                raise ValueError(f"--{name} is required")
