"""Where each BERT parameter lives in our trees, in Hugging Face files and in Google's.

One table (`TensorSpec`s) names every parameter three ways: its path in our Flax params,
its Hugging Face state-dict key and its Google TF variable name, with the reshape and
transpose between them. Our kernels are reshapes of Google's (in, out) matrices
(`(H, A, D)` for query/key/value, `(A, D, H)` for the attention output); torch `Linear`
stores (out, in). A `Family` gathers one model family's tables (BERT's here, ModernBERT's in
`modernbert`) for the generic reading and writing code. Also here: moving between the looped
(`layer_N`) and scanned (`layers`, stacked on axis 0) encoder layouts.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from bert_jax.config import BertConfig

Params = dict[str, Any]


class ConversionError(ValueError):
    """A checkpoint that does not fit the requested model (names the tensor)."""


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One parameter: its path in our tree and its names in the HF and Google layouts."""

    path: tuple[str, ...]  # under the encoder (encoder specs) or the model root (heads)
    hf: str  # HF state-dict key (encoder keys without the `bert.` prefix)
    tf: str  # Google TF variable name
    split: int | None = None  # how many of our leading axes form Google's `in`; None: flat
    hf_t: bool = False  # HF stores the transpose of Google's layout (torch Linear: out, in)
    tf_t: bool = False  # Google stores (out, in) too (NSP and task `output_weights`)
    # (i, n): the HF tensor holds n such tensors on its axis 0 and this is the i-th (ModernBERT's
    # fused Wqkv: query, key, value); None: the HF tensor is this one alone.
    part: tuple[int, int] | None = None
    # HF has no such tensor (ModernBERT's layer 0 has no attn_norm): imported as this
    # constant, never exported; None: HF has it.
    hf_fill: float | None = None

    @property
    def ours(self) -> str:
        return "/".join(self.path)

    def flat_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """Our `shape` as an (in, out) matrix, or flat for vectors and tables."""
        if self.split is None:
            return (math.prod(shape),)
        return (math.prod(shape[: self.split]), math.prod(shape[self.split :]))

    def stored_shape(self, shape: tuple[int, ...], naming: str) -> tuple[int, ...]:
        """The shape a checkpoint in `naming` ("hf", "tf", "ours") stores for our `shape`."""
        if naming == "ours":
            return tuple(shape)
        transposed = self.hf_t if naming == "hf" else self.tf_t
        flat = self.flat_shape(shape)
        flat = flat[::-1] if transposed else flat
        if naming == "hf" and self.part:  # the whole fused tensor
            return (flat[0] * self.part[1], *flat[1:])
        return flat

    def to_hf(self, value: np.ndarray) -> np.ndarray:
        """Our parameter as HF stores it (its block of a fused tensor), float32."""
        value = np.asarray(value, dtype=np.float32).reshape(self.flat_shape(value.shape))
        return np.ascontiguousarray(value.T if self.hf_t else value)

    def from_hf(self, value: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """The HF tensor (the whole fused one) as our parameter of `shape`."""
        if self.part:
            value = np.split(value, self.part[1], axis=0)[self.part[0]]
        return (value.T if self.hf_t else value).reshape(shape)


def _dense(path, hf, tf, split=1) -> list[TensorSpec]:
    return [
        TensorSpec((*path, "kernel"), f"{hf}.weight", f"{tf}/kernel", split, hf_t=True),
        TensorSpec((*path, "bias"), f"{hf}.bias", f"{tf}/bias"),
    ]


def _layer_norm(path, hf, tf) -> list[TensorSpec]:
    return [
        TensorSpec((*path, "scale"), f"{hf}.weight", f"{tf}/gamma"),
        TensorSpec((*path, "bias"), f"{hf}.bias", f"{tf}/beta"),
    ]


def _output_layer(path, hf, tf) -> list[TensorSpec]:
    """A task output layer: Google stores `output_weights` as (out, in) like torch does."""
    return [
        TensorSpec((*path, "kernel"), f"{hf}.weight", f"{tf}output_weights", 1, True, True),
        TensorSpec((*path, "bias"), f"{hf}.bias", f"{tf}output_bias"),
    ]


def embedding_specs() -> list[TensorSpec]:
    specs = [
        TensorSpec(
            ("embeddings", f"{name}_embeddings", "embedding"),
            f"embeddings.{name}_embeddings.weight",
            f"bert/embeddings/{name}_embeddings",
            split=1,
        )
        for name in ("word", "position", "token_type")
    ]
    return specs + _layer_norm(
        ("embeddings", "layer_norm"), "embeddings.LayerNorm", "bert/embeddings/LayerNorm"
    )


def layer_specs(i: int) -> list[TensorSpec]:
    """The tensors of encoder layer `i` (looped layout)."""
    path, hf, tf = ("encoder", f"layer_{i}"), f"encoder.layer.{i}", f"bert/encoder/layer_{i}"
    specs = []
    for name in ("query", "key", "value"):
        specs += _dense(
            (*path, "attention", name), f"{hf}.attention.self.{name}", f"{tf}/attention/self/{name}"
        )
    specs += _dense(
        (*path, "attention", "output"),
        f"{hf}.attention.output.dense",
        f"{tf}/attention/output/dense",
        split=2,  # (A, D, H): heads and head_dim together are the input
    )
    specs += _layer_norm(
        (*path, "attention_layer_norm"),
        f"{hf}.attention.output.LayerNorm",
        f"{tf}/attention/output/LayerNorm",
    )
    specs += _dense((*path, "intermediate"), f"{hf}.intermediate.dense", f"{tf}/intermediate/dense")
    specs += _dense((*path, "output"), f"{hf}.output.dense", f"{tf}/output/dense")
    specs += _layer_norm(
        (*path, "output_layer_norm"), f"{hf}.output.LayerNorm", f"{tf}/output/LayerNorm"
    )
    return specs


def encoder_specs(num_layers: int) -> list[TensorSpec]:
    """Embeddings and every layer (the pooler is apart: token-level models have none)."""
    return embedding_specs() + [spec for i in range(num_layers) for spec in layer_specs(i)]


POOLER_SPECS = _dense(("pooler",), "pooler.dense", "bert/pooler/dense")
# The E -> H projection of an encoder whose embeddings are narrower (`embedding_size`): not
# in BERT's formats; transformers' ElectraModel and google-research/electra name it so.
PROJECT_SPECS = _dense(("embeddings_project",), "embeddings_project", "electra/embeddings_project")

# Heads by their name in our trees. The MLM decoder matrix is the word-embedding table
# (tied), so only its bias is a head tensor.
HEAD_SPECS: dict[str, list[TensorSpec]] = {
    "mlm": [
        *_dense(
            ("mlm", "transform"),
            "cls.predictions.transform.dense",
            "cls/predictions/transform/dense",
        ),
        *_layer_norm(
            ("mlm", "layer_norm"),
            "cls.predictions.transform.LayerNorm",
            "cls/predictions/transform/LayerNorm",
        ),
        TensorSpec(("mlm", "output_bias"), "cls.predictions.bias", "cls/predictions/output_bias"),
    ],
    "nsp": _output_layer(("nsp",), "cls.seq_relationship", "cls/seq_relationship/"),
    # run_classifier.py keeps its output layer at the top level of the graph.
    "classifier": _output_layer(("classifier",), "classifier", ""),
    "qa_outputs": _output_layer(("qa_outputs",), "qa_outputs", "cls/squad/"),
}

TIED_DECODER = {  # HF copies of tied tensors -> the tensor they must equal
    "cls.predictions.decoder.weight": "embeddings.word_embeddings.weight",
    "cls.predictions.decoder.bias": "cls.predictions.bias",
}
# Buffers and optimiser state that are not parameters.
IGNORED_NAMES = re.compile(r"(^|[./])(position_ids|global_step)$|/adam_[mv]$|^bad_steps$")
# An encoder layer's index in a HF (BERT's, ModernBERT's), Google or our (looped) name.
LAYER_INDEX = re.compile(r"(encoder\.layer\.|encoder/layer_|^layers\.)(\d+)[./]")
# Our path of the word-embedding table (its HF name checks an export's vocab_size).
WORD_EMBEDDINGS = ("embeddings", "word_embeddings", "embedding")


def bert_architecture(params: Params, causal: bool = False) -> str:
    """The transformers Bert class of our params (looped, numpy): by their heads."""
    heads = frozenset(params) - {"bert"} if "bert" in params else frozenset()
    if causal and heads == {"mlm"}:  # the "ltr" objective's model: a left-to-right LM
        return "BertLMHeadModel"
    if heads == {"classifier"}:
        pooled = "pooler" in params["bert"]
        return "BertForSequenceClassification" if pooled else "BertForTokenClassification"
    architectures = {
        frozenset(): "BertModel",
        frozenset({"mlm", "nsp"}): "BertForPreTraining",
        frozenset({"mlm"}): "BertForMaskedLM",
        frozenset({"nsp"}): "BertForNextSentencePrediction",
        frozenset({"qa_outputs"}): "BertForQuestionAnswering",
    }
    if heads not in architectures:
        raise ConversionError(f"no transformers model has exactly the heads {sorted(heads)}")
    return architectures[heads]


@dataclasses.dataclass(frozen=True)
class Family:
    """One model family's tables and HF conventions, read and written by the generic code
    (`load`, `readers`, `export`). Tables are functions of our config (`BertConfig`), whose
    switches add or drop tensors."""

    model_type: str  # transformers' config.json `model_type`
    encoder: Callable[[BertConfig], list[TensorSpec]]  # embeddings, layers (+ a final norm)
    heads: Callable[[BertConfig], dict[str, list[TensorSpec]]]  # by their name in our trees
    pooler: list[TensorSpec]  # empty: the family has no pooler
    hf_prefix: str  # the encoder's key prefix in HF task models (none in the bare encoder)
    head_keys: tuple[str, ...]  # how HF head keys (outside the prefix) begin
    tied: dict[str, str]  # HF copies of tied tensors -> the tensor they must equal
    architecture: Callable[[Params, BertConfig], str]  # our params, config -> transformers class
    hf_config: Callable[[BertConfig], dict[str, Any]]  # our config -> its config.json
    from_hf_config: Callable[
        [dict[str, Any], str], BertConfig
    ]  # config.json (and its path) -> ours


def _bert_encoder(config) -> list[TensorSpec]:
    specs = encoder_specs(config.num_hidden_layers)
    # The E -> H projection of narrower embeddings (ELECTRA-Small): Google's name is ELECTRA's.
    return specs + (PROJECT_SPECS if config.embedding_width != config.hidden_size else [])


BERT = Family(
    model_type="bert",
    encoder=_bert_encoder,
    heads=lambda config: HEAD_SPECS,
    pooler=POOLER_SPECS,
    hf_prefix="bert.",
    head_keys=("cls.", "classifier.", "qa_outputs."),
    tied=TIED_DECODER,
    architecture=lambda params, config: bert_architecture(params, config.causal),
    hf_config=lambda config: config.to_hf_dict(),
    from_hf_config=BertConfig.from_dict,
)


# --- Trees ------------------------------------------------------------------------------------


def get_path(tree: Mapping, path: tuple[str, ...]):
    for key in path:
        tree = tree[key]
    return tree


def set_path(tree: dict, path: tuple[str, ...], value) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def flatten(tree: Mapping, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple, Any]]:
    """(path, leaf) pairs of a nested dict, depth first."""
    for key, value in tree.items():
        if isinstance(value, Mapping):
            yield from flatten(value, (*prefix, key))
        else:
            yield (*prefix, key), value


