"""Named remat policies (MaxText's names, `model.remat_policy`) and the tags they read.

A policy changes what the backward pass keeps, never what it computes: each one's gradient
equals the gradient with nothing recomputed. And each keeps what its name says: the residuals
jax saves across a rematerialised layer are the tagged matmul outputs the policy names (those
the backward pass reads), so a tag missing from a layer, or a policy saving the wrong names,
shows here.
"""

import collections
import contextlib
import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.config import REMAT_POLICIES, BertConfig
from bert_jax.model import REMAT_TAGS, BertModel

LAYERS = 2
# Pre-LN, GeGLU, a local and a global layer: ModernBERT's layer, CPU-sized.
MODERN = BertConfig.from_preset(
    "modernbert_tiny",
    vocab_size=96,
    hidden_size=32,
    num_hidden_layers=LAYERS,
    num_attention_heads=4,
    intermediate_size=48,
    max_position_embeddings=32,
    local_attention_window=4,
    global_attention_every=2,
)
# Post-LN with biases: BERT's layer, where the output norm reads the feed-forward's output.
BERT = BertConfig(
    vocab_size=96,
    hidden_size=32,
    num_hidden_layers=LAYERS,
    num_attention_heads=4,
    intermediate_size=48,
    max_position_embeddings=32,
)
QKV = {"query_proj", "key_proj", "value_proj"}
ATTEND = {"attend_query", "attend_key", "attend_value"}  # q, k, v as attention reads them

# What each named policy keeps of a layer in each model: the policy's tags that the
# backward pass reads. A pre-LN layer's feed-forward output only joins the residual stream
# (an add, whose backward needs no operand), so no policy keeps `mlpwo` there.
KEPT = {
    ("save_qkv_proj", "modern"): QKV,
    ("save_out_proj", "modern"): {"out_proj"},
    ("save_dot_except_mlp", "modern"): QKV | {"out_proj"},
    ("save_dot_except_mlpwi", "modern"): QKV | {"out_proj"},
    ("save_dot_except_mlpwi", "bert"): QKV | {"out_proj", "mlpwo"},
    ("save_attend_qkv", "modern"): ATTEND,
    ("save_attend_qkv", "bert"): ATTEND,
    # splash's output and logsumexp too, on the splash path only (below)
    ("save_attend_qkv_out", "modern"): ATTEND,
}


def _ids():
    return jnp.asarray(np.random.default_rng(0).integers(1, 96, (2, 16)))


@pytest.fixture(scope="module")
def params():
    """Each model's params, by its name in KEPT."""
    configs = {"modern": MODERN, "bert": BERT}
    return {
        name: jax.jit(BertModel(config, add_pooling_layer=False).init)(jax.random.key(0), _ids())[
            "params"
        ]
        for name, config in configs.items()
    }


def _loss(config, policy):
    model = BertModel(config.replace(remat_policy=policy), add_pooling_layer=False)
    ids = _ids()

    def loss(params):
        out = model.apply({"params": params}, ids).sequence_output  # (B, T, H)
        return jnp.sum(jnp.sin(out))  # not linear in out: the backward reads activations

    return loss


def test_every_layer_tags_its_six_matmuls(params):
    """The forward's jaxpr holds each tag once per layer (a tag is an identity: `name`): the
    six matmuls' outputs and the q, k, v attention reads."""
    jaxpr = jax.make_jaxpr(_loss(MODERN, "none"))(params["modern"])
    names = collections.Counter(
        e.params["name"] for e in jaxpr.jaxpr.eqns if e.primitive.name == "name"
    )
    assert names == {tag: LAYERS for tag in REMAT_TAGS}


def test_named_policies_give_the_gradient_of_remat_none(params):
    """`full` and every named policy: the same gradient as nothing recomputed."""
    policies = ["full", *REMAT_POLICIES[REMAT_POLICIES.index("minimal") :]]
    grads = jax.jit(lambda p: [jax.grad(_loss(MODERN, q))(p) for q in ["none", *policies]])(
        params["modern"]
    )
    want = jax.tree.leaves(grads[0])
    for policy, got in zip(policies, grads[1:], strict=True):
        for x, y in zip(jax.tree.leaves(got), want, strict=True):
            np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7, err_msg=policy)


