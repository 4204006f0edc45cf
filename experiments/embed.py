r"""Sentence embeddings of a text file, one line one text, written as a (N, H) .npy array.

  python -m experiments.embed --model=<dir> --input_file=texts.txt --output_file=emb.npy \
      [--pooling=mean|cls|last] [--normalize] [--max_seq_length=256] [--batch_size=64] \
      [--dims=128]

--model is anything `bert_jax.convert` reads (a Hugging Face directory of BERT, ModernBERT,
MosaicBERT or ELECTRA, a Google TF checkpoint, a pretraining workdir, a params-only Orbax
directory), a sentence-transformers directory, or the workdir of
`experiments.finetune_embeddings`. Pooling runs over the encoder's last output as
transformers' `last_hidden_state` is (after a pre-LN encoder's final norm). --pooling,
--normalize and --max_seq_length default to the directory's own: a sentence-transformers
directory's modules.json, pooling config and sentence_bert_config.json, or the embedding
settings a fine-tuned workdir saved; otherwise mean pooling, no normalisation and the
model's positions (at most 512). --do_lower_case defaults to the casing the model was
made with (its finetuned.json, tokenizer_config.json or saved vocabulary fingerprint); a
flag or a --vocab_file that contradicts the model is refused. Row i of the output is line i
of the input as `wc -l` counts lines: split on "\n" only (a "\r\n" ending dropped), empty
lines included, a lone "\r", form feed or Unicode line separator kept inside its line. The
output's directory must exist and the output may not be a directory (both checked before
the model is read); it is written under a temporary name and renamed when complete.
--dims=N keeps the first N dimensions of each embedding (a Matryoshka model's prefix),
re-normalised when the model normalises; default: the directory's `truncate_dim`
(config_sentence_transformers.json), else all.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)


def read_lines(path: str) -> list[str]:
    r"""The lines of a UTF-8 text file (a byte-order mark dropped), split on "\n" alone as
    `wc -l` counts them, without their "\n" or "\r\n" (a directory is refused). Python's
    own line splitting also breaks at a lone "\r", \x0b, \x0c, \x1c-\x1e, \x85, \u2028
    and \u2029: row i would then be another line's embedding."""
    if os.path.isdir(path):
        raise ValueError(f"--input_file={path} is a directory; give a text file, one text a line")
    with open(path, "rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    if lines[-1] == b"":  # the last line's "\n" (or an empty file)
        lines.pop()
    texts = []
    for number, raw in enumerate(lines, 1):
        try:
            text = raw.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(f"--input_file={path}:{number}: not UTF-8 text ({error.reason} "
                             f"at byte {error.start} of the line)") from None  # fmt: skip
        texts.append(text.removesuffix("\r"))
    return texts


def check_output(path: str) -> None:
    """Refuses, before the model is read, an output the final rename could not write: one
    in a directory that does not exist, or an existing directory."""
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ValueError(f"--output_file={path} is a directory; give a .npy file name")
    if not os.path.isdir(directory):
        what = "is not a directory" if os.path.exists(directory) else "does not exist"
        raise ValueError(f"--output_file={path}: its directory {directory} {what}")
    if not os.access(directory, os.W_OK):
        raise ValueError(f"--output_file={path}: its directory {directory} is not writable")


def _check_settings(model_path: str, max_seq_length) -> None:
    """A directory's own max_seq_length (used where the flag is not given) must be a
    positive int: one line naming the file, not a TypeError deep in the load."""
    from bert_jax import embeddings

    if max_seq_length is not None:
        return
    found = embeddings.directory_settings(model_path)
    if found is None:
        return
    value = found[0].get("max_seq_length")
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{found[1]}: max_seq_length {value!r} is not a positive whole number "
                         "of tokens (or give --max_seq_length)")  # fmt: skip


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
    dims=None,
) -> int:  # fmt: skip
    """The whole tool; returns the number of embeddings written."""
    from bert_jax import embeddings, encoder_vocab

    if batch_size < 1:
        raise ValueError(f"--batch_size={batch_size} must be positive")
    check_output(output_file)
    texts = read_lines(input_file)
    _check_settings(model_path, max_seq_length)
    if vocab_file:  # of the same size it would read without an error, as other tokens
        encoder_vocab.check_model_vocab(model_path, vocab_file)
    do_lower_case = encoder_vocab.resolve_casing(
        model_path, do_lower_case, vocab_file or model_path, "--do_lower_case"
    )
    model = embeddings.load_embedding_model(
        model_path, pooling=pooling, normalize=normalize, max_seq_length=max_seq_length,
        vocab_file=vocab_file, do_lower_case=do_lower_case, truncate_dim=dims,
    )  # fmt: skip
    log.info("%d texts from %s; %s pooling%s%s, %d tokens at most (settings: %s), "
             "do_lower_case=%s", len(texts), input_file, model.module.pooling,
             ", L2-normalised" if model.module.normalize else "",
             f", the first {model.truncate_dim} dimensions" if model.truncate_dim else "",
             model.max_seq_length, model.source, do_lower_case)  # fmt: skip
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
    flags.DEFINE_integer(
        "dims", None,
        "Keep the first N dimensions (Matryoshka), re-normalised when the model normalises; "
        "default: the directory's truncate_dim, else all.",
    )  # fmt: skip
    flags.DEFINE_string("vocab_file", None, "Tokenizer file; default: the one beside --model.")
    flags.DEFINE_bool(
        "do_lower_case",
        None,
        "Lower-case first (vocab.txt, .model); default: the casing the model was made "
        "with (finetuned.json, tokenizer_config.json, its saved fingerprint), else yes; "
        "another is refused.",
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
            do_lower_case=f.do_lower_case, dims=f.dims)  # fmt: skip
    except (ValueError, FileNotFoundError) as error:  # bad input: one line, no traceback
        raise SystemExit(f"embed: {error}") from None


if __name__ == "__main__":
    from data_pipelines import cli

    _define_flags()
    cli.run(main)
