"""Contrastive pretraining on every host (issue 81, item 5), from the tool's own command line:
`python -m experiments.finetune_embeddings --coordinator_address=127.0.0.1:PORT
--num_processes=2 --process_id=<i>` run twice (4 CPU devices each, jax.distributed + gloo),
each process feeding its own rows of every global batch, trains as one process owning all 8
devices does: the same loss at every step and the same saved model. SIGTERM to one of the
two stops both after the same step, and the rerun of the same commands resumes there to the
same losses and model. Multi-host flags that make no one process of a run are refused in
one line."""

import json
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from finetune_fixtures import TINY, minilm_vocab, pretrained_params
from test_contrastive_pretraining import _corpus
from test_multihost import _free_port

from bert_jax import convert, distributed

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT_S = 600
CONFIG = os.path.join(REPO, "experiments", "configs", "embeddings_contrastive_pretraining.py")
# Four steps of 16 pairs of 16 tokens, a log line each, a save of the resume point at step 2
# (a multi-process save too).
OVERRIDES = ("global_batch_size=16", "chunk_size=8", "num_train_steps=4", "learning_rate=2e-3",
             "warmup_proportion=0.0", "max_seq_length=16", "query_max_seq_length=16",
             "log_every=1", "passages_per_document=2", "checkpoint_every=2")  # fmt: skip


def _launch(root, name, log_name, devices, extra, sigterm_at=None):
    """`python -m experiments.finetune_embeddings` on `devices` CPU devices; with
    `sigterm_at`, through the driver that sends this process SIGTERM at that step."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2", USE_TF="0",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices} "
               "--xla_backend_optimization_level=0")  # fmt: skip
    driver = os.path.join(REPO, "tests", "embeddings_multihost_driver.py")
    command = ([sys.executable, "-m", "experiments.finetune_embeddings"] if sigterm_at is None
               else [sys.executable, driver, f"--sigterm_at_step={sigterm_at}"])  # fmt: skip
    command += [f"--config={CONFIG}", f"--config.init_from={root / 'hf'}",
                f"--config.corpus_files={root / 'corpus.txt'}",
                *(f"--config.{o}" for o in OVERRIDES), f"--workdir={root / name}",
                *extra]  # fmt: skip
    log = open(root / f"{log_name}.log", "w")
    return log, subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=log)


def _launch_pair(root, name, log_name, ports, sigterm_at=(None, None)):
    """Processes 0 and 1 of a two-process run on a port not used before; `sigterm_at`:
    the step each one gets SIGTERM at (None: none)."""
    port = _free_port()
    while port in ports:
        port = _free_port()
    ports.add(port)
    return [_launch(root, name, f"{log_name}_{index}", 4, [f"--coordinator_address=127.0.0.1:"
                    f"{port}", "--num_processes=2", f"--process_id={index}"],
                    sigterm_at[index])  # fmt: skip
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
    procs = [_launch(root, "single", "single", 8, [])]  # one process, 8 devices: the reference
    procs += _launch_pair(root, "pair", "pair", ports)
    # Process 1 alone gets SIGTERM at step 0's batch: both stop after one step, exit 143.
    procs += _launch_pair(root, "stopped", "stopped", ports, (None, 0))
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
def test_two_processes_of_the_command_line_train_as_one_does(runs):
    reference = _losses(runs / "single")
    assert len(reference) == 4 and len(set(reference)) == 4
    np.testing.assert_allclose(_losses(runs / "pair"), reference, rtol=1e-5)
    _assert_same_model(runs / "single", runs / "pair")
    assert not (runs / "pair" / "state").exists()  # a finished run keeps no resume point
    # Process 0 logs the run; process 1 says nothing at INFO (its bar and progress lines).
    quiet = (runs / "pair_1.log").read_text()
    assert "contrastive:" not in quiet and "pooling, batch 16" not in quiet, quiet[-2000:]
    assert "pooling, batch 16" in (runs / "pair_0.log").read_text()


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


def _flags(**given):
    unset = dict(coordinator_address=None, num_processes=None, process_id=None)
    return SimpleNamespace(**{**unset, "distributed": False, **given})


@pytest.mark.parametrize(
    "given, says",
    [
        (dict(coordinator_address="localhost:1234"), "needs --num_processes and --process_id"),
        (dict(coordinator_address="localhost:1234", num_processes=2), "needs --num_processes"),
        (dict(num_processes=2, process_id=0), "only with --coordinator_address"),
        (dict(coordinator_address="h:1", num_processes=2, process_id=2), "--process_id=2: from"),
        (dict(coordinator_address="h:1", num_processes=0, process_id=0), "--num_processes=0"),
    ],
)
def test_multi_host_flags_that_make_no_process_of_a_run_are_one_line(given, says):
    flag_values = _flags(**given)
    with pytest.raises(SystemExit, match=re.escape("tool: ") + ".*" + re.escape(says)):
        distributed.check_or_exit(flag_values, "tool")


@pytest.mark.parametrize(
    "given",
    [
        dict(),
        dict(distributed=True),  # a Cloud TPU pod: JAX finds the rest
        dict(distributed=True, num_processes=4, process_id=3),
        dict(coordinator_address="localhost:1234", num_processes=2, process_id=1),
    ],
)
def test_multi_host_flags_of_one_process_of_a_run_pass(given):
    flag_values = _flags(**given)
    distributed.check_or_exit(flag_values, "tool")


@pytest.mark.parametrize(
    "tool, config",
    [("finetune_embeddings", CONFIG),
     ("pretrain", os.path.join(REPO, "experiments", "configs", "bert_tiny_cpu.py"))],
)  # fmt: skip
def test_a_coordinator_address_alone_is_refused_in_one_line_before_the_workdir(
    tmp_path, tool, config
):
    workdir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", f"experiments.{tool}", f"--config={config}",
         f"--workdir={workdir}", "--coordinator_address=localhost:1234"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"{tool}: --coordinator_address needs --num_processes and --process_id (this "
        "process's index, 0 on the coordinator's host)"
    ], done.stderr
    assert not workdir.exists()
