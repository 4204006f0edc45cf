"""The two bf16 options, off by default: kernel gradients summed over the devices in bf16
(`config.grad_reduce_dtype`) and Adam's / LAMB's first moment stored in bf16
(`config.optimizer.mu_dtype`), on 8 fake CPU devices.

Off, the step is today's bit for bit; on, the compiled program's gradient sums are bf16
(read after SPMD partitioning: XLA:CPU later widens every bf16 all-reduce to f32, the TPU
compiler keeps it), the step stays close to the f32 one, the moments are bf16 in the state
and in checkpoints; a bad value is refused naming its key. The held-out curves and the TPU
compiler's estimates are in docs/tpu_estimates.md.
"""

import functools
import glob
import re

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
import synthetic_pretraining as synth
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from bert_jax import checkpointing, optim, sharding, train
from bert_jax.config import ConfigError
from bert_jax.train_state import run_keys, sharded_state
from experiments.configs import bert_tiny_cpu

# The default run and the run with the keys at their defaults compile one program: once.
pytestmark = pytest.mark.usefixtures("compile_cache")
STEPS = 3
# Elements of the matmul kernels of synth.TINY cut to one layer, the leaves whose gradients
# the option sums in bf16: q, k, v, output (64 x 64) and the feed-forward pair (64 x 256,
# 256 x 64); the MLM transform and the pooler (64 x 64) and the NSP classifier (64 x 2).
KERNEL_ELEMENTS = (4 * 64 * 64 + 2 * 64 * 256) + 2 * 64 * 64 + 64 * 2


def _config(optimizer="adamw", reduce=None, mu=None, shard=False, dtype="bfloat16"):
    """bert_tiny_cpu.py at synth.TINY's shapes, one layer (fast compiles), bf16 matmuls (the
    TPU configs'); the option keys set only where given (None: absent, as in a config older
    than them)."""
    config = synth.tiny_shaped_config(num_hidden_layers=1, dtype=dtype)
    config.optimizer.update(name=optimizer, learning_rate=5e-3, warmup_steps=1)
    config.num_train_steps = 20
    config.shard_weight_update = shard
    with config.unlocked():
        del config["grad_reduce_dtype"], config.optimizer["mu_dtype"]
        if reduce is not None:
            config.grad_reduce_dtype = reduce
        if mu is not None:
            config.optimizer.mu_dtype = mu
    return config


@functools.cache
def _run(optimizer="adamw", reduce=None, mu=None):
    """(losses, params, opt_state) of STEPS steps on the 8-device data-parallel mesh, and
    the initial params."""
    config = _config(optimizer, reduce, mu)
    mesh = sharding.create_mesh((8, 1, 1))
    run = train.setup(config, mesh, config.model.vocab_size)
    state, _ = sharded_state(run.model, run.tx, mesh, run.inputs, rng=jax.random.key(0))
    to_host = functools.partial(jax.tree.map, np.asarray)
    init, losses = to_host(state.params), []
    with sharding.activation_context(mesh, run.rules):
        for _ in range(STEPS):
            # One batch again and again: its loss falls from step to step.
            batch = sharding.global_batch(synth.random_batch(8, seed=0), mesh, run.rules)
            state, metrics = run.train_step(state, batch, run_keys(0)[1])
            losses.append(float(metrics["loss"]))
    return np.array(losses), to_host(state.params), to_host(state.opt_state), init


def _assert_bit_identical(a, b):
    for (path, x), y in zip(
        jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b), strict=True
    ):
        assert x.dtype == y.dtype, jax.tree_util.keystr(path)
        np.testing.assert_array_equal(x, y, err_msg=jax.tree_util.keystr(path))


# --- off: today's step -------------------------------------------------------------------------


def test_the_default_values_are_the_step_without_the_keys_bit_for_bit():
    losses, params, opt_state, _ = _run()
    ref_losses, ref_params, ref_opt_state, _ = _run(reduce="float32", mu="float32")
    assert losses[-1] < losses[0]  # it trains
    np.testing.assert_array_equal(losses, ref_losses)
    _assert_bit_identical(params, ref_params)
    _assert_bit_identical(opt_state, ref_opt_state)


def test_lamb_is_optax_lamb_bit_for_bit():
    # `optim.lamb` rebuilds optax.lamb from its pieces to take mu_dtype: the default must be
    # the same transform (same state tree, same updates), so older LAMB checkpoints restore.
    params = {"kernel": jnp.linspace(-1.0, 1.0, 48).reshape(6, 8), "bias": jnp.ones(8)}
    grads = jax.tree.map(lambda p: jnp.cos(3.0 * p) + 0.1, params)
    ours = optim.lamb(1e-2, weight_decay=0.01)
    theirs = optax.lamb(1e-2, 0.9, 0.999, 1e-6, weight_decay=0.01, mask=optim.decay_mask)
    state, ref_state = ours.init(params), theirs.init(params)
    assert jax.tree.structure(state) == jax.tree.structure(ref_state)
    for _ in range(3):
        updates, state = ours.update(grads, state, params)
        ref_updates, ref_state = theirs.update(grads, ref_state, params)
        _assert_bit_identical(updates, ref_updates)
        _assert_bit_identical(state, ref_state)
        params = optax.apply_updates(params, updates)


