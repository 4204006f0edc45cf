r"""Continued pretraining of a published encoder on your own corpus (domain or language).

The model (architecture, vocabulary size), its tokenizer and its weights all come from one
transformers directory: a ModernBERT (`ModernBertForMaskedLM`: config.json,
model.safetensors, its byte-level BPE tokenizer.json) or a BERT (`BertForMaskedLM` /
`BertForPreTraining`, with vocab.txt). The directory is this config's argument, read when
the config is built (the architecture must be known then):

  python -m data_pipelines.create_pretraining_data --input_file=corpus.txt \
      --vocab_file=<dir> --next_sentence=false --masking=dynamic \
      --max_seq_length=128 --output_file=records/train.tfrecord
  python -m experiments.pretrain \
      --config=experiments/configs/continue_pretraining.py:<dir> --workdir=workdirs/continued
  python -m bert_jax.convert --input=workdirs/continued --output=continued_hf --format=hf

The objective is masked LM alone, at the source's training rate (30% for ModernBERT, 15%
for BERT; held-out metrics at 15% for both), on single-segment records made with the
source's own tokenizer (`--vocab_file=<dir>` picks its vocab.txt or tokenizer.json). The
special ids ([CLS]/[SEP]/[MASK] or <s>/</s>/<mask>) are the tokenizer's. `config.model`
is the source's config.json (`bert_jax.convert.families.read_config`) as the nearest preset
and the fields that differ from it: the weights load into exactly that model
(`init_from`), and the export
(`bert_jax.convert --format=hf`) loads in transformers as the source's class.
"""

import dataclasses
import json
import os

import ml_collections

from bert_jax.presets import MODERN_PRESETS
from experiments.configs import bert_tiny_cpu, modernbert_tiny_cpu

# The source's training masking rate, by family (the guide and the docstring say why).
MODERN_MASKED_LM_PROB = 0.30  # ModernBERT's (and MosaicBERT's)
BERT_MASKED_LM_PROB = 0.15  # BERT's


def source_model(source: str) -> tuple[str, dict]:
    """(preset, the fields that differ from it) of the source's config.json: the preset
    nearest to it, so a published size (ModernBERT-base, BERT-base) is its preset alone."""
    from bert_jax.config import BertConfig, preset_fields
    from bert_jax.convert import families
    from bert_jax.presets import PRESETS

    fields = dataclasses.asdict(families.read_config(os.path.join(source, "config.json")))
    defaults = dataclasses.asdict(BertConfig())
    best = None
    for name in [*PRESETS, *MODERN_PRESETS]:
        preset = {**defaults, **preset_fields(name)}
        differ = {k: v for k, v in fields.items() if v != preset[k] and v is not None}
        if best is None or len(differ) < len(best[1]):
            best = (name, differ)
    return best


def _lower_cases(source: str) -> bool:
    """A vocab.txt's do_lower_case from tokenizer_config.json (uncased BERTs: True); a
    tokenizer.json normalizes itself and ignores it."""
    path = os.path.join(source, "tokenizer_config.json")
    if not os.path.isfile(path):
        return True
    with open(path, encoding="utf-8") as f:
        return bool(json.load(f).get("do_lower_case", True))


def get_config(source: str = "") -> ml_collections.ConfigDict:
    if not source:
        raise ValueError(
            "continue_pretraining.py needs the transformers directory to continue: "
            "--config=experiments/configs/continue_pretraining.py:<dir>"
        )
    preset, fields = source_model(source)
    modern = preset in MODERN_PRESETS
    config = (modernbert_tiny_cpu if modern else bert_tiny_cpu).get_config()
    config.objective = "mlm"  # masked LM alone: the head every published encoder ships
    config.model.preset = preset  # the source's architecture: its nearest preset ...
    for name, value in fields.items():  # ... and every field where it differs
        setattr(config.model, name, value)
    config.init_from = source  # its weights, MLM head included
    data = config.data
    data.vocab_file = source  # its tokenizer: vocab.txt, else tokenizer.json
    data.do_lower_case = _lower_cases(source)  # vocab.txt only
    data.train_files = "records/train*.tfrecord"  # your corpus's records (globs, comma-separated)
    data.eval_files = "records/eval*.tfrecord"  # held-out records ("" disables evaluation)
    data.max_seq_length = 128  # T of the records
    data.dynamic_masking = True  # unmasked records, masked anew each epoch
    data.masked_lm_prob = MODERN_MASKED_LM_PROB if modern else BERT_MASKED_LM_PROB
    data.max_predictions_per_seq = 40  # P: >= masked_lm_prob * T
    data.eval_masked_lm_prob = 0.15  # held-out rate: BERT's, so any two runs compare
    data.pack = modern  # ModernBERT trains on packed rows; BERT's absolute positions do not
    # A published model is far along its schedule: a small peak rate keeps what it knows.
    config.optimizer.learning_rate = 5e-5
    config.optimizer.warmup_steps = 100
    config.num_train_steps = 1_000
    return config