def stack_layers(encoder: Mapping, num_layers: int) -> Params:
    """`encoder` subtree: `layer_0..layer_{L-1}` -> one `layers` subtree stacked on axis 0."""
    layers = [encoder[f"layer_{i}"] for i in range(num_layers)]
    return {"layers": jax.tree_util.tree_map(lambda *xs: np.stack(xs), *layers)}


def unstack_layers(encoder: Mapping) -> Params:
    """The inverse of `stack_layers` (a looped encoder is returned as a copy)."""
    if "layers" not in encoder:
        return dict(encoder)
    stacked = encoder["layers"]
    num_layers = jax.tree_util.tree_leaves(stacked)[0].shape[0]
    return {
        f"layer_{i}": jax.tree_util.tree_map(lambda x, i=i: np.asarray(x[i]), stacked)
        for i in range(num_layers)
    }


def as_numpy(params: Mapping) -> Params:
    """Plain numpy params from boxed or unboxed, `{"params": ...}`-wrapped or bare trees."""
    params = nn.meta.unbox(params)
    if set(params) == {"params"}:
        params = params["params"]
    return jax.tree_util.tree_map(np.asarray, dict(params))


def with_layout(params: Mapping, scan_layers: bool, num_layers: int) -> Params:
    """A copy of a model's params (encoder at the root or under `bert`) in one layout."""
    params = dict(params)
    root = dict(params["bert"]) if "bert" in params else params
    encoder = unstack_layers(root["encoder"])
    root["encoder"] = stack_layers(encoder, num_layers) if scan_layers else encoder
    if "bert" in params:
        params["bert"] = root
    return params
