"""`config.profile` traces a step range with jax.profiler into `<workdir>/plugins/profile`, and
`config.jax_cache_dir` turns on JAX's persistent compilation cache (docs/profiling.md).

Two `python -m experiments.pretrain` processes on 2 fake CPU devices with the session's
cache as their `config.jax_cache_dir`: the first traces steps 2 and 3 and writes (or finds)
its train step there, the second (no trace) loads every program from it. The window's
rules (resumes, step 0, a trace cut short) are checked in this process, without a run.
"""

import importlib.util
import os
import re
import subprocess

import jax
import ml_collections
import pytest
import synthetic_pretraining as synth
from conftest import subprocess_env

from bert_jax import train_loop
from bert_jax.config import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIRST, TRACED, STOP = 2, 2, 4  # steps 2 and 3 traced, of a run stopped after step 4
TRAIN_STEP = re.compile(r"(?:Writing|cache hit for) '?jit_train_step'? .*?with key '([^']+)'")


def _pretrain(workdir, data_dir, env, *extra: str) -> str:
    """A `pretrain_command` run (its train step is the shared reference run's program:
    stop_at_step leaves the schedule as it is); returns its output."""
    command = synth.pretrain_command(workdir, data_dir, "--config.checkpoint_every=20", *extra)
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=480)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    return output


def _traces(workdir) -> list:
    return sorted(workdir.glob("plugins/profile/*/*.xplane.pb"))


def _traced_steps(path) -> list[int]:
    """The step numbers of the "train" StepTraceAnnotations in the XSpace at `path`."""
    # The proto module alone, by its file: importing it as tensorflow.tsl... would load
    # all of TensorFlow first.
    root = importlib.util.find_spec("tensorflow").submodule_search_locations[0]
    spec = importlib.util.spec_from_file_location(
        "xplane_pb2", os.path.join(root, "tsl", "profiler", "protobuf", "xplane_pb2.py")
    )
    xplane_pb2 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(xplane_pb2)
    space = xplane_pb2.XSpace.FromString(path.read_bytes())
    steps = []
    for plane in space.planes:
        stat_names = {k: v.name for k, v in plane.stat_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                if plane.event_metadata[event.metadata_id].name == "train":
                    stats = {stat_names[s.metadata_id]: s.int64_value for s in event.stats}
                    steps.append(stats["step_num"])
    return sorted(steps)


@pytest.mark.extended  # a traced run and a second process on the cache, ~21 s; CI runs it
def test_trace_of_a_step_range_and_the_compilation_cache(tmp_path, synthetic_data, xla_cache):
    # config.jax_cache_dir names the session's cache (where the reference run's train step
    # usually is already, which keeps this test cheap); JAX_COMPILATION_CACHE_DIR names an
    # empty folder the key must win over. Every persistent-cache write, hit and miss is
    # logged (JAX_LOG_COMPILES, JAX_EXPLAIN_CACHE_MISSES).
    ignored = tmp_path / "env_cache"
    ignored.mkdir()
    env = subprocess_env(xla_cache) | {
        "JAX_COMPILATION_CACHE_DIR": str(ignored),
        "JAX_LOG_COMPILES": "1",
        "JAX_EXPLAIN_CACHE_MISSES": "1",
    }
    cache = f"--config.jax_cache_dir={xla_cache}"
    traced = tmp_path / "traced"
    first = _pretrain(
        traced,
        synthetic_data,
        env,
        cache,
        f"--config.stop_at_step={STOP}",
        f"--config.profile.start_step={FIRST}",
        f"--config.profile.num_steps={TRACED}",
    )
    (trace,) = _traces(traced)
    assert _traced_steps(trace) == list(range(FIRST, FIRST + TRACED))
    assert f"profile trace of steps {FIRST} to {FIRST + TRACED - 1} written in" in first
    # The train step was written to (or, compiled earlier, read from) config.jax_cache_dir.
    (key,) = set(TRAIN_STEP.findall(first))
    assert (xla_cache / f"{key}-cache").is_file()
    assert not any(ignored.iterdir())

    # A fresh process (a restarted run) loads every program: no miss, the train step a hit.
    plain = tmp_path / "plain"
    second = _pretrain(plain, synthetic_data, env, cache, "--config.stop_at_step=1")
    assert "PERSISTENT COMPILATION CACHE MISS" not in second, second[-4000:]
    assert f"cache hit for 'jit_train_step' with key '{key}'" in second
    assert not _traces(plain)  # profile off: no trace


def _profile(start_step: int, num_steps: int) -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.profile = dict(start_step=start_step, num_steps=num_steps, all_processes=False)
    return config


def test_the_window_is_the_configured_steps_of_a_run_that_reaches_them(tmp_path):
    assert train_loop._StepTrace(_profile(5, 3), str(tmp_path), start=0).steps == range(5, 8)
    assert train_loop._StepTrace(_profile(5, 3), str(tmp_path), start=4).steps == range(5, 8)
    # A resume at or past start_step would trace part of the window: none of it.
    assert not train_loop._StepTrace(_profile(5, 3), str(tmp_path), start=5).steps
    assert not train_loop._StepTrace(_profile(5, 0), str(tmp_path), start=0).steps
    assert not train_loop._StepTrace(ml_collections.ConfigDict(), str(tmp_path), 0).steps


def test_step_0_is_refused():
    with pytest.raises(ConfigError, match="profile.start_step=0"):
        train_loop._StepTrace(_profile(0, 2), "unused", start=0)


def test_a_trace_cut_short_is_written(tmp_path):
    trace = train_loop._StepTrace(_profile(1, 10), str(tmp_path), start=0)
    trace.before(1)
    jax.block_until_ready(jax.numpy.ones(4) * 2)
    trace.close(1)  # what the loop's `finally` does on an error or SIGTERM
    assert not trace.active and _traces(tmp_path)
