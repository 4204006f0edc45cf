"""benchmarks.studies.elementwise_bounds: each variant's step lacks exactly its kind of op (read in
the lowered program: LayerNorm's rsqrt, exact GELU's erf, threefry's hashing of the dropout
masks), and the model and config are as they were after the block."""

import jax
import pytest
from synthetic_pretraining import tiny_shaped_config

from benchmarks.studies import elementwise_bounds
from bert_jax import heads, model
from experiments import aot_compile

# The op each kind lowers to: LayerNorm's 1/sqrt(var + eps), GELU's erf, and the dropout
# masks' threefry2x32 (the train step's only random bits: its key is split with threefry
# too, but outside the step).
OPS = {"layer_norm": "stablehlo.rsqrt", "gelu": "chlo.erf", "dropout": "threefry2x32"}


@pytest.fixture(scope="module")
def lowered():
    config = tiny_shaped_config(num_hidden_layers=1)
    texts = {}
    for name, kinds in elementwise_bounds.VARIANTS.items():
        with elementwise_bounds.without(config, kinds) as variant:
            train, _, _, _ = aot_compile.lower_steps(variant, jax.devices(), evaluate=False)
        texts[name] = train.as_text()
    return config, texts


@pytest.mark.parametrize("name", list(elementwise_bounds.VARIANTS))
def test_each_variant_lacks_exactly_its_ops(lowered, name):
    _, texts = lowered
    removed = elementwise_bounds.VARIANTS[name]
    for kind, op in OPS.items():
        count = texts[name].count(op)
        assert (count == 0) == (kind in removed), (name, kind, count)


def test_the_model_and_the_config_are_restored(lowered):
    config, _ = lowered
    assert model.layer_norm.__module__ == "bert_jax.model" and heads.layer_norm is model.layer_norm
    assert model.activation.__module__ == "bert_jax.model" and heads.activation is model.activation
    assert config.to_dict() == tiny_shaped_config(num_hidden_layers=1).to_dict()
