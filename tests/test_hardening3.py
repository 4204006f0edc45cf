"""Issue 64 items 4 and 5: nothing quiet about what did not happen (a finished workdir rerun
with fewer steps, Orbax's shape mismatch named), the coordinator bound to the loopback
address it is given, a cached registry archive checked against its pin again."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import ml_collections
import pytest
import synthetic_pretraining as synth
from test_registry import DATA, PINNED, _index, serve  # noqa: F401 - serve: a fixture

from bert_jax import checkpointing
from bert_jax.config import ConfigError
from data_pipelines import registry
from experiments import pretrain
from tests.conftest import run_captured, subprocess_env

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --- a finished workdir rerun --------------------------------------------------------------


def _steps(num_train_steps: int, stop_at_step: int | None = None):
    return ml_collections.ConfigDict(
        {"num_train_steps": num_train_steps, "stop_at_step": stop_at_step}
    )


def test_a_workdir_past_num_train_steps_says_by_how_much():
    with pytest.raises(ConfigError) as refused:
        checkpointing.check_steps_left(2000, _steps(1500), "/w/checkpoints step 2000")
    assert str(refused.value).startswith(
        "/w/checkpoints step 2000 is at step 2000, past --config.num_train_steps=1500 by 500 "
        "steps: nothing to train"
    )
    with pytest.raises(ConfigError, match=r"past --config.stop_at_step=10 by 2 steps"):
        checkpointing.check_steps_left(12, _steps(1500, stop_at_step=10), "w")
    checkpointing.check_steps_left(9, _steps(1500, stop_at_step=10), "w")  # steps left


def test_a_finished_workdir_at_its_stop_step_says_so(caplog):
    with caplog.at_level("WARNING"):
        checkpointing.check_steps_left(40, _steps(40), "/w/checkpoints step 40")
    assert any("nothing left to train" in r.getMessage() for r in caplog.records)


@pytest.mark.extended  # a pretraining process restoring the reference run (~15 s)
def test_rerunning_the_reference_workdir_with_fewer_steps_is_refused(
    tmp_path, pretrain_reference, synthetic_data, xla_cache
):
    """The issue's case: the rerun exited 0 with `final metrics: {}` and nothing said."""
    workdir = tmp_path / "run"
    shutil.copytree(pretrain_reference, workdir)
    steps = max(checkpointing.make_manager(str(workdir / "checkpoints"), create=False).all_steps())
    command = synth.pretrain_command(
        workdir, synthetic_data, f"--config.num_train_steps={steps - 3}"
    )
    result = run_captured(command, timeout=300, cwd=REPO, env=subprocess_env(xla_cache))
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert f"is at step {steps}, past --config.num_train_steps={steps - 3} by 3 steps" in last
    assert "Traceback" not in result.stderr


# --- Orbax's shape mismatch, named -----------------------------------------------------------


def _target(state, **shapes):
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), state)
    for name, shape in shapes.items():
        target["params"][name] = jax.ShapeDtypeStruct(shape, jnp.float32, sharding=device)
    return target


def test_a_checkpoint_of_another_shape_names_the_array_not_orbax_strict(tmp_path):
    state = {"params": {"kernel": jnp.zeros((4, 3)), "bias": jnp.ones((5,))}, "step": jnp.array(3)}
    manager = checkpointing.make_manager(str(tmp_path / "checkpoints"), async_save=False)
    checkpointing.save(manager, 3, state, [{}], {})
    manager.wait_until_finished()
    with pytest.raises(checkpointing.CheckpointError) as refused:
        checkpointing.restore(manager, 3, _target(state, kernel=(4, 2)))
    message = str(refused.value)
    assert "params/kernel saved (4, 3), model (4, 2)" in message
    assert str(tmp_path / "checkpoints" / "3" / "state") in message
    assert "strict" not in message
    # Params-only reads (init_from, convert) say the same.
    with pytest.raises(checkpointing.CheckpointError, match=r"params/bias saved \(5,\), model"):
        checkpointing.restore_params(
            str(tmp_path / "checkpoints"), _target(state, bias=(6,))["params"]
        )


# --- the coordinator on a loopback address -----------------------------------------------------


