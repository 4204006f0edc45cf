"""The sharded weight update (`config.shard_weight_update`): where each leaf lives, that the
math is the replicated step's, what the compiled program reduces and holds, and that
checkpoints move between the layouts (8 fake CPU devices)."""

import functools
import re

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import synthetic_pretraining as synth
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from bert_jax import checkpointing, sharding, train
from bert_jax.train_state import run_keys, sharded_state
from experiments import aot_compile

# --- where each leaf lives -----------------------------------------------------------------


def _placed(mesh_shape, shape, spec, spread=False):
    mesh = sharding.create_mesh(mesh_shape)
    return sharding.update_sharding(shape, NamedSharding(mesh, spec), spread=spread).spec


def test_each_leaf_is_split_over_data_along_its_largest_dimension_that_divides():
    # BERT-Large's word embeddings on 128-way data parallelism: 30522 rows do not divide by
    # 128 (here 8 stands for it with 30522 = 2 x 15261), the 1024 columns do.
    assert _placed((8, 1, 1), (30522, 1024), P("tensor", "fsdp")) == P("tensor", ("fsdp", "data"))
    assert _placed((8, 1, 1), (1024, 4096), P("fsdp", "tensor")) == P("fsdp", ("tensor", "data"))
    assert _placed((8, 1, 1), (1024,), P("fsdp")) == P(("fsdp", "data"))
    # A dimension already split (fsdp 2) must divide by both: 2 x 4 ways.
    assert _placed((4, 2, 1), (24, 8), P(None, "fsdp")) == P("data", "fsdp")
    assert _placed((4, 2, 1), (6, 8), P(None, "fsdp")) == P(None, ("fsdp", "data"))


def test_leaves_nothing_divides_and_meshes_without_data_parallelism_stay_as_they_were():
    assert _placed((8, 1, 1), (), P()) == P()  # the step counter
    assert _placed((8, 1, 1), (2,), P(None)) == P(None)  # the NSP bias
    assert _placed((8, 1, 1), (3, 5), P(None, None)) == P(None, None)
    assert _placed((1, 8, 1), (64, 64), P("fsdp", None)) == P("fsdp", None)  # fsdp holds it
    assert _placed((1, 1, 8), (64, 64), P(None, "tensor")) == P(None, "tensor")


# Both mesh axes hold examples: a mesh of data x fsdp used as one data-parallel group.
_DATA_ONLY = (("batch", ("data", "fsdp")), ("embed", None))


def _abstract_placed(mesh_shape, shape, spec=None, rules=_DATA_ONLY, spread=True):
    """`update_sharding` (`spread` by default) on an abstract mesh (no devices: a pod's
    shape)."""
    mesh = jax.sharding.AbstractMesh(mesh_shape, sharding.MESH_AXES)
    return sharding.update_sharding(shape, NamedSharding(mesh, spec or P()), rules, spread).spec


def test_a_leaf_no_dimension_of_which_divides_by_all_the_cores_is_split_over_two():
    # BERT-Large with LAMB on 2,048 v3 cores: 1024 does not divide by 2048, so one data
    # axis of 2048 leaves the 1024 x 1024 kernels (and the 1024-wide vectors) replicated.
    assert _abstract_placed((2048, 1, 1), (1024, 1024)) == P()
    assert _abstract_placed((2048, 1, 1), (1024, 4096)) == P(None, "data")
    # The same cores as 64 x 32: the kernel is split 64 x 32 ways (1/2048 per core), a vector
    # over as many cores as divide it (1/64), the 4096-wide kernel still along one dimension.
    assert _abstract_placed((64, 32, 1), (1024, 1024)) == P("data", "fsdp")
    assert _abstract_placed((64, 32, 1), (1024, 1024), spread=False) == P()  # the default
    assert _abstract_placed((64, 32, 1), (1024,)) == P("data")
    assert _abstract_placed((64, 32, 1), (1024, 4096)) == P(None, ("data", "fsdp"))
    # The word embeddings (30522 = 2 x 15261 rows): 64 of the 2048 ways, not 32.
    assert _abstract_placed((64, 32, 1), (30522, 1024)) == P(None, "data")
    # A dimension split for the compute (tensor 2) keeps that split and adds what divides.
    assert _abstract_placed((32, 32, 2), (1024, 1024), P(None, "tensor")) == P(
        ("data", "fsdp"), "tensor"
    )
    assert _abstract_placed((32, 64, 2), (1024, 1024), P(None, "tensor")) == P(
        "data", ("tensor", "fsdp")
    )


