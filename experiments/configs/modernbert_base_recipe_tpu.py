r"""ModernBERT-base with ModernBERT's own recipe on a TPU v4-128 (Warner et al. 2024).

`modernbert_base_tpu.py` is the ModernBERT model trained with this project's pipeline (AdamW,
one batch size, linear warmup and decay). This file is the paper's recipe on the same slice
and layout, each choice marked with its source:

- StableAdamW (`bert_jax.optim.stable_adamw`): AdamW whose step each tensor divides by
  max(1, RMS of its gradient against Adam's second moment) (Wortsman et al. 2023), with
  weight decay 1e-5 decoupled from the learning rate, b2 0.98, eps 1e-6, decay off norms
  and biases, and no global-norm clipping: the paper's `decoupled_stableadamw` (Warner et
  al. 2024, its pretraining yaml).
- The trapezoidal learning rate: warmup over 3B tokens to 8e-4, then held through phase 1
  (the paper's `warmup_stable_decay` with no decay in phase 1); phase 2 at a constant 3e-4,
  and phase 3's 1-sqrt decay to 0 over the last 50B tokens (the paper: to 0.001 x; the
  difference is 3e-7 at the last step).
- Batch-size warmup: the paper grows the batch from 768 to 4,608 sequences over its first
  50B tokens (its data loader adds sequences as tokens are seen). Here the batch grows in
  five stages (`warmup1` .. `warmup5`) of 10B tokens each, at the paper's ramp's batch at
  each stage's middle (1,152 to 4,224, multiples of the 64 chips), each a run that resumes
  the previous stage's full train state (`resume_from`: params, StableAdamW's moments,
  step) and compiles its own step. A run's data position is only valid for the batch size
  it was saved with (`pretraining_input.data_identity`), so each stage starts its data
  stream again, with its own seed (another file order and shuffle): the stages' 50B
  tokens are drawn anew from the corpus at each stage, not continued. The ramp is a
  staircase, not the paper's straight line.
- Phase 1: the rest of the paper's 1.719T tokens at 4,608 x 1,024 (the paper's batch).
- Phase 2: the context extension to T = 8,192 with the global layers' rotary theta raised
  from 10k to 160k (local layers keep 10k: the paper's), continuing phase 1's full train
  state, the learning rate restarted at 3e-4 with no warmup (the paper's
  `constant_with_warmup` with 0 warmup), 250B tokens held, then the paper's phase 3 as the
  last 50B tokens of the same run: the same data, length and batch, the rate decaying as
  1 - sqrt. The paper ran phase 3 as a run of its own; here it is the tail of phase 2's
  schedule (`optim.warmup_stable_decay`, `decay_shape="1-sqrt"`), so the data read on.
  The batch is the paper's, 576 sequences of 8,192 (4.7M tokens per step), 9 per chip
  (`LONG_ROWS_PER_CHIP`): with splash attention the fastest per token of 1, 4 and 9 per chip
  by the TPU compiler's estimate (docs/tpu_modernbert_recipe.md).

The layout is `modernbert_base_tpu.py`'s (64-way data parallel, the weight update sharded),
one step per update: nothing recomputed at 18 sequences per chip (`warmup1`), above that and
in phase 2 each layer recomputed but q, k, v and splash's output and logsumexp
(`save_attend_qkv_out`), with phase 1's splash settings. By the TPU compiler's estimate
(splash attention; the stages taken at `modernbert_base_tpu.py`'s step times, which
StableAdamW and the rotary theta do not change) the whole recipe takes 3.3 days on the
v4-128 (docs/tpu_modernbert_recipe.md has each stage's figures).

Step counts are the paper's token counts at our batches. The run, stage by stage:

  make tpu-create ZONE=us-central2-b ACCELERATOR_TYPE=v4-128 TPU_NAME=modernbert
  for p in warmup1 warmup2 warmup3 warmup4 warmup5 phase1 phase2; do
    make tpu-pretrain CONFIG=experiments/configs/modernbert_base_recipe_tpu.py PHASE=$p \
        ZONE=us-central2-b TPU_NAME=modernbert BUCKET=gs://my-bucket
  done

The fit check and the compiler's step-time estimate of a stage:

  python -m experiments.aot_compile \
      --config=experiments/configs/modernbert_base_recipe_tpu.py:phase1
"""

