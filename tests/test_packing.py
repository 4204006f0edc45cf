"""Sequence packing: rows never split or repeat an instance, the packed stream resumes
exactly, and a packed batch has the unpacked batch's loss and gradients."""

from __future__ import annotations

import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import protobuf_records
import pytest

from bert_jax import sharding, train
from bert_jax.config import BertConfig
from bert_jax.heads import BertForPreTraining
from bert_jax.train_state import sharded_state
from data_pipelines import input_pipeline, input_streams, packing, records, tfrecord_files

CLS, SEP, MASK = 101, 102, 103
T, P, INST = 24, 6, 3  # row length, prediction slots and instance slots of the packed rows


def _instance(rng, uid: int, length: int, predictions: int) -> dict:
    """[CLS] uid ... [SEP] ... [SEP]: token 1 names the instance; predictions avoid it."""
    ids = rng.integers(1000, 3000, length)
    split = int(rng.integers(2, length - 1)) if length > 4 else length - 2
    ids[0], ids[1], ids[split], ids[length - 1] = CLS, uid, SEP, SEP
    candidates = np.setdiff1d(np.arange(2, length - 1), [split])
    positions = np.sort(rng.choice(candidates, min(predictions, len(candidates)), replace=False))
    labels = ids[positions].copy()
    ids[positions] = MASK
    return {
        "input_ids": ids,
        "segment_ids": (np.arange(length) > split).astype(np.int64),
        "masked_lm_positions": positions,
        "masked_lm_ids": labels,
        "next_sentence_labels": [uid % 2],
    }


def _unpacked_batch(instances: list[dict], seq: int = T) -> dict[str, np.ndarray]:
    """Instances in the input pipeline's unpacked layout (`records.batch_spec`)."""
    layout = records.batch_spec(len(instances), seq, P)
    out = {k: np.zeros(shape, dtype) for k, (shape, dtype) in layout.items()}
    for b, ex in enumerate(instances):
        n, p = len(ex["input_ids"]), len(ex["masked_lm_positions"])
        out["input_ids"][b, :n] = ex["input_ids"]
        out["input_mask"][b, :n] = 1
        out["segment_ids"][b, :n] = ex["segment_ids"]
        out["masked_lm_positions"][b, :p] = ex["masked_lm_positions"]
        out["masked_lm_ids"][b, :p] = ex["masked_lm_ids"]
        out["masked_lm_weights"][b, :p] = 1.0
        out["next_sentence_labels"][b] = ex["next_sentence_labels"][0]
    return out


def _random_instances(seed: int, count: int, first_uid: int = 10) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [
        _instance(rng, first_uid + i, int(rng.integers(4, T + 1)), int(rng.integers(1, P + 1)))
        for i in range(count)
    ]


def _instances_of_packed(batch: dict[str, np.ndarray]) -> dict[int, dict]:
    """uid -> the instance read back out of a packed batch, checking the row's bookkeeping."""
    found = {}
    rows, slots = batch["instance_weights"].shape
    for r in range(rows):
        ids, inst = batch["input_ids"][r], batch["instance_ids"][r]
        real = batch["input_mask"][r] > 0
        np.testing.assert_array_equal(real, inst > 0)  # padding is exactly instance 0
        count = int(batch["instance_weights"][r].sum())
        np.testing.assert_array_equal(batch["instance_weights"][r], np.arange(slots) < count)
        for slot in range(count):
            where = np.flatnonzero(inst == slot + 1)
            # Never split: one contiguous run, starting at the slot's [CLS].
            assert len(where) and np.array_equal(where, np.arange(where[0], where[-1] + 1))
            start = where[0]
            assert batch["cls_positions"][r, slot] == start and ids[start] == CLS
            np.testing.assert_array_equal(batch["position_ids"][r, where], np.arange(len(where)))
            weights = batch["masked_lm_weights"][r] > 0
            mine = (batch["masked_lm_positions"][r] >= start) & (
                batch["masked_lm_positions"][r] <= where[-1]
            )
            uid = int(ids[start + 1])
            assert uid not in found, f"instance {uid} packed twice"
            found[uid] = {
                "input_ids": ids[where],
                "segment_ids": batch["segment_ids"][r, where],
                "masked_lm_positions": batch["masked_lm_positions"][r][weights & mine] - start,
                "masked_lm_ids": batch["masked_lm_ids"][r][weights & mine],
                "next_sentence_labels": [int(batch["instance_next_sentence_labels"][r, slot])],
            }
        assert int(batch["input_mask"][r].sum()) <= T
        assert int((batch["masked_lm_weights"][r] > 0).sum()) <= P
    return found


