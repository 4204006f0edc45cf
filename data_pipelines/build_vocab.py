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

Either output loads with `data_pipelines.tokenization.load_tokenizer`.

Example:

    python -m data_pipelines.build_vocab --input_file=data/shakespeare.txt \
        --output_file=data/vocab.txt --vocab_size=8000 --do_lower_case
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterator

from data_pipelines import corpora

log = logging.getLogger(__name__)

MODEL_TYPES = ("wordpiece", "sentencepiece")
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
    if model_type not in MODEL_TYPES:
        raise ValueError(f"--model_type must be one of {MODEL_TYPES}, got {model_type!r}")
    if num_unused < 0:
        raise ValueError(f"--num_unused must be >= 0, got {num_unused}")
    directory = os.path.dirname(output_file)
    if directory:
        os.makedirs(directory, exist_ok=True)
    stats = corpora.ReadStats()
    sentences = iter_sentences(input_file, stats)
    train = train_wordpiece if model_type == "wordpiece" else train_sentencepiece
    size = train(
        sentences,
        output_file,
        vocab_size=vocab_size,
        do_lower_case=do_lower_case,
        num_unused=num_unused,
    )
    return {
        "vocab_size": size,
        "files": stats.files,
        "lines": stats.lines,
        "lines_with_bad_bytes": stats.lines_with_bad_bytes,
    }


def main(argv: list[str]) -> None:
    """Entry point."""
    del argv
    from absl import flags

    f = flags.FLAGS
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    counts = build_vocab(
        f.input_file,
        f.output_file,
        vocab_size=f.vocab_size,
        do_lower_case=f.do_lower_case,
        num_unused=f.num_unused,
        model_type=f.model_type,
    )
    log.info("wrote %s: %s", f.output_file, counts)


if __name__ == "__main__":
    from absl import flags

    from data_pipelines import cli

    flags.DEFINE_string(
        "input_file",
        None,
        "Corpus: comma-separated files/globs (plain or .gz), one sentence per line.",
    )
    flags.DEFINE_string("output_file", None, "vocab.txt (wordpiece) or NAME.model (sentencepiece).")
    flags.DEFINE_integer("vocab_size", 30522, "Size of the vocabulary, special tokens included.")
    flags.DEFINE_bool("do_lower_case", True, "Lower-case (uncased vocabulary).")
    flags.DEFINE_integer("num_unused", 0, "[unusedN] slots after [PAD].")
    flags.DEFINE_enum("model_type", "wordpiece", list(MODEL_TYPES), "What to train.")
    flags.mark_flags_as_required(["input_file", "output_file"])
    cli.run(main)