def _residuals(fun, *args) -> list[str]:
    """The residuals jax keeps for `fun`'s backward, one line each: the type (`bf16[1,128,4,8]`),
    then where it comes from (jax's public listing, printed, read back)."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        jax.ad_checkpoint.print_saved_residuals(fun, *args)
    return printed.getvalue().splitlines()


def _saved(config, policy, params):
    """The tags of the residuals jax keeps across the layers, with how many of each."""
    saved = _residuals(_loss(config, policy), params)
    names = collections.Counter()
    for where in saved:
        for tag in REMAT_TAGS:
            if f"named '{tag}'" in where:
                names[tag] += 1
    dots = sum("output of dot_general" in where for where in saved)
    return names, dots


@pytest.mark.parametrize("policy, model", sorted(KEPT))
def test_a_named_policy_keeps_its_tagged_outputs(params, policy, model):
    config = {"modern": MODERN, "bert": BERT}[model]
    names, dots = _saved(config, policy, params[model])
    assert names == {tag: LAYERS for tag in KEPT[policy, model]}
    assert dots == 0  # no untagged matmul output kept: the rest is recomputed
    full, _ = _saved(config, "full", params[model])
    assert not full  # `full` keeps no tagged output


def test_minimal_is_jaxs_dots_with_no_batch_dims_saveable(params):
    """MaxText's `minimal` keeps every weight matmul's output the backward pass reads: five
    per pre-LN layer (not the feed-forward's output: see KEPT), untagged by the policy."""
    names, dots = _saved(MODERN, "minimal", params["modern"])
    assert (names, dots) == ({}, 5 * LAYERS)
    assert _saved(MODERN, "dots_with_no_batch_dims_saveable", params["modern"]) == (names, dots)


def test_the_splash_path_keeps_q_k_v_in_the_compute_dtype_and_splash_its_residuals():
    """The splash kernels read q, k, v in the compute dtype, and `save_attend_qkv` keeps them
    so: bf16 residuals, half the f32 arrays the same policy keeps on the einsum path.
    `save_attend_qkv_out` keeps splash's output and logsumexp besides (what its backward
    reads, so that no forward kernel is recomputed), and gives remat none's gradient."""
    config = MODERN.replace(dtype="bfloat16", max_position_embeddings=128)
    ids = jnp.asarray(np.random.default_rng(0).integers(1, 96, (1, 128)))
    params = jax.jit(BertModel(config, add_pooling_layer=False).init)(jax.random.key(0), ids)

    def loss(implementation, policy):
        changes = dict(attention_implementation=implementation, remat_policy=policy)
        model = BertModel(config.replace(**changes), add_pooling_layer=False)
        return lambda p: jnp.sum(jnp.sin(model.apply({"params": p}, ids).sequence_output))

    def kept(implementation, policy):
        saved = _residuals(loss(implementation, policy), params["params"])

        def dtype(line):
            return line.split("[")[0]  # as jax prints it: bf16, f32

        tags = sorted(
            (tag, dtype(line)) for line in saved for tag in ATTEND if f"named '{tag}'" in line
        )
        splash_out = sorted(dtype(line) for line in saved if "_splash_attention" in line)
        return tags, splash_out

    def per_layer(dtype):
        return sorted((tag, dtype) for tag in ATTEND for _ in range(LAYERS))

    assert kept("splash", "save_attend_qkv") == (per_layer("bf16"), [])
    assert kept("einsum", "save_attend_qkv") == (per_layer("f32"), [])
    # the output (bf16) and logsumexp (f32) of each layer's kernel
    want = (per_layer("bf16"), sorted(["bf16", "f32"] * LAYERS))
    assert kept("splash", "save_attend_qkv_out") == want

    grads = jax.jit(
        lambda p: [jax.grad(loss("splash", q))(p) for q in ("none", "save_attend_qkv_out")]
    )(params["params"])
    for x, y in zip(*(jax.tree.leaves(g) for g in grads), strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.extended  # ~10 s; make test checks the fused kernel (test_splash_attention)
def test_the_fused_splash_backward_under_save_attend_qkv_out_gives_remat_nones_gradient():
    """One splash backward kernel (`splash_fused_backward`, phase 1 of modernbert_base_tpu.py)
    reads the residuals `save_attend_qkv_out` keeps as the two-kernel backward does: the same
    gradient as nothing recomputed and as the two-kernel backward, bit for bit."""
    config = MODERN.replace(
        dtype="bfloat16", max_position_embeddings=128, attention_implementation="splash"
    )
    ids = jnp.asarray(np.random.default_rng(0).integers(1, 96, (1, 128)))
    params = jax.jit(BertModel(config, add_pooling_layer=False).init)(jax.random.key(0), ids)

    def grad(policy, fused):
        changes = dict(remat_policy=policy, splash_fused_backward=fused)
        model = BertModel(config.replace(**changes), add_pooling_layer=False)
        loss = lambda p: jnp.sum(jnp.sin(model.apply({"params": p}, ids).sequence_output))  # noqa: E731
        return jax.tree.leaves(jax.jit(jax.grad(loss))(params["params"]))

    fused_none, fused_kept = grad("none", True), grad("save_attend_qkv_out", True)
    for x, y in zip(fused_none, fused_kept, strict=True):
        np.testing.assert_array_equal(x, y)
    # one key tile at T = 128: the fused kernel's dq is the dq kernel's sum, no partials
    for x, y in zip(fused_kept, grad("none", False), strict=True):
        np.testing.assert_array_equal(x, y)