class _ListSource:
    """Unpacked batches from a list, with the input pipeline's position protocol."""

    def __init__(self, batches, position=None):
        self.batches = batches
        self.index = 0 if position is None else position["batch_in_epoch"]

    @property
    def position(self):
        return {"epoch": 0, "batch_in_epoch": self.index}

    def __next__(self):
        self.index += 1
        return self.batches[self.index - 1]


def _packed_stream(batches, position=None, rows=4):
    return packing.PackedIterator(
        lambda pos: _ListSource(batches, pos),
        num_rows=rows,
        max_seq_length=T,
        max_predictions_per_seq=P,
        max_instances_per_row=INST,
        position=position,
    )


def test_packing_keeps_every_instance_once_and_never_splits_one():
    instances = _random_instances(seed=0, count=120)
    batches = [_unpacked_batch(instances[i : i + 8]) for i in range(0, 120, 8)]
    stream = _packed_stream(batches)
    packed, found = [], {}
    while len(found) < 100:
        packed.append(next(stream))
        for uid, got in _instances_of_packed(packed[-1]).items():
            assert uid not in found, f"instance {uid} in two batches"
            found[uid] = got
    # Exactly the first instances of the stream, in order of arrival, and nothing else.
    consumed = 8 * stream.position["batch_in_epoch"] + stream.position["instance_in_batch"]
    assert sorted(found) == [10 + i for i in range(consumed)]
    for uid, got in found.items():
        want = instances[uid - 10]
        for key, value in got.items():
            np.testing.assert_array_equal(value, want[key], err_msg=f"{uid} {key}")
    # Packing pays: fewer rows than instances (the unpacked stream's one row each).
    assert len(packed) * 4 < 0.8 * len(found)

    # Resuming from any saved position yields the uninterrupted stream's batches.
    for stop in (1, 3, 5):
        run = _packed_stream(batches)
        for _ in range(stop):
            next(run)
        resumed = _packed_stream(batches, json.loads(json.dumps(run.position)))
        for i in range(stop, len(packed)):
            got = next(resumed)
            for key in got:
                np.testing.assert_array_equal(got[key], packed[i][key], err_msg=f"{i} {key}")


def test_first_fit_fills_rows_in_order_and_refuses_what_cannot_fit():
    sizes = dict(num_rows=2, max_seq_length=10, max_predictions_per_seq=3, max_instances_per_row=2)
    # 6 -> row 0; 5 -> row 1; 4 fits row 0; 3 fits row 1 (row 0 is full); 2 fits nowhere.
    rows, consumed = packing.first_fit([6, 5, 4, 3, 2], [1, 1, 1, 1, 1], **sizes)
    assert rows == [[0, 2], [1, 3]] and consumed == 4
    # The prediction budget counts too: 2 + 2 > 3 opens a second row.
    rows, consumed = packing.first_fit([2, 2, 2], [2, 2, 1], **sizes)
    assert rows == [[0, 2], [1]] and consumed == 3
    with pytest.raises(ValueError, match="does not fit a row of max_seq_length=10"):
        packing.first_fit([11], [1], **sizes)


# --- the model: a packed batch is the unpacked batch ------------------------------------------

CONFIG = BertConfig(
    vocab_size=3001,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=T,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)


