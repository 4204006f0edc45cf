r"""BERT-Large with LAMB and huge batches on a TPU v3 pod, v3:32x32 (1024 chips).

You et al. 2019 ("Large Batch Optimization for Deep Learning: Training BERT in 76
minutes"): mixed-batch training, 65,536 sequences of length 128, then 32,768 of length
512. The schedule is the one NVIDIA published for that recipe (DeepLearningExamples,
BERT `run_pretraining_lamb`): phase 1 7,038 updates, lr 6e-3, 2,000 warmup steps;
phase 2 1,563 updates, lr 4e-3, 200 warmup steps; polynomial decay of power 0.5.

Phase 2 re-warms its own schedule, so it starts from phase 1's *params* (`init_from`)
with fresh LAMB moments at step 0 (NVIDIA's code keeps the moments; our resume path
restores a step counter with them, which would put phase 2 past its schedule's end).

2,048 TPU v3 cores take 32 (phase 1) and 16 (phase 2) sequences each, which fits a
16 GiB core only with the attention recomputed in the backward pass (remat policy
`dots_with_no_batch_dims_saveable`) and, in phase 2, the train state sharded 8 ways
(`fsdp`); no gradient accumulation is needed.

  python -m experiments.aot_compile --config=experiments/configs/bert_large_lamb.py:phase1

  make tpu-qr-create ACCELERATOR_TYPE=v3-2048 TPU_NAME=bert-lamb   # a full pod: queue for it
  make tpu-setup tpu-data TPU_NAME=bert-lamb BUCKET=gs://my-bucket
  make tpu-pretrain CONFIG=experiments/configs/bert_large_lamb.py PHASE=phase1 \
      TPU_NAME=bert-lamb BUCKET=gs://my-bucket   # then PHASE=phase2
"""

import ml_collections

from experiments.configs import bert_large, cloud_tpu

# phase -> (global batch, updates, peak lr, warmup updates)
SCHEDULES = {"phase1": (65_536, 7_038, 6e-3, 2_000), "phase2": (32_768, 1_563, 4e-3, 200)}


def get_config(phase: str = "phase1") -> ml_collections.ConfigDict:
    """Phase 1 (T=128, batch 64k) or phase 2 (T=512, batch 32k, from phase 1's params)."""
    config = bert_large.get_config(phase)
    batch, steps, learning_rate, warmup = SCHEDULES[phase]
    config.resume_from = ""  # phase 2 takes phase 1's params only (see init_from)
    config = cloud_tpu.on_cloud_tpu(
        config, config_name="bert_large_lamb", phase=phase, topology="v3:32x32"
    )
    if phase == "phase2":  # phase 1's last checkpoint, params only: a fresh schedule
        phase1 = cloud_tpu.run_dir(config.get_ref("bucket"), "bert_large_lamb", "phase1")
        config.init_from = phase1 + "/checkpoints"
    config.global_batch_size = batch  # sequences per update over all devices
    config.num_train_steps = steps  # this phase's own schedule
    config.stop_at_step = None  # each phase runs its whole schedule
    config.start_step = 0  # phase 2 restarts the step count (params only)
    # 32 (phase 1) or 16 (phase 2) sequences per core need the attention recomputed in the
    # backward pass; phase 2 also shards the train state 8 ways (the fit check's choice).
    config.model.remat_policy = "dots_with_no_batch_dims_saveable"  # keep weight matmuls
    config.mesh_shape = (-1, 1, 1) if phase == "phase1" else (-1, 8, 1)  # (data, fsdp, tensor)
    # LAMB's state split over the data-parallel cores (a leaf with a dimension that divides):
    # faster by the TPU compiler's cost model (docs/tpu_estimates.md); the trust ratios stay
    # per layer.
    # Phase 1's 1024-wide leaves stay replicated (1.51 GiB a core); a 64 x 32 mesh of data
    # axes with shard_weight_update_spread splits them over two dimensions (0.01 GiB) but
    # costs the compiler 12% more time.
    config.shard_weight_update = True

    config.optimizer.name = "lamb"  # layer-wise trust ratio for huge batches
    config.optimizer.learning_rate = learning_rate  # peak
    config.optimizer.warmup_steps = warmup  # linear warmup from 0
    config.optimizer.decay_power = 0.5  # polynomial decay (NVIDIA's recipe)

    config.log_every = 10  # a few thousand updates in all: log often
    config.eval_every = 500
    config.checkpoint_every = 200
    return config
