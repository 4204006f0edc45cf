"""Contrastive pretraining on every host (issue 81, item 5): two processes on 127.0.0.1 (4
CPU devices each, jax.distributed + gloo), each feeding its own rows of every global batch,
train as one process owning all 8 devices does: the same loss at every step and the same
saved model. SIGTERM to one of the two stops both after the same step, and the rerun resumes
there to the same losses and model."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from finetune_fixtures import TINY, minilm_vocab, pretrained_params
from test_contrastive_pretraining import _corpus
from test_multihost import _free_port

from bert_jax import convert

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT_S = 600


def _launch(root, name, log_name, devices, extra):
    env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2", USE_TF="0",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices} "
               "--xla_backend_optimization_level=0")  # fmt: skip
    command = [sys.executable, os.path.join(REPO, "tests", "embeddings_multihost_driver.py"),
               f"--init_from={root / 'hf'}", f"--corpus={root / 'corpus.txt'}",
               f"--workdir={root / name}", *extra]  # fmt: skip
    log = open(root / f"{log_name}.log", "w")
    return log, subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=log)


def _launch_pair(root, name, log_name, ports, extra=((), ())):
    """Processes 0 and 1 of a two-process run on a port not used before; `extra`: each one's
    own flags."""
    port = _free_port()
    while port in ports:
        port = _free_port()
    ports.add(port)
    return [_launch(root, name, f"{log_name}_{index}", 4, [f"--coordinator_address=127.0.0.1:"
                    f"{port}", f"--process_id={index}", *extra[index]])  # fmt: skip
            for index in range(2)]  # fmt: skip


def _wait(procs, exit_codes):
    try:
        for _, proc in procs:
            proc.wait(timeout=TIMEOUT_S)
    finally:
        for log, proc in procs:
            if proc.poll() is None:  # a peer died and left this one in a collective
                proc.kill()
                proc.wait()
            log.close()
    for (log, proc), code in zip(procs, exit_codes, strict=True):
        if proc.returncode != code:
            pytest.fail(f"{log.name} exited {proc.returncode}, not {code}:\n"
                        f"{open(log.name).read()[-4000:]}")  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("embeddings_multihost")
    convert.save_hf(root / "hf", TINY, pretrained_params(), vocab_file=minilm_vocab(),
                    do_lower_case=True)  # fmt: skip
    _corpus(root / "corpus.txt", documents=40)
    ports = set()
    procs = [_launch(root, "single", "single", 8, ["--num_processes=1"])]
    procs += _launch_pair(root, "pair", "pair", ports)
    # Process 1 alone gets SIGTERM at step 0's batch: both stop after one step, exit 143.
    procs += _launch_pair(root, "stopped", "stopped", ports, ((), ["--sigterm_at_step=0"]))
    _wait(procs, [0, 0, 0, 143, 143])
    (root / "stopped_log.jsonl").write_text((root / "stopped" / "train_log.jsonl").read_text())
    _wait(_launch_pair(root, "stopped", "resumed", ports), [0, 0])  # the same command again
    return root


def _losses(workdir):
    log = (workdir / "train_log.jsonl").read_text().splitlines()
    return [json.loads(line)["loss"] for line in log]


def _assert_same_model(a, b):
    import jax

    from bert_jax.finetune_common import load_finetuned

    _, want, _, _ = load_finetuned(str(a / "checkpoint"))
    _, got, _, _ = load_finetuned(str(b / "checkpoint"))
    for x, y in zip(jax.tree.leaves(want), jax.tree.leaves(got), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6)


@pytest.mark.extended  # seven processes compile the step
def test_two_processes_train_as_one_does(runs):
    reference = _losses(runs / "single")
    assert len(reference) == 4 and len(set(reference)) == 4
    np.testing.assert_allclose(_losses(runs / "pair"), reference, rtol=1e-5)
    _assert_same_model(runs / "single", runs / "pair")
    assert not (runs / "pair" / "state").exists()  # a finished run keeps no resume point


@pytest.mark.extended  # the same run as the test above
def test_sigterm_to_one_process_stops_both_at_one_step_and_the_rerun_resumes_there(runs):
    said = []
    for index in range(2):
        text = (runs / f"stopped_{index}.log").read_text()
        said += re.findall(r"stopped by SIGTERM at step (\d+) of 4: the train state is saved", text)
    assert len(said) == 2 and said[0] == said[1], said  # both processes, one step
    stop = int(said[0])
    assert 0 < stop < 4  # agreed well before the end (the signalled process is slow a step)
    before = [json.loads(line)["step"] for line in (runs / "stopped_log.jsonl").open()]
    assert before == list(range(1, stop + 1))
    # The rerun appended the steps after the stop: it resumed from the saved state, both
    # processes, rather than starting again (which would have set the first log aside).
    assert [json.loads(line)["step"] for line in (runs / "stopped" / "train_log.jsonl").open()] \
        == [1, 2, 3, 4]  # fmt: skip
    assert not (runs / "stopped" / "train_log.jsonl.1").exists()
    np.testing.assert_allclose(_losses(runs / "stopped"), _losses(runs / "single"), rtol=1e-5)
    _assert_same_model(runs / "single", runs / "stopped")
    assert not (runs / "stopped" / "state").exists()
