"""Two processes on 127.0.0.1 (4 CPU devices each, `jax.distributed` + gloo) reproduce the
single-process 8-device run: the same losses on a data-parallel and on an fsdp x tensor
mesh, and a checkpoint that holds both processes' data positions and the same state.

The reference is the same driver run as one plain process owning 8 devices, launched at
the same time as the pair so the three compile in parallel.
"""

import dataclasses
import json
import os
import socket
import subprocess
import sys

import jax
import multihost_driver as driver
import numpy as np
import pytest
import synthetic_pretraining as synth

from bert_jax import checkpointing, sharding

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# dp8: every gradient is all-reduced across the two processes. fsdp2_tp4: the process
# boundary runs along fsdp, so the params themselves are split across the processes;
# the driver checkpoints this last mesh's state, so each process writes its own shards.
MESH_SHAPES = {"dp8": "8,1,1", "fsdp2_tp4": "1,2,4"}
# One layer and a small vocabulary (random_batch draws ids below 3000; 3008 = 8 * 376)
# keep the three compilations short; the distribution logic is the same at any size.
MODEL = synth.TINY.replace(num_hidden_layers=1, vocab_size=3008)
# XLA's backend optimisation level 0 halves the CPU compile time; all three runs use it.
XLA_FLAGS = "--xla_backend_optimization_level=0"
TIMEOUT_S = 600


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(out, name, run_dir, devices, extra, logs):
    env = dict(
        os.environ,
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices} {XLA_FLAGS}",
        JAX_PLATFORMS="cpu",
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    (out / run_dir).mkdir(exist_ok=True)
    command = [
        sys.executable,
        os.path.join(REPO, "tests", "multihost_driver.py"),
        f"--batches={out / 'batches.npz'}",
        f"--model_config={out / 'model.json'}",
        f"--output_dir={out / run_dir}",
        *(f"--mesh_shapes={shape}" for shape in MESH_SHAPES.values()),
        *extra,
    ]
    log = open(out / f"{name}.log", "w")
    logs.append(log)
    return name, subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=log)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Runs the reference and the two-process pair; returns their output directory."""
    out = tmp_path_factory.mktemp("multihost")
    batches = [synth.random_batch(driver.BATCH_SIZE, seed=step) for step in range(driver.STEPS)]
    np.savez(
        out / "batches.npz",
        **{f"{k}_{step}": v for step, batch in enumerate(batches) for k, v in batch.items()},
    )
    (out / "model.json").write_text(json.dumps(dataclasses.asdict(MODEL)))
    address = f"127.0.0.1:{_free_port()}"
    logs = []
    procs = [_launch(out, "single", "single", 8, ["--num_processes=1"], logs)]
    for index in range(2):
        pair = [f"--coordinator_address={address}", f"--process_id={index}"]
        procs.append(_launch(out, f"pair_{index}", "pair", 4, pair, logs))
    try:
        for _, proc in procs:
            proc.wait(timeout=TIMEOUT_S)
    finally:
        for _, proc in procs:
            if proc.poll() is None:  # a peer died and left this one waiting in a collective
                proc.kill()
                proc.wait()
        for log in logs:
            log.close()
    for name, proc in procs:
        if proc.returncode != 0:
            tail = (out / f"{name}.log").read_text()[-4000:]
            pytest.fail(f"{name} exited with {proc.returncode}:\n{tail}")
    return out


def _results(out, run_dir, index):
    return json.loads((out / run_dir / f"losses_{index}.json").read_text())


@pytest.mark.parametrize("mesh_name", MESH_SHAPES)
def test_two_processes_reproduce_the_single_process_losses(runs, mesh_name):
    shape = MESH_SHAPES[mesh_name]
    reference = _results(runs, "single", 0)[shape]
    assert reference["rows"] == [0, driver.BATCH_SIZE]
    pair = [_results(runs, "pair", i)[shape] for i in range(2)]
    # Each process fed half of every batch, and the halves differ.
    assert sorted(r["rows"] for r in pair) == [[0, 4], [4, 8]]
    assert len(set(reference["losses"])) == driver.STEPS  # five different batches
    for result in pair:
        np.testing.assert_allclose(result["losses"], reference["losses"], rtol=1e-5)


def _restore(directory):
    """The checkpoint in `directory` restored onto one device of this process."""
    mesh = sharding.create_mesh((1, 1, 1), jax.devices()[:1])
    *_, abstract, shardings = driver.setup(mesh, MODEL, synth.SEQ_LEN, synth.PREDICTIONS)
    manager = checkpointing.make_manager(directory, async_save=False)
    try:
        assert manager.latest_step() == driver.STEPS
        target = checkpointing.abstract_like(abstract, shardings)
        return checkpointing.restore(manager, None, target)
    finally:
        manager.close()


def test_two_process_checkpoint_holds_both_positions_and_the_same_state(runs):
    state, positions, config = _restore(runs / "pair" / "checkpoints")
    reference, reference_positions, _ = _restore(runs / "single" / "checkpoints")
    assert positions == [
        {"epoch": 0, "batch_in_epoch": driver.STEPS, "process": 0},
        {"epoch": 0, "batch_in_epoch": driver.STEPS, "process": 1},
    ]
    assert reference_positions == [{"epoch": 0, "batch_in_epoch": driver.STEPS, "process": 0}]
    assert config == {"driver": "multihost"}
    assert int(state.step) == driver.STEPS
    leaves = jax.tree_util.tree_leaves_with_path(state)
    expected = jax.tree.leaves(reference)
    assert len(leaves) == len(expected)
    for (path, saved), want in zip(leaves, expected, strict=True):
        np.testing.assert_allclose(
            np.asarray(saved),
            np.asarray(want),
            rtol=1e-4,
            atol=1e-6,
            err_msg=jax.tree_util.keystr(path),
        )
