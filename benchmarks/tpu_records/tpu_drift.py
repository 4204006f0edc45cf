r"""Keeps each shipped TPU config's compiler estimate from drifting unseen.

The record, `benchmarks/tpu_records/tpu_estimates.json`, holds per config and phase what
docs/tpu_estimates.md states of it: the TPU compiler's estimate of one train step (its
cost model's `optimal_seconds` of the step compiled with its layers unrolled, as
`experiments.aot_compile` reports it), the MFU that implies, the cost model's HBM traffic
per device, the scanned train step's memory per device, and the libtpu, jax and date they
were measured with. Recompiling against it:

  python -m benchmarks.tpu_records.tpu_drift          # every config in the record
  python -m benchmarks.tpu_records.tpu_drift \
      --configs=bert_base_paper.py:phase2,bert_large_paper.py:phase2
  python -m benchmarks.tpu_records.tpu_drift --configs=... --update   # measured figures in
  python -m benchmarks.tpu_records.tpu_drift --configs=... --update --figures   # and the
                                                                  # docs' ranges' record

compiles each config named (libtpu needed, no TPU: the slice is described by
`jax.experimental.topologies`), prints its figures beside the record's and names every one
that moved by more than `--tolerance` (1%); the exit status is 1 if any did. A change that
moves an estimate on purpose is recorded with `--update` and the docs' figures with it:
tests/test_tpu_drift.py (default tier, no compile) fails while a docs figure differs from
its record. Compile times on a 2-core host: BERT-Base a few minutes a phase, BERT-Large up
to 15, LAMB's 2,048 cores longer (run `--configs` a few at a time).

issue 77 item 5 is why: commit 517d6a8 (2026-11-26) moved BERT-Base phase 2 from 76.0 to
78.8 ms and BERT-Large phase 2 from 67.2 to 69.0 ms by the compiler without any page saying
so (`bert_jax.layers.product_dtype` read the compiling host's backend).

The same compile also gives the compiler's second estimate, its per-op `estimated_cycles`
summed (`experiments.aot_compile.per_op_seconds`); with `--figures` both estimates go into
the record the docs' calibrated ranges are rendered from
(benchmarks/tpu_records/tpu_figures.json, the entry `<config>@<slice>`;
`python -m benchmarks.tpu_records.tpu_figures --write` then rewrites the pages), replacing a
figure that entry carried from the docs' tables.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import re
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECORD = os.path.join(REPO, "benchmarks", "tpu_records", "tpu_estimates.json")
DOCS = os.path.join(REPO, "docs", "tpu_estimates.md")
TOLERANCE = 0.01
# The figures compared, with how each is written in the docs.
FIGURES = ("ms_per_step", "mfu_percent", "hbm_gb", "train_gib")
# Where docs/tpu_estimates.md states a BERT config's figures (an entry's `docs_tables`
# overrides it): the fit table its memory, the estimate and layouts tables the rest.
ESTIMATE = ["ms_per_step", "mfu_percent", "hbm_gb"]
DOCS_TABLES = {"fit": ["train_gib"], "estimate": ESTIMATE, "layouts": ESTIMATE}


def load(path: str = RECORD) -> dict:
    with open(path) as f:
        return json.load(f)


def save(record: dict, path: str = RECORD) -> None:
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")


def moved(recorded: dict, measured: dict, tolerance: float = TOLERANCE) -> list[str]:
    """One line per figure of `measured` that differs from `recorded` by more than
    `tolerance` of the recorded value (figures either side lacks are not compared)."""
    lines = []
    for name in FIGURES:
        old, new = recorded.get(name), measured.get(name)
        if old is None or new is None:
            continue
        change = (new - old) / old if old else float("inf")
        if abs(change) > tolerance:
            lines.append(f"{name} {old:g} -> {new:g} ({100 * change:+.1f}%)")
    return lines


# --- the docs' figures against the record (no compile) --------------------------------------


def _cells(line: str) -> list[str]:
    return [c.strip().replace("**", "") for c in line.strip().strip("|").split("|")]


def docs_figures(path: str = DOCS) -> dict[str, dict[str, list[str]]]:
    """The cells each shipped config's rows hold in docs/tpu_estimates.md, by table: `fit`
    (memory per device, from "What each config needs"), `estimate` (the compiler's step
    time table) and `layouts` (the row marked "(the config" in the layouts table)."""
    found: dict[str, dict[str, list[str]]] = {}
    table, group = None, None
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.startswith("|"):
                table, group = None, None
                continue
            cells = _cells(line)
            if table is None:  # the header row says which table this is
                header = " ".join(cells)
                table = (
                    "fit"
                    if "memory / device (train step)" in header
                    else "estimate"
                    if "implied MFU" in header and "slice" in header
                    else "layouts"
                    if "HBM GB / device" in header or "MFU" in header
                    else "other"
                )
                continue
            if set(line.strip()) <= set("|-: "):  # the header's rule
                continue
            # `bert_base_paper` 2 (...), `electra_paper:base`
            match = re.match(r"`(\w+)(?::(\w+))?`(?: ([12])\b)?", cells[0])
            if match and (match[2] or match[3]):
                group = f"{match[1]}.py:{match[2] or 'phase' + match[3]}"
            else:
                match = None
            if table in ("fit", "estimate") and match:
                found.setdefault(group, {})[table] = cells
            elif table == "layouts" and group and len(cells) > 1 and "(the config" in cells[1]:
                found.setdefault(group, {})["layouts"] = cells
    return found


def _leading_number(cell: str) -> tuple[float, float] | None:
    """A cell's leading number and half its last digit ("433.7 (with ...)": 433.7, 0.05)."""
    match = re.match(r"\(?([0-9][0-9,]*)(?:\.([0-9]+))?(?=$|[\s%),])", cell)
    if not match:
        return None
    decimals = len(match[2] or "")
    text = match[1].replace(",", "") + (f".{match[2]}" if match[2] else "")
    return float(text), 0.5 * 10**-decimals


