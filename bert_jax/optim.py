"""Optimizers and learning-rate schedules of the BERT recipes, built from optax pieces.

- `adamw`: the original BERT `AdamWeightDecayOptimizer` (Adam without bias correction,
  decoupled weight decay skipped for LayerNorm parameters and biases).
- `lamb`: LAMB for large-batch pretraining (You et al. 2019), optax's pieces.
- `stable_adamw`: AdamW whose step each tensor scales down by its gradient's RMS against
  Adam's second moment (Wortsman et al. 2023; ModernBERT's optimizer, Warner et al. 2024).
All are preceded by global-norm clipping and may accumulate gradients over micro-steps. Each
may store its first moment in bf16 (`mu_dtype`, optax's name): the update is computed in
f32 from the f32 moment of the step, which is then rounded for storage (MLPerf BERT's
choice: 2 bytes a parameter less state, and less to read and write per update).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

# Only the annotations name it: the optimizers run where ml_collections is not installed (an
# accelerator machine's own Python, `benchmarks.accelerator_bench`).
if TYPE_CHECKING:
    import ml_collections

# Parameter names that the original excludes from weight decay ("LayerNorm", "layer_norm",
# "bias"); ours are the LayerNorm `scale`/`bias` leaves, every `bias`, and the MLM output bias.
_NO_DECAY_LEAVES = ("bias", "scale", "output_bias")


def decay_mask(params: Any) -> Any:
    """True for the leaves weight decay applies to: kernels and embedding tables."""

    def decays(path, _):
        # The last dict key names the leaf (boxed params add an attribute key after it).
        names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
        return names[-1] not in _NO_DECAY_LEAVES

    return jax.tree_util.tree_map_with_path(decays, params)


def warmup_polynomial_decay(
    peak_value: float, warmup_steps: int, total_steps: int, power: float = 1.0, end_value=0.0
) -> optax.Schedule:
    """The original schedule: linear warmup from 0, polynomial decay counted from step 0.

    As in google-research/bert, the decay is computed from the global step (not from the
    end of warmup), and warmup replaces it while `step < warmup_steps`.
    """
    decay = optax.polynomial_schedule(peak_value, end_value, power, total_steps)

    def schedule(step):
        warmup = peak_value * step / max(warmup_steps, 1)
        return jnp.where(step < warmup_steps, warmup, decay(step))

    return schedule


class ScaleByAdamNoBiasState(NamedTuple):
    mu: Any  # first moment
    nu: Any  # second moment


def scale_by_adam_without_bias_correction(
    b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6, mu_dtype=None
) -> optax.GradientTransformation:
    """Adam's m / (sqrt(v) + eps) without bias correction, as the original BERT optimizer.

    `mu_dtype` stores the first moment in that dtype (None: the params'), as optax's Adam:
    the step's moment is f32 (the f32 gradient promotes the stored one) until stored.
    """

    def init(params):
        zeros = optax.tree_utils.tree_zeros_like(params, dtype=mu_dtype)
        return ScaleByAdamNoBiasState(mu=zeros, nu=optax.tree_utils.tree_zeros_like(params))

    def update(updates, state, params=None):
        del params
        mu = optax.tree_utils.tree_update_moment(updates, state.mu, b1, 1)
        nu = optax.tree_utils.tree_update_moment_per_elem_norm(updates, state.nu, b2, 2)
        updates = jax.tree.map(lambda m, v: m / (jnp.sqrt(v) + eps), mu, nu)
        mu = optax.tree_utils.tree_cast(mu, mu_dtype)
        return updates, ScaleByAdamNoBiasState(mu=mu, nu=nu)

    return optax.GradientTransformation(init, update)


def bert_adamw(
    learning_rate: optax.ScalarOrSchedule,
    weight_decay: float = 0.01,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-6,
    mu_dtype=None,
) -> optax.GradientTransformation:
    """The original BERT AdamW: no bias correction, decay masked off LayerNorm and biases."""
    adam = scale_by_adam_without_bias_correction(b1, b2, eps, mu_dtype)
    return _with_masked_decay(adam, learning_rate, weight_decay)


def adamw_bias_corrected(
    learning_rate: optax.ScalarOrSchedule,
    weight_decay: float = 0.01,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-6,
    mu_dtype=None,
) -> optax.GradientTransformation:
    """`bert_adamw` with Adam's bias correction (optax's Adam), decay masked the same way."""
    adam = optax.scale_by_adam(b1, b2, eps, mu_dtype=mu_dtype)
    return _with_masked_decay(adam, learning_rate, weight_decay)


def lamb(
    learning_rate: optax.ScalarOrSchedule,
    weight_decay: float = 0.01,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-6,
    mu_dtype=None,
) -> optax.GradientTransformation:
    """`optax.lamb` (decay masked as `bert_adamw`'s), built from the same pieces in the same
    order, so its state is optax's, with the first moment stored in `mu_dtype` (None: the
    params' dtype), which `optax.lamb` does not take."""
    return optax.chain(
        optax.scale_by_adam(b1, b2, eps, mu_dtype=mu_dtype),
        optax.add_decayed_weights(weight_decay, mask=decay_mask),
        optax.scale_by_trust_ratio(),
        optax.scale_by_learning_rate(learning_rate),
    )


def _with_masked_decay(
    adam: optax.GradientTransformation,
    learning_rate: optax.ScalarOrSchedule,
    weight_decay: float,
) -> optax.GradientTransformation:
    """Adam's direction, then decoupled weight decay off LayerNorm and biases, then the rate."""
    return optax.chain(
        adam,
        optax.add_decayed_weights(weight_decay, mask=decay_mask),
        optax.scale_by_learning_rate(learning_rate),
    )


# Per-tensor update clipping (`clip_by_gradient_rms`) --------------------------------------

# The Encoder's scanned layers (`scan_layers=True`) stack each layer's tensor on axis 0 under
# this name (`bert_jax.model.Encoder`): one leaf, `num_hidden_layers` tensors.
STACKED_LAYERS = "layers"


def stacked_mask(params: Any) -> Any:
    """True for the leaves that stack one tensor per layer on axis 0 (scanned layers)."""

    def stacked(path, _):
        return STACKED_LAYERS in [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]

    return jax.tree_util.tree_map_with_path(stacked, params)


def gradient_rms(grad: jax.Array, nu_hat: jax.Array, eps: float, stacked: bool) -> jax.Array:
    """sqrt(mean(g^2 / max(v_hat, eps^2))) of one tensor, or of each layer's (`stacked`:
    one value per index of axis 0, shaped to broadcast against `grad`), in f32."""
    ratio = jnp.square(grad.astype(jnp.float32)) / jnp.maximum(
        nu_hat.astype(jnp.float32), eps * eps
    )
    axes = tuple(range(1, ratio.ndim)) if stacked and ratio.ndim > 0 else None
    return jnp.sqrt(jnp.mean(ratio, axis=axes, keepdims=stacked))


def clip_by_gradient_rms(
    inner: optax.GradientTransformation, b2: float, eps: float
) -> optax.GradientTransformation:
    """Scales each tensor's output of `inner` by 1 / max(1, RMS), RMS = `gradient_rms` of the
    raw gradient against the bias-corrected second moment of `inner`'s Adam (its state's
    `nu` and `count`, after this step's update).

    The update clipping of Wortsman et al. 2023 ("Stable and low-precision training for
    large-scale vision-language models", Algorithm 1, from AdaFactor): when a tensor's
    gradient is large against what Adam's second moment has seen (v lags g after a spike),
    its whole step shrinks, weight decay included, instead of Adam's per-element steps of
    up to lr. RMS is 1 on the first step (v_hat = g^2). Scanned layers' stacked leaves are
    clipped per layer (`stacked_mask`), as the looped model's tensors are.
    """

    def update(updates, state, params=None):
        grads = updates
        updates, state = inner.update(grads, state, params)
        nu = optax.tree_utils.tree_get(state, "nu")
        count = optax.tree_utils.tree_get(state, "count")
        nu_hat = optax.tree_utils.tree_bias_correction(nu, b2, count)
        stacked = stacked_mask(grads)

        def clip(u, g, v, s):
            rms = gradient_rms(g, v, eps, s)
            return (u / jnp.maximum(1.0, rms)).astype(u.dtype)

        return jax.tree.map(clip, updates, grads, nu_hat, stacked), state

    return optax.GradientTransformation(inner.init, update)


def stable_adamw(
    learning_rate: optax.ScalarOrSchedule,
    peak_learning_rate: float,
    weight_decay: float = 1e-5,
    b1: float = 0.9,
    b2: float = 0.98,
    eps: float = 1e-6,
    mu_dtype=None,
) -> optax.GradientTransformation:
    """StableAdamW with fully decoupled weight decay: ModernBERT's `decoupled_stableadamw`
    (Warner et al. 2024, through optimi's StableAdamW with `decouple_lr=True`).

    Per tensor, with eta_t the schedule's rate and RMS `gradient_rms`:
        eta' = eta_t / max(1, RMS)
        p <- p - eta' * (m_hat / (sqrt(v_hat) + eps) + (weight_decay / peak) * p)
    `weight_decay` is the fraction a weight shrinks per step at the peak rate (1e-5:
    ModernBERT's), not multiplied by the rate as optax's AdamW's is (there 1e-5 x 8e-4 would
    shrink it by 8e-9). Decay is masked off LayerNorm and biases (`decay_mask`), as
    ModernBERT's `filter_bias_norm_wd`. The state is optax's Adam state.
    """
    if not peak_learning_rate > 0:
        raise ValueError(
            f"stable_adamw needs a positive peak learning rate, got {peak_learning_rate}"
        )
    direction = optax.chain(
        optax.scale_by_adam(b1, b2, eps, mu_dtype=mu_dtype),
        optax.add_decayed_weights(weight_decay / peak_learning_rate, mask=decay_mask),
    )
    return optax.chain(
        clip_by_gradient_rms(direction, b2, eps), optax.scale_by_learning_rate(learning_rate)
    )


# Learning-rate schedules -------------------------------------------------------------------


def one_minus_sqrt_schedule(init_value: float, decay_steps: int) -> optax.Schedule:
    """init_value * (1 - sqrt(step / decay_steps)), 0 from `decay_steps` on: the "1-sqrt"
    anneal of ModernBERT's last phase (Warner et al. 2024; Hägele et al. 2024)."""

    def schedule(step):
        frac = jnp.clip(step / max(decay_steps, 1), 0.0, 1.0)
        return init_value * (1.0 - jnp.sqrt(frac))

    return schedule


# config.optimizer.decay_shape -> the anneal of "wsd"'s last `decay_fraction` of the steps.
DECAY_SHAPES = (
    "linear",  # peak to 0 in a straight line (transformers' get_wsd_schedule "linear")
    "1-sqrt",  # peak x (1 - sqrt(fraction of the decay done)): ModernBERT's phase-3 decay
)


def warmup_stable_decay(
    peak_value: float,
    warmup_steps: int,
    total_steps: int,
    decay_fraction: float,
    decay_shape: str = "linear",
) -> optax.Schedule:
    """Linear warmup from 0, the peak held, then a decay to 0 (`DECAY_SHAPES`) over the last
    `decay_fraction` of the steps (the "trapezoidal" or warmup-stable-decay schedule of
    ModernBERT and MiniCPM: most steps at the peak, a short anneal at the end).
    """
    decay_steps = max(round(total_steps * decay_fraction), 1)
    stable_end = max(total_steps - decay_steps, warmup_steps)
    if decay_shape == "linear":
        decay = optax.linear_schedule(peak_value, 0.0, total_steps - stable_end)
    elif decay_shape == "1-sqrt":
        decay = one_minus_sqrt_schedule(peak_value, total_steps - stable_end)
    else:
        raise ValueError(
            f"config.optimizer.decay_shape must be one of {DECAY_SHAPES}, got {decay_shape!r}"
        )
    return optax.join_schedules(
        [
            optax.linear_schedule(0.0, peak_value, max(warmup_steps, 1)),
            optax.constant_schedule(peak_value),
            decay,
        ],
        boundaries=[warmup_steps, stable_end],
    )


def warmup_constant(peak_value: float, warmup_steps: int) -> optax.Schedule:
    """Linear warmup from 0, then the peak held to the end: a trapezoid whose decay is a
    later run's (ModernBERT's phase 1, whose rate only decays in its last phase)."""
    return optax.join_schedules(
        [
            optax.linear_schedule(0.0, peak_value, max(warmup_steps, 1)),
            optax.constant_schedule(peak_value),
        ],
        boundaries=[warmup_steps],
    )


# config.optimizer.schedule -> what the learning rate does after warmup.
SCHEDULES = (
    "linear",  # polynomial decay (power `decay_power`, 1 = linear) to 0 from step 0: BERT
    "wsd",  # held at the peak, then decay (`decay_shape`) over the last `decay_fraction`
    "constant",  # held at the peak to the end: a phase whose decay is a later run's
)


def learning_rate_schedule(
    config: ml_collections.ConfigDict, num_train_steps: int
) -> optax.Schedule:
    """The schedule an optimizer config describes, over `num_train_steps` updates.

    Keys: learning_rate (the peak), warmup_steps, schedule (`SCHEDULES`; absent: "linear"),
    decay_power ("linear"), decay_fraction and decay_shape (`DECAY_SHAPES`; "wsd").
    """
    name = config.get("schedule", "linear")
    if name == "linear":
        return warmup_polynomial_decay(
            config.learning_rate,
            config.warmup_steps,
            num_train_steps,
            power=config.get("decay_power", 1.0),
        )
    if name == "wsd":
        fraction = config.get("decay_fraction", 0.2)
        if not 0 < fraction <= 1:
            raise ValueError(f"config.optimizer.decay_fraction must be in (0, 1], got {fraction}")
        return warmup_stable_decay(
            config.learning_rate,
            config.warmup_steps,
            num_train_steps,
            fraction,
            config.get("decay_shape", "linear"),
        )
    if name == "constant":
        return warmup_constant(config.learning_rate, config.warmup_steps)
    raise ValueError(f"config.optimizer.schedule must be one of {SCHEDULES}, got {name!r}")


# config.optimizer.name -> the update rule.
OPTIMIZERS = (
    "adamw",  # the original BERT AdamW: no bias correction, decay scaled by the rate
    "adamw_bias_corrected",  # torch's / optax's AdamW, decay masked as BERT's
    "lamb",  # LAMB (You et al. 2019): large-batch pretraining
    "stable_adamw",  # StableAdamW, decay decoupled from the rate: ModernBERT's (`stable_adamw`)
)

# config.optimizer.mu_dtype -> the dtype the first moment is stored in (None: the params', f32).
MU_DTYPES = {"float32": None, "bfloat16": jnp.bfloat16}


def make_optimizer(
    config: ml_collections.ConfigDict, num_train_steps: int
) -> optax.GradientTransformation:
    """Builds the optimizer of an experiment's `config.optimizer` block.

    Keys: name (`OPTIMIZERS`), learning_rate, warmup_steps,
    decay_power, weight_decay, b1, b2, eps, max_grad_norm, grad_accum_steps, mu_dtype
    (`MU_DTYPES`; absent: 'float32'). The schedule counts optimizer updates, i.e. micro-steps /
    grad_accum_steps.
    """
    mu_name = config.get("mu_dtype", "float32")
    if mu_name not in MU_DTYPES:
        raise ValueError(
            f"config.optimizer.mu_dtype must be one of {tuple(MU_DTYPES)}, got {mu_name!r}"
        )
    schedule = learning_rate_schedule(config, num_train_steps)
    moments = (config.b1, config.b2, config.eps, MU_DTYPES[mu_name])
    if config.name == "adamw":
        opt = bert_adamw(schedule, config.weight_decay, *moments)
    elif config.name == "adamw_bias_corrected":
        # Adam's bias correction: without it (the original) the first updates are up to
        # (1 - b1^t) / sqrt(1 - b2^t) times larger, ~2.5-4x at the end of a short warmup.
        opt = adamw_bias_corrected(schedule, config.weight_decay, *moments)
    elif config.name == "lamb":
        opt = lamb(schedule, config.weight_decay, *moments)
    elif config.name == "stable_adamw":
        opt = stable_adamw(schedule, config.learning_rate, config.weight_decay, *moments)
    else:
        raise ValueError(f"config.optimizer.name must be one of {OPTIMIZERS}, got {config.name!r}")
    if config.max_grad_norm:
        opt = optax.chain(optax.clip_by_global_norm(config.max_grad_norm), opt)
    if config.get("grad_accum_steps", 1) > 1:
        opt = optax.MultiSteps(opt, every_k_schedule=config.grad_accum_steps)
    return opt
