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
from ml_collections.config_dict import placeholder

# The original README's per-task learning rates are one of 5e-5, 3e-5, 2e-5 (picked on dev).
LEARNING_RATES = {"cola": 2e-5, "mrpc": 2e-5, "stsb": 2e-5, "rte": 3e-5, "wnli": 2e-5}


def get_config(task: str = "mrpc") -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.task = f"glue/{task}"  # data_pipelines.tasks.sentence_tasks name
    config.data_dir = ""  # the task's directory of GLUE TSVs (tfds: TFDS data_dir)
    config.data_source = "tsv"  # "tsv" or "tfds"
    config.skip_malformed = task == "qqp"  # QQP's train.tsv has a few broken rows (logged)

    config.init_from = ""  # HF dir, TF checkpoint, Orbax params or pretraining workdir
    config.bert_config_file = ""  # replaces the config found beside init_from
    config.vocab_file = ""  # "" = the vocab.txt beside init_from
    config.do_lower_case = True  # False for cased checkpoints
    config.from_scratch = False  # True: random weights in the same architecture (baseline)
    config.model_overrides = ml_collections.ConfigDict()
    config.model_overrides.hidden_dropout_prob = placeholder(float)  # None: the checkpoint's

    config.pooling = "cls"  # BERT's tanh pooler on [CLS]; "mean": mean of the last layer

    config.max_seq_length = 128  # word pieces incl. [CLS]/[SEP]s
    config.keep_tail = 0  # long single texts keep their last N pieces too (head+tail)
    config.max_train_examples = placeholder(int)  # None: all; N: a random N drawn with `seed`
    config.train_batch_size = 32  # global
    config.eval_batch_size = 64  # global
    config.num_epochs = 3
    config.eval_every_epochs = 1  # dev scores after every N-th epoch (and the last)
    config.learning_rate = LEARNING_RATES.get(task, 2e-5)  # peak, after warmup
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