def test_spread_the_most_ways_win_then_the_fewest_dimensions():
    # 8 devices as 4 x 2: all 8 along one dimension where one divides...
    assert _placed((4, 2, 1), (8, 6), P(), spread=True) == P(("data", "fsdp"), None)
    # ...else over two dimensions (data 4 along 12, fsdp 2 along 6)...
    assert _placed((4, 2, 1), (6, 12), P(), spread=True) == P("fsdp", "data")
    assert _placed((4, 2, 1), (6, 12), P()) == P()  # (without spread: replicated)
    # ...else over the axes that divide (the NSP bias: 2 of the 8 ways).
    assert _placed((4, 2, 1), (2,), P(None), spread=True) == P("fsdp")
    assert _placed((4, 2, 1), (12,), P(None), spread=True) == P("data")
    assert _placed((4, 2, 1), (12,), P(None)) == P(None)


def test_the_data_parallel_axes_are_the_batch_rules():
    mesh = sharding.create_mesh((2, 4, 1))
    assert sharding.data_parallel_axes(mesh) == ("data", "fsdp")
    assert sharding.data_parallel_axes(mesh, (("batch", "data"),)) == ("data",)
    assert sharding.data_parallel_axes(sharding.create_mesh((1, 1, 8))) == ()


# --- the math is the replicated step's ------------------------------------------------------

STEPS = 5


def _config(
    optimizer: str, shard: bool, dtype: str = "float32", model=(), rules=None, spread=False
) -> ml_collections.ConfigDict:
    """bert_tiny_cpu.py at the synthetic records' shapes (synth.TINY: every weight dimension
    divides by 8; `model`: (field, value) pairs that change them), a fast-warming
    `optimizer`, the update sharded or not, `rules` for the rule table."""
    config = synth.tiny_shaped_config(dtype=dtype)
    config.model.update(dict(model))
    config.sharding_rules = rules
    config.shard_weight_update_spread = spread
    config.optimizer.update(name=optimizer, learning_rate=5e-3, warmup_steps=3)
    config.num_train_steps = 20
    config.shard_weight_update = shard
    return config


@functools.cache
def _trajectory(
    optimizer: str, shard: bool, mesh_shape=(8, 1, 1), model=(), rules=None, spread=False,
    dtype="float32", explicit=False,
):  # fmt: skip
    """(losses, params after step 1, params after STEPS, the final state's shardings);
    `explicit`: `config.shard_weight_update_explicit_gather`."""
    config = _config(optimizer, shard, dtype=dtype, model=model, rules=rules, spread=spread)
    config.shard_weight_update_explicit_gather = explicit
    mesh = sharding.create_mesh(mesh_shape, jax.devices()[: np.prod(mesh_shape)])
    run = train.setup(config, mesh, config.model.vocab_size)
    state, shardings = sharded_state(
        run.model,
        run.tx,
        mesh,
        run.inputs,
        rng=jax.random.key(0),
        rules=run.rules,
        shard_update=shard,
        spread=spread,
    )
    losses, first = [], None
    with sharding.activation_context(mesh, run.rules):
        for step in range(STEPS):
            batch = sharding.global_batch(synth.random_batch(8, seed=step), mesh, run.rules)
            state, metrics = run.train_step(state, batch, run_keys(0)[1])
            losses.append(float(metrics["loss"]))
            if step == 0:
                first = jax.tree.map(np.asarray, state.params)
    placed = jax.tree.map(lambda x: x.sharding, state)
    return np.array(losses), first, jax.tree.map(np.asarray, state.params), placed, shardings