def _relative_error(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def test_packed_batch_has_the_unpacked_loss_and_gradients():
    """Per-instance losses, their metrics and the gradient of every parameter, through both
    attention paths (the block-diagonal mask as a bias, and as jax.nn's boolean mask)."""
    instances = _random_instances(seed=1, count=7)
    unpacked = _unpacked_batch(instances)
    rows, consumed = packing.first_fit(
        *packing.instance_sizes(unpacked),
        num_rows=7,
        max_seq_length=T,
        max_predictions_per_seq=P,
        max_instances_per_row=INST,
    )
    assert consumed == 7 and len(rows) < 7 and max(map(len, rows)) > 1
    sizes = dict(max_seq_length=T, max_predictions_per_seq=P, max_instances_per_row=INST)
    packed = packing.pack_rows(unpacked, rows, num_rows=len(rows), **sizes)

    model = BertForPreTraining(CONFIG)
    params = nn.meta.unbox(model.init(jax.random.key(0), *train.init_inputs(unpacked))["params"])

    def loss(params, batch, module):
        batch = {k: jnp.asarray(v) for k, v in batch.items()}
        return train.train_loss(params, batch, jax.random.key(1), model=module)

    grad = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=2)
    (want, want_metrics), want_grads = grad(params, unpacked, model)
    scale = max(float(np.abs(g).max()) for g in jax.tree_util.tree_leaves(want_grads))
    want_leaves = dict(jax.tree_util.tree_leaves_with_path(want_grads))
    for implementation in ("einsum", "xla"):
        fused = BertForPreTraining(CONFIG.replace(attention_implementation=implementation))
        (got, got_metrics), got_grads = grad(params, packed, fused)
        for key, value in want_metrics.items():  # mlm/nsp loss and accuracy, per instance
            assert abs(float(got_metrics[key]) - float(value)) <= 1e-5 * abs(float(value)), key
        assert abs(float(got) - float(want)) <= 1e-5 * float(want)
        for path, value in jax.tree_util.tree_leaves_with_path(got_grads):
            name = f"{implementation} {jax.tree_util.keystr(path)}"
            if "['key']['bias']" in name:  # zero in exact arithmetic: both are rounding noise
                assert np.abs(value).max() < 1e-6 * scale, name
                assert np.abs(want_leaves[path]).max() < 1e-6 * scale, name
            else:
                assert _relative_error(value, want_leaves[path]) < 1e-5, name


def test_packed_ltr_rows_have_the_unpacked_loss_and_gradients():
    """The "ltr" objective packs: causal AND block-diagonal attention, next-token targets
    moved into the row (P = T), through both attention paths."""
    import tensorflow as tf

    instances = _random_instances(seed=4, count=7)
    layout = records.batch_spec(len(instances), T, T)
    unmasked = {k: np.zeros(shape, dtype) for k, (shape, dtype) in layout.items()}
    for b, ex in enumerate(instances):
        ids = ex["input_ids"].copy()
        ids[ex["masked_lm_positions"]] = ex["masked_lm_ids"]
        unmasked["input_ids"][b, : len(ids)] = ids
        unmasked["input_mask"][b, : len(ids)] = 1
    features = {k: tf.constant(unmasked[k]) for k in ("input_ids", "input_mask", "segment_ids")}
    features["next_sentence_labels"] = tf.zeros((len(instances), 1), tf.int32)
    unpacked = {k: v.numpy() for k, v in input_streams.next_token_targets(features, T).items()}
    unpacked["next_sentence_labels"] = unpacked["next_sentence_labels"][:, 0]
    sizes = dict(max_seq_length=T, max_predictions_per_seq=T, max_instances_per_row=INST)
    rows, consumed = packing.first_fit(*packing.instance_sizes(unpacked), num_rows=7, **sizes)
    assert consumed == 7 and len(rows) < 7 and max(map(len, rows)) > 1
    packed = packing.pack_rows(unpacked, rows, num_rows=len(rows), **sizes)

    causal = CONFIG.replace(causal=True, num_hidden_layers=1)  # compiles in half the time
    model = BertForPreTraining(causal, next_sentence=False)
    params = nn.meta.unbox(model.init(jax.random.key(0), *train.init_inputs(unpacked))["params"])

    def loss(params, batch, module):
        batch = {k: jnp.asarray(v) for k, v in batch.items()}
        return train.train_loss(params, batch, jax.random.key(1), model=module)

    grad = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=2)
    (want, _), want_grads = grad(params, unpacked, model)
    want_leaves = dict(jax.tree_util.tree_leaves_with_path(want_grads))
    scale = max(float(np.abs(g).max()) for g in want_leaves.values())
    for implementation in ("einsum", "xla"):
        module = BertForPreTraining(
            causal.replace(attention_implementation=implementation), next_sentence=False
        )
        (got, _), got_grads = grad(params, packed, module)
        assert abs(float(got) - float(want)) <= 1e-5 * float(want), implementation
        for path, value in jax.tree_util.tree_leaves_with_path(got_grads):
            name = f"{implementation} {jax.tree_util.keystr(path)}"
            if "['key']['bias']" in name:  # zero in exact arithmetic: both are rounding noise
                assert np.abs(value).max() < 1e-6 * scale, name
            else:
                assert _relative_error(value, want_leaves[path]) < 1e-5, name