import math

import ml_collections

from experiments.configs import cloud_tpu, modernbert_base_tpu

CONFIG_NAME = "modernbert_base_recipe_tpu"
CHIPS = 64  # v4:4x4x4, modernbert_base_tpu's slice
SEQ_LEN, LONG_SEQ_LEN = 1_024, modernbert_base_tpu.LONG_SEQ_LEN  # phase 1, then 8,192

# Phase 1 (the paper's pretraining yaml): 1.719T tokens, batch 4,608 after the warmup.
PHASE1_TOKENS = 1_719_000_000_000
BATCH = 4_608
LR_WARMUP_TOKENS = 3_000_000_000  # the paper's learning-rate warmup (`t_warmup: 3B tok`)
# Batch-size warmup: the paper's 768 -> 4,608 over 50B tokens, as five 10B-token stages at
# the ramp's batch at each stage's middle (multiples of the 64 chips and 64 data streams).
BATCH_WARMUP = (768, 4_608, 50_000_000_000)  # (first batch, last batch, tokens)
STAGES = 5

# Sequences per chip that fit with nothing recomputed (TPU compiler, v4, T=1,024: 28.8 GiB).
NO_REMAT_ROWS = 18

# Phases 2 and 3 (the paper's context extension): 250B tokens held at 3e-4, then 50B decayed.
LONG_TOKENS, DECAY_TOKENS = 250_000_000_000, 50_000_000_000
# Sequences of 8,192 per chip: the paper's 576 per step, with splash attention the fastest
# per token by the compiler's estimate (`remat full`: 114.8 ms per sequence against 140.2
# at 1 per chip; docs/tpu_modernbert_recipe.md; 96.9 with `save_attend_qkv_out`, the
# layout now).
LONG_ROWS_PER_CHIP = 9


def warmup_batches() -> list[int]:
    """The batch of each batch-warmup stage: the paper's linear ramp at the stage's middle,
    rounded to a multiple of the chips."""
    first, last, _ = BATCH_WARMUP
    return [
        CHIPS * round((first + (last - first) * (k + 0.5) / STAGES) / CHIPS) for k in range(STAGES)
    ]


def stage_steps() -> list[tuple[str, int, int]]:
    """(variant, global batch, steps) of phase 1's runs in order: the warmup stages, then the
    rest of phase 1's tokens at the paper's batch."""
    tokens = BATCH_WARMUP[2] / STAGES
    stages = [
        (f"warmup{k + 1}", batch, math.ceil(tokens / (batch * SEQ_LEN)))
        for k, batch in enumerate(warmup_batches())
    ]
    rest = PHASE1_TOKENS - BATCH_WARMUP[2]
    return [*stages, ("phase1", BATCH, round(rest / (BATCH * SEQ_LEN)))]


def schedule_steps() -> tuple[int, int, int]:
    """(steps of phase 1 in all, phase 2's held steps, its decay steps)."""
    phase1 = sum(steps for _, _, steps in stage_steps())
    long_batch = LONG_ROWS_PER_CHIP * CHIPS * LONG_SEQ_LEN
    return phase1, round(LONG_TOKENS / long_batch), round(DECAY_TOKENS / long_batch)


VARIANTS = tuple(name for name, _, _ in stage_steps()) + ("phase2",)


