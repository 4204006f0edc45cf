r"""BERT-Large as the paper trained it: 16 Cloud TPUs (64 TPU v3 chips), v3:8x8.

The recipe of `bert_large.py` (batch 256, lr 1e-4, 10k warmup, 900k steps at T=128
then 100k at T=512) on a v3-128 slice: 128 TPU v3 cores, 2 sequences per core.

Fit check on this CPU (needs the `tpu` extra):

  python -m experiments.aot_compile \
      --config=experiments/configs/bert_large_paper.py:phase1   # and :phase2

Launch on Cloud TPU (docs/tpu.md has the whole walkthrough):

  make tpu-create ACCELERATOR_TYPE=v3-128 TPU_NAME=bert-large
  make tpu-setup tpu-data BUCKET=gs://my-bucket TPU_NAME=bert-large ACCELERATOR_TYPE=v3-128
  make tpu-pretrain CONFIG=experiments/configs/bert_large_paper.py PHASE=phase1 \
      BUCKET=gs://my-bucket TPU_NAME=bert-large ACCELERATOR_TYPE=v3-128
  make tpu-pretrain CONFIG=experiments/configs/bert_large_paper.py PHASE=phase2 \
      BUCKET=gs://my-bucket TPU_NAME=bert-large ACCELERATOR_TYPE=v3-128
"""

import ml_collections

from experiments.configs import bert_large, cloud_tpu


def get_config(phase: str = "phase1") -> ml_collections.ConfigDict:
    """Phase 1 (T=128) or phase 2 (T=512, from phase 1's checkpoints)."""
    config = bert_large.get_config(phase)
    config = cloud_tpu.on_cloud_tpu(
        config, config_name="bert_large_paper", phase=phase, topology="v3:8x8"
    )
    config.mesh_shape = (-1, 1, 1)  # (data, fsdp, tensor): 128-way data parallel
    return config
