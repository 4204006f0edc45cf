"""Where each parameter of a modern encoder lives in transformers' ModernBERT files.

The `MODERNBERT` family (`names.Family`): one table naming our paths for every combination of
the architecture switches (`BertConfig.position_encoding`, `feed_forward`, `norm_placement`,
`linear_bias`, `norm_bias`, `type_vocab_size`), so any modern checkpoint of ours reads and
writes params-only, with the names of transformers' `ModernBertModel` (and
`ModernBertForMaskedLM`, under `model.`). Only ModernBERT's own combination (rotary, GeGLU,
pre-LN, no token types) has a transformers config: `hf_config` refuses the rest, naming the
key. Google never published ModernBERT: no TF names.

Two HF tensors are not one of ours each: `attn.Wqkv` (3AD, H) holds query, key and value
(rows in that order, each head-major: transformers views it as (T, 3, A, D)), and layer 0
has no `attn_norm` (its input is the embedding norm's output already), so our layer 0's
attention norm imports as ones and zeros and is never exported. `mlp.Wi` (2F, H) is our GLU
kernel (H, 2, F) transposed and reshaped: rows [0, F) the input half, [F, 2F) the gate
(`input, gate = Wi(x).chunk(2, -1)`).
"""

from __future__ import annotations

from typing import Any

from bert_jax.config import BertConfig, ConfigError
from bert_jax.convert.names import WORD_EMBEDDINGS, ConversionError, Family, Params, TensorSpec

# transformers' hidden_activation -> our hidden_act (its "gelu" is the erf form).
_ACTS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}
# ModernBertConfig's special-token ids (its defaults, those of ModernBERT's tokenizer); a
# vocabulary too small to hold them gets none (transformers then sets no padding_idx).
_TOKEN_IDS = {
    "bos_token_id": 50281,
    "cls_token_id": 50281,
    "eos_token_id": 50282,
    "pad_token_id": 50283,
    "sep_token_id": 50282,
}


def _dense(path, hf: str, bias: bool, split: int = 1, part=None) -> list[TensorSpec]:
    kernel = TensorSpec((*path, "kernel"), f"{hf}.weight", "", split, hf_t=True, part=part)
    return [kernel, TensorSpec((*path, "bias"), f"{hf}.bias", "", part=part)][: 1 + bias]


def _norm(path, hf: str | None, bias: bool) -> list[TensorSpec]:
    """A LayerNorm; `hf` None: HF has none there (imported as the identity's 1 and 0)."""
    if hf is None:
        scale = TensorSpec((*path, "scale"), "", "", hf_fill=1.0)
        return [scale, TensorSpec((*path, "bias"), "", "", hf_fill=0.0)][: 1 + bias]
    scale = TensorSpec((*path, "scale"), f"{hf}.weight", "")
    return [scale, TensorSpec((*path, "bias"), f"{hf}.bias", "")][: 1 + bias]


def layer_specs(config: BertConfig, i: int) -> list[TensorSpec]:
    """The tensors of encoder layer `i` (looped layout)."""
    path, hf, bias = ("encoder", f"layer_{i}"), f"layers.{i}", config.linear_bias
    specs = []
    for j, name in enumerate(("query", "key", "value")):
        specs += _dense((*path, "attention", name), f"{hf}.attn.Wqkv", bias, part=(j, 3))
    specs += _dense((*path, "attention", "output"), f"{hf}.attn.Wo", bias, split=2)
    # Pre-LN: the norm before attention, which ModernBERT's layer 0 does not have.
    attn_norm = None if i == 0 else f"{hf}.attn_norm"
    specs += _norm((*path, "attention_layer_norm"), attn_norm, config.norm_bias)
    specs += _dense((*path, "intermediate"), f"{hf}.mlp.Wi", bias)
    specs += _dense((*path, "output"), f"{hf}.mlp.Wo", bias)
    specs += _norm((*path, "output_layer_norm"), f"{hf}.mlp_norm", config.norm_bias)
    return specs


