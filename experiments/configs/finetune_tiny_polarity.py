r"""BERT-tiny (pretrained here, or from scratch) fine-tuned on sentence polarity: the demo's
`--task=polarity`.

  python -m experiments.finetune_classification \
      --config=experiments/configs/finetune_tiny_polarity.py \
      --config.init_from=workdirs/demo/pretrain --workdir=workdirs/demo/polarity_pretrained \
      [--config.max_train_examples=250 --config.num_epochs=43 --config.seed=1]
  # the baseline: the same architecture and vocab, random weights
  ... --config.from_scratch=True --workdir=workdirs/demo/polarity_scratch

The demo runs both arms at several label budgets and seeds with every other setting shared,
so the only difference is the pretraining; it sets `pooling="mean"` (see README, "The demo":
its short pretraining leaves NSP, and so the [CLS] pooler, untrained). Small BERTs take a
larger learning rate than BERT-Base: 3e-4 fine-tuned the demo's pretrained model better
than 1e-4 (78.5% vs 74.9% with all labels, mean pooling, seed 0).
"""

import ml_collections
from ml_collections.config_dict import placeholder


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.task = "polarity"  # data_pipelines.tasks.sentence_tasks name
    config.data_dir = ""  # "" = the cached vaderSentiment sdist (fetched with pip if missing)
    config.data_source = "tsv"  # GLUE only: "tsv" files or "tfds"
    config.skip_malformed = False  # GLUE only: skip unparsable rows (logged) instead of failing

    config.init_from = ""  # the pretraining workdir (experiments.pretrain --workdir)
    config.bert_config_file = ""  # replaces the config found beside init_from
    config.vocab_file = ""  # "" = the vocab file the pretraining config names
    config.do_lower_case = True  # the demo vocab is uncased
    config.from_scratch = False  # True: random weights in the same architecture (baseline)
    config.model_overrides = ml_collections.ConfigDict()
    config.model_overrides.hidden_dropout_prob = placeholder(float)  # None: the checkpoint's

    config.pooling = "cls"  # BERT's tanh pooler on [CLS]; "mean": mean of the last layer

    config.max_seq_length = 64  # word pieces incl. [CLS]/[SEP]
    config.keep_tail = 0  # long single texts keep their last N pieces too (head+tail)
    config.max_train_examples = placeholder(int)  # None: all; N: a random N drawn with `seed`
    config.train_batch_size = 32  # global
    config.eval_batch_size = 128  # global
    config.num_epochs = 3
    config.eval_every_epochs = 1  # dev scores after every N-th epoch (and the last)
    config.learning_rate = 3e-4  # peak; measured better than 1e-4 (see above)
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
    config.log_every = 20  # steps between train_log.jsonl records
    return config
