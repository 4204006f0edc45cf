r"""python -m bert_jax.convert: a checkpoint in any format read by `load_pretrained`, written
as a Hugging Face directory or params-only Orbax (see the package docstring).

    python -m bert_jax.convert --input=uncased_L-12_H-768_A-12/bert_model.ckpt \
        --output=/tmp/bert-base-uncased-hf --format=hf

An "electra" pretraining workdir exports to HF as two models (`save_hf_electra`): the
discriminator in --output (transformers' ElectraForPreTraining), the generator in
<output>/generator (ElectraForMaskedLM); --format=orbax keeps the discriminator's encoder.
"""

from __future__ import annotations

import logging

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
        ["hf", "orbax"],
        "hf: config.json + model.safetensors "
        "+ vocab.txt; orbax: params-only Orbax + config.json + vocab.txt.",
    )
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
        "do_lower_case (HF output); unset writes none (transformers then "
        "lower-cases).",
    )
    flags.DEFINE_bool("scan_layers", False, "Orbax output: stack the layers (scan layout).")
    flags.DEFINE_bool(
        "overwrite",
        False,
        "Replace --output if it is an export (recognised by its files; never the input).",
    )
    return flags.FLAGS


def main(argv) -> None:
    from absl import app, flags
    from absl import logging as absl_logging

    # Here, not at the top: `-h` answers without loading JAX and Flax.
    from bert_jax.convert.electra import read_electra_train_state, save_hf_electra
    from bert_jax.convert.export import save_hf
    from bert_jax.convert.load import load_pretrained
    from bert_jax.convert.names import with_layout
    from bert_jax.convert.output_dir import check_output
    from bert_jax.convert.readers import detect_format, save_params, tokenizer_files

    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    FLAGS = flags.FLAGS
    # Our progress at INFO; Orbax's per-file INFO lines (absl) only from --verbosity=0 on.
    if not FLAGS["verbosity"].present:
        absl_logging.set_verbosity(absl_logging.WARNING)
    logging.getLogger("bert_jax").setLevel(logging.INFO)
    # Before anything is read: an --output that is the input, above it, or not an export.
    reads = (FLAGS.input, FLAGS.vocab_file, FLAGS.bert_config_file)
    try:
        check_output(FLAGS.output, FLAGS.overwrite, reads)
    except FileExistsError as error:
        raise SystemExit(f"convert: {error}") from None
    log.info("Reading %s (%s)", FLAGS.input, detect_format(FLAGS.input))
    electra = read_electra_train_state(FLAGS.input) if FLAGS.format == "hf" else None
    if electra is not None:
        config, generator, params, vocab_file = electra
        save_hf_electra(
            FLAGS.output,
            config,
            generator,
            params,
            vocab_file=FLAGS.vocab_file or vocab_file,
            overwrite=FLAGS.overwrite,
        )
        print(f"wrote {FLAGS.output} (ELECTRA: the generator in {FLAGS.output}/generator)")
        return
    config, params, vocab_file = load_pretrained(
        FLAGS.input, model="auto", config_file=FLAGS.bert_config_file
    )
    vocab_file = FLAGS.vocab_file or vocab_file
    # A HF directory's tokenizer (ModernBERT's is tokenizer.json alone, without vocab.txt).
    tokenizer = tokenizer_files(FLAGS.input)
    if vocab_file is None and not tokenizer:
        log.warning("No vocab.txt beside %s and no --vocab_file: none written", FLAGS.input)
    if FLAGS.format == "hf":
        save_hf(
            FLAGS.output,
            config,
            params,
            vocab_file=vocab_file,
            tokenizer=tokenizer,
            do_lower_case=FLAGS.do_lower_case,
            overwrite=FLAGS.overwrite,
        )
    else:
        config = config.replace(scan_layers=FLAGS.scan_layers)
        params = with_layout(params, FLAGS.scan_layers, config.num_hidden_layers)
        save_params(
            FLAGS.output,
            config,
            params,
            vocab_file=vocab_file,
            tokenizer=tokenizer,
            overwrite=FLAGS.overwrite,
        )
    print(f"wrote {FLAGS.output}")


if __name__ == "__main__":
    from data_pipelines import cli

    _define_flags()
    cli.run(main)
