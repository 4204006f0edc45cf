"""benchmarks.studies.compile_census (the plugin behind docs/testing.md's account of the
suite's time): run on a test file of its own, it counts each test's compiles and finds a
program compiled again by a new jit of the same function."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from benchmarks.studies import compile_census

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SUBJECT = """
import jax
import jax.numpy as jnp


def chain(x):
    for _ in range(20):
        x = jnp.sin(x) * 1.0001 + jnp.cos(x)
    return x


def step():
    # A new function each call, as a training loop built anew jits its step: JAX's own
    # caches (keyed by the function) miss, and the same program compiles again.

    def f(x):
        return chain(x)

    return jax.jit(f)


def test_compiles_once():
    step()(jnp.ones(8)).block_until_ready()


def test_compiles_the_same_program_again():
    step()(jnp.ones(8)).block_until_ready()


def test_compiles_nothing():
    assert 1 + 1 == 2
"""


def test_census_counts_compiles_and_finds_the_recompiled_program(tmp_path):
    (tmp_path / "test_subject.py").write_text(SUBJECT)
    out = tmp_path / "census.jsonl"
    env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "benchmarks.studies.compile_census",
         f"--compile-census={out}", "--compile-census-threshold=0", "-p", "no:cacheprovider",
         "test_subject.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = {r["test"].split("::")[1]: r for r in map(json.loads, out.read_text().splitlines())}
    assert set(records) == {
        "test_compiles_once", "test_compiles_the_same_program_again", "test_compiles_nothing"
    }  # fmt: skip
    first, again = records["test_compiles_once"], records["test_compiles_the_same_program_again"]
    assert first["compiles"] >= 1 and first["compile_s"] > 0 and first["trace_s"] > 0
    assert records["test_compiles_nothing"]["compiles"] == 0
    # Every compile fingerprinted (threshold 0): the second test's one compile is the first
    # test's program, seen before; none of the first test's was.
    assert not any(seen for _, _, seen in first["big"])
    [(key, _, seen)] = again["big"]
    assert seen and key in {k for k, _, _ in first["big"]}
    summary = compile_census.summarize(list(records.values()))
    assert summary["compiles"] == sum(r["compiles"] for r in records.values())
    assert summary["big_recompile_s"] == sum(s for _, s, seen in again["big"] if seen) > 0
    assert "compile census" in result.stdout and "test_subject.py" in result.stdout
