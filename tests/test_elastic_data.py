"""The input pipeline's streams: resuming at any batch without replaying the epoch, and on
another process count (`data_pipelines.input_pipeline`, `data_pipelines.input_streams`).

Records carry a unique id (token 1), so a test can say which records a batch holds. The
files have uneven record counts (one is empty), so groups and windows end mid-file.
"""

from __future__ import annotations

import itertools
import json
import os

import numpy as np
import protobuf_records
import pytest
import tensorflow as tf

from data_pipelines import input_pipeline, input_streams, tfrecord_files, tfrecord_framing

T, P = 16, 4
CLS, SEP = 101, 102
COUNTS = [9, 0, 14, 3, 11, 7, 12, 5, 8]  # records per file: 69, one file empty
WINDOW, CYCLE = 5, 3  # small windows and groups, so that a few epochs cross many of each


def _write_files(directory, counts, stats=True):
    """Files part-NNN with `counts` records whose token 1 is a unique id from 10; with
    `stats`, a stats JSON beside them giving the counts, as create_pretraining_data's."""
    uid, paths = 10, []
    for f, count in enumerate(counts):
        path = os.path.join(directory, f"part-{f:03d}.tfrecord")
        with tfrecord_files.TFRecordShardWriter(path) as writer:
            for _ in range(count):
                example = {
                    "input_ids": [CLS, uid, 7, 8, SEP, 9, 11, 12, SEP],
                    "segment_ids": [0] * 5 + [1] * 4,
                    "next_sentence_label": uid % 2,
                    "masked_lm_positions": [2],
                    "masked_lm_ids": [7],
                }
                writer.write(
                    protobuf_records.serialize_masked(
                        example, max_seq_length=T, max_predictions_per_seq=P
                    )
                )
                uid += 1
        paths.append(path)
    if stats:
        with open(paths[0] + ".stats.json", "w") as f:
            json.dump({"output_files": paths, "records_per_file": list(counts)}, f)
    return os.path.join(directory, "part-*.tfrecord")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return _write_files(str(tmp_path_factory.mktemp("uneven")), COUNTS)


def _make(pattern, **overrides):
    kwargs = dict(
        global_batch_size=4,
        max_seq_length=T,
        max_predictions_per_seq=P,
        seed=17,
        process_index=0,
        process_count=1,
        shuffle_buffer=WINDOW,
        cycle_length=CYCLE,
    )
    return input_pipeline.make_pretraining_dataset(pattern, **(kwargs | overrides))


def _uids(batch) -> list[int]:
    return batch["input_ids"][:, 1].tolist()


def _global(iterators, steps) -> list[list[int]]:
    """The uids of `steps` global batches, each the processes' rows in process order."""
    return [sum((_uids(next(it)) for it in iterators), []) for _ in range(steps)]


def _saved(iterators) -> list[dict]:
    """Every process's position, through JSON as a checkpoint stores them."""
    return [json.loads(json.dumps(it.position)) for it in iterators]


def _round_robin(groups: list[list[tuple[str, int]]], counts: dict) -> list[tuple[str, int]]:
    """(file, record) in the order that reading each group's files round robin from the
    given offsets gives, the groups one after another: the module's steps 1-2, restated."""
    out = []
    for group in groups:
        cursors = [[path, start] for path, start in group if start < counts[path]]
        while cursors:
            for cursor in cursors:
                out.append((cursor[0], cursor[1]))
                cursor[1] += 1
            cursors = [c for c in cursors if c[1] < counts[c[0]]]
    return out


def test_skip_records_leaves_the_rest_of_the_round_robin():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 9))
        order = [f"f{i}" for i in range(n)]
        counts = {f: int(rng.integers(0, 7)) for f in order}
        cycle = int(rng.integers(1, 5))
        groups = [[(f, 0) for f in order[i : i + cycle]] for i in range(0, n, cycle)]
        full = _round_robin(groups, counts)
        for skip in range(len(full) + 1):
            current, rest = input_streams.skip_records(order, counts, cycle, skip)
            rest_groups = [
                [(f, 0) for f in rest[i : i + cycle]] for i in range(0, len(rest), cycle)
            ]
            assert _round_robin([current] + rest_groups, counts) == full[skip:], (counts, skip)
            assert len(current) <= cycle


