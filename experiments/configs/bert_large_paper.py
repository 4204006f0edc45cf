r"""BERT-Large as the paper trained it: 16 Cloud TPUs (64 TPU v3 chips), v3:8x8.

The recipe of `bert_large.py` (batch 256, lr 1e-4, 10k warmup, 900k steps at T=128
then 100k at T=512) on a v3-128 slice: 128 TPU v3 cores, 2 sequences per core, the
weight update sharded over the cores.

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
    # The fastest layouts by the TPU compiler's cost model (docs/tpu_estimates.md), none of which
    # changes the math: the train state split over every core (sharded weight update);
    # phase 1's 2 sequences per core also split each matmul over 2 cores (tensor parallel),
    # phase 2 gathers the weights over groups of 8 cores layer by layer (FSDP).
    # bf16 gradient sums and bf16 first moment (config.grad_reduce_dtype, optimizer.mu_dtype)
    # stay off: the sums pay by the TPU compiler's estimate (BERT-Large, 4 layers: -5%) but the
    # BERT-tiny curve that shows no loss change ends on the unigram plateau; the moment saves
    # nothing with the state split over the devices (docs/tpu_estimates.md, "bf16 gradient sums").
    config.shard_weight_update = True
    if phase == "phase1":
        config.mesh_shape = (-1, 1, 2)  # (data, fsdp, tensor): 64 data x 2 tensor
        # The kernels' 64-way gathers in bf16 by an explicit all-gather (same math): 20.9 ->
        # 20.0 ms by the compiler; phase 2's FSDP layout gains nothing from it.
        config.shard_weight_update_explicit_gather = True
    else:
        config.mesh_shape = (-1, 8, 1)  # (data, fsdp, tensor): 16 data x 8 FSDP
    return config
