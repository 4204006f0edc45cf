"""The flags of `create_pretraining_data` (the original tool's, and its own), shared with
`beam_records`, which takes the same flags and makes the same records."""

from __future__ import annotations

import logging
from typing import Any

from data_pipelines import vocab_fingerprint
from data_pipelines.pretraining_options import CORPORA, Options

log = logging.getLogger("data_pipelines.create_pretraining_data")


def default_dupe_factor(masking: str) -> int:
    """--dupe_factor when not given: the original's 10 masked copies for static masking;
    1 for dynamic masking, which draws new masks every epoch (copies would only repeat)."""
    return 1 if masking == "dynamic" else Options(input_file="", output_file="",
                                                   vocab_file="").dupe_factor  # fmt: skip


def define_flags() -> None:
    """Defines the original tool's flags (and this one's) with absl."""
    from absl import flags

    defaults = Options(input_file="", output_file="", vocab_file="")
    flags.DEFINE_string(
        "input_file",
        None,
        "Input text files: comma-separated files or globs "
        "(plain or .gz), or tfds:NAME for a TFDS text dataset.",
    )
    flags.DEFINE_string("output_file", None, "Output TFRecord file(s), comma-separated.")
    flags.DEFINE_string(
        "vocab_file",
        None,
        "WordPiece vocab.txt, sentencepiece .model or Hugging Face tokenizer.json (or a "
        "directory holding one, e.g. a transformers model's); its special tokens are its own.",
    )
    flags.DEFINE_bool(
        "do_lower_case",
        defaults.do_lower_case,
        "Lower-case the input (vocab.txt and .model; a tokenizer.json normalizes itself). "
        "Unset: the tokenizer_config.json's in (or beside) --vocab_file, else true.",
    )
    flags.DEFINE_bool(
        "do_whole_word_mask",
        defaults.do_whole_word_mask,
        "Mask whole words rather than single WordPieces.",
    )
    flags.DEFINE_integer("max_seq_length", defaults.max_seq_length, "Maximum sequence length.")
    flags.DEFINE_integer(
        "max_predictions_per_seq",
        defaults.max_predictions_per_seq,
        "Maximum number of masked LM predictions per sequence.",
    )
    flags.DEFINE_integer("random_seed", defaults.random_seed, "Random seed for data generation.")
    flags.DEFINE_integer(
        "dupe_factor", None,
        f"Passes over the input (with different masks); default {defaults.dupe_factor} with "
        "static masking (the original's), 1 with --masking=dynamic (each epoch masks anew, "
        "so copies only repeat the same text).",
    )  # fmt: skip
    flags.DEFINE_float("masked_lm_prob", defaults.masked_lm_prob, "Masked LM probability.")
    flags.DEFINE_float(
        "short_seq_prob",
        defaults.short_seq_prob,
        "Probability of sequences shorter than the maximum length.",
    )
    flags.DEFINE_integer(
        "num_output_shards",
        defaults.num_output_shards,
        "Shards to write when one --output_file is given: at most one per instance (fewer "
        "instances than this: one shard each, named -of-<instances>, and a warning naming "
        "both counts, instead of empty shards).",
    )
    flags.DEFINE_integer(
        "num_workers", defaults.num_workers, "Worker processes (the output does not depend on it)."
    )
    flags.DEFINE_enum(
        "masking",
        defaults.masking,
        ["static", "dynamic"],
        "static: masked records (original format); dynamic: unmasked records "
        "with word_starts, masked by the input pipeline each epoch.",
    )
    flags.DEFINE_bool(
        "next_sentence",
        defaults.next_sentence,
        "Sentence pairs [CLS] A [SEP] B [SEP] with next-sentence labels (BERT); false: "
        "single-segment instances [CLS] text [SEP] of contiguous text from one document, "
        "for pretraining without NSP (--config.objective=mlm or ltr).",
    )
    flags.DEFINE_enum(
        "corpus",
        None,
        list(CORPORA),
        "An embedded corpus instead of --input_file (Chinese word boundaries included).",
    )
    flags.DEFINE_integer(
        "documents_per_chunk",
        defaults.documents_per_chunk,
        "Documents shuffled and paired together; bounds memory.",
    )
    flags.DEFINE_bool(
        "split_sentences",
        defaults.split_sentences,
        "Input lines are paragraphs: split them into sentences (pysbd).",
    )
    flags.DEFINE_string("language", defaults.language, "pysbd language for sentence splitting.")
    flags.DEFINE_bool(
        "word_boundary_files",
        defaults.word_boundary_files,
        "Read word segmentations from <input_file>.words (see prepare_corpus).",
    )
    flags.DEFINE_float(
        "max_undecodable_fraction",
        defaults.max_undecodable_fraction,
        "Refuse an input file when more than this fraction of its non-blank lines are not "
        "UTF-8 text (a binary file, another encoding); fewer get a warning naming the file.",
    )
    flags.DEFINE_string("tfds_data_dir", None, "data_dir for tfds: inputs.")
    flags.DEFINE_string("tfds_split", defaults.tfds_split, "Split of tfds: inputs.")
    flags.DEFINE_string("tfds_text_key", defaults.tfds_text_key, "Text feature of tfds: inputs.")


def resolve_do_lower_case(vocab_file: str, flag: bool, given: bool) -> bool:
    """The casing to make records with: `--do_lower_case` where given on the command line
    (`given`), else the `do_lower_case` of the tokenizer_config.json in (or beside) the
    `vocab_file` directory, as its model was trained, else the flag's default; logged."""
    found = None if given else vocab_fingerprint.configured_lower_case(vocab_file)
    if found is None:
        source = "given by --do_lower_case" if given else "--do_lower_case's default"
        log.info("do_lower_case=%s (%s)", flag, source)
        return flag
    log.info("do_lower_case=%s (from the tokenizer_config.json of %s)", found, vocab_file)
    return found


def options_from_flags(f: Any) -> Options:
    """The `Options` of the parsed flags (`_define_flags`'s), with --dupe_factor's and
    --do_lower_case's defaults resolved; shared with `beam_records`."""
    return Options(
        input_file=f.input_file or "",
        output_file=f.output_file,
        vocab_file=f.vocab_file,
        do_lower_case=resolve_do_lower_case(
            f.vocab_file, f.do_lower_case, f["do_lower_case"].present
        ),
        do_whole_word_mask=f.do_whole_word_mask,
        max_seq_length=f.max_seq_length,
        max_predictions_per_seq=f.max_predictions_per_seq,
        random_seed=f.random_seed,
        dupe_factor=default_dupe_factor(f.masking) if f.dupe_factor is None else f.dupe_factor,
        masked_lm_prob=f.masked_lm_prob,
        short_seq_prob=f.short_seq_prob,
        num_output_shards=f.num_output_shards,
        num_workers=f.num_workers,
        masking=f.masking,
        next_sentence=f.next_sentence,
        corpus=f.corpus or "",
        documents_per_chunk=f.documents_per_chunk,
        split_sentences=f.split_sentences,
        language=f.language,
        word_boundary_files=f.word_boundary_files,
        max_undecodable_fraction=f.max_undecodable_fraction,
        tfds_data_dir=f.tfds_data_dir or "",
        tfds_split=f.tfds_split,
        tfds_text_key=f.tfds_text_key,
    )