@pytest.mark.extended  # 25 resumed pipelines
def test_resume_at_any_batch_yields_the_uninterrupted_batches(files):
    """Two streams over two epoch ends; stops mid-window, mid-group, at window and epoch
    ends (every third batch: windows of 5 records, batches of 2 per stream).

    Extended tier. make test still resumes the streams mid-epoch and mid-window:
    test_two_processes_to_one_and_one_to_two_mid_epoch and
    test_a_per_host_position_goes_on_at_its_batch_count."""
    reference = _make(files, num_streams=2)
    expected = [_uids(next(reference)) for _ in range(60)]
    epochs = reference.position["streams"]["0"]["epoch"]
    assert epochs == 2  # stream 0: 54 records in batches of 2, 27 batches an epoch
    run = _make(files, num_streams=2)
    for stop in range(60):
        if stop % 3 == 0 or stop in (26, 27, 28, 53, 54):
            resumed = _make(files, start_position=_saved([run])[0])
            assert [_uids(next(resumed)) for _ in range(60 - stop)] == expected[stop:], stop
        next(run)


def test_each_stream_epoch_holds_each_of_its_records_once(files):
    iterator = _make(files, num_streams=2, global_batch_size=2)  # one row per stream
    per_stream = {0: {}, 1: {}}
    for _ in range(80):
        uids = _uids(next(iterator))
        for stream, uid in enumerate(uids):
            epoch = iterator.position["streams"][str(stream)]["epoch"]
            per_stream[stream].setdefault(epoch, []).append(uid)
    first_uid = np.cumsum([0] + COUNTS) + 10  # of each file
    for stream in (0, 1):
        files_of_stream = range(stream, len(COUNTS), 2)  # every other file
        held = sorted(u for f in files_of_stream for u in range(first_uid[f], first_uid[f + 1]))
        epochs = per_stream[stream]
        for epoch in sorted(epochs)[:-1]:  # the last epoch is unfinished
            assert sorted(epochs[epoch]) == held, (stream, epoch)
        assert epochs[0] != epochs[1]  # another order each epoch


@pytest.mark.parametrize(
    "streams",
    [
        2,
        # Extended tier (~13 s: seven pipelines): make test keeps the same property on 2
        # streams over 2 processes, and streams held two to a process in
        # test_two_processes_to_one_and_one_to_two_mid_epoch.
        pytest.param(4, marks=pytest.mark.extended),
    ],
)
def test_the_global_batches_do_not_depend_on_the_process_count(tmp_path, streams):
    pattern = _write_files(str(tmp_path), COUNTS)
    single = _global([_make(pattern, num_streams=streams)], 30)
    for processes in range(2, streams + 1):
        if streams % processes:
            continue
        each = [
            _make(pattern, num_streams=streams, process_index=i, process_count=processes)
            for i in range(processes)
        ]
        assert _global(each, 30) == single, processes


# Packed rows in the extended tier (~27 s; CI runs it): make test keeps the unpacked change.
@pytest.mark.parametrize("packed", [None, pytest.param(2, marks=pytest.mark.extended)])
def test_two_processes_to_one_and_one_to_two_mid_epoch(files, packed):
    """The elastic resume: N -> M processes continues exactly as the uninterrupted run, so
    over the epoch every record is consumed once across the change."""
    options = dict(num_streams=2, max_instances_per_row=packed)
    expected = _global([_make(files, **options)], 40)

    two = [_make(files, process_index=i, process_count=2, **options) for i in range(2)]
    before = _global(two, 7)
    merged = input_pipeline.merge_positions(_saved(two))
    assert set(merged["streams"]) == {"0", "1"}
    one = _make(files, start_position=merged, max_instances_per_row=packed)
    assert before + _global([one], 33) == expected

    one = _make(files, **options)
    before = _global([one], 9)
    (saved,) = _saved([one])
    resume = dict(start_position=saved, process_count=2, max_instances_per_row=packed)
    two = [_make(files, process_index=i, **resume) for i in range(2)]
    assert before + _global(two, 31) == expected
    if packed is None:  # the first epoch of stream 0 as a multiset: each record once
        stream0 = [uid for batch in expected[:17] for uid in batch[:2]]
        assert len(stream0) == len(set(stream0))


