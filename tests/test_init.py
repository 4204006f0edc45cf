"""Fresh weights are drawn as the original draws them: TF1's truncated normal, sampled here.

google-research/bert (and /electra) initialise every kernel and embedding table with
`tf.compat.v1.truncated_normal_initializer(stddev=initializer_range)`: N(0, stddev) cut at
2 stddev, whose samples have std 0.88 * stddev. Biases and LayerNorm offsets start at 0,
LayerNorm scales at 1. Each model here is initialised once and every one of its weight
matrices is compared with samples of TF's own initializer drawn in the same test, so no
constant of the distribution is restated. Parity tests start from copied weights and never
see the init: this is the test that does.

Statistics (every matrix has >= 1024 samples: the narrowest, H x 1 heads, at H = 1024):

* std: the sample std of n draws has relative standard error sqrt((kurtosis - 1) / (4 n))
  (kurtosis of the reference itself, ~2.37); a matrix may differ from the 2^20-sample
  reference by 5 standard errors of the difference (a correct init fails with p ~ 6e-7).
  At n = 1024 that is 9%; 0.88x the spread is 6.6 standard errors off, and the many larger
  matrices (1e5-1e6 samples, tolerance 0.3-1%) place it 40+ standard errors off.
* cut-off: max |w| <= 2 stddev (TF's cut, checked on the reference), and close to it: the
  density of |w| at the cut is f = 2 phi(2) / ((2 Phi(2) - 1) stddev), so n draws all stay
  below 2 stddev - t with probability exp(-n f t); t = ln(1e6) / (n f) makes that 1e-6.
  At n = 1024, t = 0.12 stddev: a cut at 0.88 * 2 stddev (0.24 stddev short) always fails.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf

from bert_jax.config import BertConfig
from bert_jax.electra import ElectraForPreTraining, generator_config
from bert_jax.heads import (
    BertForMultipleChoice,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from bert_jax.model import BertModel

RANGE = 0.02  # google-research/bert's initializer_range (and its heads' fixed 0.02)
# H = 1024 gives the narrowest matrices (the H x 1 multiple-choice and RTD outputs) 1024
# samples: enough for both checks (module docstring); one layer keeps the init cheap.
CONFIG = BertConfig(
    vocab_size=512,
    hidden_size=1024,
    num_hidden_layers=1,
    num_attention_heads=8,
    intermediate_size=256,
    max_position_embeddings=64,
    initializer_range=RANGE,
)
REFERENCE_SAMPLES = 2**20
Z = 5.0  # standard errors allowed between a matrix's std and the reference's
MISS = 1e-6  # probability that a correct init's max |w| falls short of the cut's band
FLOAT32_SLACK = 1e-6  # relative: float32 rounding of a sample drawn at the cut


@pytest.fixture(scope="module")
def reference():
    """TF1's truncated_normal_initializer(stddev=RANGE): std, kurtosis, max |w|."""
    init = tf.compat.v1.truncated_normal_initializer(stddev=RANGE, seed=0)
    draws = init((REFERENCE_SAMPLES,), dtype=tf.float32).numpy().astype(np.float64)
    std = draws.std()
    return {"std": std, "kurtosis": np.mean(draws**4) / std**4, "max": np.abs(draws).max()}


def _cut_band(n: int) -> float:
    """t such that n truncated-normal draws all stay below cut - t with probability MISS."""
    phi, cdf2 = math.exp(-2.0) / math.sqrt(2 * math.pi), 0.5 * (1 + math.erf(2 / math.sqrt(2)))
    density_at_cut = 2 * phi / ((2 * cdf2 - 1) * RANGE)  # of |w|, both tails
    return math.log(1 / MISS) / (n * density_at_cut)


def _ids(*shape):
    return jnp.zeros(shape, jnp.int32)


def _init(module, *args):
    params = jax.jit(lambda key: module.init(key, *args)["params"])(jax.random.key(0))
    return {
        jax.tree_util.keystr(path): np.asarray(leaf, np.float64)
        for path, leaf in jax.tree_util.tree_flatten_with_path(nn.meta.unbox(params))[0]
    }


ENCODER_ARGS = (_ids(2, 8), _ids(2, 8), _ids(2, 8))
ELECTRA = CONFIG.replace(embedding_size=512)  # factorised: both embeddings_project layers
MODELS = {
    "encoder": lambda: _init(BertModel(CONFIG), *ENCODER_ARGS),
    "encoder_scanned": lambda: _init(
        BertModel(CONFIG.replace(num_hidden_layers=2, scan_layers=True)), *ENCODER_ARGS
    ),
    "pretraining": lambda: _init(BertForPreTraining(CONFIG), *ENCODER_ARGS, _ids(2, 3)),
    "classification": lambda: _init(BertForSequenceClassification(CONFIG, 3), *ENCODER_ARGS),
    "multiple_choice": lambda: _init(BertForMultipleChoice(CONFIG), *ENCODER_ARGS),
    "tagging": lambda: _init(BertForTokenClassification(CONFIG, 5), *ENCODER_ARGS),
    "question_answering": lambda: _init(BertForQuestionAnswering(CONFIG), *ENCODER_ARGS),
    "electra": lambda: _init(
        ElectraForPreTraining(ELECTRA, generator_config(ELECTRA)),
        *ENCODER_ARGS,
        _ids(2, 3),
        _ids(2, 3),
        jnp.ones((2, 3)),
        jax.random.key(1),
    ),
}


@pytest.mark.parametrize("name", MODELS)
def test_fresh_weights_follow_tf1_truncated_normal(name, reference):
    """Kernels and tables: TF1's std and cut; biases and LayerNorm offsets 0, scales 1."""
    # TF's own samples are cut at 2 stddev (and reach it): the cut checked below.
    assert 2 * RANGE - _cut_band(REFERENCE_SAMPLES) <= reference["max"]
    assert reference["max"] <= 2 * RANGE * (1 + FLOAT32_SLACK)
    params = MODELS[name]()
    weights = {
        path: w for path, w in params.items() if path.endswith(("['kernel']", "['embedding']"))
    }
    for path, w in params.items():
        if path in weights:
            continue
        # Every other leaf is a bias / LayerNorm offset (0) or a LayerNorm scale (1), as in
        # TF's tf.layers.dense and layer_norm: a new kind of parameter must be added here.
        expected = 1.0 if path.endswith("['scale']") else 0.0
        assert path.endswith(("['bias']", "['scale']", "['output_bias']")), path
        assert np.all(w == expected), path
    problems = []
    for path, w in weights.items():
        n = w.size
        assert n >= 1024, f"{path}: {n} samples, too few for the tolerances"
        rel_se = math.sqrt((reference["kurtosis"] - 1) / 4 * (1 / n + 1 / REFERENCE_SAMPLES))
        ratio = w.std() / reference["std"]
        top = np.abs(w).max()
        if abs(w.mean()) > Z * reference["std"] / math.sqrt(n):
            problems.append(f"{path}: mean {w.mean():.2e}, TF's is 0")
        if abs(ratio - 1) > Z * rel_se:
            problems.append(f"{path}: std {ratio:.3f}x TF's (tolerance {Z * rel_se:.3f})")
        if not 2 * RANGE - _cut_band(n) <= top <= 2 * RANGE * (1 + FLOAT32_SLACK):
            problems.append(f"{path}: max |w| {top:.5f}, TF cuts at {2 * RANGE}")
    assert not problems, "\n".join(problems)
