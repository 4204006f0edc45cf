"""Resumes that refuse other data, runs that stop without losing a save, `eval_every=0`
(issue 41 items 1, 2, 6).

Other data: a workdir's checkpoints store the data identity their data position is valid for
(`pretraining_input.data_identity`); a resume compares it key by key (in-process, one case
per key) and refuses other data naming each flag, unless `config.data.on_change="restart"`
(one tiny end-to-end run of each).

A stopped run: a reader error (or the step's) while an async save is in flight lands that
save before the error leaves the loop, and the error names the last complete checkpoint.

Tiny real runs: `train_loop.train_and_evaluate` in this process, 8 fake CPU devices, the
synthetic records.
"""

import logging
import os
import time

import pytest
import synthetic_pretraining as synth
import tensorflow as tf
from orbax.checkpoint._src.checkpointers import async_checkpointer

from bert_jax import checkpointing, pretraining_input, telemetry, train, train_loop

# Each run builds its jitted steps anew: the session's compilation cache compiles each
# program once for the module, not once a run.
pytestmark = pytest.mark.usefixtures("compile_cache")

STEPS = 4


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("data")
    synth.write_records(str(directory), "train", 2, 64, seed=0)
    return directory


def _config(data_dir, **changes):
    """bert_tiny_cpu.py on the synthetic records: STEPS steps, a checkpoint every 2."""
    config = synth.tiny_config(str(data_dir))
    # One layer: what is checked (the data identity, refusals, a fault's landing) does not
    # depend on the depth, and the step compiles faster.
    config.model.num_hidden_layers = 1
    config.data.eval_files = ""
    config.num_train_steps = STEPS
    config.log_every = 2
    config.checkpoint_every = 2
    config.update(changes)
    return config


def _complete_and_unfinished(workdir) -> tuple[list[int], list[str]]:
    names = os.listdir(workdir / "checkpoints")
    complete = sorted(int(n) for n in names if n.isdigit())
    return complete, [n for n in names if ".orbax-checkpoint-tmp" in n]


# --- the data identity, key by key ---------------------------------------------------------


def _other_files(tmp_path):
    """Two files of other records, as many as the run's: a file count alone cannot tell."""
    return synth.write_records(str(tmp_path), "train", 2, 48, seed=1)


def _fewer_records(tmp_path):
    """The run's file names, with fewer records each."""
    return synth.write_records(str(tmp_path), "train", 2, 40, seed=0)


# (what changes, the flag named, a change of config; dynamic: both sides mask dynamically)
CHANGES = [
    ("other files", "data.train_files", lambda c, t: c.data.update(train_files=_other_files(t))),
    (
        "fewer records",
        "data.train_files",
        lambda c, t: c.data.update(train_files=_fewer_records(t)),
    ),
    ("T", "data.max_seq_length", lambda c, t: c.data.update(max_seq_length=64)),
    ("P", "data.max_predictions_per_seq", lambda c, t: c.data.update(max_predictions_per_seq=8)),
    ("masking mode", "data.dynamic_masking", lambda c, t: c.data.update(dynamic_masking=True)),
    ("masking rate", "data.masked_lm_prob", lambda c, t: c.data.update(masked_lm_prob=0.2)),
    ("whole word", "data.whole_word_mask", lambda c, t: c.data.update(whole_word_mask=True)),
    ("packing", "data.pack", lambda c, t: c.data.update(pack=True)),
    ("slots", "data.max_instances_per_row", lambda c, t: c.data.update(max_instances_per_row=2)),
    ("streams", "data.num_streams", lambda c, t: c.data.update(num_streams=2)),
    ("shuffle", "data.shuffle_buffer", lambda c, t: c.data.update(shuffle_buffer=8)),
    ("batch", "global_batch_size", lambda c, t: c.update(global_batch_size=16)),
    ("seed", "seed", lambda c, t: c.update(seed=1)),
    ("objective", "objective", lambda c, t: c.update(objective="mlm")),
]


