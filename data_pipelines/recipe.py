r"""The pretraining data recipe: embedded corpora -> held-out documents -> WordPiece vocab ->
masked TFRecords. Each stage is skipped when its outputs exist, so a rerun resumes.

  python -m data_pipelines.recipe --corpora=shakespeare --corpus_dir=workdirs/shakespeare \
      [--records_dir=DIR --max_seq_length=128 --dupe_factor=5 --seed=0 --vocab_size=8000]
      [--next_sentence=false --masking=dynamic]

`make pretrain-data` (Shakespeare, sequences of 128) and `experiments.demo` (IMDB, 64) run
it. What it writes:
  <corpus_dir>/corpus.txt   the corpora joined (prepare_corpus; one corpus is written as it)
  <corpus_dir>/train.txt    every document but each 20th; eval.txt: each 20th, held out
  <corpus_dir>/vocab.txt    build_vocab on train.txt (uncased)
  <records_dir>/train-*-of-00004.tfrecord   static masking, --dupe_factor passes, seeded by
                            12345 + --seed; eval.tfrecord: one pass, always seed 54321, so
                            every seed is scored on the same held-out records
The records are sentence pairs for BERT's objective, or with `--next_sentence=false`
single segments for pretraining without NSP (`--config.objective=mlm`; with
`--masking=dynamic`, unmasked, for `--config.objective=ltr`): give each kind its own
--records_dir (a stage whose outputs exist is skipped).
Each stage runs as `python -m <tool>` with its own progress bar.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
from collections.abc import Iterator

from absl import app, flags, logging

from data_pipelines import cli

HELD_OUT_EVERY = 20  # every 20th document is an evaluation document


def run(stage: str, args: list[str]) -> None:
    """Runs `python -m <args>` with live output; raises naming the stage if it fails. An
    interrupted wait stops the stage first (`cli.run_child`)."""
    command = [sys.executable, "-m", *args]
    logging.info("[%s] %s", stage, " ".join(command))
    env = {"TF_CPP_MIN_LOG_LEVEL": "2", **os.environ}
    returncode = cli.run_child(command, env=env)
    if returncode:
        raise RuntimeError(f"stage {stage!r} failed (exit {returncode}): {' '.join(command)}")


def concatenate(parts: list[str], output: str) -> None:
    """Joins corpus files in the original format (a blank line between two files' documents)."""
    with open(output + ".tmp", "w", encoding="utf-8") as out:
        for i, part in enumerate(parts):
            with open(part, encoding="utf-8") as f:
                text = f.read().strip("\n")
            out.write(("\n\n" if i else "") + text + "\n")
    os.replace(output + ".tmp", output)


def split_documents(corpus: str, train: str, held_out: str) -> tuple[int, int]:
    """Writes every HELD_OUT_EVERY-th blank-line-separated document to `held_out`."""
    with open(corpus, encoding="utf-8") as f:
        documents = [d.strip("\n") for d in f.read().split("\n\n") if d.strip()]
    counts = [0, 0]
    for path, keep in (
        (train, lambda i: i % HELD_OUT_EVERY),
        (held_out, lambda i: not i % HELD_OUT_EVERY),
    ):
        chosen = [d for i, d in enumerate(documents, start=1) if keep(i)]
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.write("".join(d + "\n\n" for d in chosen))
        os.replace(path + ".tmp", path)
        counts[path == held_out] = len(chosen)
    return counts[0], counts[1]


def predictions_per_seq(max_seq_length: int, masked_lm_prob: float = 0.15) -> int:
    """The masked share of the sequence, rounded up (15%: 20 at 128, the original's setting)."""
    return -(-max_seq_length * round(masked_lm_prob * 100) // 100)


@contextlib.contextmanager
def _one_writer(directory: str) -> Iterator[None]:
    """Holds `<directory>/.recipe.lock` (an flock, dropped however the process ends) for the
    body: two demos sharing a corpus or records directory take turns, the second reusing
    what the first wrote, where both wrote the same temporaries and one lost its file."""
    os.makedirs(directory, exist_ok=True)
    fd = os.open(os.path.join(directory, ".recipe.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logging.info("waiting for another run writing %s", directory)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def prepare_corpus(corpora: list[str], corpus_dir: str, vocab_size: int) -> str:
    """The corpus, its held-out split and the vocab; returns the vocab file. One run at a
    time writes a corpus directory (`_one_writer`)."""
    with _one_writer(corpus_dir):
        return _prepare_corpus(corpora, corpus_dir, vocab_size)


def _prepare_corpus(corpora: list[str], corpus_dir: str, vocab_size: int) -> str:
    corpus = os.path.join(corpus_dir, "corpus.txt")
    train, held_out = (os.path.join(corpus_dir, n) for n in ("train.txt", "eval.txt"))
    vocab = os.path.join(corpus_dir, "vocab.txt")
    if not os.path.exists(corpus):
        single = len(corpora) == 1
        parts = []
        for name in corpora:
            part = corpus if single else os.path.join(corpus_dir, f"{name}.txt")
            if not os.path.exists(part):
                run("corpus", ["data_pipelines.prepare_corpus", f"--corpus={name}",
                               f"--output_file={part}"])  # fmt: skip
            parts.append(part)
        if not single:
            concatenate(parts, corpus)
    if not (os.path.exists(train) and os.path.exists(held_out)):
        n_train, n_eval = split_documents(corpus, train, held_out)
        logging.info("[corpus] %d training and %d held-out documents", n_train, n_eval)
    if not os.path.exists(vocab):
        run("vocab", ["data_pipelines.build_vocab", f"--input_file={train}",
                      f"--output_file={vocab}", f"--vocab_size={vocab_size}",
                      "--do_lower_case"])  # fmt: skip
    return vocab


def make_records(
    corpus_dir: str, vocab: str, records_dir: str, *, max_seq_length: int, dupe_factor: int,
    seed: int, next_sentence: bool = True, masking: str = "static",
) -> None:  # fmt: skip
    """Training records (seeded by `seed`) and the fixed held-out records: sentence pairs
    or, without `next_sentence`, single segments; masked, or unmasked with `masking="dynamic"`.
    One run at a time writes a records directory (`_one_writer`)."""
    with _one_writer(records_dir):
        _make_records(corpus_dir, vocab, records_dir, max_seq_length, dupe_factor, seed,
                      next_sentence, masking)  # fmt: skip


def _make_records(
    corpus_dir, vocab, records_dir, max_seq_length, dupe_factor, seed, next_sentence, masking
) -> None:
    splits = (("train", 4, dupe_factor, 12345 + seed), ("eval", 1, 1, 54321))
    for name, shards, dupe, split_seed in splits:
        marker = os.path.join(records_dir, f".{name}-records")
        if os.path.exists(marker):
            continue
        run("records", [
            "data_pipelines.create_pretraining_data",
            f"--input_file={os.path.join(corpus_dir, name + '.txt')}",
            f"--output_file={os.path.join(records_dir, name + '.tfrecord')}",
            f"--num_output_shards={shards}", f"--vocab_file={vocab}", "--do_lower_case",
            f"--max_seq_length={max_seq_length}",
            f"--max_predictions_per_seq={predictions_per_seq(max_seq_length)}",
            f"--dupe_factor={dupe}", f"--random_seed={split_seed}", "--num_workers=2",
            f"--next_sentence={str(next_sentence).lower()}", f"--masking={masking}",
        ])  # fmt: skip
        open(marker, "w").close()


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    FLAGS = flags.FLAGS
    corpus_dir = os.path.abspath(FLAGS.corpus_dir)
    vocab = prepare_corpus(FLAGS.corpora, corpus_dir, FLAGS.vocab_size)
    make_records(
        corpus_dir, vocab, os.path.abspath(FLAGS.records_dir or corpus_dir),
        max_seq_length=FLAGS.max_seq_length, dupe_factor=FLAGS.dupe_factor, seed=FLAGS.seed,
        next_sentence=FLAGS.next_sentence, masking=FLAGS.masking,
    )  # fmt: skip


if __name__ == "__main__":
    flags.DEFINE_list(
        "corpora", ["shakespeare"], "Embedded corpora, joined (prepare_corpus names: imdb, "
        "shakespeare, austen, peoples_daily); give each list its own --corpus_dir."
    )  # fmt: skip
    flags.DEFINE_string("corpus_dir", None, "Corpus text, held-out split and vocab.")
    flags.DEFINE_string("records_dir", None, "TFRecords (default: --corpus_dir).")
    flags.DEFINE_integer("vocab_size", 8000, "WordPiece vocabulary size (special tokens included).")
    flags.DEFINE_integer("max_seq_length", 128, "Sequence length of the records (pieces).")
    flags.DEFINE_integer("dupe_factor", 5, "Masked copies of the training documents.")
    flags.DEFINE_integer("seed", 0, "Changes the training records' masks and pairing.")
    flags.DEFINE_bool(
        "next_sentence", True, "Sentence pairs with NSP labels; false: single segments "
        "[CLS] text [SEP] for --config.objective=mlm or ltr (give them their own --records_dir)."
    )  # fmt: skip
    flags.DEFINE_enum(
        "masking", "static", ["static", "dynamic"],
        "static: masked records; dynamic: unmasked (dynamic masking, or the ltr objective).",
    )  # fmt: skip
    flags.mark_flags_as_required(["corpus_dir"])
    cli.run(main)
