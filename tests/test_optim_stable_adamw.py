"""StableAdamW's per-tensor update clipping and the schedules of ModernBERT's recipe, against
numpy computations of the published formulas (Wortsman et al. 2023, Algorithm 1; ModernBERT's
fully decoupled weight decay; the 1-sqrt anneal)."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from bert_jax import optim

B1, B2, EPS, PEAK, DECAY = 0.9, 0.98, 1e-6, 1e-2, 0.05
STEPS, SPIKE = 10, 7  # steps run; the one whose gradient spikes


def numpy_stable_adamw(params, grads_per_step, rates, stacked_names=()):
    """StableAdamW written out in numpy: per tensor (per layer of a stacked one), the step's
    rate is divided by max(1, sqrt(mean(g^2 / max(v_hat, eps^2)))), and that rate scales both
    Adam's step and the decay (weight_decay / peak) of every leaf but biases.

    Returns the params after each step and the divisor each tensor got at each step."""
    p = {k: np.array(v, np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(x) for k, x in p.items()}
    history, divisors = [], []
    for t, (grads, rate) in enumerate(zip(grads_per_step, rates, strict=True), start=1):
        step_divisors = {}
        for k in p:
            g = np.asarray(grads[k], np.float64)
            m[k] = B1 * m[k] + (1 - B1) * g
            v[k] = B2 * v[k] + (1 - B2) * g * g
            m_hat = m[k] / (1 - B1**t)
            v_hat = v[k] / (1 - B2**t)
            ratio = g * g / np.maximum(v_hat, EPS * EPS)
            if k in stacked_names:  # one tensor per index of axis 0
                rms = np.sqrt(ratio.reshape(ratio.shape[0], -1).mean(axis=1))
                rms = rms.reshape((-1,) + (1,) * (g.ndim - 1))
            else:
                rms = np.sqrt(ratio.mean())
            divisor = np.maximum(1.0, rms)
            step_divisors[k] = divisor
            lr = rate / divisor
            decay = 0.0 if k == "bias" else DECAY / PEAK
            p[k] = p[k] - lr * (m_hat / (np.sqrt(v_hat) + EPS) + decay * p[k])
        history.append({k: x.copy() for k, x in p.items()})
        divisors.append(step_divisors)
    return history, divisors


def _grads(rng, shapes, spike):
    """Gradients of 10 steps; at step 8 the `spike` tensor's gradient is 30x larger (v_hat
    then holds (1 - b2) / (1 - b2^8) = 13% of the spike's square: RMS up to 2.7)."""
    steps = []
    for t in range(STEPS):
        g = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
        if t == SPIKE:
            g[spike] = g[spike] * 30.0
        steps.append(g)
    return steps


def _run_optax(tx, params, grads_per_step):
    state = tx.init(params)
    history = []
    for grads in grads_per_step:
        grads = jax.tree.map(jnp.asarray, grads)
        updates, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)
        history.append(jax.tree.map(np.asarray, params))
    return history


def test_stable_adamw_clips_each_tensor_by_its_own_gradient_rms():
    rng = np.random.default_rng(0)
    shapes = {"kernel": (6, 5), "bias": (5,)}
    params = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
    grads = _grads(rng, shapes, spike="kernel")
    rates = [PEAK * f for f in np.linspace(0.2, 1.0, STEPS)]  # a schedule: each step's rate
    expected, divisors = numpy_stable_adamw(params, grads, rates)
    # The test means something: the spike is clipped, the other tensor at that step is not.
    assert float(divisors[SPIKE]["kernel"]) > 2.0
    assert float(divisors[SPIKE]["bias"]) == 1.0
    assert float(divisors[0]["kernel"]) == 1.0  # v_hat = g^2 at the first step

    schedule = lambda step: jnp.asarray(rates)[step]  # noqa: E731  (the step's rate)
    tx = optim.stable_adamw(schedule, PEAK, DECAY, B1, B2, EPS)
    ours = _run_optax(tx, jax.tree.map(jnp.asarray, params), grads)
    for step, (got, want) in enumerate(zip(ours, expected, strict=True)):
        for k in shapes:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-7, err_msg=f"{k} {step}")


def test_scanned_layers_are_clipped_layer_by_layer():
    """A stacked (L, ...) leaf of scanned layers is L tensors: a spike in one layer's slice
    clips that layer alone, as the looped model's separate tensors would be."""
    rng = np.random.default_rng(1)
    params = {"encoder": {"layers": {"kernel": rng.normal(size=(3, 4, 4)).astype(np.float32)}}}
    flat = {"kernel": params["encoder"]["layers"]["kernel"]}
    grads = []
    for t in range(STEPS):
        g = rng.normal(size=(3, 4, 4)).astype(np.float32)
        if t == SPIKE:
            g[1] *= 30.0  # layer 1 only
        grads.append({"kernel": g})
    expected, divisors = numpy_stable_adamw(flat, grads, [PEAK] * STEPS, stacked_names=("kernel",))
    spike = divisors[SPIKE]["kernel"].ravel()
    assert spike[1] > 2.0 and spike[0] == 1.0 and spike[2] == 1.0

    tx = optim.stable_adamw(PEAK, PEAK, DECAY, B1, B2, EPS)
    nested = [{"encoder": {"layers": g}} for g in grads]
    ours = _run_optax(tx, jax.tree.map(jnp.asarray, params), nested)
    for got, want in zip(ours, expected, strict=True):
        np.testing.assert_allclose(
            got["encoder"]["layers"]["kernel"], want["kernel"], rtol=1e-5, atol=1e-7
        )


