r"""Trains a BERT vocabulary from a corpus: WordPiece vocab.txt or a sentencepiece model.

* `--model_type=wordpiece` (default): the `tokenizers` library's WordPiece trainer with
  BERT's normalisation and pre-tokenisation. The vocab.txt starts with the special
  tokens in the original BERT order: `[PAD]` = 0, then `[unused0]` ... `[unusedN-1]`
  (`--num_unused`, slots to repurpose later for new tokens), then `[UNK] [CLS] [SEP]
  [MASK]`, then the learned pieces.
* `--model_type=sentencepiece`: the sentencepiece unigram trainer, with `[PAD]` (id 0)
  and `[UNK]` (id 1) as its pad/unk pieces and `[CLS] [SEP] [MASK]` (and the unused
  slots) as user-defined symbols; writes `<output_file>` (a `.model`) and the matching
  `.vocab`.

* `--model_type=bpe`: a byte-level BPE like ModernBERT's (and RoBERTa's, GPT-2's): every
  byte has a token, so no text is ever unknown; words keep their leading space ('Ġthe').
  `--output_file` is a `tokenizer.json`; `tokenizer_config.json` and
  `special_tokens_map.json` are written beside it, so the directory loads in transformers
  (`AutoTokenizer.from_pretrained(dir)`, a fast tokenizer) as well as here. The special
  tokens are `[PAD] [UNK] [CLS] [SEP] [MASK]` (ids 0-4; `[MASK]` absorbs the space before
  it, as ModernBERT's `<mask>`), inputs are `[CLS] A [SEP] B [SEP]`, and the vocabulary is
  padded with `[unusedN]` slots to a multiple of 64 (as ModernBERT's 50368), which keeps the
  embedding and output matrices in whole tiles on accelerators.

Every output loads with `data_pipelines.tokenization.load_tokenizer`.

Example:

    python -m data_pipelines.build_vocab --input_file=data/shakespeare.txt \
        --output_file=data/vocab.txt --vocab_size=8000 --do_lower_case
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator

from data_pipelines import corpora, paths

log = logging.getLogger(__name__)

MODEL_TYPES = ("wordpiece", "sentencepiece", "bpe")
# A BPE vocabulary is padded with [unusedN] to a multiple of this (ModernBERT's choice).
BPE_VOCAB_MULTIPLE = 64
PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"


def special_tokens(num_unused: int) -> list[str]:
    """[PAD], [unused0..N-1], [UNK], [CLS], [SEP], [MASK]: the original vocab's head."""
    return [PAD, *(f"[unused{i}]" for i in range(num_unused)), UNK, CLS, SEP, MASK]


def iter_sentences(input_file: str, stats: corpora.ReadStats) -> Iterator[str]:
    """The non-empty lines of the input files (comma-separated globs, plain or gzip)."""
    for document in corpora.read_documents(corpora.expand_input_patterns(input_file), stats):
        yield from document.sentences


def train_wordpiece(
    sentences: Iterator[str],
    output_file: str,
    *,
    vocab_size: int,
    do_lower_case: bool,
    num_unused: int = 0,
    min_frequency: int = 2,
) -> int:
    """Trains WordPiece and writes vocab.txt (atomically). Returns the vocabulary size.

    Every character of the corpus gets an entry (no alphabet limit), as in the original
    vocabularies: a Chinese corpus needs thousands of them.
    """
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordPiece(unk_token=UNK, continuing_subword_prefix="##"))
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True,
        handle_chinese_chars=True,
        strip_accents=do_lower_case,
        lowercase=do_lower_case,
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = special_tokens(num_unused)
    if vocab_size <= len(specials):
        raise ValueError(
            f"--vocab_size={vocab_size} leaves no room after {len(specials)} special tokens"
        )
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=specials,
        continuing_subword_prefix="##",
        show_progress=False,
    )
    tokenizer.train_from_iterator(sentences, trainer=trainer)
    vocab = tokenizer.get_vocab()
    tokens = sorted(vocab, key=vocab.__getitem__)
    if tokens[: len(specials)] != specials:
        raise AssertionError(f"the trainer did not put the special tokens first: {tokens[:8]}")
    if len(tokens) == len(specials):
        raise ValueError("the corpus is empty: no token was learned")
    temporary = output_file + ".incomplete"
    with open(temporary, "w", encoding="utf-8") as f:
        f.write("".join(t + "\n" for t in tokens))
    os.replace(temporary, output_file)
    return len(tokens)