@pytest.mark.parametrize("what, flag, change", CHANGES, ids=[c[0] for c in CHANGES])
def test_each_data_setting_a_position_depends_on_is_a_named_change(
    tmp_path, data_dir, what, flag, change
):
    config = _config(data_dir)
    if flag in ("data.masked_lm_prob", "data.whole_word_mask"):
        config.data.dynamic_masking = True  # static records fix the masking: not compared
    if flag == "data.max_instances_per_row":
        config.data.pack = True  # an unpacked run has no slots
    saved = pretraining_input.data_identity(config, num_streams=1)
    change(config, tmp_path)
    now = pretraining_input.data_identity(config)
    changes = pretraining_input.data_changes(saved, now)
    assert [c[0] for c in changes] == [flag], changes
    listed = pretraining_input.describe_changes(changes)
    assert listed.startswith(f"--config.{flag}: saved ")
    if flag == "data.train_files":  # both globs, both counts, and the files that differ
        assert f"'{data_dir}/train-*.tfrecord' (2 files; train-00000.tfrecord (" in listed
        assert f", now '{tmp_path}/train-*.tfrecord' (2 files; train-00000.tfrecord (" in listed
    else:
        _, was, value = changes[0]
        assert listed == f"--config.{flag}: saved {was!r}, now {value!r}"


def test_the_same_data_moved_to_another_directory_is_no_change(tmp_path, data_dir):
    config = _config(data_dir)
    saved = pretraining_input.data_identity(config, num_streams=1)
    for name in os.listdir(data_dir):
        os.link(data_dir / name, tmp_path / name)
    config.data.train_files = f"{tmp_path}/train-*.tfrecord"
    assert pretraining_input.data_changes(saved, pretraining_input.data_identity(config)) == []
    # num_streams left to None takes the saved count (an elastic resume): no change either.
    assert config.data.num_streams is None


def test_an_identity_saved_before_the_new_keys_is_compared_on_the_keys_it_holds(data_dir):
    config = _config(data_dir)
    now = pretraining_input.data_identity(config)
    old = {  # what checkpoints held before issue 41
        "train_files": config.data.train_files,
        "max_seq_length": 32,
        "max_predictions_per_seq": 5,
        "dynamic_masking": False,
        "global_batch_size": 8,
        "seed": 0,
    }
    assert pretraining_input.data_changes(old, now) == []
    assert pretraining_input.data_changes(None, now) == []  # older still: the position decides
    config.data.update(train_files=f"{data_dir}/train-0000*.tfrecord", pack=True)
    config.update(objective="mlm")
    assert pretraining_input.data_changes(old, pretraining_input.data_identity(config)) == [
        ("data.train_files", repr(old["train_files"]), repr(config.data.train_files)),
        ("data.pack", False, True),
        ("objective", "mlm_nsp", "mlm"),
    ]


# --- end to end: refused, then restarted on request ----------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_dir):
    """A 2-step run's workdir (checkpoint at step 2), with eval files but eval_every=0."""
    workdir = tmp_path_factory.mktemp("trained")
    config = _config(data_dir, stop_at_step=2, eval_every=0, eval_steps=1)
    config.data.eval_files = config.data.train_files
    config.data.allow_eval_in_train = True  # the same files: never evaluated here anyway
    train_loop.train_and_evaluate(config, str(workdir))
    return workdir


def test_eval_every_0_never_evaluates(trained):
    records = telemetry.read_metrics(str(trained / "metrics.jsonl"))
    assert {r["split"] for r in records} == {"train"}, records