def test_resuming_reads_no_file_of_the_skipped_groups(tmp_path):
    """With the counts in a stats JSON, a position late in the epoch is reached without
    opening the files before its group: here they are overwritten with garbage after the
    position was saved, and the resumed run still yields the uninterrupted batches."""
    pattern = _write_files(str(tmp_path), COUNTS)
    reference = _make(pattern)
    expected = [_uids(next(reference)) for _ in range(17)]  # 69 records: 17 batches of 4
    run = _make(pattern)
    for _ in range(14):  # 56 records read: windows 0-10 skipped, window 11 re-read
        next(run)
    (saved,) = _saved([run])
    epoch_order = [
        p.decode() for p in input_streams._file_order(run.spec, stream=0, epoch=0).numpy()
    ]
    counts = input_streams.record_counts(run.spec.files)
    current, _ = input_streams.skip_records(epoch_order, counts, CYCLE, 55)
    skipped = epoch_order[: epoch_order.index(current[0][0]) // CYCLE * CYCLE]
    first_file = run.spec.files[0]  # the schema check reads it: keep it
    corrupted = [p for p in skipped if counts[p] and p != first_file]
    assert corrupted  # the test would prove nothing otherwise
    for path in corrupted:
        with open(path, "wb") as f:
            f.write(b"not a TFRecord file" * 100)
    resumed = _make(pattern, start_position=saved)
    assert [_uids(next(resumed)) for _ in range(3)] == expected[14:]


def test_record_counts_come_from_the_stats_json_else_from_the_framing(tmp_path):
    pattern = _write_files(str(tmp_path), [3, 5, 2], stats=False)
    paths = input_pipeline.list_files(pattern)
    assert input_streams.record_counts(paths) == dict(zip(paths, [3, 5, 2], strict=True))
    # The framing's count is tf.data's, and a file cut inside a record is named.
    assert [tfrecord_framing.count_records(p) for p in paths] == [
        int(tf.data.TFRecordDataset(p).reduce(np.int64(0), lambda n, _: n + 1)) for p in paths
    ]
    cut = str(tmp_path / "cut.tfrecord")
    with open(paths[1], "rb") as f, open(cut, "wb") as out:
        out.write(f.read()[:-3])
    with pytest.raises(ValueError, match="cut.tfrecord: truncated TFRecord file"):
        tfrecord_framing.count_records(cut)
    with open(paths[0] + ".stats.json", "w") as f:  # the JSON wins: it is not read again
        json.dump({"output_files": paths[:2], "records_per_file": [30, 50]}, f)
    assert input_streams.record_counts(paths) == dict(zip(paths, [30, 50, 2], strict=True))


def test_stream_refusals_name_the_setting(files):
    with pytest.raises(ValueError, match="num_streams=2 streams, which 4 processes cannot"):
        _make(files, num_streams=2, process_count=4)
    with pytest.raises(ValueError, match="not a positive multiple of the 3 data streams"):
        _make(files, num_streams=3)
    with pytest.raises(ValueError, match="9 input files for 12 data streams"):
        _make(files, num_streams=12, global_batch_size=12)
    two = [_make(files, num_streams=2, process_index=i, process_count=2) for i in range(2)]
    own = _saved(two)[1]  # process 1's alone lacks stream 0
    with pytest.raises(ValueError, match=r"no position for stream 0 \(it holds streams \['1'\]\)"):
        _make(files, start_position=own)
    with pytest.raises(ValueError, match="num_streams: saved 2, now 4"):
        _make(files, num_streams=4, start_position=input_pipeline.merge_positions(_saved(two)))
    with pytest.raises(ValueError, match="streams \\['0'\\] twice"):
        input_pipeline.merge_positions(_saved(two)[:1] * 2)


def test_a_per_host_position_goes_on_at_its_batch_count(files, caplog):
    """A position the pipeline saved before streams (one per host) resumes at the same batch
    of the same epoch, with a warning that the epoch's records are drawn afresh."""
    old = {
        "epoch": 1,
        "batch_in_epoch": 5,
        "process_index": 0,
        "process_count": 1,
        "seed": 17,
        "per_host_batch": 4,
        "num_host_files": 9,
        "dynamic_masking": False,
    }
    resumed = _make(files, start_position=old)
    next(resumed)
    assert resumed.position["streams"]["0"] == {"epoch": 1, "batch_in_epoch": 6}
    assert "per-host pipeline" in caplog.text
    with pytest.raises(ValueError, match="seed: saved 17, now 3"):
        _make(files, seed=3, start_position=old)


def test_positions_name_their_streams(files):
    iterator = _make(files, num_streams=4, process_index=1, process_count=2)
    assert iterator.streams == [2, 3]
    assert set(iterator.position["streams"]) == {"2", "3"}
    assert list(itertools.islice(iterator.spec.stream_files(2), 2)) == [
        iterator.spec.files[2],
        iterator.spec.files[6],
    ]
