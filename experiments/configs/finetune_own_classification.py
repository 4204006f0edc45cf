r"""Sentence (pair) classification or regression on your own files (TSV, CSV or JSONL).

  python -m experiments.finetune_classification \
      --config=experiments/configs/finetune_own_classification.py \
      --config.init_from=<your model dir> --config.train_file=train.tsv \
      --config.dev_file=dev.tsv [--config.test_file=test.tsv] --workdir=workdirs/mine

Columns: `text`, optional `text_b`, `label` (data_pipelines.tasks.own_files). The label set
is the training file's (or `labels`, comma-separated); numbers with a fraction regress
(`label_type`). The defaults suit a small model pretrained here (a few layers, H <= 256):
BERT-base's 5e-5 for 3 epochs barely moves one (a tiny model then predicts the majority
class), so the peak is 3e-4 over 10 epochs with Adam's bias correction; for a BERT-base
sized model set --config.learning_rate=5e-5 --config.num_epochs=3.
"""

import ml_collections

from experiments.configs import finetune_base


def get_config() -> ml_collections.ConfigDict:
    config = finetune_base.classification("files")
    config.init_from = ""  # your pretrained model: a workdir, an export, a HF directory
    config.train_file = ""  # TSV / CSV (header: text[, text_b], label) or JSONL
    config.dev_file = ""  # scored after every epoch ("": none)
    config.test_file = ""  # scored at the end when labelled, else predicted ("": none)
    config.labels = ""  # the classes in id order, comma-separated ("": the training file's)
    config.label_type = "auto"  # "class", "number" (regression) or "auto" (see above)
    config.learning_rate = 3e-4  # a small model's peak (BERT-base: 5e-5)
    config.num_epochs = 10
    config.optimizer = "adamw_bias_corrected"  # steadier for short runs (Zhang et al. 2021)
    return config