def train_sentencepiece(
    sentences: Iterator[str],
    output_file: str,
    *,
    vocab_size: int,
    do_lower_case: bool,
    num_unused: int = 0,
) -> int:
    """Trains a sentencepiece unigram model; writes `output_file` (.model) and `.vocab`."""
    import sentencepiece as spm

    if not output_file.endswith(".model"):
        raise ValueError(f"a sentencepiece --output_file must end in .model, got {output_file}")
    user_symbols = [CLS, SEP, MASK, *(f"[unused{i}]" for i in range(num_unused))]
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(output_file))) as tmp:
        prefix = os.path.join(tmp, "spm")
        spm.SentencePieceTrainer.train(
            sentence_iterator=sentences,
            model_prefix=prefix,
            vocab_size=vocab_size,
            model_type="unigram",
            pad_id=0,
            unk_id=1,
            bos_id=-1,
            eos_id=-1,
            pad_piece=PAD,
            unk_piece=UNK,
            user_defined_symbols=user_symbols,
            # Case folding on top of NFKC when the tokenizer lower-cases its input too.
            normalization_rule_name="nmt_nfkc_cf" if do_lower_case else "nmt_nfkc",
            character_coverage=0.9995,
            minloglevel=2,
        )
        shutil.move(prefix + ".vocab", output_file[: -len(".model")] + ".vocab")
        shutil.move(prefix + ".model", output_file)  # last: the model marks completion
    processor = spm.SentencePieceProcessor(model_file=output_file)
    return processor.get_piece_size()


def train_bpe(
    sentences: Iterator[str],
    output_file: str,
    *,
    vocab_size: int,
    do_lower_case: bool,
    num_unused: int = 0,
    min_frequency: int = 2,
) -> int:
    """Trains a byte-level BPE; writes `output_file` (tokenizer.json) and its two config
    files beside it. Returns the vocabulary size: `vocab_size` (plus `num_unused`) rounded
    up to a multiple of `BPE_VOCAB_MULTIPLE`, the rounding filled with [unusedN] slots."""
    from tokenizers import (
        AddedToken,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    if os.path.basename(output_file) != "tokenizer.json":
        raise ValueError(f"a bpe --output_file must be named tokenizer.json, got {output_file}")
    specials = [PAD, UNK, CLS, SEP, MASK]
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(specials) + len(alphabet):
        raise ValueError(
            f"--vocab_size={vocab_size} is below the {len(specials)} special tokens and the "
            f"{len(alphabet)} bytes a byte-level BPE starts from"
        )
    tokenizer = Tokenizer(models.BPE())
    steps = [normalizers.NFC()] + ([normalizers.Lowercase()] if do_lower_case else [])
    tokenizer.normalizer = normalizers.Sequence(steps)
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=specials,
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tokenizer.train_from_iterator(sentences, trainer=trainer)
    if tokenizer.get_vocab_size() <= len(specials) + len(alphabet):
        raise ValueError("the corpus is empty: no merge was learned")
    # [MASK] takes the space before it, so "a [MASK]." is 'a' '[MASK]' '.' (ModernBERT's).
    tokenizer.add_special_tokens([AddedToken(MASK, lstrip=True, normalized=False, special=True)])
    size = tokenizer.get_vocab_size() + num_unused
    padded = -(-size // BPE_VOCAB_MULTIPLE) * BPE_VOCAB_MULTIPLE
    tokenizer.add_special_tokens(
        [f"[unused{i}]" for i in range(padded - tokenizer.get_vocab_size())]
    )
    ids = {t: tokenizer.token_to_id(t) for t in specials}
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{CLS} $A {SEP}",
        pair=f"{CLS} $A {SEP} $B:1 {SEP}:1",
        special_tokens=[(CLS, ids[CLS]), (SEP, ids[SEP])],
    )
    roles = {"pad_token": PAD, "unk_token": UNK, "cls_token": CLS, "sep_token": SEP}
    mask = {"content": MASK, "lstrip": True, "normalized": False, "rstrip": False,
            "single_word": False, "special": True}  # fmt: skip
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **roles,
        "mask_token": mask,
        "clean_up_tokenization_spaces": False,
        # ModernBERT's: no token types (its models take none; pairs differ by [SEP] alone).
        "model_input_names": ["input_ids", "attention_mask"],
    }
    directory = os.path.dirname(os.path.abspath(output_file))
    _write_json(os.path.join(directory, "special_tokens_map.json"), {**roles, "mask_token": mask})
    _write_json(os.path.join(directory, "tokenizer_config.json"), config)
    temporary = output_file + ".incomplete"
    tokenizer.save(temporary)
    os.replace(temporary, output_file)  # last: tokenizer.json marks completion
    return tokenizer.get_vocab_size()


