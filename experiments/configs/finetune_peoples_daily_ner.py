r"""Chinese NER (PER/LOC/ORG, character BIO) on People's Daily 1998, from a Chinese checkpoint.

  python -m experiments.finetune_tagging \
      --config=experiments/configs/finetune_peoples_daily_ner.py \
      --config.init_from=chinese_L-12_H-768_A-12 --workdir=workdirs/peoples_daily_ner

`init_from` must have a vocabulary of Chinese characters (Google's BERT-Base Chinese, or a
model pretrained here on `--corpus=peoples_daily_unlabelled`: the articles without the dev and
test sentences, as `make demo` does; `peoples_daily` holds them). The task is
`data_pipelines.tasks.peoples_daily_ner` (sentences; test 2,000 / dev 2,000 / train rest).
"""

import ml_collections

from experiments.configs import finetune_base


def get_config() -> ml_collections.ConfigDict:
    # do_lower_case stays True, as Google's Chinese model (Latin letters lower-cased).
    config = finetune_base.tagging("peoples_daily_ner")  # train_file: a copy of 199801.txt
    config.learning_rate = 3e-5  # peak: one of the original's 5e-5 / 3e-5 / 2e-5
    return config
