"""Suite-wide settings: XLA compiles the tests' programs for compile time, not run time.

The suite's programs are tiny (BERT-tiny steps on batches of 8), compiled hundreds of times
and each run for a few steps: most of a test's CPU goes to XLA's CPU backend (LLVM), little
to running what it built. Backend optimisation level 0 without LLVM's expensive passes
made test_train + test_weight_update_sharding 1.33x faster (242 s -> 181 s, same run);
XLA's HLO passes are the same, only LLVM's code generation is cheaper (test_multihost
already ran at level 0).

Set at import, before any test module imports JAX (pytest imports conftest.py first), and
inherited by the `python -m ...` runs the end-to-end tests start with the suite's
environment; a test that sets its own XLA_FLAGS for a subprocess keeps them.

Also the fixtures the end-to-end tests share: one compilation cache per session (for the
processes they start and, on request, this one), the synthetic records, and one reference
pretraining run.
"""

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FAST_COMPILE}".strip()
# transformers is the suite's PyTorch reference: without this, the first module to import it
# decides for the whole worker whether its TensorFlow classes load (they fail without a
# Keras transformers accepts, e.g. in the fill-mask pipeline), whatever later modules set.
os.environ["USE_TF"] = "0"
# The shared compilation cache's size limit: never reached by the suite (a few hundred MB);
# any limit turns on JAX's file lock around cache reads and writes.
CACHE_MAX_BYTES = 16 << 30


def _run_dir(tmp_path_factory) -> Path:
    """The folder of this pytest run that every xdist worker shares (each worker's own
    basetemp lies in it); without xdist, the run's basetemp. Fresh in every run."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextlib.contextmanager
def _once_per_run(tmp_path_factory, name: str):
    """Yields (folder, done) for a fixture built once per pytest run and shared by the
    xdist workers: the first worker to take the lock builds `folder` (done False) and the
    others wait for it and find it done. A failed build leaves no marker: the next worker
    tries again, and fails as loudly."""
    import filelock

    folder = _run_dir(tmp_path_factory) / name
    marker = folder.parent / f"{name}.done"
    with filelock.FileLock(str(folder.parent / f"{name}.lock")):
        done = marker.exists()
        if not done:
            shutil.rmtree(folder, ignore_errors=True)  # a failed build's leftovers
            folder.mkdir()
        yield folder, done
        marker.touch()


@pytest.fixture(scope="session")
def xla_cache(tmp_path_factory):
    """This run's persistent XLA compilation cache, empty at its start (nothing depends on
    an earlier run). The `python -m experiments...` processes the tests start share it
    (`subprocess_env`), as do the in-process runs that ask for `compile_cache`: a program
    compiled once is loaded from it by every later process or run that builds the same one
    (the same HLO, XLA flags and devices). Both xdist workers share it, so a program that
    files on both workers build (the shared reference run's, test_resume's and
    test_fault_injection's restarts) compiles once in the run; `CACHE_MAX_BYTES` makes JAX
    take a file lock around every read and write (without a size limit it takes none, and a
    reader could see a half-written entry)."""
    cache = _run_dir(tmp_path_factory) / "xla_cache"
    cache.mkdir(exist_ok=True)
    return cache


def subprocess_env(cache, devices: int = 2) -> dict[str, str]:
    """The environment of a training process a test starts: CPU only, `devices` fake
    devices, the suite's compile flags and the session's compilation cache `cache`, where
    every program is kept (the tiny ones too: each compiles in well under the default
    1 s threshold)."""
    return dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        TF_CPP_MIN_LOG_LEVEL="2",
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices} {FAST_COMPILE}",
        JAX_COMPILATION_CACHE_DIR=str(cache),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
        JAX_COMPILATION_CACHE_MAX_SIZE=str(CACHE_MAX_BYTES),
    )


@pytest.fixture(scope="module")
def compile_cache(xla_cache):
    """The session's compilation cache for this process's own compiles, while the module
    that asks for it runs: its tiny training runs (`train_loop.train_and_evaluate`, a jit
    built anew each call) compile each program once, not once a run. Switched off again
    after the module, so no other test file depends on it."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    saved = {
        name: getattr(jax.config, name)
        for name in (
            "jax_compilation_cache_dir",
            "jax_persistent_cache_min_compile_time_secs",
            "jax_persistent_cache_min_entry_size_bytes",
            "jax_compilation_cache_max_size",
        )
    }
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_compilation_cache_max_size", CACHE_MAX_BYTES)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    compilation_cache.set_cache_dir(str(xla_cache))
    compilation_cache.reset_cache()  # JAX decides once per process whether to use a cache
    yield
    for name, value in saved.items():
        jax.config.update(name, value)
    compilation_cache.reset_cache()