def encoder_specs(config: BertConfig) -> list[TensorSpec]:
    """Embeddings, every layer and the final norm, as `config`'s switches build them."""
    specs = [TensorSpec(WORD_EMBEDDINGS, "embeddings.tok_embeddings.weight", "", split=1)]
    # Tables ModernBERT has none of, named for our own checkpoints (hf_config refuses them).
    if config.position_encoding == "learned":
        path = ("embeddings", "position_embeddings", "embedding")
        specs.append(TensorSpec(path, "embeddings.position_embeddings.weight", "", split=1))
    if config.type_vocab_size:
        path = ("embeddings", "token_type_embeddings", "embedding")
        specs.append(TensorSpec(path, "embeddings.token_type_embeddings.weight", "", split=1))
    specs += _norm(("embeddings", "layer_norm"), "embeddings.norm", config.norm_bias)
    for i in range(config.num_hidden_layers):
        specs += layer_specs(config, i)
    if config.norm_placement == "pre":
        specs += _norm(("encoder", "final_layer_norm"), "final_norm", config.norm_bias)
    return specs


def head_specs(config: BertConfig) -> dict[str, list[TensorSpec]]:
    """ModernBertForMaskedLM's head: dense, GELU, norm, then the decoder tied to the word
    table (only its bias is a head tensor)."""
    return {
        "mlm": [
            *_dense(("mlm", "transform"), "head.dense", config.linear_bias),
            *_norm(("mlm", "layer_norm"), "head.norm", config.norm_bias),
            TensorSpec(("mlm", "output_bias"), "decoder.bias", ""),
        ]
    }


def architecture(params: Params, config: BertConfig) -> str:
    """The transformers ModernBert class of our params (by their heads)."""
    heads = frozenset(params) - {"bert"} if "bert" in params else frozenset()
    classes = {frozenset(): "ModernBertModel", frozenset({"mlm"}): "ModernBertForMaskedLM"}
    if heads not in classes:
        raise ConversionError(
            f"no transformers ModernBert model has exactly the heads {sorted(heads)} "
            "(exported: the encoder alone, or with the MLM head)"
        )
    return classes[heads]


def _bias(data: dict[str, Any], source: str) -> bool:
    """transformers' three switches of linear biases, which are one switch here."""
    keys = ("attention_bias", "mlp_bias", "classifier_bias")
    values = {key: bool(data.get(key, False)) for key in keys}
    if len(set(values.values())) > 1:
        raise ConfigError(
            f"{source}: {values} differ; only linear biases all on or all off are supported "
            "(BertConfig.linear_bias)"
        )
    return values["attention_bias"]


def config_from_hf(data: dict[str, Any], source: str = "<dict>") -> BertConfig:
    """Our config of a transformers `ModernBertConfig` (config.json); what we cannot express
    (a tanh GELU in one place and erf in the other, two dropout rates where we have one,
    rope scaling, no decoder bias) is a ConfigError naming the key."""
    if data.get("model_type") != "modernbert":
        raise ConfigError(f"{source}: model_type {data.get('model_type')!r} is not 'modernbert'")
    act = data.get("hidden_activation", "gelu")
    if act not in _ACTS:
        raise ConfigError(
            f"{source}: hidden_activation {act!r} is not supported; use one of {tuple(_ACTS)}"
        )
    head_act = data.get("classifier_activation", "gelu")
    if _ACTS.get(head_act) != _ACTS[act]:
        raise ConfigError(
            f"{source}: classifier_activation {head_act!r} differs from hidden_activation "
            f"{act!r}; our MLM head applies the encoder's activation"
        )
    if data.get("rope_scaling"):
        raise ConfigError(f"{source}: rope_scaling {data['rope_scaling']!r} is not supported")
    if not data.get("decoder_bias", True):
        raise ConfigError(f"{source}: decoder_bias false is not supported (our MLM head has one)")
    # Our hidden_dropout_prob drops the embeddings' and both blocks' outputs.
    dropout = data.get("mlp_dropout", 0.0)
    if data.get("embedding_dropout", 0.0) != dropout:
        raise ConfigError(
            f"{source}: embedding_dropout {data.get('embedding_dropout')} != mlp_dropout "
            f"{dropout}; one rate (hidden_dropout_prob) covers both here"
        )
    try:
        return BertConfig(
            vocab_size=data.get("vocab_size", 50368),
            hidden_size=data.get("hidden_size", 768),
            num_hidden_layers=data.get("num_hidden_layers", 22),
            num_attention_heads=data.get("num_attention_heads", 12),
            intermediate_size=data.get("intermediate_size", 1152),
            hidden_act=_ACTS[act],
            hidden_dropout_prob=dropout,
            attention_probs_dropout_prob=data.get("attention_dropout", 0.0),
            max_position_embeddings=data.get("max_position_embeddings", 8192),
            type_vocab_size=0,
            initializer_range=data.get("initializer_range", 0.02),
            layer_norm_eps=data.get("norm_eps", 1e-5),
            position_encoding="rotary",
            rope_theta=float(data.get("global_rope_theta", 160000.0)),
            local_rope_theta=data.get("local_rope_theta", 10000.0),
            feed_forward="glu",
            norm_placement="pre",
            linear_bias=_bias(data, source),
            norm_bias=bool(data.get("norm_bias", False)),
            local_attention_window=data.get("local_attention", 128),
            global_attention_every=data.get("global_attn_every_n_layers", 3),
        )
    except ConfigError as error:
        raise ConfigError(f"{source}: {error}") from None


