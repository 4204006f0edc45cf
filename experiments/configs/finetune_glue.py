r"""A GLUE task with the original BERT recipe (batch 32, 3 epochs, max_seq_length 128).

  python -m experiments.finetune_classification \
      --config=experiments/configs/finetune_glue.py:mrpc --config.data_dir=glue_data/MRPC \
      --config.init_from=uncased_L-12_H-768_A-12 --workdir=workdirs/glue_mrpc

The argument after `:` is the task: cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli.
`data_dir` is the task's directory from the GLUE download (train.tsv, dev.tsv, test.tsv);
with `--config.data_source=tfds` it is TFDS's data_dir instead ("" for the default), and
`glue/<task>` must have been prepared there. Test predictions are written as the GLUE
server's submission files under <workdir>/submission/.
"""

import ml_collections

from experiments.configs import finetune_base

# The original README's per-task learning rates are one of 5e-5, 3e-5, 2e-5 (picked on dev).
LEARNING_RATES = {"cola": 2e-5, "mrpc": 2e-5, "stsb": 2e-5, "rte": 3e-5, "wnli": 2e-5}


def get_config(task: str = "mrpc") -> ml_collections.ConfigDict:
    config = finetune_base.classification(f"glue/{task}")  # data_dir: required (see above)
    config.skip_malformed = task == "qqp"  # QQP's train.tsv has a few broken rows (logged)
    config.learning_rate = LEARNING_RATES.get(task, 2e-5)  # the README's, per task (above)
    return config