# --- bf16 gradient reduction -------------------------------------------------------------------

# `%x = bf16[64,256]{1,0} all-reduce(...`, or a tuple `(f32[64]{0}, bf16[...]...)`.
_COLLECTIVE = re.compile(r" = (.*?) (?:all-reduce|reduce-scatter)(?:-start)?\(")


def _partitioned_reductions(shard: bool, reduce: str, tmp_path) -> dict[str, int]:
    """{dtype: elements} that the step's all-reduces and reduce-scatters sum, read from the
    HLO right after SPMD partitioning (where the collectives are born, before XLA:CPU widens
    bf16 ones to f32)."""
    config = _config(reduce=reduce, shard=shard)
    mesh = sharding.create_mesh((8, 1, 1))
    run = train.setup(config, mesh, config.model.vocab_size)
    state = checkpointing.abstract_like(run.abstract_state, run.shardings)
    shapes = jax.eval_shape(lambda: train.example_batch(8, synth.SEQ_LEN, synth.PREDICTIONS))
    data = sharding.batch_sharding(mesh, run.rules)
    batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=data), shapes)
    rng = jax.ShapeDtypeStruct((), run_keys(0)[1].dtype, sharding=NamedSharding(mesh, P()))
    dump = tmp_path / f"{reduce}-{shard}"
    options = {"xla_dump_to": str(dump), "xla_dump_hlo_pass_re": "spmd-partitioning"}
    # The suite's own backend level (conftest.FAST_COMPILE), stated: an option the cache key
    # holds (the dump options it leaves out), so that the program is compiled, and dumped,
    # rather than loaded from the session's cache.
    options["xla_backend_optimization_level"] = 0
    with sharding.activation_context(mesh, run.rules):
        run.train_step.lower(state, batch, rng).compile(compiler_options=options)
    (path,) = glob.glob(str(dump / "*train_step*after_spmd-partitioning*"))
    sums = {}
    for line in open(path).read().splitlines():
        match = _COLLECTIVE.search(line)
        for dtype, dims in re.findall(r"([a-z0-9]+)\[([0-9,]*)\]", match.group(1) if match else ""):
            size = int(np.prod([int(d) for d in dims.split(",") if d]))
            sums[dtype] = sums.get(dtype, 0) + size
    return sums


@pytest.mark.parametrize("shard", [False, True], ids=["replicated", "sharded_update"])
def test_bf16_reduction_sums_the_kernel_gradients_in_bf16(tmp_path, shard):
    bf16 = _partitioned_reductions(shard, "bfloat16", tmp_path)
    # Exactly the kernels move to bf16; the tables, LayerNorms and biases stay f32 (on 8
    # data-parallel devices the sharded update's sums are all-reduces too: v3's compiler too
    # lowers it so, docs/tpu_estimates.md).
    assert bf16["bf16"] == KERNEL_ELEMENTS, bf16
    if not shard:
        default = _partitioned_reductions(shard, "float32", tmp_path)
        assert "bf16" not in default, default
        assert bf16["f32"] == default["f32"] - KERNEL_ELEMENTS, (default, bf16)


def test_bf16_reduction_stays_close_to_the_f32_step():
    losses, params, _, _ = _run(reduce="bfloat16")
    ref_losses, ref_params, _, init = _run()
    assert losses[0] == ref_losses[0]  # step 1's loss comes before any update
    # Steps 2 and 3 see params moved by updates computed from gradients rounded to bf16
    # (relative error <= 2^-8 per rounding; two: each device's partial sum and the total):
    # a few units in the 4th digit of a loss ~11 at most.
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-4)
    # Adam normalises each element: an element's update hardly moves with a 0.8% error of a
    # gradient far above eps, but where the 8 partial sums nearly cancel, the rounding may
    # flip its sign (a swing of 2 x lr x 3.2). Over the whole update the two runs agree to a
    # few percent; a wrong gradient, or a reduction in a coarser type, would not.
    leaves = jax.tree.leaves
    moved = [p - i for p, i in zip(leaves(ref_params), leaves(init), strict=True)]
    diff = [p - r for p, r in zip(leaves(params), leaves(ref_params), strict=True)]
    norm = lambda xs: float(np.sqrt(sum(np.sum(np.square(x)) for x in xs)))  # noqa: E731
    assert 0 < norm(diff) < 0.05 * norm(moved), (norm(diff), norm(moved))


