r"""Per-token feature vectors from a pretrained BERT, in google-research/bert's JSON layout.

Each input line is `text_a` or `text_a ||| text_b`. Each output line is

    {"linex_index": i, "features": [{"token": "[CLS]",
                                     "layers": [{"index": -1, "values": [...]}, ...]}, ...]}

for every token of `[CLS] A [SEP] (B [SEP])` (a tokenizer.json: its own layout, e.g.
`<s> A </s></s> B </s>`), with the outputs of the encoder layers in
--layers (-1 is the encoder's output, transformers' `last_hidden_state`: for a pre-LN
encoder such as ModernBERT, after its final norm; the others are the layers' outputs as
transformers' `hidden_states` gives them; the embeddings are not a layer), rounded to 6 decimals,
exactly as the original extract_features.py writes them (including its `linex_index`).

  python -m experiments.extract_features --input_file=input.txt \
      --output_file=/tmp/features.jsonl --init_checkpoint=/path/to/hf_dir_or_bert_model.ckpt \
      [--vocab_file=vocab.txt --bert_config_file=bert_config.json] --layers=-1,-2,-3,-4

--init_checkpoint takes any model location `bert_jax.convert` reads (a Google TF checkpoint, a
Hugging Face or sentence-transformers directory, a params-only Orbax directory, a pretraining
or fine-tuning workdir: `bert_jax.convert.locations`); a vocab.txt and config found beside it
make --vocab_file and --bert_config_file optional.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

log = logging.getLogger(__name__)

_PAIR = re.compile(r"^(.*) \|\|\| (.*)$")


@dataclasses.dataclass(frozen=True)
class Example:
    unique_id: int
    text_a: str
    text_b: str | None


@dataclasses.dataclass(frozen=True)
class Feature:
    unique_id: int
    tokens: list[str]  # [CLS] A [SEP] (B [SEP]) or the tokenizer's own layout, unpadded
    input_ids: list[int]
    input_type_ids: list[int]


def read_examples(path: str) -> list[Example]:
    """One example per line (blank lines included, as the original): `A` or `A ||| B`."""
    examples = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            line = line.strip()
            match = _PAIR.match(line)
            text_a, text_b = (match.group(1), match.group(2)) if match else (line, None)
            examples.append(Example(i, text_a, text_b))
    return examples


def convert_examples(examples: Sequence[Example], tokenizer, seq_length: int) -> list[Feature]:
    """Tokenizes and truncates like the original (A alone to L-2, A and B together to L-3,
    around BERT's [CLS] and [SEP]s), or as a tokenizer.json's own post-processor and
    truncation lay inputs out (`Tokenizer.encode_for_model_batch`); a B that tokenizes to
    nothing is no B, as in the original."""
    has_b = [bool(b) for b in tokenizer.encode_batch([e.text_b or "" for e in examples])]
    inputs = tokenizer.encode_for_model_batch(
        [e.text_a for e in examples],
        [e.text_b if b else None for e, b in zip(examples, has_b, strict=True)],
        seq_length,
    )
    return [
        Feature(e.unique_id, tokenizer.convert_ids_to_tokens(ids), ids, type_ids)
        for e, (ids, type_ids, _) in zip(examples, inputs, strict=True)
    ]


def parse_layers(text: str, num_layers: int) -> list[int]:
    """ "-1,-2" -> [-1, -2], each an index into the encoder's `num_layers` layer outputs."""
    try:
        layers = [int(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"--layers={text!r}: expected comma-separated integers") from None
    bad = [i for i in layers if not -num_layers <= i < num_layers]
    if bad:
        raise ValueError(f"--layers={text!r}: {bad} out of range for {num_layers} layers")
    return layers


def _batches(
    features: Sequence[Feature], batch_size: int, seq_length: int, pad_id: int
) -> Iterator[tuple]:
    """(features, ids, mask, type_ids), padded with `pad_id` (masked, but the pad token:
    RoBERTa's id 0 is <s>); the last batch is filled up with empty rows."""
    for start in range(0, len(features), batch_size):
        chunk = features[start : start + batch_size]
        ids = np.full((batch_size, seq_length), pad_id, np.int32)
        types = np.zeros_like(ids)
        mask = np.zeros_like(ids)
        for row, feature in enumerate(chunk):
            n = len(feature.input_ids)
            ids[row, :n], types[row, :n], mask[row, :n] = (
                feature.input_ids,
                feature.input_type_ids,
                1,
            )
        yield chunk, ids, mask, types


def extract(
    features: Sequence[Feature],
    config,
    params,
    layers: Sequence[int],
    *,
    batch_size: int,
    seq_length: int,
    pad_id: int,
) -> Iterator[tuple[Feature, np.ndarray]]:
    """Yields (feature, (len(layers), tokens, H) float32 array) in input order; batches
    are padded with `pad_id` (the tokenizer's)."""
    import jax
    from tqdm import tqdm

    from bert_jax.model import BertModel

    model = BertModel(config, add_pooling_layer=False)
    params = jax.device_put(params)

    @jax.jit
    def forward(params, ids, mask, types):
        out = model.apply({"params": params}, ids, mask, types, output_hidden_states=True)
        # The embeddings are not a layer. The last is the encoder's output (transformers'
        # `last_hidden_state`: a pre-LN encoder's after its final norm), the others each
        # layer's output (`hidden_states[i]`); in a post-LN BERT the last is both.
        encoder_layers = [*out.hidden_states[1:-1], out.sequence_output]
        return jax.numpy.stack([encoder_layers[i] for i in layers])  # (K, B, T, H)

    total = -(-len(features) // batch_size)
    batches = _batches(features, batch_size, seq_length, pad_id)
    for chunk, ids, mask, types in tqdm(batches, total=total, unit="batch", desc="features"):
        outputs = np.asarray(forward(params, ids, mask, types))
        for row, feature in enumerate(chunk):
            yield feature, outputs[:, row, : len(feature.tokens)]


def to_json(feature: Feature, values: np.ndarray, layers: Sequence[int]) -> str:
    """One output line, in the original's key order and rounding."""
    tokens = []
    for i, token in enumerate(feature.tokens):
        per_layer = [
            {"index": index, "values": [round(v, 6) for v in values[k, i].tolist()]}
            for k, index in enumerate(layers)
        ]
        tokens.append({"token": token, "layers": per_layer})
    return json.dumps({"linex_index": feature.unique_id, "features": tokens})


def write_lines(path: str, lines: Iterable[str]) -> None:
    """Writes to `path.tmp` and renames, so an interrupted run leaves no partial output."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(line + "\n")
    os.replace(tmp, path)


def check_output_is_not_input(output_file: str, input_file: str, init_checkpoint: str,
                              *others: str | None) -> None:  # fmt: skip
    """Refuses an `output_file` that is the input, a file of the checkpoint (a directory's
    files, a TF checkpoint's), the vocab or the config, by real path, before anything is
    read (`data_pipelines.paths.check_not_an_input`; a new file in the checkpoint's
    directory is fine).

    Raises:
        paths.OutputIsInputError: naming the output and the input.
    """
    import glob

    from data_pipelines import paths

    if os.path.isdir(init_checkpoint):  # its files and folders, not the directory itself
        checkpoint = [os.path.join(init_checkpoint, n) for n in os.listdir(init_checkpoint)]
    else:  # a file, or a TF checkpoint's prefix and its files
        checkpoint = [init_checkpoint, *glob.glob(glob.escape(init_checkpoint) + ".*")]
    paths.check_not_an_input(output_file, [input_file, *checkpoint, *others])


def run(
    input_file: str,
    output_file: str,
    init_checkpoint: str,
    *,
    layers: str = "-1,-2,-3,-4",
    vocab_file: str | None = None,
    bert_config_file: str | None = None,
    max_seq_length: int = 128,
    do_lower_case: bool | None = None,
    batch_size: int = 32,
) -> int:
    """The whole tool; returns the number of lines written. `do_lower_case` None: the
    casing the checkpoint was made with (`encoder_vocab.resolve_casing`), else True."""
    from bert_jax import convert, encoder_vocab
    from bert_jax.config import BertConfig
    from bert_jax.model import BertModel
    from data_pipelines.tokenization import load_tokenizer

    check_output_is_not_input(output_file, input_file, init_checkpoint, vocab_file,
                              bert_config_file)  # fmt: skip
    config, params, found_vocab = convert.load_pretrained(
        init_checkpoint,
        # The encoder without its pooler; load_pretrained gives it the checkpoint's config.
        model=BertModel(BertConfig(), add_pooling_layer=False),
        config_file=bert_config_file,
    )
    given_vocab, vocab_file = vocab_file, vocab_file or found_vocab
    if vocab_file is None:
        raise ValueError(
            f"--vocab_file is required: no vocab.txt, tokenizer.json or .model beside "
            f"{init_checkpoint}"
        )
    convert.check_vocab(vocab_file, config)  # ids past vocab_size would give NaN features
    if given_vocab:  # of the same size it would read without an error, as other tokens
        encoder_vocab.check_model_vocab(init_checkpoint, given_vocab)
    if not 3 <= max_seq_length <= config.max_position_embeddings:
        raise ValueError(
            f"--max_seq_length={max_seq_length} must be in [3, max_position_embeddings="
            f"{config.max_position_embeddings}]"
        )
    if batch_size < 1:
        raise ValueError(f"--batch_size={batch_size} must be positive")
    layer_indexes = parse_layers(layers, config.num_hidden_layers)
    do_lower_case = encoder_vocab.resolve_casing(
        init_checkpoint, do_lower_case, vocab_file, "--do_lower_case"
    )
    tokenizer = load_tokenizer(vocab_file, do_lower_case=do_lower_case)
    examples = read_examples(input_file)
    features = convert_examples(examples, tokenizer, max_seq_length)
    log.info("%d examples from %s; %s, do_lower_case=%s", len(features), input_file,
             tokenizer, do_lower_case)  # fmt: skip
    outputs = extract(features, config, params, layer_indexes, batch_size=batch_size,
                      seq_length=max_seq_length, pad_id=tokenizer.pad_id)  # fmt: skip
    write_lines(output_file, (to_json(f, v, layer_indexes) for f, v in outputs))
    log.info("Wrote %d lines to %s", len(features), output_file)
    return len(features)


def _define_flags():
    from absl import flags

    flags.DEFINE_string("input_file", None, "Lines of `text_a` or `text_a ||| text_b`.")
    flags.DEFINE_string("output_file", None, "JSON lines to write.")
    flags.DEFINE_string(
        "layers", "-1,-2,-3,-4",
        "Encoder layers to output. -1 is the encoder's output, transformers' "
        "last_hidden_state (a pre-LN encoder such as ModernBERT: after its final norm); -2, "
        "-3, ... and 0, 1, ... are layer outputs, transformers' hidden_states[i] (a pre-LN "
        "encoder's before any final norm).",
    )  # fmt: skip
    flags.DEFINE_string(
        "bert_config_file", None, "Model config; default: the one beside --init_checkpoint."
    )
    flags.DEFINE_integer(
        "max_seq_length",
        128,
        "Tokens per example, special tokens included; longer inputs are truncated.",
    )
    flags.DEFINE_string(
        "init_checkpoint",
        None,
        "Any model: Google TF checkpoint, HF or sentence-transformers directory, params-only "
        "Orbax directory, a pretraining or fine-tuning workdir.",
    )
    flags.DEFINE_string(
        "vocab_file",
        None,
        "vocab.txt, sentencepiece .model or tokenizer.json (or a directory holding one); "
        "default: the one beside the checkpoint.",
    )
    flags.DEFINE_bool(
        "do_lower_case",
        None,
        "Lower-case the input (uncased vocab.txt or .model; a tokenizer.json normalizes "
        "itself); default: the casing the checkpoint was made with, else yes; another is "
        "refused.",
    )
    flags.DEFINE_integer("batch_size", 32, "Examples per forward pass.")
    flags.mark_flags_as_required(["input_file", "output_file", "init_checkpoint"])


def main(argv):
    from absl import app, flags

    from data_pipelines import cli

    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    cli.progress_logging("bert_jax", "experiments", __name__)
    from data_pipelines import paths

    f = flags.FLAGS
    try:
        check_output_is_not_input(f.output_file, f.input_file, f.init_checkpoint,
                                  f.vocab_file, f.bert_config_file)  # fmt: skip
    except paths.OutputIsInputError as error:
        raise SystemExit(f"extract_features: {error}") from None
    from data_pipelines.vocab_fingerprint import VocabMismatchError

    try:
        _run_flags(f)
    except VocabMismatchError as error:  # another casing than the checkpoint's: one line
        raise SystemExit(f"extract_features: {error}") from None


def _run_flags(f) -> None:
    run(
        f.input_file,
        f.output_file,
        f.init_checkpoint,
        layers=f.layers,
        vocab_file=f.vocab_file,
        bert_config_file=f.bert_config_file,
        max_seq_length=f.max_seq_length,
        do_lower_case=f.do_lower_case,
        batch_size=f.batch_size,
    )


if __name__ == "__main__":
    from data_pipelines import cli

    _define_flags()
    cli.run(main)