def test_make_optimizer_builds_stable_adamw_from_a_config():
    config = ml_collections.ConfigDict(
        {"name": "stable_adamw", "learning_rate": PEAK, "warmup_steps": 0, "schedule": "constant",
         "weight_decay": DECAY, "b1": B1, "b2": B2, "eps": EPS, "max_grad_norm": 0.0}
    )  # fmt: skip
    rng = np.random.default_rng(2)
    shapes = {"kernel": (6, 5), "bias": (5,)}
    params = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
    grads = _grads(rng, shapes, spike="bias")
    expected, divisors = numpy_stable_adamw(params, grads, [PEAK] * STEPS)
    assert float(divisors[SPIKE]["bias"]) > 2.0
    ours = _run_optax(optim.make_optimizer(config, 10), jax.tree.map(jnp.asarray, params), grads)
    np.testing.assert_allclose(ours[-1]["kernel"], expected[-1]["kernel"], rtol=1e-5, atol=1e-7)
    config.name = "adam"
    with pytest.raises(ValueError, match=r"config.optimizer.name must be one of .*'adam'"):
        optim.make_optimizer(config, 10)


def test_wsd_one_minus_sqrt_decay_and_the_constant_schedule():
    total, warmup, fraction = 100, 10, 0.3
    config = ml_collections.ConfigDict(
        {"learning_rate": PEAK, "warmup_steps": warmup, "schedule": "wsd",
         "decay_fraction": fraction, "decay_shape": "1-sqrt"}
    )  # fmt: skip
    schedule = optim.learning_rate_schedule(config, total)
    start = total - round(total * fraction)  # 70: the decay's first step
    steps = np.arange(total + 1)
    want = np.where(
        steps < warmup,
        PEAK * steps / warmup,
        np.where(
            steps < start,
            PEAK,
            PEAK * (1 - np.sqrt(np.clip((steps - start) / (total - start), 0, 1))),
        ),
    )
    np.testing.assert_allclose([float(schedule(s)) for s in steps], want, rtol=1e-6, atol=1e-12)
    config.decay_shape = "cosine"
    with pytest.raises(ValueError, match=r"decay_shape must be one of"):
        optim.learning_rate_schedule(config, total)

    config.schedule = "constant"
    constant = optim.learning_rate_schedule(config, total)
    np.testing.assert_allclose(
        [float(constant(s)) for s in (0, 5, 10, 99, 10**6)], [0, PEAK / 2, PEAK, PEAK, PEAK],
        rtol=1e-6,
    )  # fmt: skip


@pytest.mark.parametrize(
    "module, phase",
    [
        ("modernbert_base", None),
        ("modernbert_base_tpu", "phase1"),
        ("modernbert_base_tpu", "phase2"),
        ("modernbert_base_recipe_tpu", "phase1"),
    ],
)
def test_modernbert_configs_decay_a_weight_by_the_papers_fraction_at_the_peak(module, phase):
    """The paper's weight decay shrinks a weight by 1e-5 of itself per step at the peak rate
    and in proportion to the rate elsewhere (ModernBERT's fully decoupled decay), whatever
    the peak. With a zero gradient Adam's step is 0, so an update is the decay alone."""
    import importlib

    configs = importlib.import_module(f"experiments.configs.{module}")
    config = configs.get_config(phase) if phase else configs.get_config()
    opt_config = config.optimizer
    total = 10 * opt_config.warmup_steps + 10
    tx = optim.make_optimizer(opt_config, total)
    rate = optim.learning_rate_schedule(opt_config, total)
    params = {"kernel": jnp.full((4, 4), 2.0, jnp.float32)}
    state = tx.init(params)
    zeros = jax.tree.map(jnp.zeros_like, params)
    count = opt_config.warmup_steps  # the end of warmup
    for _ in range(count):
        _, state = tx.update(zeros, state, params)
    updates, _ = tx.update(zeros, state, params)
    shrink = -float(updates["kernel"][0, 0]) / 2.0
    expected = 1e-5 * float(rate(count)) / opt_config.learning_rate
    assert float(rate(count)) > 0.5 * opt_config.learning_rate  # near the peak
    np.testing.assert_allclose(shrink, expected, rtol=1e-3)