def get_config(variant: str = "phase1") -> ml_collections.ConfigDict:
    """A stage of phase 1 (`warmup1` .. `warmup5`, `phase1`) or phase 2 (with phase 3)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}: choose one of {', '.join(VARIANTS)}")
    config = modernbert_base_tpu.get_config("phase2" if variant == "phase2" else "phase1")
    bucket = config.get_ref("bucket")
    phase1_steps, held, decay = schedule_steps()
    total = phase1_steps + held + decay
    config.num_train_steps = total  # one step count from the first stage to phase 3's end
    config.checkpoint_every = 1_000  # steps; below the shortest stage (2,312 steps)

    opt = config.optimizer
    opt.name = "stable_adamw"  # the paper's decoupled_stableadamw (bert_jax.optim.OPTIMIZERS)
    opt.weight_decay = 1e-5  # per step at the peak rate, not times the rate (the paper's)
    opt.b1, opt.b2, opt.eps = 0.9, 0.98, 1e-6  # the paper's
    opt.max_grad_norm = 0.0  # none: StableAdamW clips each tensor's step (the paper's)

    if variant == "phase2":
        config.init_from = ""  # not params only: phase 1's full state goes on
        config.resume_from = cloud_tpu.run_dir(bucket, CONFIG_NAME, "phase1") + "/checkpoints"
        config.allow_model_change = True  # the global rotary theta 10k -> 160k (the paper's)
        config.model.rope_theta = 160_000.0  # global layers (local: the preset's 10k)
        config.global_batch_size = LONG_ROWS_PER_CHIP * CHIPS  # see LONG_ROWS_PER_CHIP
        config.start_step = phase1_steps  # where phase 1 stopped
        config.stop_at_step = None  # on to phase 3's end
        config.seed = 1 + STAGES + 1  # phase 1's were 1 .. STAGES + 1
        opt.learning_rate = 3e-4  # the paper's context-extension rate, no warmup
        opt.warmup_steps = 0
        opt.schedule = "wsd"  # held, then the last DECAY_TOKENS decayed (the paper's phase 3)
        opt.decay_fraction = decay / total  # of the whole step count: phase 3's steps
        opt.decay_shape = "1-sqrt"  # the paper's phase-3 decay (`one_minus_sqrt`)
        return config

    stages = stage_steps()
    index = [name for name, _, _ in stages].index(variant)
    _, batch, _ = stages[index]
    start = sum(steps for _, _, steps in stages[:index])
    config.model.rope_theta = 10_000.0  # global layers in phase 1 (the paper's; 160k after)
    config.global_batch_size = batch  # this stage's (warmup_batches) or the paper's 4,608
    # One step per update: the stages chain full train states, and gradient accumulation
    # (optax.MultiSteps) would give the stages with and without it different states.
    opt.grad_accum_steps = 1
    # Nothing recomputed where that fits (18 sequences per chip), else modernbert_base_tpu.py's
    # phase 1 layout (each layer recomputed but q, k, v and splash's output, which fits its 72
    # sequences per chip and so the stages' fewer; docs/tpu_modernbert.md)
    if batch // CHIPS <= NO_REMAT_ROWS:
        config.model.remat_policy = "none"
    config.start_step = start  # where the previous stage stopped (0 for the first)
    config.stop_at_step = start + stages[index][2]  # this stage's share of the tokens
    config.seed = 1 + index  # each stage restarts its data: another file order and shuffle
    if index:  # the previous stage's full train state: params, moments, step
        previous = stages[index - 1][0]
        config.resume_from = cloud_tpu.run_dir(bucket, CONFIG_NAME, previous) + "/checkpoints"
    opt.learning_rate = 8e-4  # the paper's peak
    # The paper's 3B warmup tokens, all in the first stage's batch (the paper's ramp starts
    # at 768 sequences; ours at 1,152, the first stage's).
    opt.warmup_steps = math.ceil(LR_WARMUP_TOKENS / (stages[0][1] * SEQ_LEN))
    opt.schedule = "constant"  # held at the peak: phase 1 does not decay (the paper's)
    return config