def _max_difference(a, b) -> float:
    return max(
        float(np.max(np.abs(x - y)))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


_ONE_LAYER = (("num_hidden_layers", 1),)


@pytest.mark.parametrize(
    "optimizer",
    [
        "adamw",
        # Extended tier: adamw in make test covers the sharded update's path; these two
        # differ only in the optax transform applied to the same sharded leaves.
        pytest.param("adamw_bias_corrected", marks=pytest.mark.extended),
        pytest.param("lamb", marks=pytest.mark.extended),
    ],
)
def test_the_sharded_update_equals_the_replicated_run_step_for_step(optimizer):
    # One layer: the update treats every layer's leaves alike, and each of the three programs
    # (sharded, replicated, one device) compiles faster.
    model = _ONE_LAYER
    losses, first, final, placed, _ = _trajectory(optimizer, shard=True, model=model)
    ref_losses, ref_first, ref_final, ref_placed, _ = _trajectory(
        optimizer, shard=False, model=model
    )
    assert losses[-1] < losses[0]  # it trains
    # The state really is split: the moments and params of the intermediate kernel hold 1/8.
    kernel = ("bert", "encoder", "layer_0", "intermediate", "kernel")
    split = functools.reduce(lambda t, k: t[k], kernel, placed.params)
    assert split.shard_shape((64, 256)) == (64, 32)
    assert functools.reduce(lambda t, k: t[k], kernel, ref_placed.params).shard_shape(
        (64, 256)
    ) == (64, 256)
    # Step 1 is the same computation: identical gradients, clipping norm, trust ratios (LAMB:
    # a norm taken per shard would change each split leaf's update by up to sqrt(8)), update.
    _assert_same_run(
        optimizer, (losses, first, final), (ref_losses, ref_first, ref_final), model=model
    )


def _assert_same_run(optimizer, run, ref, mesh_shape=(8, 1, 1), model=(), rules=None):
    """`run` (losses, params after step 1, after STEPS) is the replicated run `ref`'s."""
    (losses, first, final), (ref_losses, ref_first, ref_final) = run, ref
    for (path, leaf), ref in zip(
        jax.tree_util.tree_leaves_with_path(first), jax.tree.leaves(ref_first), strict=True
    ):
        np.testing.assert_array_equal(leaf, ref, err_msg=jax.tree_util.keystr(path))
    # Later steps: the f32 gradient sums are rounded in another order (a reduce-scatter's,
    # not an all-reduce's), and Adam normalises each element: a vocab row whose gradient is
    # a near-cancelling sum of softmax mass moves by up to ~1e-3 of a learning-rate step
    # (5e-3) when its sum is rounded otherwise. The same rounding separates the replicated
    # 8-device run from the 1-device run; the sharded run may differ from the replicated one
    # by no more than that, with a 2x margin (float32 ulps).
    _, _, one_device, _, _ = _trajectory(
        optimizer, shard=False, mesh_shape=(1, 1, 1), model=model, rules=rules
    )
    rounding = max(_max_difference(ref_final, one_device), 2e-7)
    assert _max_difference(final, ref_final) <= 2 * rounding
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-6)  # 1 f32 ulp of a loss ~11


# A model no weight dimension of which divides by 8 but by 4 or 2 (hidden 12, head 6, mlp 36)
# on 4 x 2 devices that all hold examples: the kernels split over two dimensions, the vectors
# over part of the devices (LAMB's 1024-wide leaves on 2,048 cores, in small).
_ODD = (
    ("hidden_size", 12),
    ("num_attention_heads", 2),
    ("intermediate_size", 36),
    ("num_hidden_layers", 1),
)


