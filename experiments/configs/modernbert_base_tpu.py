r"""ModernBERT-base on a TPU v4 slice: v4:4x4x4 (64 chips, `v4-128`), T=1,024 then 8,192.

Phase 1 is `modernbert_base.py` (the paper's 4,608 x 1,024-token batch, 30% masking,
packed rows, 360k updates), data parallel with the weight update sharded over the chips:
one step of 72 sequences per chip per update, each layer recomputed in the backward pass but
for q, k and v as the kernels read them and splash's output and logsumexp
(`remat_policy="save_attend_qkv_out"`), splash's backward as one kernel and local layers in
whole-row tiles. By the TPU compiler's estimate (splash attention, with the splash path's
layout changes) that is 622.1 ms per update, 34.4% MFU, 29.7 GiB of the usable 30.9 (657.6
ms with two backward kernels and 256-token local tiles; `save_attend_qkv`, q, k, v only:
698.2 ms, 24.7 GiB, the fallback if a real run runs short of memory). `save_attend_qkv_out`
is 14.5% faster than every layer recomputed (`full`: 769.5 ms, 27.8%,
13.0 GiB), itself 6.7% faster than four micro-steps of 18 per chip with nothing recomputed
(824.4 ms, 26.0%, 24.3 GiB) (docs/tpu_modernbert.md, "What still moves the bytes at 72 rows
per chip"; docs/tpu_modernbert_recipe.md, "Remat policies and rows per chip with splash").

Phase 2 is the paper's context extension (Warner et al. 2024: 8,192-token sequences,
global layers' rotary theta 160,000 — the preset's already —, 300B more tokens at an lr
of 3e-4, which the paper holds constant and then decays; ours warms up and decays
linearly): it starts from phase 1's params with a fresh schedule (`init_from`, as
`bert_large_lamb.py`). Its batch is the paper's too: 576 sequences of 8,192 (4.7M tokens
per step), 9 per chip. Under the einsum attention a global layer's f32 (A, T, T)
probabilities (10.5 GiB per sequence) held it to one per chip; splash holds no (T, T)
array, and by the TPU compiler's estimate 9 per chip with every layer recomputed in the
backward pass (`remat full`) fit in 12.7 GiB and cost 18% less per token than one per
chip: 1,032.9 ms per step, 114.8 ms per sequence, 34.4% MFU, against 140.2 ms and 28.2%
(docs/tpu_modernbert_recipe.md, "Remat policies and rows per chip with splash"). Keeping
q, k, v and splash's output and logsumexp as in phase 1 (`save_attend_qkv_out`) makes it
872.4 ms, 40.8% MFU, 29.6 GiB (docs/tpu_modernbert.md).

  python -m experiments.aot_compile --config=experiments/configs/modernbert_base_tpu.py:phase1

  make tpu-create ZONE=us-central2-b ACCELERATOR_TYPE=v4-128 TPU_NAME=modernbert
  make tpu-pretrain CONFIG=experiments/configs/modernbert_base_tpu.py PHASE=phase1 \
      ZONE=us-central2-b TPU_NAME=modernbert BUCKET=gs://my-bucket   # then PHASE=phase2
"""

import ml_collections

from experiments.configs import cloud_tpu, modernbert_base

CONFIG_NAME = "modernbert_base_tpu"
TOPOLOGY = "v4:4x4x4"  # 64 v4 chips: 4,608 / 64 = 72 sequences per chip per update in phase 1
LONG_SEQ_LEN = 8_192  # the paper's extended context (the preset's max_position_embeddings)
# phase 2: 300B tokens (the paper's context extension) at the paper's 576 x 8,192 per step
LONG_BATCH, LONG_STEPS = 576, 63_578


def get_config(phase: str = "phase1") -> ml_collections.ConfigDict:
    """Phase 1 (T=1,024) or phase 2 (T=8,192, from phase 1's params)."""
    config = modernbert_base.get_config()
    config = cloud_tpu.on_cloud_tpu(config, config_name=CONFIG_NAME, phase=phase, topology=TOPOLOGY)
    bucket = config.get_ref("bucket")
    config.data_dir = bucket + "/modern"  # ModernBERT's records (modernbert_base.py's layout)
    config.mesh_shape = (-1, 1, 1)  # (data, fsdp, tensor): 64-way data parallel
    config.shard_weight_update = True  # each chip updates 1/64 of the train state
    # Pallas' flash kernels, no (T, S) arrays (bert_jax.splash; issue 66): TPU-only, as this config
    config.model.attention_implementation = "splash"
    if phase == "phase1":
        # 72 per chip, each layer recomputed but q, k, v and splash's output and logsumexp:
        # 657.6 ms/update, 29.7 GiB (q, k, v alone, `save_attend_qkv`: 698.2, 24.7 GiB),
        # against 769.5 for `full` and 824.4 for 18 x 4 micro-steps with nothing recomputed
        # (docs/tpu_modernbert.md)
        config.model.remat_policy = "save_attend_qkv_out"
        # splash's backward as one kernel: at T = 1,024 a global layer's key tile is the whole
        # row, so dq needs no partial sums, and the probabilities are recomputed once, not
        # twice (at T = 8,192, eight key tiles, it costs more: phase 2 keeps two kernels)
        config.model.splash_fused_backward = True
        # local layers in one tile of the whole row (a window of 128 computed as a global
        # layer, masked): more FLOPs, fewer bytes, and the step is bound by its bytes. With
        # the fused backward: 622.1 ms/update, 34.4% MFU (docs/tpu_modernbert.md)
        config.model.splash_local_block = 1_024
    if phase == "phase2":
        data = config.data
        data.max_seq_length = LONG_SEQ_LEN  # T of the records
        data.train_files = bucket + f"/modern/seq{LONG_SEQ_LEN}/train-*.tfrecord"  # globs
        data.eval_files = bucket + f"/modern/seq{LONG_SEQ_LEN}/eval-*.tfrecord"  # "" disables
        data.max_predictions_per_seq = 2_496  # P: >= 30% of 8,192, a multiple of 64
        data.max_instances_per_row = 16  # instance slots of a packed row
        config.init_from = cloud_tpu.run_dir(bucket, CONFIG_NAME, "phase1") + "/checkpoints"
        config.global_batch_size = LONG_BATCH  # the paper's: 9 sequences per chip
        config.num_train_steps = LONG_STEPS  # this phase's own schedule
        config.start_step = 0  # params only: the step count restarts
        config.optimizer.learning_rate = 3e-4  # the paper's context-extension peak rate
        # the paper's 1e-5 per step at this phase's peak (the rate scales weight_decay here)
        config.optimizer.weight_decay = modernbert_base.decay_for(config.optimizer.learning_rate)
        config.optimizer.warmup_steps = 640  # as phase 1 (our choice)
        # each layer recomputed but q, k, v and splash's output and logsumexp: 9 per chip
        # 872.4 ms/step (40.8% MFU, 29.6 GiB; `save_attend_qkv` 958.0, 24.6 GiB) against
        # 1,032.9 for `full`; keeping the output projection gained nothing
        # (docs/tpu_modernbert.md, docs/tpu_modernbert_recipe.md)
        config.model.remat_policy = "save_attend_qkv_out"
    return config
