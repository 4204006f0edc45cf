"""Contrastive pretraining on every host (issue 81, item 5): two processes on 127.0.0.1 (4
CPU devices each, jax.distributed + gloo), each feeding its own rows of every global batch,
train as one process owning all 8 devices does: the same loss at every step and the same
saved model."""

import json
import os
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


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("embeddings_multihost")
    convert.save_hf(root / "hf", TINY, pretrained_params(), vocab_file=minilm_vocab(),
                    do_lower_case=True)  # fmt: skip
    _corpus(root / "corpus.txt", documents=40)
    address = f"127.0.0.1:{_free_port()}"
    procs = [_launch(root, "single", "single", 8, ["--num_processes=1"])]
    for index in range(2):
        procs.append(_launch(root, "pair", f"pair_{index}", 4, [f"--coordinator_address={address}",
                                               f"--process_id={index}"]))  # fmt: skip
    try:
        for _, proc in procs:
            proc.wait(timeout=TIMEOUT_S)
    finally:
        for log, proc in procs:
            if proc.poll() is None:  # a peer died and left this one in a collective
                proc.kill()
                proc.wait()
            log.close()
    for log, proc in procs:
        if proc.returncode != 0:
            pytest.fail(f"{log.name} exited {proc.returncode}:\n{open(log.name).read()[-4000:]}")
    return root


@pytest.mark.extended  # three processes compile the step
def test_two_processes_train_as_one_does(runs):
    def losses(name):
        log = (runs / name / "train_log.jsonl").read_text().splitlines()
        return [json.loads(line)["loss"] for line in log]

    reference = losses("single")
    assert len(reference) == 4 and len(set(reference)) == 4
    np.testing.assert_allclose(losses("pair"), reference, rtol=1e-5)
    import jax

    from bert_jax.finetune_common import load_finetuned

    _, want, _, _ = load_finetuned(str(runs / "single" / "checkpoint"))
    _, got, _, _ = load_finetuned(str(runs / "pair" / "checkpoint"))
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    assert not (runs / "pair" / "state").exists()  # a finished run keeps no resume point