# --- bf16 first moment ---------------------------------------------------------------------------


def _moments(opt_state, field):
    found = []

    def visit(node):
        if hasattr(node, "_fields"):
            if field in node._fields:
                found.extend(jax.tree.leaves(getattr(node, field)))
            for child in node:
                visit(child)
        elif isinstance(node, tuple | list):
            for child in node:
                visit(child)

    visit(opt_state)
    return found


@pytest.mark.parametrize("optimizer", ["adamw", "adamw_bias_corrected", "lamb"])
def test_bf16_mu_keeps_the_first_moment_in_bf16(optimizer):
    config = _config(optimizer, mu="bfloat16").optimizer
    params = {"kernel": jnp.linspace(-1.0, 1.0, 48).reshape(6, 8), "bias": jnp.ones(8)}
    grads = jax.tree.map(lambda p: jnp.cos(3.0 * p) + 0.1, params)
    tx, ref_tx = (
        optim.make_optimizer(config, 20),
        optim.make_optimizer(_config(optimizer).optimizer, 20),
    )
    state, ref_state = tx.init(params), ref_tx.init(params)
    for _ in range(3):
        updates, state = tx.update(grads, state, params)
        ref_updates, ref_state = ref_tx.update(grads, ref_state, params)
    mu, nu = _moments(state, "mu"), _moments(state, "nu")
    assert len(mu) == 2 and {x.dtype for x in mu} == {jnp.dtype(jnp.bfloat16)}
    assert {x.dtype for x in nu} == {jnp.dtype(jnp.float32)}  # the second moment stays f32
    assert {x.dtype for x in jax.tree.leaves(updates)} == {jnp.dtype(jnp.float32)}
    # The stored moment is the f32 one rounded (relative 2^-9, compounded over 3 steps); the
    # updates computed from it differ by about as much.
    for m, ref in zip(mu, _moments(ref_state, "mu"), strict=True):
        np.testing.assert_allclose(np.asarray(m, np.float32), ref, rtol=1e-2)
        assert not np.array_equal(np.asarray(m, np.float32), ref)  # really rounded
    for u, ref in zip(jax.tree.leaves(updates), jax.tree.leaves(ref_updates), strict=True):
        np.testing.assert_allclose(u, ref, rtol=1e-2, atol=1e-7)


def test_bf16_mu_is_in_the_train_state_and_its_checkpoints(tmp_path):
    config = _config(mu="bfloat16")
    mesh = sharding.create_mesh((8, 1, 1))
    run = train.setup(config, mesh, config.model.vocab_size)
    bf16 = {jnp.dtype(jnp.bfloat16)}
    assert {x.dtype for x in _moments(run.abstract_state.opt_state, "mu")} == bf16
    # A state of random values in the state's own dtypes and places (zero moments would
    # compare trivially), put there without compiling anything.
    rng = np.random.default_rng(0)
    saved = jax.tree.map(lambda x: rng.standard_normal(x.shape).astype(x.dtype), run.abstract_state)
    state = jax.device_put(saved, run.shardings)
    manager = checkpointing.make_manager(str(tmp_path / "checkpoints"), async_save=False)
    assert checkpointing.save(manager, STEPS, state, [{}], {})
    manager.close()
    manager = checkpointing.make_manager(str(tmp_path / "checkpoints"), async_save=False)
    restored, _, _ = checkpointing.restore(
        manager, None, checkpointing.abstract_like(run.abstract_state, run.shardings)
    )
    manager.close()
    _assert_bit_identical(jax.tree.map(np.asarray, restored), saved)


# --- bad values ----------------------------------------------------------------------------------


def test_a_bad_value_is_refused_naming_its_key():
    mesh = sharding.create_mesh((8, 1, 1))
    with pytest.raises(ConfigError, match=r"config\.grad_reduce_dtype must be one of"):
        train.setup(_config(reduce="bf16"), mesh, synth.TINY.vocab_size)
    with pytest.raises(ConfigError, match=r"config\.model\.dtype='bfloat16'"):
        train.setup(_config(reduce="bfloat16", dtype="float32"), mesh, synth.TINY.vocab_size)
    with pytest.raises(ValueError, match=r"config\.optimizer\.mu_dtype must be one of"):
        optim.make_optimizer(_config(mu="float16").optimizer, 20)


def test_the_keys_default_to_off_in_the_base_configs():
    for config in (bert_tiny_cpu.get_config(), _base()):
        assert config.grad_reduce_dtype == "float32"
        assert config.optimizer.mu_dtype == "float32"


def _base() -> ml_collections.ConfigDict:
    from experiments.configs import bert_base

    return bert_base.get_config()
