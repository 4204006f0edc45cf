"""The frozen model configuration: each field's choices, validation, the presets by name (their
tables: `bert_jax.presets`), and Google/HF JSON round trips.

`BertConfig` describes the network only (no optimiser, no data); experiment configs
(`experiments/configs/*.py`) build one through `BertConfig.from_preset` or
`BertConfig.from_json_file` in one place and hand it to the model.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

from bert_jax.presets import MODERN_PRESETS, PRESETS


def preset_fields(name: str) -> dict[str, Any]:
    """Every field preset `name` (a PRESETS or MODERN_PRESETS name) sets."""
    if name in MODERN_PRESETS:
        return dict(MODERN_PRESETS[name])
    if name not in PRESETS:
        choices = sorted(PRESETS) + sorted(MODERN_PRESETS)
        raise ConfigError(f"unknown preset {name!r}; choose one of {choices}")
    layers, hidden, heads = PRESETS[name]
    return dict(
        num_hidden_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        intermediate_size=4 * hidden,
    )


REMAT_POLICIES = (
    "none",  # no rematerialisation: keep every activation (fastest, most memory)
    "full",  # recompute the whole layer in the backward pass (least memory)
    "dots_saveable",  # keep matmul outputs, recompute elementwise ops
    "dots_with_no_batch_dims_saveable",  # keep weight matmuls, recompute attention
    "nothing_saveable",  # same as "full", spelled as a jax policy
    # MaxText's names; the named ones keep the outputs of the layers' matmuls that the model
    # tags (`model.Dense.tag`: query_proj key_proj value_proj out_proj mlpwi mlpwo)
    "minimal",  # dots_with_no_batch_dims_saveable under MaxText's name
    "save_dot_except_mlp",  # keep q, k, v and the attention output projection
    "save_dot_except_mlpwi",  # those and the feed-forward's output (post-LN only reads it)
    "save_qkv_proj",  # keep q, k and v only
    "save_out_proj",  # keep the attention output projection only
    # ours: keep q, k, v as attention reads them (rotated, scaled; bf16 on the splash path)
    "save_attend_qkv",
    "save_attend_qkv_out",  # ours: those and splash's output and logsumexp (splash path only)
)

_DTYPES = ("float32", "bfloat16", "float16")

ATTENTION_IMPLEMENTATIONS = (
    "einsum",  # two einsums around an f32 softmax, written out here: the reference (default)
    "xla",  # jax.nn.dot_product_attention(implementation="xla"): the same math, XLA's op
    "cudnn",  # jax.nn.dot_product_attention(implementation="cudnn"): fused, GPU only
    "splash",  # Pallas' block-sparse flash kernels (bert_jax.splash): TPU (CPU: interpreted)
)

HIDDEN_ACTS = (
    "gelu",  # exact GELU, x * Phi(x) with erf: PyTorch's and transformers' "gelu"
    "gelu_tanh",  # the tanh approximation in google-research/bert (modeling.gelu)
)
# The `hidden_act` each JSON flavour may hold -> ours. Google's bert_config.json says "gelu"
# for the tanh form: the original code has no other GELU, and Google's checkpoints were
# trained with it. We write an exact-GELU model there as "gelu_exact", which the original
# code refuses rather than running it with the wrong GELU. In transformers (4.57) "gelu" is
# erf, "gelu_new" the tanh formula as the original writes it (what we export) and
# "gelu_pytorch_tanh" torch's fused kernel of the same formula.
_JSON_ACTS = {
    "google": {"gelu": "gelu_tanh", "gelu_exact": "gelu"},
    "hf": {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"},
}


POSITION_ENCODINGS = (
    "learned",  # a learned table of absolute positions, added to the embeddings: BERT
    "rotary",  # queries and keys rotated by their positions (RoFormer): ModernBERT
    "alibi",  # a -slope * |i - j| bias on the attention logits (Press et al.): MosaicBERT
)
FEED_FORWARDS = (
    "mlp",  # dense, GELU, dense: BERT
    "glu",  # GeGLU (Shazeer 2020): GELU(x W_in) * (x W_gate), then dense: ModernBERT, MosaicBERT
)
NORM_PLACEMENTS = (
    "post",  # LayerNorm after each residual sum: BERT
    "pre",  # LayerNorm before attention and FFN, plus a final norm (Xiong et al.): ModernBERT
)
# The architecture of BERT itself: the values of the switches Google's bert_config.json and
# transformers' BertConfig can describe (`BertConfig.non_bert_fields`).
_BERT_ARCHITECTURE = dict(
    position_encoding="learned",
    feed_forward="mlp",
    norm_placement="post",
    linear_bias=True,
    norm_bias=True,
    local_attention_window=0,
)


# The pretraining objectives an experiment picks with `config.objective`, the rows of the
# paper's Table 5: "mlm_nsp" masked LM + next sentence prediction (BERT), "mlm" masked LM
# alone ("No NSP"), "ltr" a left-to-right LM, causal attention, no NSP ("LTR & No NSP");
# beyond the paper, "electra" replaced-token detection (Clark et al. 2020, `bert_jax.electra`):
# the encoder being pretrained is ELECTRA's discriminator, a small generator trains beside it.
OBJECTIVES = ("mlm_nsp", "mlm", "ltr", "electra")


def objective(config) -> str:
    """The pretraining objective, `config.objective` (configs older than the key: "mlm_nsp")."""
    return config.get("objective", "mlm_nsp")


class ConfigError(ValueError):
    """A model configuration that cannot describe a working BERT."""


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """Hyper-parameters of a BERT encoder (the fields of Google's `bert_config.json`)."""

    vocab_size: int = 30522  # rows of the word-embedding table (and MLM output classes)
    hidden_size: int = 768  # width H of the residual stream
    num_hidden_layers: int = 12  # number of transformer layers L
    num_attention_heads: int = 12  # attention heads A; H must divide by A
    intermediate_size: int = 3072  # width of the feed-forward block (4H in every preset)
    hidden_act: str = "gelu"  # GELU form, one of HIDDEN_ACTS; Google's checkpoints use "gelu_tanh"
    hidden_dropout_prob: float = 0.1  # dropout after embeddings, attention output and FFN
    attention_probs_dropout_prob: float = 0.1  # dropout on the attention probabilities
    max_position_embeddings: int = 512  # longest sequence the position table covers
    type_vocab_size: int = 2  # number of segment (token type) ids
    initializer_range: float = 0.02  # stddev of the truncated-normal weight init
    layer_norm_eps: float = 1e-12  # LayerNorm epsilon of the original TF code
    dtype: str = "float32"  # compute dtype of matmul inputs; accumulation is always f32
    param_dtype: str = "float32"  # storage dtype of parameters (master weights)
    # dtype of the encoder's activations between matmuls: the residual stream, norm outputs
    # (statistics stay f32), GeGLU, rotary; the matmuls still accumulate, softmax runs in f32
    activation_dtype: str = "float32"
    residual_dtype: str = "float32"  # the residual stream's dtype (x + branch, stream norms)
    scan_layers: bool = False  # stack the layers under one `nn.scan` (faster compiles)
    remat_policy: str = "none"  # rematerialisation of each layer, one of REMAT_POLICIES
    # How attention is computed, one of ATTENTION_IMPLEMENTATIONS. The fused ones
    # ("xla", "cudnn", "splash") cannot drop attention probabilities: training with them needs
    # attention_probs_dropout_prob=0 (the model refuses otherwise), a recipe change.
    attention_implementation: str = "einsum"
    # splash's tiles (multiples of 128, capped at T), the TPU compiler's estimate's choices
    # (docs/tpu_modernbert.md): query and key/value tiles of global layers, local layers' tile
    splash_block_q: int = 1024  # query tile of global layers
    splash_block_kv: int = 1024  # key/value tile of global layers
    splash_local_block: int = 256  # query and key/value tile of local layers
    # splash's backward as one kernel (dq computed beside dk and dv: one recomputation of the
    # probabilities, not two) instead of a dq kernel and a dk/dv kernel
    splash_fused_backward: bool = False
    # Left-to-right attention: position t attends only positions <= t (and real tokens), the
    # paper's "LTR" ablation, in pretraining and fine-tuning alike; the pooled output is then
    # the last real token's (see `bert_jax.model.BertModel`). HF's `is_decoder`.
    causal: bool = False
    # Width E of the embedding tables, projected to hidden_size by a dense layer when they
    # differ (ELECTRA's factorised embeddings: ELECTRA-Small has E=128, H=256; a generator
    # shares the discriminator's tables at its own H). None: E = hidden_size, plain BERT.
    embedding_size: int | None = None
    # --- architecture switches (issue 42); the defaults are BERT's ---------------------------
    position_encoding: str = "learned"  # one of POSITION_ENCODINGS; not "learned": no table
    rope_theta: float = 10000.0  # rotary base of global layers (RoFormer 10k; ModernBERT 160k)
    local_rope_theta: float | None = None  # rotary base of local layers (None: rope_theta)
    feed_forward: str = "mlp"  # one of FEED_FORWARDS; intermediate_size is F after the gate
    norm_placement: str = "post"  # one of NORM_PLACEMENTS; "pre": norm before each block
    linear_bias: bool = True  # biases of the encoder's dense layers and the MLM transform
    norm_bias: bool = True  # LayerNorm biases (ModernBERT: neither)
    # 0: every layer attends the whole sequence (BERT); W > 0: local layers attend keys within
    # W // 2 tokens either side (ModernBERT's `local_attention`, 128).
    local_attention_window: int = 0
    global_attention_every: int = (
        1  # with a window, layer i is global iff i % K == 0 (ModernBERT 3)
    )

    def __post_init__(self):
        problems = []
        for name in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
            "global_attention_every",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                problems.append(f"{name} must be a positive integer, got {value!r}")
        for name in ("type_vocab_size", "local_attention_window"):  # 0: none
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                problems.append(f"{name} must be a non-negative integer, got {value!r}")
        if not problems and self.hidden_size % self.num_attention_heads:
            problems.append(
                f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                f"{self.num_attention_heads}"
            )
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                problems.append(f"{name} must be in [0, 1), got {value!r}")
        if self.hidden_act not in HIDDEN_ACTS:
            problems.append(
                f"hidden_act {self.hidden_act!r} is not supported; use one of {HIDDEN_ACTS}"
            )
        if self.layer_norm_eps <= 0:
            problems.append(f"layer_norm_eps must be positive, got {self.layer_norm_eps!r}")
        for name in ("dtype", "param_dtype", "activation_dtype", "residual_dtype"):
            if getattr(self, name) not in _DTYPES:
                problems.append(f"{name} must be one of {_DTYPES}, got {getattr(self, name)!r}")
        if self.remat_policy not in REMAT_POLICIES:
            problems.append(
                f"remat_policy must be one of {REMAT_POLICIES}, got {self.remat_policy!r}"
            )
        if self.attention_implementation not in ATTENTION_IMPLEMENTATIONS:
            problems.append(
                f"attention_implementation must be one of {ATTENTION_IMPLEMENTATIONS}, got "
                f"{self.attention_implementation!r}"
            )
        for name in ("splash_block_q", "splash_block_kv", "splash_local_block"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0 or value % 128:
                problems.append(f"{name} must be a positive multiple of 128, got {value!r}")
        size = self.embedding_size
        if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size <= 0):
            problems.append(f"embedding_size must be a positive integer or None, got {size!r}")
        for name in ("causal", "linear_bias", "norm_bias", "splash_fused_backward"):
            if not isinstance(getattr(self, name), bool):
                problems.append(f"{name} must be True or False, got {getattr(self, name)!r}")
        problems += self._architecture_problems()
        if problems:
            raise ConfigError("invalid BertConfig: " + "; ".join(problems))

    def _architecture_problems(self) -> list[str]:
        problems = []
        for name, choices in (
            ("position_encoding", POSITION_ENCODINGS),
            ("feed_forward", FEED_FORWARDS),
            ("norm_placement", NORM_PLACEMENTS),
        ):
            if getattr(self, name) not in choices:
                problems.append(f"{name} must be one of {choices}, got {getattr(self, name)!r}")
        for name in ("rope_theta", "local_rope_theta"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int | float) and value > 0):
                problems.append(f"{name} must be a positive number, got {value!r}")
        rotary = self.position_encoding == "rotary"
        heads = self.num_attention_heads
        if rotary and isinstance(heads, int) and heads > 0 and self.head_dim % 2:
            problems.append(
                f"position_encoding='rotary' needs an even head dimension, got "
                f"hidden_size/num_attention_heads = {self.head_dim}"
            )
        return problems

    def non_bert_fields(self) -> list[str]:
        """The fields, as `key=value`, that BERT's own formats cannot describe (empty: BERT)."""
        fields = [
            f"{name}={getattr(self, name)!r}"
            for name, value in _BERT_ARCHITECTURE.items()
            if getattr(self, name) != value
        ]
        if self.type_vocab_size == 0:
            fields.append("type_vocab_size=0")
        return fields

    def _check_bert_architecture(self, what: str) -> None:
        if self.non_bert_fields():
            raise ConfigError(
                f"{', '.join(self.non_bert_fields())} has no {what}: BERT's format describes "
                "a post-LN BERT with learned positions, biases and token types only"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def is_global_layer(self, index):
        """Whether layer `index` (an int, or a traced scan index) attends the whole sequence:
        every layer without a local window, else every `global_attention_every`-th (0, K, ...)."""
        return not self.local_attention_window or index % self.global_attention_every == 0

    @property
    def embedding_width(self) -> int:
        """E, the width of the embedding tables (hidden_size unless `embedding_size` says)."""
        return self.embedding_size or self.hidden_size

    def replace(self, **changes: Any) -> BertConfig:
        """A copy with `changes` applied (validated again)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> BertConfig:
        """One of PRESETS (tiny, mini, small, medium, base, large) or MODERN_PRESETS
        (modernbert_base, modernbert_large, modernbert_tiny), with overrides."""
        fields = preset_fields(name)
        fields.update(overrides)
        return cls(**fields)

    @classmethod
    def from_experiment(
        cls,
        model: Mapping[str, Any],
        vocab_size: int | None = None,
        objective: str = "mlm_nsp",
    ) -> BertConfig:
        """The config an experiment's `model` block describes: a preset and overrides.

        Fields set to None keep the preset's value; vocab_size, when the block leaves it to
        the vocab file, is `vocab_size` (default 30522, BERT's uncased vocab). `objective`
        (the experiment's `config.objective`, one of OBJECTIVES) makes the model causal for
        "ltr": the one place where an objective reaches the network.
        """
        if objective not in OBJECTIVES:
            raise ConfigError(f"config.objective must be one of {OBJECTIVES}, got {objective!r}")
        fields = {k: v for k, v in model.items() if v is not None}
        preset = fields.pop("preset")
        fields.setdefault("vocab_size", vocab_size or 30522)
        causal = objective == "ltr"
        if fields.get("causal", causal) != causal:
            raise ConfigError(
                f"model.causal={fields['causal']} contradicts config.objective={objective!r} "
                "(only 'ltr' is causal): set the objective alone"
            )
        fields["causal"] = causal
        return cls.from_preset(preset, **fields)

    # --- JSON: Google's bert_config.json and Hugging Face's config.json -------------------

    def to_google_dict(self) -> dict[str, Any]:
        """The fields of Google's `bert_config.json` (whose "gelu" is the tanh form).

        Raises:
            ConfigError: a causal model: the file has no field for it, and google-research/bert
                would run the weights bidirectionally, a different network.
        """
        if self.causal:
            raise ConfigError(
                "a causal (left-to-right) model has no Google bert_config.json: "
                "google-research/bert has no causal attention and would run it bidirectionally; "
                "write the HF config.json (is_decoder=true) instead"
            )
        if self.embedding_width != self.hidden_size:
            raise ConfigError(
                f"embedding_size {self.embedding_size} != hidden_size {self.hidden_size} has no "
                "Google bert_config.json: google-research/bert has no embedding projection"
            )
        self._check_bert_architecture("Google bert_config.json")
        return self._architecture_dict()

    def _architecture_dict(self) -> dict[str, Any]:
        return {
            "attention_probs_dropout_prob": self.attention_probs_dropout_prob,
            "hidden_act": "gelu" if self.hidden_act == "gelu_tanh" else "gelu_exact",
            "hidden_dropout_prob": self.hidden_dropout_prob,
            "hidden_size": self.hidden_size,
            "initializer_range": self.initializer_range,
            "intermediate_size": self.intermediate_size,
            "max_position_embeddings": self.max_position_embeddings,
            "num_attention_heads": self.num_attention_heads,
            "num_hidden_layers": self.num_hidden_layers,
            "type_vocab_size": self.type_vocab_size,
            "vocab_size": self.vocab_size,
        }

    def to_hf_dict(self) -> dict[str, Any]:
        """A `transformers` `BertConfig` as its `config.json` stores it.

        A causal model gets `is_decoder: true`, under which transformers' BertModel applies
        the same causal-and-padding mask (its pooler still reads [CLS]: see `BertModel`).

        Raises:
            ConfigError: an architecture transformers' BertModel does not compute
                (`non_bert_fields`).
        """
        self._check_bert_architecture("transformers BertConfig")
        causal = {"is_decoder": True} if self.causal else {}
        # transformers' BertConfig keeps a key it does not know; our params-only Orbax
        # directories (`bert_jax.convert.save_params`) read it back.
        factorised = {} if self.embedding_size is None else {"embedding_size": self.embedding_size}
        return {
            "architectures": ["BertForPreTraining"],
            "model_type": "bert",
            **self._architecture_dict(),
            # "gelu_new", not "gelu_pytorch_tanh": the tanh formula itself, op for op.
            "hidden_act": "gelu_new" if self.hidden_act == "gelu_tanh" else "gelu",
            **causal,
            **factorised,
            "layer_norm_eps": self.layer_norm_eps,
            "pad_token_id": 0,
            "position_embedding_type": "absolute",
            "torch_dtype": "float32",
        }

    @classmethod
    def from_dict(
        cls, data: dict[str, Any], source: str = "<dict>", *, flavour: str = "hf", **overrides: Any
    ) -> BertConfig:
        """Reads Google or HF fields; unknown keys are ignored, wrong values are errors.

        `flavour` says whose names `hidden_act` uses: "google" for google-research/bert's
        `bert_config.json` ("gelu" is the tanh form), "hf" for `config.json` ("gelu" is erf).
        """
        if data.get("model_type", "bert") != "bert":
            raise ConfigError(f"{source}: model_type {data['model_type']!r} is not 'bert'")
        pos_type = data.get("position_embedding_type", "absolute")
        if pos_type != "absolute":
            raise ConfigError(f"{source}: position_embedding_type {pos_type!r} is not supported")
        acts = _JSON_ACTS[flavour]
        act = data.get("hidden_act", "gelu")
        if act not in acts:
            raise ConfigError(
                f"{source}: hidden_act {act!r} is not supported; use one of {tuple(acts)}"
            )
        names = {f.name for f in dataclasses.fields(cls)}
        fields = {k: v for k, v in data.items() if k in names and k not in ("dtype",)}
        fields["hidden_act"] = acts[act]
        if flavour == "hf" and "is_decoder" in data:  # transformers' name for causal attention
            fields["causal"] = bool(data["is_decoder"])
        fields.update(overrides)
        try:
            return cls(**fields)
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None

    @classmethod
    def from_json_file(
        cls, path: str | os.PathLike, *, flavour: str = "hf", **overrides: Any
    ) -> BertConfig:
        """Loads `config.json` (HF) or, with flavour="google", Google's `bert_config.json`."""
        path = os.fspath(path)
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such config file") from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: not valid JSON ({e})") from None
        return cls.from_dict(data, source=path, flavour=flavour, **overrides)

    def write_json(self, path: str | os.PathLike, flavour: str = "google") -> None:
        """Writes `bert_config.json` (flavour="google") or `config.json` (flavour="hf")."""
        data = self.to_google_dict() if flavour == "google" else self.to_hf_dict()
        with open(path, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
