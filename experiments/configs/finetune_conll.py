r"""Token tagging on CoNLL-format files (e.g. CoNLL-2003 English NER) with the original recipe.

  python -m experiments.finetune_tagging --config=experiments/configs/finetune_conll.py \
      --config.train_file=conll2003/eng.train --config.dev_file=conll2003/eng.testa \
      --config.test_file=conll2003/eng.testb --config.init_from=cased_L-12_H-768_A-12 \
      --config.do_lower_case=False --workdir=workdirs/conll2003

Any scheme conlleval reads works (BIO, IOB1, IOBES); the tag set is the training file's.
"""

import ml_collections
from ml_collections.config_dict import placeholder


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.task = "conll"  # data_pipelines.tasks.tagging_tasks name
    config.train_file = ""  # CoNLL-format training file (required)
    config.dev_file = ""  # scored after every epoch (required)
    config.test_file = ""  # scored at the end ("" = none)
    config.tag_column = -1  # the tag column (CoNLL-2003: the last, NER)

    config.init_from = ""  # HF dir, TF checkpoint, Orbax params or pretraining workdir
    config.bert_config_file = ""  # replaces the config found beside init_from
    config.vocab_file = ""  # "" = the vocab.txt beside init_from
    config.do_lower_case = False  # NER wants a cased model
    config.from_scratch = False  # True: random weights in the same architecture (baseline)
    config.model_overrides = ml_collections.ConfigDict()
    config.model_overrides.hidden_dropout_prob = placeholder(float)  # None: the checkpoint's

    config.max_seq_length = 128  # word pieces incl. [CLS]/[SEP]; longer sentences are cut
    config.max_train_examples = placeholder(int)  # None: all
    config.train_batch_size = 32  # global
    config.eval_batch_size = 64  # global
    config.num_epochs = 3
    config.learning_rate = 5e-5  # peak, after warmup
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