@pytest.mark.parametrize(
    "address, bound",
    [
        ("localhost:1234", "localhost:1234"),
        ("127.0.0.1:1234", "127.0.0.1:1234"),
        ("[::1]:1234", "[::1]:1234"),
        ("10.1.2.3:1234", None),  # another host's address: every interface (the pod needs it)
        (None, None),
    ],
)
def test_a_loopback_coordinator_address_is_also_the_bind_address(address, bound):
    assert pretrain.loopback_bind_address(address) == bound


_LISTEN = """
import jax
from experiments.pretrain import loopback_bind_address
address = "localhost:{port}"
jax.distributed.initialize(address, 1, 0, coordinator_bind_address=loopback_bind_address(address))
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    for row in open(table).read().splitlines()[1:]:
        local, state = row.split()[1], row.split()[3]
        if state == "0A" and local.endswith(":%04X" % {port}):  # LISTEN
            print(table, local.split(":")[0])
jax.distributed.shutdown()
"""


def test_the_coordinator_listens_on_loopback_only():
    """The issue's case: `--coordinator_address=localhost:PORT` listened on every interface."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_LISTEN.format(port=port))],
        capture_output=True, text=True, timeout=120, cwd=REPO,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    listening = result.stdout.split("\n")
    hosts = {line.split()[1] for line in listening if line}
    assert hosts, result.stdout
    # 127.0.0.1 (/proc/net/tcp, little-endian hex), ::ffff:127.0.0.1 or ::1; never 0.0.0.0
    # nor :: (every interface, JAX's default).
    loopback = {
        "0100007F",
        "0000000000000000FFFF00000100007F",
        "00000000000000000000000001000000",
    }
    assert hosts <= loopback, hosts


# --- the registry's cache, checked again ---------------------------------------------------------


def test_a_damaged_cached_archive_is_refused_offline_and_fetched_again_online(
    tmp_path,
    serve,  # noqa: F811 - the fixture imported above
    monkeypatch,
    caplog,
):
    cache = tmp_path / "cache"
    cache.mkdir()
    damaged = cache / PINNED.filename
    damaged.write_bytes(DATA[:-1] + b"!")  # a flipped byte: same name, same size
    with pytest.raises(registry.RegistryError) as refused:
        registry.fetch(PINNED, str(cache), allow_download=False)
    wrong = hashlib.sha256(damaged.read_bytes()).hexdigest()
    assert f"{damaged}: sha256 {wrong} is not the pinned {PINNED.sha256}" in str(refused.value)
    index = _index(tmp_path, "index", "some-project-x", PINNED.filename, DATA)
    monkeypatch.setenv("PIP_INDEX_URL", serve + index + "/")
    with caplog.at_level("WARNING"):
        assert registry.fetch(PINNED, str(cache)) == str(damaged)
    assert damaged.read_bytes() == DATA
    assert any("fetching it again" in r.getMessage() for r in caplog.records)


# --- a corpus line longer than an instance ---------------------------------------------------


def test_an_overlong_corpus_line_is_reported_and_the_truncation_adds_up(tmp_path, caplog):
    """The issue's case (a 2 MB line here 40 KB): it was cut with no word, and the stats
    reported more tokens removed than the input had."""
    from create_data_fixtures import MAX_SEQ, _options, _write_documents

    from data_pipelines.create_pretraining_data import create_pretraining_data

    documents = [[f"the {w} sat on the mat .", f"a {w} ran off ."] for w in ("cat", "dog", "ox")]
    documents[1].append(" ".join(["word"] * 8000))  # line 6 of the file: 8000 tokens
    path = _write_documents(tmp_path / "docs.txt", documents)
    with caplog.at_level("WARNING"):
        stats = create_pretraining_data(_options(tmp_path, path, dupe_factor=3))
    assert stats["inputs"]["longest_line"] == {"at": f"{path}:6", "bytes": 8000 * 5}
    warned = [
        r.getMessage() for r in caplog.records if "more tokens than an instance" in r.getMessage()
    ]
    assert warned and f"the longest line is {path}:6" in warned[0]
    assert warned[0].startswith(f"{stats['overlong_sentences']} sentences")
    assert stats["overlong_sentences"] == 1
    cut = stats["truncation"]
    # Three passes over the line remove more tokens than the input holds; the tokens they
    # are a part of are the instances' before truncation.
    assert cut["tokens_removed"] > stats["tokens"]
    kept = stats["instance_tokens"] - 3 * stats["instances"]
    assert cut["tokens_before_truncation"] == kept + cut["tokens_removed"]
    assert kept <= stats["instances"] * (MAX_SEQ - 3)
