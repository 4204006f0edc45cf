r"""Sentence embeddings of a text file, one line one text, written as a (N, H) .npy array.

  python -m experiments.embed --model=<dir> --input_file=texts.txt --output_file=emb.npy \
      [--pooling=mean|cls|last] [--normalize] [--max_seq_length=256] [--batch_size=64]

--model is anything `bert_jax.convert` reads (a Hugging Face directory of BERT, ModernBERT,
MosaicBERT or ELECTRA, a Google TF checkpoint, a pretraining workdir, a params-only Orbax
directory), a sentence-transformers directory, or the workdir of
`experiments.finetune_embeddings`. Pooling runs over the encoder's last output as
transformers' `last_hidden_state` is (after a pre-LN encoder's final norm). --pooling,
--normalize and --max_seq_length default to the directory's own: a sentence-transformers
directory's modules.json, pooling config and sentence_bert_config.json, or the embedding
settings a fine-tuned workdir saved; otherwise mean pooling, no normalisation and the
model's positions (at most 512). Row i of the output is line i of the input (empty lines
included). The output is written under a temporary name and renamed when complete.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)


def read_lines(path: str) -> list[str]:
    """The lines of a UTF-8 text file, without their line ends (a directory is refused)."""
    if os.path.isdir(path):
        raise ValueError(f"--input_file={path} is a directory; give a text file, one text a line")
    try:
        with open(path, encoding="utf-8") as f:
            return [line.rstrip("\r\n") for line in f]
    except UnicodeDecodeError as error:
        raise ValueError(f"--input_file={path}: not UTF-8 text ({error.reason} at byte "
                         f"{error.start})") from None  # fmt: skip


def save_npy(path: str, array) -> None:
    """np.save through a temporary file beside `path`, so a half-written file never exists."""
    import numpy as np

    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            np.save(f, array)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def run(
    model_path: str, input_file: str, output_file: str, *, pooling=None, normalize=None,
    max_seq_length=None, batch_size: int = 64, vocab_file=None, do_lower_case=None,
) -> int:  # fmt: skip
    """The whole tool; returns the number of embeddings written."""
    from bert_jax import embeddings

    if batch_size < 1:
        raise ValueError(f"--batch_size={batch_size} must be positive")
    texts = read_lines(input_file)
    model = embeddings.load_embedding_model(
        model_path, pooling=pooling, normalize=normalize, max_seq_length=max_seq_length,
        vocab_file=vocab_file, do_lower_case=do_lower_case,
    )  # fmt: skip
    log.info("%d texts from %s; %s pooling%s, %d tokens at most (settings: %s)", len(texts),
             input_file, model.module.pooling, ", L2-normalised" if model.module.normalize
             else "", model.max_seq_length, model.source)  # fmt: skip
    vectors = embeddings.embed_texts(model, texts, batch_size=batch_size)
    save_npy(output_file, vectors)
    log.info("Wrote %s: %d x %d float32", output_file, *vectors.shape)
    return len(vectors)


def _define_flags():
    from absl import flags

    flags.DEFINE_string("model", None, "Model directory or checkpoint (see the module doc).")
    flags.DEFINE_string("input_file", None, "UTF-8 text, one text a line.")
    flags.DEFINE_string("output_file", None, ".npy file to write: (lines, hidden size) float32.")
    flags.DEFINE_enum(
        "pooling",
        None,
        ["mean", "cls", "last"],
        "Pooling over the encoder's output; default: the directory's, else mean.",
    )
    flags.DEFINE_bool(
        "normalize", None, "L2-normalise each embedding; default: the directory's, else no."
    )
    flags.DEFINE_integer(
        "max_seq_length",
        None,
        "Tokens per text, special tokens included; "
        "default: the directory's, else the model's positions (<= 512).",
    )
    flags.DEFINE_integer("batch_size", 64, "Texts per forward pass.")
    flags.DEFINE_string("vocab_file", None, "Tokenizer file; default: the one beside --model.")
    flags.DEFINE_bool(
        "do_lower_case",
        None,
        "Lower-case first (vocab.txt, .model); default: "
        "tokenizer_config.json's beside the vocabulary, else yes.",
    )
    flags.mark_flags_as_required(["model", "input_file", "output_file"])


def main(argv):
    from absl import app, flags

    from data_pipelines import cli, paths

    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    cli.progress_logging("bert_jax", "experiments", __name__)
    f = flags.FLAGS
    try:
        # Before anything is read: an output that is (or is inside) an input would replace it.
        paths.check_not_an_input(f.output_file, (f.input_file, f.model, f.vocab_file))
        run(f.model, f.input_file, f.output_file, pooling=f.pooling, normalize=f.normalize,
            max_seq_length=f.max_seq_length, batch_size=f.batch_size, vocab_file=f.vocab_file,
            do_lower_case=f.do_lower_case)  # fmt: skip
    except (ValueError, FileNotFoundError) as error:  # bad input: one line, no traceback
        raise SystemExit(f"embed: {error}") from None


if __name__ == "__main__":
    from data_pipelines import cli

    _define_flags()
    cli.run(main)
