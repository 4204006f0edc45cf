"""A pretraining run moves between process counts mid-epoch: 2 processes -> 1 and 1 -> 2.

Every run is a real `python -m experiments.pretrain` on 2 CPU devices in all: one process
owning both, or two `jax.distributed` processes on 127.0.0.1 (gloo) owning one each, on
the same (2, 1, 1) data-parallel mesh. The data is dealt into 2 streams
(`config.data.num_streams`), so the global batches do not depend on the process count: a
run that changes it at a checkpoint must end where the uninterrupted single-process run
ends: the same data position of every stream (each record consumed once over the epoch),
the same per-step losses and the same train state, up to the order in which the two
devices' gradients are summed (in-process or through gloo).
"""

import json
import socket
import sys

import jax
import numpy as np
import pytest
import synthetic_pretraining as synth
from conftest import subprocess_env
from test_resume import _finish, _restore, _run, _start

from bert_jax import checkpointing

STEPS, SWITCH = 12, 8  # the change happens at the checkpoint of step 8 (or 4)
RUN = [
    f"--config.num_train_steps={STEPS}",
    "--config.checkpoint_every=4",
    "--config.log_every=1",
    "--config.data.eval_files=",
    "--config.mesh_shape=(2,1,1)",
    "--config.data.num_streams=2",
    # Windows of 16 records and groups of files: the resumed streams skip, not replay.
    "--config.data.shuffle_buffer=16",
]
# Sums of two gradients in another order: float32 rounding, carried through 12 AdamW steps.
RTOL, ATOL = 1e-4, 1e-6


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("data")
    synth.write_records(str(directory), "train", 4, 24, seed=0)  # 96 records: 12 steps of 8
    return directory


@pytest.fixture(scope="module")
def cache(xla_cache):
    return xla_cache


def _command(workdir, data_dir, *extra):
    # Not test_resume's: a config flag given twice is not overridden (tuples append).
    return [
        sys.executable,
        "-m",
        "experiments.pretrain",
        "--config=experiments/configs/bert_tiny_cpu.py",
        f"--workdir={workdir}",
        *synth.tiny_config_overrides(str(data_dir)),
        *RUN,
        *extra,
    ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _one_process(workdir, data_dir, cache, *extra):
    _run(_command(workdir, data_dir, *extra), subprocess_env(cache, 2), workdir.parent / "one.log")


def _two_processes(workdir, data_dir, cache, *extra):
    address = f"127.0.0.1:{_free_port()}"
    procs = []
    for index in range(2):
        distributed = [
            f"--coordinator_address={address}",
            "--num_processes=2",
            f"--process_id={index}",
        ]
        log = workdir.parent / f"two_{index}.log"
        command = _command(workdir, data_dir, *distributed, *extra)
        procs.append((_start(command, subprocess_env(cache, 1), log), log))
    for proc, log in procs:
        _finish(proc, log)


def _losses(workdir) -> list[tuple[int, float]]:
    lines = (workdir / "metrics.jsonl").read_text().split("\n")[:-1]
    records = [json.loads(line) for line in lines]
    return [(r["step"], r["loss"]) for r in records if r["split"] == "train"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data_dir, cache):
    workdir = tmp_path_factory.mktemp("reference") / "run"
    _one_process(workdir, data_dir, cache)
    return workdir


def _positions(workdir, step) -> list[dict]:
    """The data positions a checkpoint holds, one per process that saved it."""
    data = workdir / "checkpoints" / str(step) / "data" / "metadata"
    return json.loads(data.read_text())["positions"]


def _state(workdir, like):
    """The last checkpoint's train state on this process's first device (a checkpoint
    written by two processes names devices this process does not have)."""
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), like)
    manager = checkpointing.make_manager(workdir / "checkpoints", async_save=False)
    try:
        return checkpointing.restore(manager, None, target)[0]
    finally:
        manager.close()


def _assert_same_end(workdir, reference):
    ref_state, ref_positions = _restore(reference)
    state = _state(workdir, ref_state)
    positions = _positions(workdir, STEPS)
    assert int(state["step"]) == STEPS
    # The same stream positions, however many processes saved them.
    streams = {k: v for p in positions for k, v in p["streams"].items()}
    assert streams == ref_positions[0]["streams"]
    for (path, leaf), ref_leaf in zip(
        jax.tree_util.tree_leaves_with_path(state), jax.tree.leaves(ref_state), strict=True
    ):
        np.testing.assert_allclose(
            np.asarray(leaf), np.asarray(ref_leaf), rtol=RTOL, atol=ATOL,
            err_msg=jax.tree_util.keystr(path),
        )  # fmt: skip
    steps, losses = zip(*_losses(workdir), strict=True)
    ref_steps, ref_losses = zip(*_losses(reference), strict=True)
    assert steps == ref_steps == tuple(range(1, STEPS + 1))
    np.testing.assert_allclose(losses, ref_losses, rtol=RTOL)


@pytest.mark.extended  # about a minute: three multi-process runs
def test_two_processes_then_one(tmp_path, data_dir, cache, reference):
    """Extended tier. Its parts stay in make test: the data position dealt from two processes'
    streams to one (test_elastic_data's test_two_processes_to_one_and_one_to_two_mid_epoch),
    a checkpoint restored onto another device count (test_checkpointing's test_restores_onto_
    another_mesh_shape_and_device_count), two jax.distributed processes training and saving
    both positions (test_multihost)."""
    workdir = tmp_path / "run"
    _two_processes(workdir, data_dir, cache, f"--config.stop_at_step={SWITCH}")
    positions = _positions(workdir, SWITCH)
    assert [sorted(p["streams"]) for p in positions] == [["0"], ["1"]]  # one stream each
    _one_process(workdir, data_dir, cache)
    _assert_same_end(workdir, reference)


@pytest.mark.extended  # about a minute; make test's coverage: test_two_processes_then_one
def test_one_process_then_two(tmp_path, data_dir, cache, reference):
    workdir = tmp_path / "run"
    _one_process(workdir, data_dir, cache, f"--config.stop_at_step={STEPS - SWITCH}")
    _two_processes(workdir, data_dir, cache)
    positions = _positions(workdir, STEPS)
    assert [sorted(p["streams"]) for p in positions] == [["0"], ["1"]]
    _assert_same_end(workdir, reference)