def docs_drift(record: dict, path: str = DOCS) -> list[str]:
    """One line per docs figure that is not its record's (to the docs' rounding: the row
    needs a cell whose leading number is the record's figure rounded to that cell's digits),
    and per record entry without its rows."""
    docs = docs_figures(path)
    lines = []
    for entry in record["estimates"]:
        key = entry["config"]
        rows = docs.get(key, {})
        want = entry.get("docs_tables", DOCS_TABLES)
        for table, figures in want.items():
            if table not in rows:
                lines.append(f"{key}: no row in docs/tpu_estimates.md's {table} table")
                continue
            numbers = [_leading_number(c) for c in rows[table][1:]]
            for name in figures:
                value = entry.get(name)
                if value is None:
                    continue
                if not any(n and abs(n[0] - value) <= n[1] + 1e-9 for n in numbers):
                    lines.append(
                        f"{key}: the {table} table's row says {' | '.join(rows[table])}, "
                        f"the record's {name} is {value:g}"
                    )
    return lines


# --- recompiling ----------------------------------------------------------------------------


def load_config(name: str):
    """`bert_base_paper.py:phase2` -> that config file's get_config('phase2')."""
    file, _, variant = name.partition(":")
    path = os.path.join(REPO, "experiments", "configs", file)
    spec = importlib.util.spec_from_file_location(f"tpu_drift_{file[:-3]}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(variant) if variant else module.get_config()


def measure(name: str) -> dict:
    """Compiles `name`'s train step for its slice as `experiments.aot_compile` does (the
    scanned config for memory, the unrolled one for the estimate) and returns its figures."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from bert_jax import train
    from experiments import aot_compile

    config = load_config(name)
    devices = aot_compile.slice_devices(config.topology)
    compiled, _, _, model_config = aot_compile.compile_steps(config, devices, evaluate=False)
    train_bytes = aot_compile.MemoryUse.of(compiled).total
    if config.model.scan_layers:
        unrolled = aot_compile.unrolled(config)
        compiled = aot_compile.compile_steps(unrolled, devices, evaluate=False)[0]
    seconds = aot_compile.optimal_seconds(compiled)
    traffic = aot_compile.bytes_accessed(compiled)
    peak = aot_compile.device_peak_flops(devices[0].device_kind)
    mfu = train.flops_per_step(config, model_config) / (seconds * len(devices) * peak)
    return {
        "ms_per_step": round(seconds * 1e3, 1),
        "mfu_percent": round(100 * mfu, 1),
        "hbm_gb": round(traffic / 1e9, 1) if traffic else None,
        "train_gib": round(train_bytes / 1024**3, 2),
        # both estimates unrounded, for the calibrated ranges' record (--figures)
        "optimal_seconds": seconds,
        "per_op_seconds": aot_compile.per_op_seconds(compiled, devices[0].device_kind),
    }


def update_figures(name: str, slice_: str, measured: dict, path: str | None = None) -> bool:
    """Writes `measured`'s two estimates into the docs' ranges' record entry `name@slice_`
    (experiments.tpu_records); False when the record has no such entry."""
    from experiments import tpu_records

    path = path or tpu_records.RECORD
    entries = tpu_records.load(path)
    key = f"{name}@{slice_}"
    if key not in entries:
        return False
    entries[key].update(
        optimal_seconds=measured["optimal_seconds"],
        per_op_seconds=measured["per_op_seconds"],
        train_gib=measured["train_gib"],
        source=tpu_records.stamp("python -m benchmarks.tpu_records.tpu_drift --figures"),
    )
    tpu_records.write(path, entries)
    return True


def versions() -> dict:
    from importlib import metadata

    found = {}
    for package in ("libtpu", "jax"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = None
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.tpu_records.tpu_drift",
        description="Recompile each shipped TPU config (experiments/configs/*.py:phaseN, on "
        "its slice, libtpu on this host) and report every figure of the TPU compiler's "
        "estimate (ms/step, MFU, HBM GB/step, train-step GiB/device) that moved by more than "
        "--tolerance from benchmarks/tpu_records/tpu_estimates.json. Exit 1 if any did.",
    )
    parser.add_argument(
        "--configs",
        default="",
        help="comma-separated config:phase names from the record (default: all of them)",
    )
    parser.add_argument("--tolerance", type=float, default=TOLERANCE)
    parser.add_argument(
        "--update", action="store_true", help="write the measured figures into the record"
    )
    parser.add_argument("--record", default=RECORD)
    parser.add_argument(
        "--figures",
        action="store_true",
        help="with --update: also write both estimates (optimal_seconds and the per-op sum) "
        "into benchmarks/tpu_records/tpu_figures.json, which the docs' calibrated ranges are "
        "rendered from (then: python -m benchmarks.tpu_records.tpu_figures --write)",
    )
    parser.add_argument(
        "--docs_only",
        action="store_true",
        help="compile nothing: check that docs/tpu_estimates.md states the record's figures",
    )
    args = parser.parse_args(argv)
    if args.figures and not args.update:
        parser.error("--figures writes what --update measures: give both")
    record = load(args.record)
    if args.docs_only:
        lines = docs_drift(record)
        print("\n".join(lines) if lines else "docs/tpu_estimates.md states the record's figures")
        return 1 if lines else 0
    entries = {e["config"]: e for e in record["estimates"]}
    names = [n for n in args.configs.split(",") if n] or list(entries)
    unknown = [n for n in names if n not in entries]
    if unknown:
        parser.error(f"not in the record: {', '.join(unknown)} (it has {', '.join(entries)})")
    drifted = 0
    for name in names:
        print(f"compiling {name} for {entries[name]['slice']} ...", flush=True)
        measured = measure(name)
        lines = moved(entries[name], measured, args.tolerance)
        figures = ", ".join(f"{k} {measured[k]} (record {entries[name].get(k)})" for k in FIGURES)
        per_op = measured["per_op_seconds"]
        print(f"  {figures}, per-op sum {per_op * 1e3:.1f} ms" if per_op else f"  {figures}")
        for line in lines:
            print(f"  MOVED {line}")
        drifted += bool(lines)
        if args.update:
            load_average = os.getloadavg()[0]
            entries[name].update({k: measured[k] for k in FIGURES})
            entries[name].update(versions())
            entries[name]["measured"] = (
                f"{datetime.date.today().isoformat()}, python -m benchmarks.tpu_records.tpu_drift, "
                f"load {load_average:.1f}"
            )
            save(record, args.record)
            if args.figures and not update_figures(name, entries[name]["slice"], measured):
                print(f"  (no {name}@{entries[name]['slice']} in the figures' record)")
    print(f"{drifted} of {len(names)} configs moved by more than {100 * args.tolerance:g}%")
    return 1 if drifted and not args.update else 0


if __name__ == "__main__":
    sys.exit(main())
