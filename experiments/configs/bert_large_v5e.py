r"""BERT-Large, the paper's recipe, on a TPU v5e slice: v5e:4x4 (16 chips, `v5litepod-16`).

The recipe of `bert_large.py` (batch 256, lr 1e-4, 10k warmup, 900k steps at T=128,
then 100k at T=512) on 16 v5e chips (197 bf16 TFLOP/s and 16 GiB of HBM each): 16
sequences per chip. Phase 1 runs data parallel with the weight update sharded over the
chips (the fastest layout by the TPU compiler's cost model); phase 2's 16 x 512 tokens
per chip do not fit beside a replicated train state, so phase 2 shards it over all 16
chips (FSDP: parameters are all-gathered layer by layer) and recomputes attention in the
backward pass. Both choices come from the fit check (`make aot-check`).

  python -m experiments.aot_compile --config=experiments/configs/bert_large_v5e.py:phase1

  make tpu-create ZONE=us-west4-a ACCELERATOR_TYPE=v5litepod-16 \
      RUNTIME_VERSION=v2-alpha-tpuv5-lite TPU_NAME=bert-v5e
  make tpu-setup tpu-data ZONE=us-west4-a TPU_NAME=bert-v5e BUCKET=gs://my-bucket
  make tpu-pretrain CONFIG=experiments/configs/bert_large_v5e.py PHASE=phase1 \
      ZONE=us-west4-a TPU_NAME=bert-v5e BUCKET=gs://my-bucket   # then PHASE=phase2
"""

import ml_collections

from experiments.configs import bert_large, cloud_tpu


def get_config(phase: str = "phase1") -> ml_collections.ConfigDict:
    """Phase 1 (T=128) or phase 2 (T=512, from phase 1's checkpoints)."""
    config = bert_large.get_config(phase)
    config = cloud_tpu.on_cloud_tpu(
        config, config_name="bert_large_v5e", phase=phase, topology="v5e:4x4"
    )
    # bf16 gradient sums and bf16 first moment (config.grad_reduce_dtype, optimizer.mu_dtype)
    # stay off: the sums pay by the TPU compiler's estimate (BERT-Large, 4 layers: -5%) but the
    # BERT-tiny curve that shows no loss change ends on the unigram plateau; the moment saves
    # nothing with the state split over the devices (docs/tpu_estimates.md, "bf16 gradient sums").
    if phase == "phase1":  # the train state split over the chips, gathered once a step
        config.mesh_shape = (-1, 1, 1)  # (data, fsdp, tensor): 16-way data parallel
        config.shard_weight_update = True
    else:  # train state sharded over all 16 chips, attention recomputed
        config.mesh_shape = (1, -1, 1)  # (data, fsdp, tensor): 16-way FSDP
        config.model.remat_policy = "dots_with_no_batch_dims_saveable"
    return config