@pytest.fixture(scope="session")
def synthetic_data(tmp_path_factory):
    """Synthetic pretraining records (`synthetic_pretraining`): train-*.tfrecord, 2 files
    of 64, and eval-*.tfrecord, 1 of 32. Written once per run, shared by the xdist workers
    (the reference run reads these very files): no test may write into it."""
    import synthetic_pretraining as synth

    with _once_per_run(tmp_path_factory, "synthetic_data") as (directory, done):
        if not done:
            synth.write_records(str(directory), "train", 2, 64, seed=0)
            synth.write_records(str(directory), "eval", 1, 32, seed=1)
    return directory


@pytest.fixture(scope="session")
def pretrain_reference(tmp_path_factory, synthetic_data, xla_cache):
    """The workdir of one uninterrupted `synthetic_pretraining.pretrain_command` process
    (its first compile fills the run's cache for the processes the tests start). Run once
    per pytest run, whichever xdist worker asks first; shared: tests read it or copy it,
    never write into it."""
    import subprocess

    import synthetic_pretraining as synth

    with _once_per_run(tmp_path_factory, "pretrain_reference") as (workdir, done):
        if not done:
            log = workdir.parent / f"{workdir.name}.log"
            with open(log, "w") as out:
                proc = subprocess.run(
                    synth.pretrain_command(workdir, synthetic_data),
                    cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    env=subprocess_env(xla_cache),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=480,
                )
            if proc.returncode:
                pytest.fail(
                    f"the reference run exited {proc.returncode}:\n{log.read_text()[-4000:]}"
                )
    return workdir


def run_captured(command: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """`subprocess.run` with the output captured as text; a run past `timeout` fails the test
    with the tail of what it printed (`TimeoutExpired` names only the command: a hung stage
    of a long end-to-end run would say nothing of where it stopped)."""
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired as expired:
        printed = "\n".join(
            part.decode(errors="replace") if isinstance(part, bytes) else part
            for part in (expired.stdout, expired.stderr)
            if part
        )
        pytest.fail(
            f"{' '.join(map(str, command[:4]))} ... ran past {timeout} s; the end of its "
            f"output:\n{printed[-4000:]}"
        )


@pytest.fixture
def parse_demo_flags():
    """`parse(*args)`: experiments.demo's flags parsed from their defaults. Only the demo's
    own flags are reset (absl's --verbosity, reset, would silence absl INFO logs that later
    tests of the worker read); every flag is as before the test after it."""
    from absl.testing import flagsaver

    from experiments import demo

    def parse(*args):
        for flag in demo.FLAGS.get_flags_for_module(demo):
            flag.unparse()
        demo.FLAGS(["demo", *args])

    with flagsaver.flagsaver():
        yield parse


EXTENDED_CASES = Path(__file__).with_name("extended_cases.txt")


def extended_cases() -> set[str]:
    """The node ids tests/extended_cases.txt moves from `make test` to `make test-extended`."""
    lines = EXTENDED_CASES.read_text(encoding="utf-8").splitlines()
    return {line.strip() for line in lines if line.strip() and not line.startswith("#")}


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config, items):
    moved = extended_cases()
    for item in items:
        if item.nodeid in moved:
            item.add_marker(pytest.mark.extended)
