r"""python -m bert_jax.convert: a checkpoint in any format read by `load_pretrained`, written
as a Hugging Face directory or params-only Orbax (see the package docstring).

    python -m bert_jax.convert --input=uncased_L-12_H-768_A-12/bert_model.ckpt \
        --output=/tmp/bert-base-uncased-hf --format=hf

--format=sentence-transformers writes the HF directory and the modules that make it a
sentence-transformers model (`SentenceTransformer(output)` loads it): the pooling
(--pooling, --normalize, --max_seq_length, --truncate_dim; by default those of the input,
when it is a sentence-transformers directory or an `experiments.finetune_embeddings`
checkpoint, else mean pooling, no normalisation, the model's positions up to 512 and every
dimension). A
sentence-transformers directory is also read as input (its Transformer module's weights).

An "electra" pretraining workdir exports to HF as two models (`save_hf_electra`): the
discriminator in --output (transformers' ElectraForPreTraining), the generator in
<output>/generator (ElectraForMaskedLM); --format=orbax keeps the discriminator's encoder.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("bert_jax.convert")


def _define_flags():
    from absl import flags

    flags.DEFINE_string(
        "input",
        None,
        "Google TF checkpoint (prefix or directory), HF directory (BERT or ModernBERT) or "
        "params-only Orbax directory.",
        required=True,
    )
    flags.DEFINE_string(
        "output", None, "Directory to write (must not exist, unless --overwrite).", required=True
    )
    flags.DEFINE_enum(
        "format",
        "hf",
        ["hf", "orbax", "sentence-transformers"],
        "hf: config.json + model.safetensors "
        "+ vocab.txt; orbax: params-only Orbax + config.json + vocab.txt; "
        "sentence-transformers: hf plus modules.json and the pooling config.",
    )
    flags.DEFINE_enum(
        "pooling", None, ["mean", "cls", "last"],
        "sentence-transformers output: the pooling; default: the input's, else mean.",
    )  # fmt: skip
    flags.DEFINE_bool(
        "normalize", None,
        "sentence-transformers output: L2-normalise; default: the input's, else no.",
    )  # fmt: skip
    flags.DEFINE_integer(
        "max_seq_length", None,
        "sentence-transformers output: tokens per text; default: the input's, else the "
        "model's positions up to 512.",
    )  # fmt: skip
    flags.DEFINE_integer(
        "truncate_dim", None,
        "sentence-transformers output: keep the first N dimensions (a Matryoshka model), "
        "written to config_sentence_transformers.json and README.md; default: the input's, "
        "else all.",
    )  # fmt: skip
    flags.DEFINE_string(
        "bert_config_file",
        None,
        "Config to use instead of the one beside "
        "the input (e.g. for a TF checkpoint without bert_config.json).",
    )
    flags.DEFINE_string(
        "vocab_file", None, "vocab.txt to copy instead of the one beside the input."
    )
    flags.DEFINE_bool(
        "do_lower_case",
        None,
        "Write tokenizer_config.json with this "
        "do_lower_case (HF output); unset: the casing a train state of ours was trained "
        "with (its saved vocabulary fingerprint's), else none (transformers then "
        "lower-cases).",
    )
    flags.DEFINE_bool("scan_layers", False, "Orbax output: stack the layers (scan layout).")
    flags.DEFINE_bool(
        "allow_non_finite", False,
        "Read and write weights holding NaN or inf (refused by default, naming the tensor).",
    )  # fmt: skip
    flags.DEFINE_bool(
        "overwrite",
        False,
        "Replace --output if it is an export (recognised by its files; never the input).",
    )
    return flags.FLAGS


def _sentence_transformers_files(
    config, location: str, flags: dict, output: str, pooler_left_out: bool
) -> dict:
    """The module files of --format=sentence-transformers: `flags` (pooling, normalize,
    max_seq_length; None: unset), else those of the input at `location`; and README.md."""
    from bert_jax import embeddings
    from bert_jax.convert import sentence_transformers
    from bert_jax.convert.names import ConversionError

    found, where = embeddings.directory_settings(location) or ({}, "default")
    pooling = embeddings.check_pooling(flags["pooling"] or found.get("pooling") or "mean")
    normalize = (
        flags["normalize"] if flags["normalize"] is not None else bool(found.get("normalize"))
    )
    length = flags["max_seq_length"]  # 0 is a choice to refuse, not "unset"
    length = length if length is not None else found.get("max_seq_length")
    length = length if length is not None else min(512, config.max_position_embeddings)
    if not 3 <= length <= config.max_position_embeddings:
        raise ConversionError(
            f"--max_seq_length={length} must be in [3, max_position_embeddings="
            f"{config.max_position_embeddings}]"
        )
    dim = flags.get("truncate_dim")
    dim = dim if dim is not None else found.get("truncate_dim")
    if dim is not None and not 1 <= dim <= config.hidden_size:
        raise ConversionError(f"--truncate_dim={dim} must be in [1, {config.hidden_size}] (the "
                              "embedding's size)")  # fmt: skip
    log.info("sentence-transformers modules: %s pooling%s, %d tokens%s (from %s)", pooling,
             ", normalised" if normalize else "", length,
             f", the first {dim} dimensions" if dim else "",
             "flags" if flags["pooling"] else where)  # fmt: skip
    name = os.path.basename(os.path.normpath(output))
    card = sentence_transformers.model_card(name, location, pooling, normalize,
                                            config.hidden_size, length,
                                            pooler_left_out=pooler_left_out,
                                            truncate_dim=dim)  # fmt: skip
    return sentence_transformers.module_files(
        pooling, normalize, config.hidden_size, length, pooler_left_out=pooler_left_out, card=card,
        truncate_dim=dim,
    )  # fmt: skip


# The flags that only --format=sentence-transformers reads.
SENTENCE_TRANSFORMERS_FLAGS = ("pooling", "normalize", "max_seq_length", "truncate_dim")


def check_flags(fmt: str, given: dict) -> None:
    """Refuses flags that would do nothing for `fmt`: the sentence-transformers settings
    outside that format, --scan_layers outside orbax (`given`: flag -> value, None unset).

    Raises:
      ConversionError: naming each such flag.
    """
    from bert_jax.convert.names import ConversionError

    named = []
    if fmt != "sentence-transformers":
        named += [f"--{n}" for n in SENTENCE_TRANSFORMERS_FLAGS if given.get(n) is not None]
    if fmt != "orbax" and given.get("scan_layers"):  # its default, False, is no choice
        named.append("--scan_layers")
    if named:
        needs = {"scan_layers": "orbax"}
        formats = sorted({needs.get(n[2:], "sentence-transformers") for n in named})
        raise ConversionError(
            f"{', '.join(named)} given with --format={fmt}, which does not read "
            f"{'it' if len(named) == 1 else 'them'} (only --format={' / '.join(formats)} does)"
        )


def trained_casing(source_dir: str) -> bool | None:
    """The `do_lower_case` a train state of ours was trained with: the one in the vocabulary
    fingerprint saved with it (None: another format, a checkpoint older than the casing's
    record, or a tokenizer.json, whose own normalizer decides)."""
    from bert_jax import checkpointing

    found = checkpointing.find_checkpoints(source_dir)
    if found is None:
        return None
    manager = checkpointing.make_manager(found[0], async_save=False, create=False)
    saved = checkpointing.saved_config(manager, found[1]).get("vocab_fingerprint") or {}
    casing = saved.get("do_lower_case")
    if casing is not None:
        log.info("do_lower_case=%s: the casing %s was trained with", casing, source_dir)
    return casing


def embedding_encoder(path: str, config_file: str | None = None):
    """("auto", False), or (our BertModel without a pooler, True) for a BERT checkpoint
    that has none (a `finetune_embeddings` run's): what `load_pretrained` should build for an
    embedding export, which needs no pooler and must not carry one made up at random."""
    from bert_jax.convert.families import family_of
    from bert_jax.convert.readers import open_source
    from bert_jax.model import BertModel

    source = open_source(path, config_file)
    if source.config is None:
        return "auto", False  # load_pretrained says what is missing
    pooler = family_of(source.config).pooler
    if not pooler or any(source.has(spec) for spec in pooler):
        return "auto", False
    return BertModel(source.config, add_pooling_layer=False), True


def convert(
    input: str,
    output: str,
    fmt: str = "hf",
    *,
    pooling: str | None = None,
    normalize: bool | None = None,
    max_seq_length: int | None = None,
    truncate_dim: int | None = None,
    bert_config_file: str | None = None,
    vocab_file: str | None = None,
    do_lower_case: bool | None = None,
    scan_layers: bool = False,
    allow_non_finite: bool = False,
    overwrite: bool = False,
) -> str:
    """The command line's work, one argument per flag; returns what it wrote.

    Raises:
      ConversionError (or ConfigError, CheckpointError, a VocabError, FileNotFoundError):
        naming the file, flag or key; `main` prints it in one line.
    """
    # Here, not at the top: `-h` answers without loading JAX and Flax.
    from bert_jax.convert import locations
    from bert_jax.convert.electra import read_electra_train_state, save_hf_electra
    from bert_jax.convert.export import save_hf
    from bert_jax.convert.load import load_pretrained
    from bert_jax.convert.names import ConversionError, with_layout
    from bert_jax.convert.output_dir import check_output
    from bert_jax.convert.readers import detect_format, save_params

    settings = {"pooling": pooling, "normalize": normalize, "max_seq_length": max_seq_length,
                "truncate_dim": truncate_dim}  # fmt: skip
    check_flags(fmt, {**settings, "scan_layers": scan_layers})
    # Before anything is read: an --output that is the input, above it, or not an export.
    try:
        check_output(output, overwrite, (input, vocab_file, bert_config_file))
    except FileExistsError as error:
        raise ConversionError(str(error)) from None
    # Any model location: a fine-tuning workdir, a sentence-transformers directory, ...
    source_dir = locations.resolve(input)
    log.info("Reading %s (%s)", source_dir, detect_format(source_dir))
    electra = read_electra_train_state(source_dir) if fmt == "hf" else None
    if electra is not None:
        config, generator, params, found_vocab = electra
        save_hf_electra(output, config, generator, params, vocab_file=vocab_file or found_vocab,
                        overwrite=overwrite)  # fmt: skip
        return f"{output} (ELECTRA: the generator in {output}/generator)"
    model, pooler_left_out = "auto", False
    if fmt == "sentence-transformers":
        model, pooler_left_out = embedding_encoder(source_dir, bert_config_file)
    config, params, found_vocab = load_pretrained(
        source_dir, model=model, config_file=bert_config_file, allow_non_finite=allow_non_finite
    )
    vocab_file = vocab_file or found_vocab
    # A HF directory's tokenizer (ModernBERT's is tokenizer.json alone, without vocab.txt).
    tokenizer = locations.tokenizer_files(source_dir)
    train_state = detect_format(source_dir) == "train_state"
    if vocab_file is None and not tokenizer:
        if train_state:
            # Its saved vocabulary is missing, or not the one the model was trained with
            # (the warning above says which): an export must not carry a stranger's.
            raise ConversionError(
                f"{input} has no vocabulary that is the model's; give the one it was "
                "trained with as --vocab_file"
            )
        log.warning("No vocab.txt beside %s and no --vocab_file: none written", input)
    if fmt in ("hf", "sentence-transformers"):
        if do_lower_case is None and train_state:
            do_lower_case = trained_casing(source_dir)
        save_hf(
            output, config, params, vocab_file=vocab_file, tokenizer=tokenizer,
            do_lower_case=do_lower_case, overwrite=overwrite,
            extra_json=_sentence_transformers_files(config, input, settings, output,
                                                    pooler_left_out)
            if fmt != "hf" else None,
            allow_non_finite=allow_non_finite,
        )  # fmt: skip
    else:
        config = config.replace(scan_layers=scan_layers)
        params = with_layout(params, scan_layers, config.num_hidden_layers)
        save_params(output, config, params, vocab_file=vocab_file, tokenizer=tokenizer,
                    overwrite=overwrite, allow_non_finite=allow_non_finite)  # fmt: skip
    return output


def _one_line_errors() -> tuple[type[BaseException], ...]:
    """The errors `main` prints in one line: about the user's input, each naming it."""
    from bert_jax.checkpoint_reading import CheckpointError
    from bert_jax.config import ConfigError
    from bert_jax.convert.names import ConversionError
    from data_pipelines.paths import GlobCharactersError, OutputIsInputError
    from data_pipelines.tokenizer_base import VocabError

    return (ConversionError, ConfigError, CheckpointError, VocabError, FileNotFoundError,
            NotADirectoryError, GlobCharactersError, OutputIsInputError)  # fmt: skip


def main(argv) -> None:
    from absl import app, flags

    from data_pipelines import cli

    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    FLAGS = flags.FLAGS
    cli.progress_logging("bert_jax")
    try:
        wrote = convert(
            FLAGS.input, FLAGS.output, FLAGS.format, pooling=FLAGS.pooling,
            normalize=FLAGS.normalize, max_seq_length=FLAGS.max_seq_length,
            truncate_dim=FLAGS.truncate_dim, bert_config_file=FLAGS.bert_config_file,
            vocab_file=FLAGS.vocab_file,
            do_lower_case=FLAGS.do_lower_case, scan_layers=FLAGS.scan_layers,
            allow_non_finite=FLAGS.allow_non_finite, overwrite=FLAGS.overwrite,
        )  # fmt: skip
    except _one_line_errors() as error:  # the input is wrong: one line, as `embed` says it
        raise SystemExit(f"convert: {error}") from None
    print(f"wrote {wrote}")


if __name__ == "__main__":
    from data_pipelines import cli

    _define_flags()
    cli.run(main)