@pytest.mark.extended  # two trajectories, ~25 s; make test keeps adamw's step-for-step equality
def test_lamb_over_leaves_split_along_two_dimensions_equals_the_replicated_run():
    args = dict(mesh_shape=(4, 2, 1), model=_ODD, rules=_DATA_ONLY, spread=True)
    losses, first, final, placed, _ = _trajectory("lamb", shard=True, **args)
    ref_losses, ref_first, ref_final, _, _ = _trajectory("lamb", shard=False, **args)
    assert losses[-1] < losses[0]  # it trains
    layer = placed.params["bert"]["encoder"]["layer_0"]
    assert layer["intermediate"]["kernel"].spec == P("fsdp", "data")  # (12, 36): 2 x 4 ways
    assert layer["intermediate"]["kernel"].shard_shape((12, 36)) == (6, 9)
    assert layer["output_layer_norm"]["scale"].shard_shape((12,)) == (3,)  # 4 of 8 ways
    # The trust ratios' norms are whole-leaf norms over both splits: step 1 is identical.
    del args["spread"]  # the 1-device reference of the rounding bound has no update to spread
    _assert_same_run("lamb", (losses, first, final), (ref_losses, ref_first, ref_final), **args)


# --- what the compiled program reduces and holds ---------------------------------------------


def _lowered_step(config):
    """The train step of `config` lowered for 8 devices on abstract inputs, a batch of 8, as
    the ahead-of-time check lowers it; returns (lowered, abstract state, its shardings)."""
    config.global_batch_size = 8
    lowered, _, _, run = aot_compile.lower_steps(config, jax.devices()[:8], evaluate=False)
    return lowered, run.abstract_state, run.shardings


def _compiled_step(shard: bool):
    """The train step of `_config` with bf16 matmuls (the TPU configs'), compiled for 8
    devices; returns (compiled, abstract state, its shardings)."""
    lowered, state, shardings = _lowered_step(_config("adamw", shard, dtype="bfloat16"))
    return lowered.compile(), state, shardings


# `%name = f32[64,256]{1,0} all-reduce(...`, or a tuple `(f32[64]{0}, /*index=5*/bf16[..]..)`.
_COLLECTIVE = re.compile(r" = (.*?) (?:all-reduce|reduce-scatter)(?:-start)?\(")


def _reductions(compiled) -> list[tuple[str, int]]:
    """(dtype, elements) of every array an all-reduce or reduce-scatter sums."""
    out = []
    for line in compiled.as_text().splitlines():
        match = _COLLECTIVE.search(line)
        for dtype, dims in re.findall(r"([a-z0-9]+)\[([0-9,]*)\]", match.group(1) if match else ""):
            out.append((dtype, int(np.prod([int(d) for d in dims.split(",") if d]))))
    return out


@pytest.fixture(scope="module")
def compiled_steps():
    return {shard: _compiled_step(shard) for shard in (False, True)}


@pytest.mark.parametrize("shard", [False, True], ids=["replicated", "sharded"])
def test_gradients_are_reduced_in_float32_under_bf16_matmuls(compiled_steps, shard):
    compiled, _, _ = compiled_steps[shard]
    reductions = _reductions(compiled)
    # Every gradient is summed over the devices: at least one weight matrix's worth of
    # elements goes through the reductions, and no reduction is in a 16-bit type.
    assert sum(n for _, n in reductions) >= 64 * 256
    assert {dtype for dtype, _ in reductions} <= {"f32", "s32", "u32", "pred"}, reductions


# --- the kernels gathered in the compute dtype -----------------------------------------------


_ONE_LAYER_BF16 = dict(dtype="bfloat16", model=(("num_hidden_layers", 1),))


@pytest.mark.extended  # two bf16 trajectories, ~22 s of make test's budget; CI runs it
def test_kernels_gathered_in_bf16_train_bit_for_bit_as_the_f32_gather():
    """`config.shard_weight_update_explicit_gather` (an explicit bf16 all-gather of the
    kernels) against the constraint on the f32 params, both with bf16 matmuls."""
    losses, _, params, _, _ = _trajectory("adamw", True, explicit=True, **_ONE_LAYER_BF16)
    ref_losses, _, ref_params, _, _ = _trajectory("adamw", True, **_ONE_LAYER_BF16)
    # The explicit path is the one taken: bf16 all-gathers in the program, none before.
    lowered = {}
    for explicit in (True, False):
        config = _config("adamw", True, **_ONE_LAYER_BF16)
        config.shard_weight_update_explicit_gather = explicit
        lowered[explicit] = _lowered_step(config)[0].as_text()
    gathers = [line for line in lowered[True].splitlines() if "all_gather" in line]
    assert gathers and all("bf16" in line for line in gathers), gathers[:3]
    assert "all_gather" not in lowered[False]
    assert losses[-1] < losses[0]  # it trains
    np.testing.assert_array_equal(losses, ref_losses)
    for (path, leaf), ref in zip(
        jax.tree_util.tree_leaves_with_path(params), jax.tree.leaves(ref_params), strict=True
    ):
        np.testing.assert_array_equal(leaf, ref, err_msg=jax.tree_util.keystr(path))