def test_a_workdir_resumed_on_other_files_is_refused_then_restarts_the_data_on_request(
    tmp_path, data_dir, trained, caplog
):
    config = _config(data_dir, stop_at_step=4)
    config.data.train_files = _other_files(tmp_path / "other")
    with pytest.raises(pretraining_input.DataChangeError) as refused:
        train_loop.train_and_evaluate(config, str(trained))
    message = str(refused.value)
    assert f"the checkpoints in {trained / 'checkpoints'} were saved reading other data: " in (
        message
    )
    assert "--config.data.train_files: saved " in message
    assert "Set --config.data.on_change=restart" in message
    assert _complete_and_unfinished(trained)[0] == [2]  # nothing was trained

    config.data.on_change = "restart"
    with caplog.at_level(logging.WARNING):
        train_loop.train_and_evaluate(config, str(trained))
    assert "with other data (on_change=restart): --config.data.train_files" in caplog.text
    assert "the data restarts from its beginning at step 2" in caplog.text
    # Steps 3-4 read the new files' first two batches: the position of a fresh stream of them.
    fresh = pretraining_input.train_input(config, None, mask_config=None)
    for _ in range(2):
        next(fresh)
    manager = checkpointing.make_manager(trained / "checkpoints", async_save=False)
    state, positions, saved = checkpointing.restore(manager, None, None)
    assert int(state["step"]) == 4
    assert positions == [fresh.position]
    assert saved["data_identity"]["files"][0][0] == "train-00000.tfrecord"


def test_an_unknown_on_change_is_refused_naming_the_flag(tmp_path, data_dir, trained):
    config = _config(data_dir, stop_at_step=4)
    config.data.on_change = "ignore"
    with pytest.raises(ValueError, match=r"--config.data.on_change='ignore': use 'refuse' or"):
        train_loop.train_and_evaluate(config, str(trained))


# --- a run stopped while a save is in flight -----------------------------------------------


class _FailingReader:
    """The run's training stream, whose `fail_at`-th batch is a cut-short record."""

    def __init__(self, inner, fail_at: int):
        self.inner, self.fail_at, self.batches = inner, fail_at, 0

    def __next__(self):
        self.batches += 1
        if self.batches == self.fail_at:
            raise tf.errors.DataLossError(None, None, "truncated record at 47107")
        return next(self.inner)

    def __getattr__(self, name):  # position, spec
        return getattr(self.inner, name)


@pytest.fixture
def slow_saves(monkeypatch):
    """Each background checkpoint write takes 2 s more: a save is in flight at the fault."""
    real = async_checkpointer._background_wait_for_commit_futures

    def slow(*args, **kwargs):
        time.sleep(2)
        return real(*args, **kwargs)

    monkeypatch.setattr(async_checkpointer, "_background_wait_for_commit_futures", slow)


@pytest.mark.parametrize(
    "fault",
    # Extended tier: make test keeps the reader case, which leaves the loop the same way.
    ["reader", pytest.param("step", marks=pytest.mark.extended)],
)
def test_a_fault_while_a_save_is_in_flight_lands_it_and_names_it(
    tmp_path, data_dir, monkeypatch, slow_saves, caplog, fault
):
    """The save of step 2 is in flight when step 3's batch (or step) fails."""
    workdir, config = tmp_path / "run", _config(data_dir)
    if fault == "reader":
        real_input = pretraining_input.train_input
        monkeypatch.setattr(
            pretraining_input,
            "train_input",
            lambda *args: _FailingReader(real_input(*args), fail_at=3),
        )
        expected = tf.errors.DataLossError
    else:
        real_setup = train.setup

        def setup(config, mesh, vocab_size=None):
            run = real_setup(config, mesh, vocab_size)

            def step(state, batch, rng):
                if int(state.step) == 2:
                    raise RuntimeError("RESOURCE_EXHAUSTED: out of memory")
                return run.train_step(state, batch, rng)

            return run._replace(train_step=step)

        monkeypatch.setattr(train, "setup", setup)
        expected = RuntimeError
    with pytest.raises(expected) as stopped:
        train_loop.train_and_evaluate(config, str(workdir))
    assert _complete_and_unfinished(workdir) == ([2], [])
    note = (
        f"training stopped at step 3 ({expected.__name__}); the last complete checkpoint is "
        f"step 2 in {workdir / 'checkpoints'}"
    )
    assert note in getattr(stopped.value, "__notes__", []), stopped.value

    monkeypatch.undo()  # the rerun reads good data, from the checkpoint the note named
    with caplog.at_level(logging.INFO):
        train_loop.train_and_evaluate(config, str(workdir))
    assert f"train state from {workdir / 'checkpoints'} step 2" in caplog.text
    assert _complete_and_unfinished(workdir) == ([2, 4], [])
