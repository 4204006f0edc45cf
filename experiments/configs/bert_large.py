r"""BERT-Large (L24/H1024/A16) with the paper's pretraining recipe, on any machine.

The recipe is `bert_base.py`'s (batch 256, lr 1e-4, 10k warmup, 1M steps: 900k at
length 128 with 20 predictions, then 100k at 512 with 80); only the model differs.

Launch (phase 2 restores phase 1's full train state through `resume_from`):

  python -m experiments.pretrain --config=experiments/configs/bert_large.py:phase1 \
      --workdir=workdirs/bert_large_phase1
  python -m experiments.pretrain --config=experiments/configs/bert_large.py:phase2 \
      --workdir=workdirs/bert_large_phase2

Cloud TPU reproductions: `bert_large_paper.py` (v3:8x8, the paper's 64 chips),
`bert_large_v4.py`, `bert_large_v5e.py`, and `bert_large_lamb.py` (LAMB, huge batches).
"""

import ml_collections

from experiments.configs import bert_base


def get_config(phase: str = "phase1") -> ml_collections.ConfigDict:
    """The recipe for `phase` ('phase1' or 'phase2'; `--config=bert_large.py:phase2`)."""
    config = bert_base.get_config(phase)
    config.model.preset = "large"  # L24/H1024/A16
    if phase == "phase2":
        config.resume_from = "workdirs/bert_large_phase1/checkpoints"  # phase 1's workdir
    return config