def test_the_sharded_eval_step_takes_a_packed_batch():
    """train.jit_steps' packed batch layout on a (data 4, fsdp 2) mesh: a packed batch (its
    empty rows all padding) scores what the unpacked one does."""
    unpacked = _unpacked_batch(_random_instances(seed=3, count=8))
    sizes = dict(max_seq_length=T, max_predictions_per_seq=P, max_instances_per_row=INST)
    rows, consumed = packing.first_fit(*packing.instance_sizes(unpacked), num_rows=8, **sizes)
    assert consumed == 8 and len(rows) < 8
    packed = packing.pack_rows(unpacked, rows, num_rows=8, **sizes)
    model = BertForPreTraining(CONFIG.replace(num_hidden_layers=1))  # compiles in half the time
    tx, mesh = optax.sgd(0.1), sharding.create_mesh((4, 2, 1))
    inputs = train.init_inputs(train.example_batch(1, T, P))
    state, shardings = sharded_state(model, tx, mesh, inputs, rng=jax.random.key(0))
    scores = []
    with sharding.activation_context(mesh):
        for batch, keys in ((unpacked, records.BATCH), (packed, records.PACKED_BATCH)):
            _, evaluate = train.jit_steps(model, tx, optax.constant_schedule(0.1), mesh, shardings,
                                          batch_keys=keys)  # fmt: skip
            scores.append(
                jax.device_get(evaluate(state.params, sharding.global_batch(batch, mesh)))
            )
    for key, value in scores[0].items():
        assert abs(scores[1][key] - value) <= 1e-5 * abs(value), key


# --- the input pipeline -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def record_files(tmp_path_factory):
    """Two files of 24 masked records of random lengths, uids 10.."""
    directory = str(tmp_path_factory.mktemp("packing"))
    instances = _random_instances(seed=2, count=48)
    paths = [os.path.join(directory, f"part-{f}.tfrecord") for f in range(2)]
    with tfrecord_files.TFRecordShardWriter(paths) as writer:
        for i, ex in enumerate(instances):
            label = ex.pop("next_sentence_labels")[0]
            example = {**ex, "next_sentence_label": label}
            writer.write(
                protobuf_records.serialize_masked(
                    example, max_seq_length=T, max_predictions_per_seq=P
                ),
                shard=i % 2,
            )
    return os.path.join(directory, "part-*.tfrecord")


def _pipeline(pattern, **overrides):
    kwargs = dict(
        global_batch_size=4,
        max_seq_length=T,
        max_predictions_per_seq=P,
        seed=5,
        process_index=0,
        process_count=1,
        shuffle_buffer=16,
    )
    return input_pipeline.make_pretraining_dataset(pattern, **(kwargs | overrides))


def test_the_input_pipeline_packs_its_own_stream_and_resumes(record_files):
    unpacked = _pipeline(record_files)
    order = [uid for _ in range(40) for uid in next(unpacked)["input_ids"][:, 1].tolist()]
    stream = _pipeline(record_files, max_instances_per_row=INST)
    batches = [next(stream) for _ in range(12)]
    layout = records.batch_spec(4, T, P, INST)
    assert {k: (v.shape, v.dtype) for k, v in batches[0].items()} == layout
    position = stream.position
    at = position["streams"]["0"]  # the one stream's
    # Instances taken from the unpacked stream: 48 records per epoch, batches of 4.
    consumed = 48 * at["epoch"] + 4 * at["batch_in_epoch"] + at["instance_in_batch"]
    uids = [uid for batch in batches for uid in _instances_of_packed(batch)]
    assert sorted(uids) == sorted(order[:consumed])  # the unpacked stream's, exactly once

    for stop in (2, 7):
        run = _pipeline(record_files, max_instances_per_row=INST)
        for _ in range(stop):
            next(run)
        saved = json.loads(json.dumps(run.position))
        resumed = _pipeline(record_files, max_instances_per_row=INST, start_position=saved)
        for i in range(stop, 12):
            got = next(resumed)
            for key in got:
                np.testing.assert_array_equal(got[key], batches[i][key], err_msg=f"{i} {key}")
    with pytest.raises(ValueError, match="max_instances_per_row: saved 3, now None"):
        _pipeline(record_files, start_position=position)
    with pytest.raises(ValueError, match="max_instances_per_row: saved 3, now 2"):
        _pipeline(record_files, max_instances_per_row=2, start_position=position)
