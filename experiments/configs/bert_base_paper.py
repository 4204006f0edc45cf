r"""BERT-Base as the paper trained it: 4 Cloud TPUs in a pod (16 TPU v3 chips), v3:4x4.

The recipe of `bert_base.py` (batch 256, lr 1e-4, 10k warmup, 900k steps at T=128 then
100k at T=512) on a v3-32 slice: 32 TPU v3 cores, 8 sequences per core, the train state
split over the cores (phase 1 FSDP, phase 2 the sharded weight update: the layouts the
TPU compiler's cost model ranks fastest). Data and checkpoints live in a bucket (see
`cloud_tpu.py` for the layout).

Fit check on this CPU (needs the `tpu` extra):

  python -m experiments.aot_compile \
      --config=experiments/configs/bert_base_paper.py:phase1   # and :phase2

Launch on Cloud TPU (docs/tpu.md walks through data creation and monitoring):

  make tpu-create ACCELERATOR_TYPE=v3-32 TPU_NAME=bert-base
  make tpu-setup tpu-data BUCKET=gs://my-bucket TPU_NAME=bert-base
  make tpu-pretrain CONFIG=experiments/configs/bert_base_paper.py PHASE=phase1 \
      BUCKET=gs://my-bucket TPU_NAME=bert-base ACCELERATOR_TYPE=v3-32
  make tpu-pretrain CONFIG=experiments/configs/bert_base_paper.py PHASE=phase2 \
      BUCKET=gs://my-bucket TPU_NAME=bert-base ACCELERATOR_TYPE=v3-32
"""

import ml_collections

from experiments.configs import bert_base, cloud_tpu


def get_config(phase: str = "phase1") -> ml_collections.ConfigDict:
    """Phase 1 (T=128) or phase 2 (T=512, from phase 1's checkpoints)."""
    config = bert_base.get_config(phase)
    config = cloud_tpu.on_cloud_tpu(
        config, config_name="bert_base_paper", phase=phase, topology="v3:4x4"
    )
    # The fastest layouts by the TPU compiler's cost model (docs/tpu_estimates.md); neither changes
    # the math. Phase 1: the train state split over all 32 cores and gathered layer by layer
    # (FSDP); phase 2: split over the cores, gathered once per step (sharded weight update).
    # bf16 gradient sums and bf16 first moment (config.grad_reduce_dtype, optimizer.mu_dtype)
    # stay off: the sums pay by the TPU compiler's estimate (BERT-Large, 4 layers: -5%) but the
    # BERT-tiny curve that shows no loss change ends on the unigram plateau; the moment saves
    # nothing with the state split over the devices (docs/tpu_estimates.md, "bf16 gradient sums").
    if phase == "phase1":
        config.mesh_shape = (1, -1, 1)  # (data, fsdp, tensor): 32-way FSDP
    else:
        config.mesh_shape = (-1, 1, 1)  # (data, fsdp, tensor): 32-way data parallel
        config.shard_weight_update = True
    return config
