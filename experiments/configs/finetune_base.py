"""The keys every fine-tuning config shares, each written once: not an experiment itself.

The fine-tuning configs next to this file start from one of its functions and set only what
differs, as `bert_large.py` does with `bert_base.py`:

  recipe()             the training loop's keys at the original recipe (run_classifier.py's
                       defaults: batch 32, lr 5e-5, 3 epochs, 10% warmup, 128 pieces);
                       distillation starts here
  get_config()         recipe() and the pretrained encoder to start from (`init_from`)
  classification(task) get_config() and a sentence (pair) task: experiments.finetune_classification
  tagging(task)        get_config() and a token tagging task: experiments.finetune_tagging and
                       experiments.feature_based_tagging

Each config's docstring holds its launch command; `--config.<key>=value` overrides any key.
"""

import ml_collections
from ml_collections.config_dict import placeholder


def recipe() -> ml_collections.ConfigDict:
    """The training loop's keys, at the original recipe's values."""
    config = ml_collections.ConfigDict()
    config.max_seq_length = 128  # word pieces incl. [CLS]/[SEP]s; longer inputs are cut
    # None: all; N: the first N (classification, multiple choice: a random N drawn with `seed`)
    config.max_train_examples = placeholder(int)
    config.train_batch_size = 32  # global
    config.eval_batch_size = 64  # global
    config.num_epochs = 3  # passes over the training split
    config.learning_rate = 5e-5  # peak, after warmup
    config.warmup_proportion = 0.1  # of all train steps, linear from 0 (0: none)
    # "adamw": the original BERT AdamW (no bias correction); "adamw_bias_corrected":
    # Adam's bias correction, steadier for runs of a few hundred steps (Zhang et al. 2021).
    config.optimizer = "adamw"
    config.weight_decay = 0.01  # not on LayerNorm and biases
    config.max_grad_norm = 1.0  # global-norm clipping (0: none)
    config.seed = 0  # init of what is not restored (head, student), data order, dropout
    # The PRNG of the dropout masks (bert_jax.train_state.PRNG_IMPLS): "threefry2x32", or
    # "rbg" / "unsafe_rbg", cheaper on TPU and GPU. The initialisation is threefry in all.
    config.prng_impl = "threefry2x32"
    config.mesh_shape = (-1, 1, 1)  # (data, fsdp, tensor): data parallel over all devices
    config.log_every = 50  # steps between train_log.jsonl records
    return config


def get_config() -> ml_collections.ConfigDict:
    """`recipe()` and the pretrained encoder the task starts from."""
    config = recipe()
    config.init_from = ""  # HF dir, TF checkpoint, Orbax params or pretraining workdir
    config.bert_config_file = ""  # replaces the config found beside init_from
    config.vocab_file = ""  # "" = the vocab beside init_from (a workdir: its config's)
    # None: the encoder's casing (its finetuned.json, tokenizer_config.json or saved
    # fingerprint; else True); a value that contradicts the encoder's is refused.
    config.do_lower_case = placeholder(bool)
    config.allow_vocab_change = False  # True: vocab_file may differ from the encoder's own
    config.from_scratch = False  # True: random weights in the same architecture (baseline)
    config.model_overrides = ml_collections.ConfigDict()
    config.model_overrides.hidden_dropout_prob = placeholder(float)  # None: the checkpoint's
    return config


def classification(task: str) -> ml_collections.ConfigDict:
    """`get_config()` for a data_pipelines.tasks.sentence_tasks `task`, scored every epoch."""
    config = get_config()
    config.task = task  # data_pipelines.tasks.sentence_tasks name
    # The task's files ("" = its cached copy, fetched with pip if missing); GLUE: the task's
    # directory of TSVs (tfds: TFDS data_dir).
    config.data_dir = ""
    config.data_source = "tsv"  # GLUE only: "tsv" files or "tfds"
    config.skip_malformed = False  # GLUE only: skip unparsable rows (logged) instead of failing
    config.pooling = "cls"  # BERT's tanh pooler on [CLS]; "mean": mean of the last layer
    config.keep_tail = 0  # long single texts keep their last N pieces too (0: the head only)
    config.eval_every_epochs = 1  # dev scores after every N-th epoch (and the last)
    return config


def tagging(task: str) -> ml_collections.ConfigDict:
    """`get_config()` for a data_pipelines.tasks.tagging_tasks `task`."""
    config = get_config()
    config.task = task  # data_pipelines.tasks.tagging_tasks name
    config.train_file = ""  # conll: required; others: another copy of their data ("" = the cached)
    config.dev_file = ""  # conll only: scored after every epoch (required)
    config.test_file = ""  # conll only: scored at the end ("" = none)
    config.tag_column = -1  # conll only: the tag column (-1: the last, CoNLL-2003's NER)
    return config