def _bytes_per_device(tree, shardings) -> int:
    return sum(
        int(np.prod(s.shard_shape(x.shape))) * x.dtype.itemsize
        for x, s in zip(jax.tree.leaves(tree), jax.tree.leaves(shardings), strict=True)
    )


def test_each_device_holds_one_eighth_of_the_moments_and_params(compiled_steps):
    sizes = {}
    for shard, (compiled, state, shardings) in compiled_steps.items():
        moments = _bytes_per_device(state.opt_state, shardings.opt_state)
        held = _bytes_per_device(state, shardings)
        # The compiled step's own accounting: its arguments are the state and the batch.
        arguments = compiled.memory_analysis().argument_size_in_bytes
        assert held <= arguments <= held + 64 * 1024, (shard, held, arguments)
        sizes[shard] = moments, arguments
    (total, arguments_rep), (moments_split, arguments_split) = sizes[False], sizes[True]
    assert total == sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state.opt_state))
    # 1/8 each, but for the leaves no dimension of which divides by 8 (the NSP bias, the
    # step counters): a few hundred bytes.
    assert total / 8 <= moments_split <= total / 8 + 1024
    assert arguments_split < arguments_rep / 7


# --- checkpoints move between layouts ---------------------------------------------------------

LAYOUTS = {  # name: (mesh shape, shard_weight_update)
    "replicated": ((8, 1, 1), False),
    "sharded_update": ((8, 1, 1), True),
    "fsdp": ((1, 8, 1), False),
}


def _layout_state(name: str):
    config = _config("adamw", LAYOUTS[name][1])
    config.model.num_hidden_layers = 1
    mesh = sharding.create_mesh(LAYOUTS[name][0])
    run = train.setup(config, mesh, config.model.vocab_size)
    return run, mesh


@pytest.mark.parametrize("source", LAYOUTS)
def test_a_checkpoint_restores_into_every_other_layout(tmp_path, source):
    run, mesh = _layout_state(source)
    state, shardings = sharded_state(
        run.model, run.tx, mesh, run.inputs, rng=jax.random.key(0), shard_update=LAYOUTS[source][1]
    )
    # Distinct leaves (zero moments would compare trivially), in the source's layout.
    state = jax.jit(
        lambda s: jax.tree.map(
            lambda x: x + 0.25 if jnp.issubdtype(x.dtype, jnp.floating) else x, s
        ),
        out_shardings=shardings,
    )(state)
    saved = jax.tree.map(np.asarray, state)
    manager = checkpointing.make_manager(str(tmp_path / "checkpoints"), async_save=False)
    assert checkpointing.save(manager, 3, state, [{}], {})
    manager.close()
    for target in LAYOUTS:
        target_run, _ = _layout_state(target)
        manager = checkpointing.make_manager(str(tmp_path / "checkpoints"), async_save=False)
        restored, _, _ = checkpointing.restore(
            manager,
            None,
            checkpointing.abstract_like(target_run.abstract_state, target_run.shardings),
        )
        manager.close()
        for (path, leaf), want, placement in zip(
            jax.tree_util.tree_leaves_with_path(restored),
            jax.tree.leaves(saved),
            jax.tree.leaves(target_run.shardings),
            strict=True,
        ):
            where = f"{source} -> {target}: {jax.tree_util.keystr(path)}"
            assert leaf.sharding == placement, where
            np.testing.assert_array_equal(np.asarray(leaf), want, err_msg=where)