def _write_json(path: str, value: dict) -> None:
    with open(path + ".incomplete", "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2)
        f.write("\n")
    os.replace(path + ".incomplete", path)


def check_output_is_not_input(input_file: str, output_file: str) -> None:
    """Refuses an `output_file` (or the `.vocab` a sentencepiece `.model` comes with) that is
    one of the corpus files, by real path (`paths.check_not_an_input`).

    Raises:
        paths.OutputIsInputError: naming the output and the input.
    """
    inputs = [p.strip() for p in input_file.split(",") if p.strip()]
    try:
        inputs += corpora.expand_input_patterns(input_file)
    except FileNotFoundError:  # said when the corpus is read
        pass
    outputs = [output_file]
    if output_file.endswith(".model"):
        outputs.append(output_file[: -len(".model")] + ".vocab")
    for output in outputs:
        paths.check_not_an_input(output, inputs)


def check_arguments(output_file: str, *, vocab_size: int, num_unused: int, model_type: str):
    """Refuses, before the corpus is read, what no corpus could make work: one line naming
    the flag (a model type, a vocabulary size below its special tokens, an output name its
    model type cannot be written under, an output that is a directory).

    Raises:
        ValueError: naming the flag and its value.
    """
    if model_type not in MODEL_TYPES:
        raise ValueError(f"--model_type must be one of {MODEL_TYPES}, got {model_type!r}")
    if num_unused < 0:
        raise ValueError(f"--num_unused must be >= 0, got {num_unused}")
    if model_type == "bpe" and os.path.basename(output_file) != "tokenizer.json":
        raise ValueError(f"a bpe --output_file must be named tokenizer.json, got {output_file}")
    if model_type == "sentencepiece" and not output_file.endswith(".model"):
        raise ValueError(f"a sentencepiece --output_file must end in .model, got {output_file}")
    if model_type == "wordpiece" and output_file.endswith((".model", ".json")):
        raise ValueError(
            f"a wordpiece --output_file is a vocab.txt (one token a line), got {output_file}; "
            "--model_type=sentencepiece writes a .model, --model_type=bpe a tokenizer.json"
        )
    if os.path.isdir(output_file):
        raise ValueError(f"--output_file={output_file} is a directory; name the file to write")
    floor = {
        "wordpiece": (len(special_tokens(num_unused)) + 1, "special tokens and one learned"),
        # [PAD] [UNK] [CLS] [SEP] [MASK], the unused slots and one learned piece.
        "sentencepiece": (5 + num_unused + 1, "special tokens and one learned piece"),
        "bpe": (5 + 256, "special tokens and the 256 bytes a byte-level BPE starts from"),
    }[model_type]
    if vocab_size < floor[0]:
        raise ValueError(
            f"--vocab_size={vocab_size} is too small for --model_type={model_type}: at least "
            f"{floor[0]} ({floor[1]})"
        )


def _sentencepiece_error(error: RuntimeError, input_file: str, vocab_size: int) -> str:
    """sentencepiece's trainer's error (`INTERNAL: src/trainer_interface.cc(744) [...] ...`)
    as one line naming the flag: what it says after its source location."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    reason = text.split("] ", 1)[-1].strip()
    too_high = re.search(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)",
                         reason)  # fmt: skip
    if too_high:
        return (
            f"--vocab_size={vocab_size} is more than sentencepiece can learn from {input_file}: "
            f"at most {too_high.group(2)} (a larger corpus has room for more)"
        )
    too_low = re.search(r"smaller than required_chars\. (\d+) vs (\d+)", reason)
    if too_low:
        return (
            f"--vocab_size={vocab_size} is below the {too_low.group(2)} pieces sentencepiece "
            f"needs for the characters of {input_file} and its special tokens"
        )
    return f"sentencepiece cannot train on {input_file} with --vocab_size={vocab_size}: {reason}"


def build_vocab(
    input_file: str,
    output_file: str,
    *,
    vocab_size: int,
    do_lower_case: bool,
    num_unused: int = 0,
    model_type: str = "wordpiece",
) -> dict[str, int]:
    """Trains a vocabulary on the input files and writes it; returns counts.

    Raises:
        ValueError: bad arguments or an empty corpus.
        FileNotFoundError: an input pattern matches nothing.
    """
    check_output_is_not_input(input_file, output_file)  # before the corpus is read
    check_arguments(output_file, vocab_size=vocab_size, num_unused=num_unused,
                    model_type=model_type)  # fmt: skip
    stats = corpora.ReadStats()
    sentences = iter_sentences(input_file, stats)
    first = next(sentences, None)  # the input's files are read (and named) before any output
    if first is None:
        raise ValueError(
            f"no text in the input {input_file} (empty, or blank lines only): no vocabulary "
            "to learn"
        )
    train = {"wordpiece": train_wordpiece, "sentencepiece": train_sentencepiece,
             "bpe": train_bpe}[model_type]  # fmt: skip
    made = paths.make_directories(os.path.dirname(output_file))
    try:
        size = train(
            itertools.chain([first], sentences),
            output_file,
            vocab_size=vocab_size,
            do_lower_case=do_lower_case,
            num_unused=num_unused,
        )
    except BaseException as error:
        paths.remove_empty_directories(made)
        if model_type == "sentencepiece" and isinstance(error, RuntimeError):
            # Its trainer's C++ check, as one line naming the flag.
            raise ValueError(_sentencepiece_error(error, input_file, vocab_size)) from None
        raise
    return {
        "vocab_size": size,
        "files": stats.files,
        "lines": stats.lines,
        "lines_with_bad_bytes": stats.lines_with_bad_bytes,
    }


def default_lower_case(model_type: str) -> bool:
    """--do_lower_case when not given: BERT's uncased WordPiece (and sentencepiece) lower-case;
    a byte-level BPE keeps case, as ModernBERT's and RoBERTa's do."""
    return model_type != "bpe"


def main(argv: list[str]) -> None:
    """Entry point."""
    del argv
    from absl import flags

    f = flags.FLAGS
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        counts = build_vocab(
            f.input_file,
            f.output_file,
            vocab_size=f.vocab_size,
            do_lower_case=default_lower_case(f.model_type)
            if f.do_lower_case is None
            else f.do_lower_case,
            num_unused=f.num_unused,
            model_type=f.model_type,
        )
    except (ValueError, OSError) as error:
        # A flag no corpus could satisfy, an empty corpus, an output that is an input or
        # cannot be written: one line naming it (nothing was written).
        raise SystemExit(f"build_vocab: {error}") from None
    log.info("wrote %s: %s", f.output_file, counts)


if __name__ == "__main__":
    from absl import flags

    from data_pipelines import cli

    flags.DEFINE_string(
        "input_file",
        None,
        "Corpus: comma-separated files/globs (plain or .gz), one sentence per line.",
    )
    flags.DEFINE_string(
        "output_file",
        None,
        "vocab.txt (wordpiece), NAME.model (sentencepiece), or DIR/tokenizer.json (bpe: "
        "tokenizer_config.json and special_tokens_map.json are written beside it).",
    )
    flags.DEFINE_integer(
        "vocab_size",
        30522,
        "Size of the vocabulary, special tokens included. bpe pads it with [unusedN] slots "
        f"to a multiple of {BPE_VOCAB_MULTIPLE}, as ModernBERT.",
    )
    flags.DEFINE_bool(
        "do_lower_case", None,
        "Lower-case (an uncased vocabulary); default: yes for wordpiece and sentencepiece "
        "(BERT's uncased models), no for bpe (ModernBERT's and RoBERTa's tokenizers are cased).",
    )  # fmt: skip
    flags.DEFINE_integer(
        "num_unused", 0, "[unusedN] slots: after [PAD] (wordpiece), at the end (bpe)."
    )
    flags.DEFINE_enum(
        "model_type",
        "wordpiece",
        list(MODEL_TYPES),
        "What to train: wordpiece (BERT's vocab.txt), sentencepiece (unigram .model), or bpe "
        "(a byte-level BPE tokenizer.json like ModernBERT's, which transformers loads).",
    )
    flags.mark_flags_as_required(["input_file", "output_file"])
    cli.run(main)
