r"""The demo's pretraining arms: BERT's recipe, each modern choice alone, all of them, and
ELECTRA's objective with BERT's encoder and with the modern one.

`experiments.demo --recipe=NAME` pretrains with `get_config(NAME)`; the comparison of the
arms at equal wall time (issue 43) is `experiments.recipe_compare`. Each arm is
`bert_tiny_cpu.py` (L2/H128/A2, the demo's model) with only its changes, so an arm's
gain or loss is the choice's. The demo's flags (records, T, batch, steps, optimizer) apply
to every arm alike; an arm's learning rate is its own unless --pretrain_learning_rate says.

  python -m experiments.pretrain --config=experiments/configs/demo_arms.py:modern ...

What the arms leave as BERT's: the model's size, dropout (0.1: the demo's corpus is small,
~10 epochs in 8,000 steps), every layer global (ModernBERT's local layers save nothing at
the demo's 64 characters), the tokenizer and the data. The held-out MLM metrics mask 15% in
every arm (`data.eval_masked_lm_prob`), so arms training at another rate compare; an
ELECTRA arm's are its generator's (a quarter of the width: not the encoder fine-tuned, so
only its fine-tuning compares).
"""

import dataclasses
from typing import Any

import ml_collections

from experiments.configs import bert_tiny_cpu

# The feed-forward width of a GeGLU block with the parameters of BERT-tiny's GELU MLP
# (2 x H x 4H = 3 x H x F, F = 8H / 3 = 341 at H = 128, rounded up to a multiple of 8).
GLU_INTERMEDIATE_SIZE = 344


@dataclasses.dataclass(frozen=True)
class Arm:
    """One pretraining recipe: BERT-tiny's config with these changes."""

    description: str
    model: dict[str, Any] = dataclasses.field(default_factory=dict)  # BertConfig fields
    masked_lm_prob: float = 0.15  # the training masking rate
    learning_rate: float = 1e-3  # the peak (the demo's BERT rate)
    schedule: str = "linear"  # bert_jax.optim.SCHEDULES
    # The pretraining objective: masked LM, or ELECTRA's replaced-token detection (a
    # generator of 1/4 the hidden size, bert_jax.electra's defaults; the encoder fine-tuned
    # is the discriminator).
    objective: str = "mlm"
    # The demo's pretraining steps with this recipe (experiments.demo's default): BERT's
    # 8,000, or the steps measured to take their wall time (None: 8,000).
    demo_steps: int | None = None


_ROTARY = {"position_encoding": "rotary"}
_GEGLU = {"feed_forward": "glu", "intermediate_size": GLU_INTERMEDIATE_SIZE}
_PRE_LN = {"norm_placement": "pre", "linear_bias": False, "norm_bias": False}

ARMS: dict[str, Arm] = {
    "bert": Arm("BERT: learned positions, GELU MLP, post-LN with biases, 15% masking, "
                "peak 1e-3 with linear decay"),
    "rotary": Arm("rotary positions (RoFormer; ModernBERT)", model=_ROTARY),
    "alibi": Arm("ALiBi: a distance penalty on the attention logits (MosaicBERT)",
                 model={"position_encoding": "alibi"}),
    "geglu": Arm(f"GeGLU feed-forward, F={GLU_INTERMEDIATE_SIZE} (the MLP's parameters)",
                 model=_GEGLU),
    "pre_ln": Arm("pre-LN without biases (norms and dense layers)", model=_PRE_LN),
    "mask30": Arm("30% of the characters masked in training (held-out: 15%)",
                  masked_lm_prob=0.30),
    "wsd": Arm("peak 2e-3, warmup-stable-decay (the last 20% of the steps decays)",
               learning_rate=2e-3, schedule="wsd"),
    # 6,550 steps: BERT's 8,000 x 4.48 / 5.47 steps/s (pretraining alone on 2 quiet cores,
    # 2026-11-27, experiments.recipe_compare's calibration).
    "modern": Arm("all of them but ALiBi (a CPU-sized ModernBERT): rotary, GeGLU, pre-LN "
                  "without biases, 30% masking, peak 2e-3 warmup-stable-decay",
                  model=_ROTARY | _GEGLU | _PRE_LN, masked_lm_prob=0.30, learning_rate=2e-3,
                  schedule="wsd", demo_steps=6_550),
    # ELECTRA (Clark et al. 2020) with each encoder: 15% masked (the paper's rate for its
    # Small and Base models), the discriminator's loss weighted 50, the generator 1/4 wide.
    "electra": Arm("ELECTRA (replaced-token detection) with BERT's encoder and recipe",
                   objective="electra"),
    "electra_modern": Arm("ELECTRA with the modern encoder and schedule (rotary, GeGLU, "
                          "pre-LN without biases, peak 2e-3 warmup-stable-decay), 15% masked",
                          model=_ROTARY | _GEGLU | _PRE_LN, learning_rate=2e-3,
                          schedule="wsd", objective="electra"),
}  # fmt: skip


def same_step(a: Arm, b: Arm) -> bool:
    """Whether the two arms' pretraining steps are one program (the same model, masking rate
    and objective; the learning rate and its schedule are only its inputs), so cost the same
    time: `experiments.recipe_compare` gives them the same steps, whatever their timings."""
    return (a.model, a.masked_lm_prob, a.objective) == (b.model, b.masked_lm_prob, b.objective)


def apply(config: ml_collections.ConfigDict, arm: Arm) -> ml_collections.ConfigDict:
    """`config` (a pretraining config) with `arm`'s changes."""
    for field, value in arm.model.items():
        config.model[field] = value
    config.objective = arm.objective
    config.data.masked_lm_prob = arm.masked_lm_prob
    config.data.eval_masked_lm_prob = 0.15
    config.optimizer.learning_rate = arm.learning_rate
    config.optimizer.schedule = arm.schedule
    return config


def get_config(name: str = "bert") -> ml_collections.ConfigDict:
    if name not in ARMS:
        raise ValueError(f"demo_arms.py: no arm {name!r}; the arms: {', '.join(ARMS)}")
    config = bert_tiny_cpu.get_config()
    # The demo's pretraining: on unmasked single segments (NER never reads NSP), the masks
    # drawn anew each epoch; masked LM alone unless the arm is ELECTRA's.
    config.data.dynamic_masking = True
    return apply(config, ARMS[name])
