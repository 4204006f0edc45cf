"""The BERT encoder in Flax linen: embeddings, transformer layers, pooler.

One encoder for BERT, ModernBERT and MosaicBERT: `BertConfig`'s architecture switches pick
the position scheme, feed-forward, norm placement, biases and attention pattern, each layer
composed from the same primitives (`bert_jax.layers`); the defaults are BERT, post-LN.

Every parameter and every block-boundary activation carries logical axis names
(`batch length embed heads kv mlp vocab layers`); `bert_jax.sharding` maps them onto a
device mesh. With `dtype="bfloat16"` matmul inputs are bf16 while every matmul
accumulates in f32 and LayerNorm, softmax and the residual stream stay in f32 (bf16 too with
`activation_dtype="bfloat16"`: the activations between matmuls; statistics stay f32). The
residual stream (embedding norm, every `x + branch`, post-LN's and the final norm's outputs)
is in `residual_dtype`: f32 with bf16 activations keeps torch autocast's split.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from bert_jax import attention, layers, splash
from bert_jax.config import BertConfig
from bert_jax.layers import attention_mask, last_token_positions


def weight_init(config: BertConfig, names: tuple[str, ...]):
    """The original BERT weight init, boxed with logical axis `names`.

    `truncated_normal(stddev)` draws N(0, stddev) cut at 2 stddev, exactly as TF1's
    `truncated_normal_initializer(stddev)` in google-research/bert and /electra: samples
    have std 0.88 * initializer_range and |w| <= 2 * initializer_range
    (tests/test_init.py samples TF's own initializer to check it).
    """
    init = nn.initializers.truncated_normal(config.initializer_range)
    return nn.with_logical_partitioning(init, names)


def zeros_init(names: tuple[str, ...]):
    return nn.with_logical_partitioning(nn.initializers.zeros_init(), names)


def ones_init(names: tuple[str, ...]):
    return nn.with_logical_partitioning(nn.initializers.ones_init(), names)


def gelu(x: jax.Array) -> jax.Array:
    """Exact GELU, x * Phi(x), written with erf as PyTorch and transformers' "gelu" do.

    `nn.gelu(approximate=False)` uses erfc, whose XLA:CPU expansion (exp, division and
    range selects) costs ~5x erf's rational polynomial on BERT's (B, T, 4H) activations.
    """
    return 0.5 * x * (1.0 + jax.lax.erf(x * (1.0 / math.sqrt(2.0))))


def gelu_tanh(x: jax.Array) -> jax.Array:
    """The tanh approximation of GELU, term for term google-research/bert's `gelu`.

    Google's checkpoints were trained with it; it differs from the exact form by up to
    4.7e-4 (at |x| = 2.7), which a network carries on to its outputs.
    """
    cdf = 0.5 * (1.0 + jnp.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    return x * cdf


def activation(config: BertConfig) -> Callable[[jax.Array], jax.Array]:
    """The GELU that `config.hidden_act` names (see bert_jax.config.HIDDEN_ACTS)."""
    return {"gelu": gelu, "gelu_tanh": gelu_tanh}[config.hidden_act]


def constrain(x: jax.Array, names: tuple[str, ...]) -> jax.Array:
    """Annotates an activation with logical axes (a no-op outside a mesh context)."""
    return nn.with_logical_constraint(x, names)


def layer_norm(config: BertConfig, name: str, dtype=jnp.float32) -> nn.LayerNorm:
    """LayerNorm with f32 statistics, its output in `dtype` (the encoder's: activation_dtype)."""
    return nn.LayerNorm(
        epsilon=config.layer_norm_eps,
        dtype=dtype,
        param_dtype=config.param_dtype,
        scale_init=ones_init(("embed",)),
        bias_init=zeros_init(("embed",)),
        use_bias=config.norm_bias,
        name=name,
    )


class Dense(nn.Module):
    """A dense layer over the last `contract` input axes, with logical axis names.

    Inputs and kernel are cast to the compute dtype, the matmul accumulates and returns
    f32. (Flax's DenseGeneral initialises a flattened kernel, which breaks named-axis
    boxes of rank > 2 under a mesh; here the kernel is created at its real shape.)

    A `tag` names the output for the remat policies that keep some matmuls and not others
    (`remat_policy`): `checkpoint_name`, an identity, on the output as the layer returns it.
    """

    config: BertConfig
    features: tuple[int, ...]
    names: tuple[str | None, ...]  # logical names of the kernel's axes
    contract: int = 1
    use_bias: bool = True
    out_dtype: str = "float32"  # the output's dtype (the encoder's layers: activation_dtype)
    tag: str | None = None  # checkpoint_name of the output (one of REMAT_TAGS), or none

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.config
        kernel_shape = x.shape[x.ndim - self.contract :] + self.features
        kernel = self.param("kernel", weight_init(cfg, self.names), kernel_shape, cfg.param_dtype)
        y = matmul(x, kernel, self.contract, cfg.dtype)
        if self.use_bias:
            out_names = self.names[self.contract :]
            bias = self.param("bias", zeros_init(out_names), self.features, cfg.param_dtype)
            y = y + bias.astype(jnp.float32)
        y = y.astype(self.out_dtype)
        return y if self.tag is None else checkpoint_name(y, self.tag)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def matmul(x: jax.Array, kernel: jax.Array, contract: int, dtype) -> jax.Array:
    """x (..., *K) @ kernel (*K, *F) -> (..., *F) over the `contract` K axes: both inputs
    cast to `dtype`, the products accumulated and returned in f32.

    The backward pass is the one jax derives, with two differences. The incoming gradient
    is cast to `dtype` too, so that both backward products are `dtype` x `dtype` as the
    forward's (`product_dtype`: in f32 on a CPU, with the same rounded operands): jax
    would multiply the f32 gradient with the bf16 copy in f32, which a TPU runs as one bf16
    pass anyway but a GPU runs as TF32 GEMMs (on an H100, BERT-Large's backward spent 61 of
    228 ms a step in them, 2026-11-26). And the kernel's gradient leaves its product in
    the kernel's dtype, f32 for f32 master weights: jax would round it to `dtype` (the cast
    copy's type) and back, and XLA then sums the gradients over the devices in bf16 before
    converting (the TPU compiler did so for every BERT-Large kernel). Here the cross-device
    sum is in f32, as google-research/bert's; a bf16 kernel (`train_state.cast_kernels`)
    asks for the bf16 sum."""
    return _matmul_forward(x, kernel, contract, dtype)[0]


def _matmul_forward(x, kernel, contract, dtype):
    x_c, kernel_c = x.astype(dtype), kernel.astype(dtype)
    x_axes = tuple(range(x.ndim - contract, x.ndim))
    y = jax.lax.dot_general(
        x_c,
        kernel_c,
        ((x_axes, tuple(range(contract))), ((), ())),
        preferred_element_type=jnp.float32,
    )
    # Residuals are arrays only: two scalars carry the dtypes the gradients go back in.
    return y, (x_c, kernel_c, jnp.zeros((), x.dtype), jnp.zeros((), kernel.dtype))


def _matmul_backward(contract, dtype, saved, g):
    x_c, kernel_c, x_type, kernel_type = saved
    compute = layers.product_dtype(dtype)
    g, x_c, kernel_c = (
        g.astype(dtype).astype(compute),
        x_c.astype(compute),
        kernel_c.astype(compute),
    )
    lead = x_c.ndim - contract  # the batch-like axes of x, and of g before its F axes
    features = kernel_c.ndim - contract
    # dx: g (..., *F) . kernel (*K, *F) over F -> (..., *K), as jax's own transpose.
    g_axes = tuple(range(g.ndim - features, g.ndim))
    k_axes = tuple(range(contract, kernel_c.ndim))
    dx = jax.lax.dot_general(
        g, kernel_c, ((g_axes, k_axes), ((), ())), preferred_element_type=jnp.float32
    )
    # dkernel: x (..., *K) . g (..., *F) over the leading axes -> (*K, *F), in the kernel's
    # dtype straight from the product: the compiler sums it over the devices right after.
    dkernel = jax.lax.dot_general(
        x_c,
        g,
        ((tuple(range(lead)), tuple(range(lead))), ((), ())),
        preferred_element_type=kernel_type.dtype,
    )
    return dx.astype(x_type.dtype), dkernel.astype(kernel_type.dtype)


matmul.defvjp(_matmul_forward, _matmul_backward)


def dense(
    config: BertConfig,
    features,
    names: tuple[str | None, ...],
    name: str,
    axis=-1,
    bias: bool = True,
    activations: bool = False,
    tag: str | None = None,
):
    """`Dense` producing `features` (an int or a tuple) from the input's `axis` dims; the
    encoder's own layers pass `bias=config.linear_bias`, `activations` (their outputs in
    config.activation_dtype) and their `tag` (REMAT_TAGS), task heads keep their biases
    and f32 outputs."""
    features = (features,) if isinstance(features, int) else tuple(features)
    contract = 1 if isinstance(axis, int) else len(axis)
    out_dtype = config.activation_dtype if activations else "float32"
    return Dense(config, features, names, contract, bias, out_dtype, tag, name=name)


class Embeddings(nn.Module):
    """word + position + token-type embeddings, then LayerNorm and dropout.

    The tables are `config.embedding_width` (E) wide; `BertModel` projects E to H. The
    position table exists with `position_encoding="learned"` only (rotary and ALiBi act in
    attention), the token-type table with `type_vocab_size > 0` only (ModernBERT has none:
    its token_type_ids are ignored).
    """

    config: BertConfig

    def setup(self):
        cfg = self.config
        embed = functools.partial(
            nn.Embed, features=cfg.embedding_width, param_dtype=cfg.param_dtype
        )
        self.word_embeddings = embed(
            cfg.vocab_size, embedding_init=weight_init(cfg, ("vocab", "embed"))
        )
        if cfg.position_encoding == "learned":
            self.position_embeddings = embed(
                cfg.max_position_embeddings, embedding_init=weight_init(cfg, (None, "embed"))
            )
        if cfg.type_vocab_size:
            self.token_type_embeddings = embed(
                cfg.type_vocab_size, embedding_init=weight_init(cfg, (None, "embed"))
            )
        self.layer_norm = layer_norm(cfg, "layer_norm", cfg.residual_dtype)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)

    def __call__(self, input_ids, token_type_ids, deterministic: bool, position_ids=None):
        length = input_ids.shape[1]
        if length > self.config.max_position_embeddings:
            raise ValueError(
                f"input_ids has length {length} > max_position_embeddings "
                f"{self.config.max_position_embeddings}"
            )
        x = self.word_embeddings(input_ids)  # (B, T, E)
        if self.config.position_encoding == "learned":
            if position_ids is None:  # one instance per row: positions 0..T-1
                x = x + self.position_embeddings(jnp.arange(length))[None]
            else:  # packed rows: positions restart at 0 with each instance
                x = x + self.position_embeddings(position_ids)
        if self.config.type_vocab_size:
            x = x + self.token_type_embeddings(token_type_ids)
        x = self.layer_norm(x.astype(jnp.float32))
        x = self.dropout(x, deterministic=deterministic)
        return constrain(x, ("batch", "length", "embed"))

    def word_table(self) -> jax.Array:
        """The (V, E) word-embedding table, for the tied MLM decoder."""
        return self.word_embeddings.embedding


class SelfAttention(nn.Module):
    """Multi-head self-attention under a boolean mask; softmax in f32.

    `config.attention_implementation` picks the computation (`bert_jax.attention`): "einsum"
    writes it out (the reference), "xla" and "cudnn" call `jax.nn.dot_product_attention`,
    "splash" Pallas' TPU kernels (`bert_jax.splash`); the fused three have no dropout on the
    attention probabilities: with them a training (non-deterministic) call needs
    `attention_probs_dropout_prob=0`.
    """

    config: BertConfig
    deterministic: bool

    @nn.compact
    def __call__(self, x, inputs: layers.AttentionInputs, local=None, is_global=True):
        """x (B, T, H) -> (B, T, H) under `inputs`, or under `local` where `is_global` is false.

        A scanned layer's `is_global` is traced and its kinds' masks differ in shape (blocked
        local ones are per block): `nn.cond` runs one attention core, projections outside it.
        Each branch is rematerialised, else jax's cond keeps both branches' residuals (local
        layers hold zeros of the global (T, S) probs): ModernBERT-base G-L-L at T = 8,192
        on TPU v4, 41.4 -> 10.4 GiB (docs/tpu_estimates.md "Local attention"; scanning groups of K
        layers would need a params layout of its own).
        """
        cfg = self.config
        heads = (cfg.num_attention_heads, cfg.head_dim)
        project = functools.partial(
            dense, cfg, heads, ("embed", "heads", "kv"), bias=cfg.linear_bias, activations=True
        )
        q = project("query", tag="query_proj")(x)  # (B, T, A, D)
        k = project("key", tag="key_proj")(x)
        v = project("value", tag="value_proj")(x)
        rotary = inputs.rotary
        if local is not None:
            rotary = layers.select(is_global, inputs.rotary, local.rotary)
        if rotary is not None:
            # f32 angles, the rotated values back in the activations' dtype; on the TPU
            # kernels' path the half-swap is a product (layers.apply_rotary: no lane slices)
            product = cfg.dtype if cfg.attention_implementation == "splash" else None
            q, k = (layers.apply_rotary(y, rotary, product).astype(y.dtype) for y in (q, k))
        q = constrain(q, ("batch", "length", "heads", "kv"))
        k = constrain(k, ("batch", "length", "heads", "kv"))
        v = constrain(v, ("batch", "length", "heads", "kv"))

        q = q / math.sqrt(cfg.head_dim)
        if cfg.attention_implementation == "splash":
            # the kernels read q, k, v in the compute dtype (bert_jax.splash casts them): cast
            # here, the same numbers, so that a policy keeping them keeps half an f32 copy
            q, k, v = (y.astype(cfg.dtype) for y in (q, k, v))
        # what attention reads (rotated, scaled): `save_attend_qkv` keeps these, so the
        # backward pass recomputes neither the projections nor rotary (only the norm they read)
        q, k, v = (checkpoint_name(y, tag) for y, tag in zip((q, k, v), ATTEND_TAGS, strict=True))
        if local is None or isinstance(is_global, bool):
            context = self._attend(q, k, v, inputs if local is None or is_global else local)
        else:

            def core(chosen):
                return nn.remat(lambda module, *qkv: module._attend(*qkv, chosen))

            context = nn.cond(is_global, core(inputs), core(local), self, q, k, v)
        context = constrain(context, ("batch", "length", "heads", "kv"))
        out_names = ("heads", "kv", "embed")
        output = dense(
            cfg,
            cfg.hidden_size,
            out_names,
            "output",
            (-2, -1),
            bias=cfg.linear_bias,
            activations=True,
            tag="out_proj",
        )
        return output(context)

    def _attend(self, q, k, v, inputs: layers.AttentionInputs):
        """(B, T, A, D) scaled q, k, v -> context (`bert_jax.attention`)."""
        dropout = nn.Dropout(self.config.attention_probs_dropout_prob)
        return attention.attend(
            self.config,
            q,
            k,
            v,
            inputs,
            self.deterministic,
            lambda p: dropout(p, self.deterministic),
        )


def feed_forward(config: BertConfig, x: jax.Array) -> jax.Array:
    """(B, T, H) -> (B, T, H): BERT's dense-GELU-dense, or GeGLU's gated form (config's
    `feed_forward`), its dense layers `intermediate` and `output` of the calling module."""
    cfg = config
    glu = cfg.feed_forward == "glu"
    # GLU: one (H, 2, F) kernel giving the input and the gate halves.
    features, names = (
        ((2, cfg.intermediate_size), ("embed", None, "mlp"))
        if glu
        else (cfg.intermediate_size, ("embed", "mlp"))
    )
    wi = dense(
        cfg, features, names, "intermediate", bias=cfg.linear_bias, activations=True, tag="mlpwi"
    )
    h = wi(x)
    h = constrain(h, ("batch", "length", *names[1:]))
    h = layers.gated(h, activation(cfg)) if glu else activation(cfg)(h)  # (B, T, F)
    output = dense(
        cfg,
        cfg.hidden_size,
        ("mlp", "embed"),
        "output",
        bias=cfg.linear_bias,
        activations=True,
        tag="mlpwo",
    )
    return output(h)


class TransformerLayer(nn.Module):
    """One layer, post-LN (BERT) or pre-LN (`config.norm_placement`), global or local
    attention by its `index`; returns (x, x or None) so that it can be scanned.

    `index` is a Python int in the looped layout (each layer decided statically) and a
    scan input in the scanned one (decided by `layers.select`). Every layer holds both
    norms, so both layouts hold the same leaves; pre-LN's layer 0 skips its attention norm,
    as ModernBERT's (the embedding norm already normalised its input).
    """

    config: BertConfig
    deterministic: bool
    return_hidden: bool = False

    @nn.compact
    def __call__(self, x, inputs, index):
        cfg = self.config
        drop = functools.partial(
            nn.Dropout(cfg.hidden_dropout_prob), deterministic=self.deterministic
        )
        attend, local = inputs  # global layers' `AttentionInputs`, local ones' (or None)
        is_global = cfg.is_global_layer(index)
        attention = SelfAttention(cfg, self.deterministic, name="attention")
        # pre-LN's norms feed matmuls (activation_dtype); post-LN's outputs are the stream
        pre = cfg.norm_placement == "pre"
        norm_dtype = cfg.activation_dtype if pre else cfg.residual_dtype
        attention_norm = layer_norm(cfg, "attention_layer_norm", norm_dtype)
        output_norm = layer_norm(cfg, "output_layer_norm", norm_dtype)
        stream = cfg.residual_dtype
        if pre:
            # an f32 stream + a bf16 branch stays f32 (torch autocast's residual stream)
            h = layers.select(index == 0, x.astype(cfg.activation_dtype), attention_norm(x))
            x = (x + drop(attention(h, attend, local, is_global))).astype(stream)
            x = constrain(x, ("batch", "length", "embed"))
            x = (x + drop(feed_forward(cfg, output_norm(x)))).astype(stream)
        else:
            x = attention_norm(x + drop(attention(x, attend, local, is_global)))
            x = constrain(x, ("batch", "length", "embed"))
            x = output_norm(x + drop(feed_forward(cfg, x)))
        x = constrain(x, ("batch", "length", "embed"))
        return x, (x if self.return_hidden else None)


# The names `Dense` gives the encoder layers' matmul outputs (MaxText's), for remat policies.
QKV_TAGS = ("query_proj", "key_proj", "value_proj")
# q, k, v as attention reads them: after rotary and q's scaling (the splash path: bf16)
ATTEND_TAGS = ("attend_query", "attend_key", "attend_value")
REMAT_TAGS = (*QKV_TAGS, "out_proj", "mlpwi", "mlpwo", *ATTEND_TAGS)

# MaxText's named policies and ours (bert_jax.config.REMAT_POLICIES): the tagged outputs each keeps;
# everything else in a layer is recomputed in the backward pass.
SAVED_TAGS = {
    "save_dot_except_mlp": (*QKV_TAGS, "out_proj"),
    "save_dot_except_mlpwi": (*QKV_TAGS, "out_proj", "mlpwo"),
    "save_qkv_proj": QKV_TAGS,
    "save_out_proj": ("out_proj",),
    "save_attend_qkv": ATTEND_TAGS,
    # and splash's output and logsumexp (`splash.RESIDUAL_TAG`): no forward kernel recomputed
    "save_attend_qkv_out": (*ATTEND_TAGS, splash.RESIDUAL_TAG),
}


def remat_policy(name: str):
    """Resolves a `remat_policy` name to a `jax.checkpoint_policies` entry."""
    if name in ("full", "nothing_saveable"):
        return jax.checkpoint_policies.nothing_saveable
    if name == "minimal":  # MaxText's name: every matmul with weights (no batch dims)
        return jax.checkpoint_policies.dots_with_no_batch_dims_saveable
    if name in SAVED_TAGS:
        return jax.checkpoint_policies.save_only_these_names(*SAVED_TAGS[name])
    return getattr(jax.checkpoint_policies, name)


class Encoder(nn.Module):
    """The stack of layers, looped (`layer_N`) or scanned (`layers`, stacked on axis 0)."""

    config: BertConfig

    @nn.compact
    def __call__(
        self, x, mask, deterministic: bool, return_hidden: bool, position_ids=None, segments=None
    ):
        """Returns the last layer's output and, if `return_hidden`, every layer's (pre-LN:
        before the final norm, as transformers' ModernBERT reports them).

        `mask` is `attention_mask`'s; `position_ids` (B, T), packed rows' positions within
        each instance (None: 0..T-1), place rotary angles and ALiBi distances; `segments`
        (B, T) (`layers.segment_ids`) let local layers build their masks block by block.
        """
        cfg = self.config
        positions = jnp.arange(x.shape[1])[None] if position_ids is None else position_ids
        inputs = layers.attention_inputs(cfg, mask, positions, segments)  # global, local|None
        layer = TransformerLayer
        if cfg.remat_policy != "none":
            layer = nn.remat(
                layer,
                policy=remat_policy(cfg.remat_policy),
                prevent_cse=not cfg.scan_layers,
                static_argnums=() if cfg.scan_layers else (3,),  # the looped layer's index
            )
        if cfg.scan_layers:
            scanned = nn.scan(
                layer,
                variable_axes={"params": 0},
                split_rngs={"params": True, "dropout": True},
                in_axes=(nn.broadcast, 0),
                length=cfg.num_hidden_layers,
                metadata_params={nn.PARTITION_NAME: "layers"},
            )
            index = jnp.arange(cfg.num_hidden_layers)
            x, hidden = scanned(cfg, deterministic, return_hidden, name="layers")(x, inputs, index)
            hidden = list(hidden) if return_hidden else []  # L x (B, T, H)
        else:
            hidden = []
            for i in range(cfg.num_hidden_layers):
                x, _ = layer(cfg, deterministic, name=f"layer_{i}")(x, inputs, i)
                if return_hidden:
                    hidden.append(x)
        if cfg.norm_placement == "pre":
            final_norm = layer_norm(cfg, "final_layer_norm", cfg.residual_dtype)
            x = constrain(final_norm(x), ("batch", "length", "embed"))
        return x, hidden


class BertOutput(NamedTuple):
    sequence_output: jax.Array  # (B, T, H) last layer
    # (B, H) tanh(dense([CLS])), of the last real token in a causal model; (B, I, H) packed
    pooled_output: jax.Array | None
    hidden_states: tuple[jax.Array, ...]  # embeddings + every layer, when asked for


class BertModel(nn.Module):
    """The BERT encoder with the [CLS] pooler.

    A causal model (`config.causal`) pools its last real token instead: its [CLS] attends
    only itself and says nothing about the sequence, while the last token has read all of
    it (as GPT's classifier does). transformers' `BertModel(is_decoder=True)` has the same
    encoder but still pools [CLS].
    """

    config: BertConfig
    add_pooling_layer: bool = True

    def setup(self):
        self.embeddings = Embeddings(self.config)
        if self.config.embedding_width != self.config.hidden_size:
            # ELECTRA's factorised embeddings: a (V, E) table and one E -> H projection cost
            # fewer parameters than a (V, H) table when E < H.
            self.embeddings_project = dense(
                self.config,
                self.config.hidden_size,
                ("embed", "mlp"),
                "embeddings_project",
                bias=self.config.linear_bias,
                activations=True,
            )
        self.encoder = Encoder(self.config)
        if self.add_pooling_layer:
            self.pooler = dense(self.config, self.config.hidden_size, ("embed", "mlp"), "pooler")

    def __call__(
        self,
        input_ids: jax.Array,  # (B, T) int
        input_mask: jax.Array | None = None,  # (B, T) 1 for tokens, 0 for padding
        token_type_ids: jax.Array | None = None,  # (B, T) segment ids
        *,
        deterministic: bool = True,
        output_hidden_states: bool = False,
        position_ids: jax.Array | None = None,  # (B, T) packed rows: position in the instance
        instance_ids: jax.Array | None = None,  # (B, T) packed rows: 1, 2, ... per instance
        cls_positions: jax.Array | None = None,  # (B, I) packed rows: each instance's [CLS]
    ) -> BertOutput:
        """The encoder; packed rows (several instances each) give the three packing inputs.

        With `instance_ids`, attention stays inside each instance; with `cls_positions` the
        pooled output is (B, I, H), one per instance, instead of (B, H) at position 0.
        """
        if input_mask is None:
            input_mask = jnp.ones_like(input_ids)
        if token_type_ids is None:
            token_type_ids = jnp.zeros_like(input_ids)
        embedded = self.embeddings(input_ids, token_type_ids, deterministic, position_ids)
        embedded = self.project(embedded)
        causal = self.config.causal
        mask = attention_mask(input_mask, instance_ids, causal)
        segments = layers.segment_ids(input_mask, instance_ids)
        x, hidden = self.encoder(
            embedded, mask, deterministic, output_hidden_states, position_ids, segments
        )
        pooled = None
        if self.add_pooling_layer:
            if cls_positions is None:
                if causal:
                    last = last_token_positions(input_mask)  # (B,)
                    cls_states = jnp.take_along_axis(x, last[:, None, None], axis=1)[:, 0]
                else:
                    cls_states = x[:, 0]  # (B, H)
            else:
                if causal:  # each packed instance's last token, not its [CLS]
                    cls_positions = last_token_positions(
                        input_mask, instance_ids, cls_positions.shape[1]
                    )
                cls_states = jnp.take_along_axis(
                    x, cls_positions[..., None].astype(jnp.int32), axis=1
                )  # (B, I, H)
            pooled = jnp.tanh(self.pooler(cls_states).astype(jnp.float32))
        states = (embedded, *hidden) if output_hidden_states else ()
        return BertOutput(x, pooled, states)

    def project(self, embedded: jax.Array) -> jax.Array:
        """(B, T, E) embeddings -> (B, T, H) encoder input (the identity when E = H)."""
        if self.config.embedding_width == self.config.hidden_size:
            return embedded
        x = self.embeddings_project(embedded).astype(self.config.residual_dtype)
        return constrain(x, ("batch", "length", "embed"))

    def word_table(self) -> jax.Array:
        return self.embeddings.word_table()
