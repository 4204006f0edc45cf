"""A pytest plugin that counts where the tests' time goes to XLA: per test, the backend
compiles (count and seconds), JAX's tracing and lowering, and which programs were compiled
before in the same process (a compilation cache could only save those).

    python -m pytest -p benchmarks.studies.compile_census --compile-census=census.jsonl tests/...

Each test appends one JSON line to the file (the xdist workers too); the run ends with a
summary. It wraps `jax._src.compiler.backend_compile_and_load`, a private function of
JAX (0.10.2): a diagnostic, never loaded by `make test`. The in-process compiles only: a test's
`python -m ...` processes are not counted.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import time

import pytest

# Compiles longer than this are fingerprinted (the module's text hashed) to find repeats
# (`--compile-census-threshold`).
BIG_COMPILE_S = 0.3

_TRACE = "/jax/core/compile/jaxpr_trace_duration"
_LOWER = "/jax/core/compile/jaxpr_to_mlir_module_duration"


class _Census:
    def __init__(self):
        self.seen: set[str] = set()  # fingerprints of the big programs this process compiled
        self.threshold_s = BIG_COMPILE_S
        self.reset()

    def reset(self) -> None:
        self.compiles, self.compile_s, self.trace_s, self.lower_s = 0, 0.0, 0.0, 0.0
        self.big: list[tuple[str, float, bool]] = []  # (fingerprint, seconds, seen before)

    def compiled(self, module, seconds: float) -> None:
        self.compiles += 1
        self.compile_s += seconds
        if seconds > self.threshold_s:
            text = module.operation.get_asm(enable_debug_info=False)
            key = hashlib.sha256(text.encode()).hexdigest()[:16]
            self.big.append((key, round(seconds, 3), key in self.seen))
            self.seen.add(key)

    def event(self, name: str, seconds: float, **_) -> None:
        if name == _TRACE:
            self.trace_s += seconds
        elif name == _LOWER:
            self.lower_s += seconds


_census = _Census()


def pytest_addoption(parser):
    parser.addoption(
        "--compile-census",
        metavar="PATH",
        help="benchmarks.studies.compile_census: append each test's XLA compile counts to PATH",
    )
    parser.addoption(
        "--compile-census-threshold",
        type=float,
        default=BIG_COMPILE_S,
        metavar="SECONDS",
        help="fingerprint the compiles longer than this, to find the programs compiled again",
    )


def _install() -> None:
    from jax._src import compiler, monitoring

    compile_and_load = compiler.backend_compile_and_load

    def counted(backend, module, *args, **kwargs):
        start = time.perf_counter()
        executable = compile_and_load(backend, module, *args, **kwargs)
        _census.compiled(module, time.perf_counter() - start)
        return executable

    compiler.backend_compile_and_load = counted
    monitoring.register_event_duration_secs_listener(_census.event)


def pytest_configure(config):
    path = config.getoption("--compile-census")
    if not path:
        return
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist)
        open(path, "w").close()
    _census.threshold_s = config.getoption("--compile-census-threshold")
    _install()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    path = item.config.getoption("--compile-census")
    _census.reset()
    start = time.perf_counter()
    yield
    if path:
        record = {
            "test": item.nodeid,
            "wall_s": round(time.perf_counter() - start, 3),
            "compiles": _census.compiles,
            "compile_s": round(_census.compile_s, 3),
            "trace_s": round(_census.trace_s, 3),
            "lower_s": round(_census.lower_s, 3),
            "big": _census.big,
        }
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")


def summarize(records: list[dict]) -> dict:
    """Totals over `records` (the file's lines), and per test file."""
    big = [entry for r in records for entry in r["big"]]
    files: dict = collections.defaultdict(lambda: collections.Counter())
    for r in records:
        totals = files[r["test"].split("::")[0]]
        for key in ("wall_s", "compile_s", "compiles", "trace_s", "lower_s"):
            totals[key] += r[key]
    return {
        "tests": len(records),
        "wall_s": sum(r["wall_s"] for r in records),
        "compile_s": sum(r["compile_s"] for r in records),
        "compiles": sum(r["compiles"] for r in records),
        "trace_and_lower_s": sum(r["trace_s"] + r["lower_s"] for r in records),
        "big_compiles": len(big),
        "big_compile_s": sum(seconds for _, seconds, _ in big),
        "big_recompile_s": sum(seconds for _, seconds, again in big if again),
        "files": {name: dict(totals) for name, totals in files.items()},
    }


def pytest_terminal_summary(terminalreporter, config):
    path = config.getoption("--compile-census")
    if not path or hasattr(config, "workerinput") or not os.path.exists(path):
        return
    with open(path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    s = summarize(records)
    write = terminalreporter.write_line
    write(
        f"compile census ({path}): {s['tests']} tests, {s['wall_s']:.0f} s; backend compiles "
        f"{s['compiles']} in {s['compile_s']:.0f} s, tracing and lowering "
        f"{s['trace_and_lower_s']:.0f} s; {s['big_compiles']} compiles over "
        f"{_census.threshold_s:g} s took {s['big_compile_s']:.0f} s, of which recompiling "
        f"a program the process had compiled before {s['big_recompile_s']:.0f} s"
    )
    for name, totals in sorted(s["files"].items(), key=lambda kv: -kv[1]["wall_s"]):
        write(
            f"  {name}: {totals['wall_s']:.0f} s, compile {totals['compile_s']:.0f} s "
            f"({totals['compiles']}), trace+lower {totals['trace_s'] + totals['lower_s']:.0f} s"
        )
