"""The record of TPU figures the docs are generated from
(benchmarks/tpu_records/tpu_figures.json): `experiments.aot_compile --record` adds a report to
it, `benchmarks.tpu_records.tpu_figures` renders the docs' marked figures from it."""

from __future__ import annotations

import datetime
import json
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORD = os.path.join(REPO, "benchmarks", "tpu_records", "tpu_figures.json")


def load(path: str = RECORD) -> dict[str, dict]:
    with open(path) as f:
        return {entry["id"]: entry for entry in json.load(f)["figures"]}


def write(path: str, entries: dict[str, dict]) -> None:
    with open(path, "w") as f:
        json.dump({"figures": list(entries.values())}, f, indent=1)
        f.write("\n")


def stamp(tool: str) -> str:
    """An entry's `source`: the tool that wrote it, when (UTC) and at what load."""
    try:
        load_average = f", load {os.getloadavg()[0]:.1f}"
    except OSError:
        load_average = ""
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"{tool}, {when}{load_average}"


def record_report(path: str, report, name: str) -> None:
    """Keeps an `experiments.aot_compile` report's figures in `path` as `name@topology`."""
    _record(path, report, name, flops_per_step=report.flops_per_step,
            tokens_per_step=report.tokens_per_step,
            optimal_seconds=report.compiler_step_seconds,
            per_op_seconds=report.per_op_step_seconds, command="")  # fmt: skip


def record_contrastive(path: str, report, name: str) -> None:
    """Keeps an `experiments.aot_embeddings` report's figures in `path` as `name@topology`,
    in the fields `record_report` writes: the model FLOPs are its forward + backward
    (`flops["model"]`), the step the estimate with every chunk loop's trips counted (and,
    for a `--proxy_layers` report, continued from its proxies to the whole encoder)."""
    proxies = ",".join(str(p.layers) for p in report.proxies)
    _record(path, report, name, flops_per_step=report.flops["model"],
            tokens_per_step=report.token_slots, optimal_seconds=report.step_seconds,
            per_op_seconds=report.per_op_seconds,
            command=f" --proxy_layers={proxies}" if proxies else "")  # fmt: skip


def _record(path: str, report, name: str, *, flops_per_step, tokens_per_step,
            optimal_seconds, per_op_seconds, command: str) -> None:  # fmt: skip
    """Writes one entry `name@topology` (replacing an earlier one of that key); the fields
    the two kinds of report name differently come in as arguments."""
    entries = load(path) if os.path.exists(path) else {}
    key = f"{name}@{report.topology}"
    entries[key] = {
        "id": key,
        "slice": report.topology,
        "device_kind": report.device_kind,
        "num_devices": report.num_devices,
        "num_chips": report.num_chips,
        "peak_flops_per_device": report.peak_flops_per_device,
        "flops_per_step": flops_per_step,
        "steps": report.steps,
        "tokens_per_step": tokens_per_step,
        "optimal_seconds": optimal_seconds,
        "per_op_seconds": per_op_seconds,
        "train_gib": round(report.train.total / 1024**3, 2),
        "layout": report.layout,
        "source": stamp("experiments.aot_compile --record" + command),
    }
    write(path, entries)
