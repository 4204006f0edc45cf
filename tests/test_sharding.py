"""The same forward pass on 8 fake CPU devices under DP, FSDP and TP meshes."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from bert_jax import sharding
from bert_jax.config import BertConfig
from bert_jax.heads import BertForPreTraining
from bert_jax.train_state import sharded_state

# Every sharded dimension divides by 8: heads 8, mlp 256, vocab 1024, embed 64.
CONFIG = BertConfig(
    vocab_size=1024,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=8,
    intermediate_size=256,
    max_position_embeddings=64,
)
BATCH, LENGTH, PREDICTIONS = 8, 32, 5


def _inputs():
    rng = np.random.default_rng(0)
    lengths = rng.integers(LENGTH // 2, LENGTH + 1, size=BATCH)
    mask = (np.arange(LENGTH)[None] < lengths[:, None]).astype(np.int32)
    return {
        "input_ids": rng.integers(0, CONFIG.vocab_size, (BATCH, LENGTH)).astype(np.int32) * mask,
        "input_mask": mask,
        "segment_ids": (np.arange(LENGTH)[None] >= lengths[:, None] // 2).astype(np.int32) * mask,
        "masked_lm_positions": rng.integers(1, LENGTH // 2, (BATCH, PREDICTIONS)).astype(np.int32),
    }


def _forward(model, params, batch):
    out = model.apply(
        {"params": params},
        batch["input_ids"],
        batch["input_mask"],
        batch["segment_ids"],
        batch["masked_lm_positions"],
    )
    return out.mlm_logits, out.nsp_logits


@functools.cache
def _single_device_reference():
    model = BertForPreTraining(CONFIG)
    batch = _inputs()
    variables = model.init(jax.random.key(0), *(jnp.asarray(v) for v in batch.values()))
    params = jax.tree.map(np.asarray, nn.unbox(variables))
    return params["params"], [np.asarray(x) for x in _forward(model, params["params"], batch)]


def test_eight_fake_devices_are_present():
    assert jax.device_count() == 8, "tests must run with --xla_force_host_platform_device_count=8"


@pytest.mark.parametrize(
    "mesh_shape, kernel_spec",
    [
        ((8, 1, 1), P(None, None)),  # data parallel: params replicated
        ((1, 8, 1), P("fsdp", None)),  # FSDP: embed dimension of params split
        ((1, 1, 8), P(None, "tensor")),  # tensor parallel: mlp dimension split
        ((2, 1, 4), P(None, "tensor")),  # data x tensor
        ((2, 2, 2), P("fsdp", "tensor")),  # all three
    ],
)
def test_sharded_forward_equals_single_device(mesh_shape, kernel_spec):
    params_host, (mlm_ref, nsp_ref) = _single_device_reference()
    mesh = sharding.create_mesh(mesh_shape)
    model = BertForPreTraining(CONFIG)
    batch = _inputs()

    # A state born sharded from the model's logical names, holding the reference values so
    # that both runs use identical weights.
    args = [jnp.asarray(v) for v in batch.values()]
    state, _ = sharded_state(model, optax.identity(), mesh, args, params=params_host)
    params = state.params
    kernel = params["bert"]["encoder"]["layer_0"]["intermediate"]["kernel"]
    # Mesh axes of size 1 may appear in the spec; what matters is the layout it implies.
    assert kernel.sharding.is_equivalent_to(NamedSharding(mesh, kernel_spec), kernel.ndim)

    global_batch = sharding.global_batch(batch, mesh)
    with sharding.activation_context(mesh):
        mlm, nsp = jax.jit(functools.partial(_forward, model))(params, global_batch)
    data_parallel = mesh.shape["data"] * mesh.shape["fsdp"]
    assert mlm.sharding.shard_shape(mlm.shape)[0] == BATCH // data_parallel
    np.testing.assert_allclose(np.asarray(mlm), mlm_ref, atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(nsp), nsp_ref, atol=2e-5, rtol=1e-5)


def test_mesh_shape_errors_are_clear():
    assert sharding.resolve_mesh_shape((-1, 2, 1), 8) == (4, 2, 1)
    with pytest.raises(ValueError, match="do not divide"):
        sharding.resolve_mesh_shape((-1, 3, 1), 8)
    with pytest.raises(ValueError, match="more than one -1"):
        sharding.resolve_mesh_shape((-1, -1, 1), 8)
    with pytest.raises(ValueError, match="uses 4 devices but 8 exist"):
        sharding.resolve_mesh_shape((2, 2, 1), 8)