# Our switches -> the value a ModernBERT has (hf_config refuses a config with another).
_MODERNBERT_SWITCHES = {
    "position_encoding": "rotary",
    "feed_forward": "glu",
    "norm_placement": "pre",
    "type_vocab_size": 0,
    "causal": False,
}


def hf_config(config: BertConfig) -> dict[str, Any]:
    """A transformers `ModernBertConfig`'s config.json for `config` (architectures is the
    caller's).

    Raises:
        ConfigError: naming the field ModernBERT has no equivalent of (e.g. ALiBi positions,
            a post-LN or causal model, factorised embeddings).
    """
    for name, value in _MODERNBERT_SWITCHES.items():
        if getattr(config, name) != value:
            raise ConfigError(
                f"{name}={getattr(config, name)!r}: transformers' ModernBERT has only "
                f"{name}={value!r}"
            )
    if config.embedding_width != config.hidden_size:
        raise ConfigError(
            f"embedding_size {config.embedding_size} != hidden_size {config.hidden_size}: "
            "transformers' ModernBERT has no embedding projection"
        )
    act = "gelu_new" if config.hidden_act == "gelu_tanh" else "gelu"
    window, every = config.local_attention_window, config.global_attention_every
    if not window:  # every layer global: transformers' window is then never used
        window, every = config.max_position_embeddings, 1
    token_ids = {k: v if v < config.vocab_size else None for k, v in _TOKEN_IDS.items()}
    return {
        "model_type": "modernbert",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "intermediate_size": config.intermediate_size,
        "hidden_activation": act,
        "classifier_activation": act,
        "max_position_embeddings": config.max_position_embeddings,
        "initializer_range": config.initializer_range,
        "norm_eps": config.layer_norm_eps,
        "norm_bias": config.norm_bias,
        "attention_bias": config.linear_bias,
        "mlp_bias": config.linear_bias,
        "classifier_bias": config.linear_bias,
        "decoder_bias": True,
        "global_rope_theta": config.rope_theta,
        "local_rope_theta": config.local_rope_theta,
        "local_attention": window,
        "global_attn_every_n_layers": every,
        "attention_dropout": config.attention_probs_dropout_prob,
        "embedding_dropout": config.hidden_dropout_prob,
        "mlp_dropout": config.hidden_dropout_prob,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        **token_ids,
    }


MODERNBERT = Family(
    model_type="modernbert",
    encoder=encoder_specs,
    heads=head_specs,
    pooler=[],
    hf_prefix="model.",
    head_keys=("head.", "decoder.", "classifier."),
    tied={"decoder.weight": "embeddings.tok_embeddings.weight"},
    architecture=architecture,
    hf_config=hf_config,
    from_hf_config=config_from_hf,
)
