r"""BERT-Base, BERT-Large and ModernBERT-base pretraining steps on one accelerator, in one table.

Made for a session lent a GPU for one call of the device tool (`benchmarks/accelerator_run.sh`
is that call): within `--time_budget_s` it measures our train step (MLM + NSP loss, the
original AdamW after global-norm clipping, bf16 matmuls with f32 params and accumulation) at
T=128 and T=512, unpacked and packed (`data_pipelines.packing`), with each attention
implementation (`bert_jax.config.ATTENTION_IMPLEMENTATIONS`; cudnn on a GPU only), and the peer,
transformers' PyTorch BertForPreTraining (bf16 autocast, fused torch AdamW), at the same shapes,
unpacked. ModernBERT-base (our `modernbert_base` preset, T=1,024) trains its own recipe, MLM
alone with 30% masked, against transformers' ModernBertForMaskedLM. Each row runs in its own
process (`benchmarks.accelerator_rows`): warm-up steps excluded, every timed step waited for,
the median kept. Writes `results.md`, `results.json` and `rows.log` (the rows' own output) to
`--output_dir` ($OUT where set), again after every row, so a run stopped early still leaves
its table.

Rows run in rounds, most wanted first: every (model, T) gets our unpacked einsum row (the
recipe as trained, attention dropout 0.1) before any gets a second; then unpacked cudnn, the
torch peer, packed cudnn, unpacked xla, packed einsum, packed xla. A row whose (peer, model, T)
took longer than the budget has left is recorded as skipped; one that outlives the budget is
stopped and recorded as a timeout. The ModernBERT rows run the same rounds after every BERT row
(`--sizes=modern` runs them alone).

Examples:
  python -m benchmarks.accelerator_bench                      # the full plan (on a GPU)
  python -m benchmarks.accelerator_bench --sizes=tiny --steps=2 --output_dir=/tmp/acc
  python -m benchmarks.accelerator_bench --sizes=large --seq_lens=512 --batch=16 \
      --attention=cudnn --packed=false --peer=none
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import fnmatch
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

from bert_jax import telemetry
from bert_jax.config import BertConfig, preset_fields

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# size: (table label, BertConfig fields). BertConfig's defaults otherwise: exact GELU (the
# torch peer's too), dropout 0.1, vocab 30522. The ModernBERT sizes are the presets.
SIZES = {
    "tiny": (
        "tiny L2/H64/A2",
        dict(
            num_hidden_layers=2,
            hidden_size=64,
            num_attention_heads=2,
            intermediate_size=256,
            vocab_size=2000,
        ),
    ),
    "base": ("BERT-Base", dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12)),
    "large": (
        "BERT-Large",
        dict(
            num_hidden_layers=24,
            hidden_size=1024,
            num_attention_heads=16,
            intermediate_size=4096,
        ),
    ),
    "modern": ("ModernBERT-base", preset_fields("modernbert_base")),
    # A vocabulary as small as tiny's, so the CPU rehearsal's MLM head stays cheap.
    "modern_tiny": (
        "tiny ModernBERT L4/H128/A2",
        dict(preset_fields("modernbert_tiny"), vocab_size=2000),
    ),
}
# size -> its family: the peer's model class and the recipe (RECIPES).
FAMILIES = {"modern": "modernbert", "modern_tiny": "modernbert"}  # any other size: "bert"
# family: (objective, masked fraction). ModernBERT trains MLM alone (`bert_jax.train`'s "mlm"
# objective: no NSP head) on single segments, masking 30% of tokens (Warner et al. 2024).
RECIPES = {"bert": ("mlm_nsp", 0.15), "modernbert": ("mlm", 0.30)}
# Default T per size. ModernBERT pretrained at 1,024 (--seq_lens=512 adds BERT's longest).
SEQ_LENS = {
    "tiny": (16, 32),
    "base": (128, 512),
    "large": (128, 512),
    "modern": (1024,),
    "modern_tiny": (32,),
}
# (size, T) -> rows per step, chosen to fit an 80 GB GPU without rematerialisation.
BATCHES = {
    ("tiny", 16): 4,
    ("tiny", 32): 4,
    ("base", 128): 256,
    ("base", 512): 64,
    ("large", 128): 128,
    ("large", 512): 32,
    # 32K tokens a step, as BERT-Base's rows; the einsum rows' global layers keep (B, A, T, T)
    # f32 probabilities, 1.6 GB each at T=1,024.
    ("modern", 512): 64,
    ("modern", 1024): 32,
    ("modern_tiny", 32): 4,
}
DEFAULT_BATCH = 8  # a (size, T) not in BATCHES
# The rounds, most wanted first: (peer, packed, attention).
VARIANTS = (
    ("ours", False, "einsum"),
    ("ours", False, "cudnn"),
    ("torch", False, "sdpa"),
    ("ours", True, "cudnn"),
    ("ours", False, "xla"),
    ("ours", True, "einsum"),
    ("ours", True, "xla"),
)
TABLE_COLUMNS = (
    "model",
    "T",
    "packed",
    "attention",
    "attn dropout",
    "batch",
    "seq/s",
    "tokens/s",
    "MFU",
    "TFLOP/s",
    "peak GiB",
    "compile s",
    "vs torch",
    "status",
)
TEXT_COLUMNS = ("model", "packed", "attention", "status")  # left-aligned; the rest are numbers


def predictions_per_seq(seq_len: int, masked_fraction: float = 0.15) -> int:
    """P of the records: the paper's 20 at T=128 and 80 at T=512 for BERT's 15% masked, in
    proportion to T and to the masked fraction elsewhere (ModernBERT's 30%: 320 at 1,024)."""
    return max(2, round(seq_len * 20 / 128 * masked_fraction / 0.15))


def parse_batches(text: str) -> dict[tuple[str, int], int] | int | None:
    """`--batch`: "" (the defaults), one number for every row, or "base:128=256,large:512=16"."""
    if not text:
        return None
    if "=" not in text:
        return int(text)
    out = {}
    for item in text.split(","):
        key, value = item.split("=")
        size, seq_len = key.split(":")
        out[(size, int(seq_len))] = int(value)
    return out


def batch_size(args, size: str, seq_len: int) -> int:
    override = parse_batches(args.batch)
    if isinstance(override, int):
        return override
    if override and (size, seq_len) in override:
        return override[(size, seq_len)]
    return BATCHES.get((size, seq_len), DEFAULT_BATCH)


def model_config(args, size: str, attention: str) -> BertConfig:
    """Our model for a row: the fused attentions have no attention dropout (see the config),
    einsum keeps the recipe's (BERT 0.1, ModernBERT none).

    A torch row's config ("sdpa") sizes the peer and counts its FLOPs; transformers picks its
    attention.
    """
    _, fields = SIZES[size]
    recipe = BertConfig(**fields)
    return recipe.replace(
        dtype=args.dtype,
        scan_layers=args.scan_layers,
        remat_policy=args.remat_policy,
        attention_implementation=attention if attention != "sdpa" else "einsum",
        attention_probs_dropout_prob=(
            recipe.attention_probs_dropout_prob if attention in ("einsum", "sdpa") else 0.0
        ),
    )


def build_plan(args, platform: str) -> list[dict[str, Any]]:
    """Every row of the run, in the order they run, with why a row cannot run here."""
    sizes = args.sizes.split(",")
    groups = sorted(
        (index, sizes.index(size), size, seq_len)
        for size in sizes
        for index, seq_len in enumerate(
            [int(t) for t in args.seq_lens.split(",")] if args.seq_lens else SEQ_LENS[size]
        )
    )
    packed_modes = [p == "true" for p in args.packed.split(",")]
    attentions = args.attention.split(",")
    rows = []
    for peer, packed, attention in VARIANTS:
        if peer == "torch":
            if args.peer != "torch":
                continue
        elif packed not in packed_modes or attention not in attentions:
            continue
        for _, _, size, seq_len in groups:
            config = model_config(args, size, attention)
            family = FAMILIES.get(size, "bert")
            objective, masked_fraction = RECIPES[family]
            row = dict(
                id=f"{peer}/{size}/T{seq_len}/{'packed' if packed else 'unpacked'}/{attention}",
                peer=peer,
                size=size,
                model=SIZES[size][0],
                family=family,
                objective=objective,
                masked_fraction=masked_fraction,
                seq_len=seq_len,
                predictions=predictions_per_seq(seq_len, masked_fraction),
                packed=packed,
                attention=attention,
                attn_dropout=config.attention_probs_dropout_prob,
                batch=batch_size(args, size, seq_len),
                config=dataclasses.asdict(config),
            )
            if not _matches(row["id"], args.rows):
                continue
            if peer == "ours" and args.profile and _matches(row["id"], args.profile):
                name = "profile-" + row["id"].replace("/", "-") + ".json.gz"
                row["profile_path"] = os.path.join(args.output_dir, name)
            if attention == "cudnn" and platform != "gpu":
                row.update(status="skipped", error=f"cudnn needs a GPU (platform {platform})")
            rows.append(row)
    # The ModernBERT rows, their own rounds, after every BERT row: adding them to a plan
    # leaves the BERT rows it had first in line for the budget (the sort is stable).
    return sorted(rows, key=lambda row: row["family"] != "bert")


def _matches(row_id: str, patterns: str) -> bool:
    return any(fnmatch.fnmatchcase(row_id, p) for p in patterns.split(",") if p)


def run_process(spec: dict[str, Any], timeout: float, log_path: str) -> tuple[dict, float]:
    """Runs one row (`benchmarks.accelerator_rows`); (its result, wall seconds)."""
    env = dict(os.environ)
    # jax takes 75% of a GPU's memory by default: let a row have nearly all of it.
    env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.setdefault("USE_TF", "0")  # transformers 4.x would look for TensorFlow otherwise
    env.setdefault("HF_HUB_OFFLINE", "1")
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as scratch:
        result_path = os.path.join(scratch, "result.json")
        command = [sys.executable, "-m", "benchmarks.accelerator_rows", json.dumps(spec)]
        with open(log_path, "w", encoding="utf-8") as log:
            try:
                process = subprocess.run(
                    [*command, result_path],
                    cwd=ROOT,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    timeout=timeout,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                wall = time.monotonic() - start
                return dict(status="timeout", error=f"stopped after {wall:.0f} s"), wall
        wall = time.monotonic() - start
        if os.path.exists(result_path):
            with open(result_path, encoding="utf-8") as f:
                return json.load(f), wall
    with open(log_path, encoding="utf-8") as f:
        tail = f.read()[-1500:]
    return dict(status="crashed", error=f"exit {process.returncode}: {tail}"), wall


def known_peak_flops(device_kind: str, override_tflops: float | None) -> float | None:
    """The chip's dense bf16 FLOP/s (`telemetry.PEAK_FLOPS_BY_DEVICE_KIND`, or the flag)."""
    if override_tflops:
        return override_tflops * 1e12
    for kind, flops in telemetry.PEAK_FLOPS_BY_DEVICE_KIND.items():
        if device_kind.startswith(kind):
            return flops
    return None  # a CPU, or a chip the table does not know: no MFU


def add_rates(row: dict[str, Any], result: dict[str, Any], peak: float | None) -> None:
    """Rates from a row's step times: medians, model FLOPs and MFU."""
    row.update({k: v for k, v in result.items() if k not in ("times",)})
    if result["status"] != "ok":
        return
    median = float(np.median(result["times"]))
    config = BertConfig(**row["config"])
    # Matmul FLOPs of the step as executed: the whole row of T for a packed row too.
    flops = telemetry.train_flops_per_step(config, row["batch"], row["seq_len"], row["predictions"])
    row.update(
        step_s=median,
        step_times_s=result["times"],
        seq_per_s=result["instances"] / median,
        rows_per_s=row["batch"] / median,
        tokens_per_s=result["real_tokens"] / median,
        instances_per_row=result["instances"] / row["batch"],
        fill=result["real_tokens"] / (row["batch"] * row["seq_len"]),
        model_flops=flops,
        tflops=flops / median / 1e12,
        mfu=flops / median / peak if peak else None,
    )


def add_peer_ratios(rows: list[dict[str, Any]]) -> None:
    """`vs_torch`: our seq/s over the torch peer's at the same model and T."""
    peers = {
        (r["size"], r["seq_len"]): r["seq_per_s"]
        for r in rows
        if r["peer"] == "torch" and r.get("status") == "ok"
    }
    for row in rows:
        peer = peers.get((row["size"], row["seq_len"]))
        if row["peer"] == "ours" and row.get("status") == "ok" and peer:
            row["vs_torch"] = row["seq_per_s"] / peer


def _cell(value, form: str) -> str:
    return "" if value is None else format(value, form)


def table_row(row: dict[str, Any]) -> list[str]:
    status = row.get("status", "pending")
    if status not in ("ok", "pending"):
        reason = (row.get("error") or "").splitlines()[0][:80] if status != "oom" else ""
        status = f"{status.upper() if status == 'oom' else status}{': ' if reason else ''}{reason}"
    peak = row.get("peak_bytes")
    attention = row["attention"]
    if row["peer"] == "torch":  # the implementation transformers chose, where the row ran
        attention = f"torch {row.get('versions', {}).get('attn_implementation', attention)}"
    return [
        row["model"],
        str(row["seq_len"]),
        "yes" if row["packed"] else "no",
        attention,
        f"{row['attn_dropout']:g}",
        str(row["batch"]),
        _cell(row.get("seq_per_s"), ",.1f"),
        _cell(row.get("tokens_per_s"), ",.0f"),
        _cell(row.get("mfu"), ".1%"),
        _cell(row.get("tflops"), ".4g"),
        _cell(peak / 2**30 if peak else None, ".1f"),
        _cell(row.get("compile_s"), ".1f"),
        _cell(row.get("vs_torch"), ".2f") + ("x" if row.get("vs_torch") else ""),
        status,
    ]


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        f"# Pretraining steps on {meta['device_kind']} ({meta['platform']})",
        "",
        f"{meta['started']}, jax {meta['jax']}, python {meta['python']}; "
        f"{meta['elapsed_s']:.0f} s of a {meta['time_budget_s']:.0f} s budget. "
        f"`{meta['command']}`",
        "",
        "| " + " | ".join(TABLE_COLUMNS) + " |",
        "| " + " | ".join("---" if c in TEXT_COLUMNS else "---:" for c in TABLE_COLUMNS) + " |",
    ]
    lines += ["| " + " | ".join(table_row(r)) + " |" for r in rows]
    peak = meta["peak_tflops"]
    lines += [
        "",
        f"- Ours: {meta['dtype']} matmuls, f32 params, scan_layers={meta['scan_layers']}, "
        f"remat_policy={meta['remat_policy']}, dropout {meta['prng_impl']}; "
        f"median of {meta['steps']} timed steps after {meta['warmup']} warm-up.",
        "- seq/s: BERT instances per second (a packed row holds several); tokens/s: real "
        "(non-padding) tokens per second. Synthetic instances: "
        "lengths uniform on [8, T] tokens"
        + (f", {meta['full_fraction']:.0%} of them T instead; " if meta["full_fraction"] else "; ")
        + "packed rows are filled first-fit (`data_pipelines.packing`).",
        "- MFU: the step's model FLOPs (`bert_jax.telemetry.train_flops_per_step`, the full "
        "row for packed rows) per median step over the chip's dense bf16 peak"
        + (f" ({peak:.0f} TFLOP/s)." if peak else " (unknown here: no MFU)."),
        "- attn dropout: the fused attentions (xla, cudnn) have none, a recipe change "
        "(`bert_jax.config`); einsum keeps the recipe's (BERT 0.1, ModernBERT none).",
        "- torch: transformers' BertForPreTraining, bf16 autocast, fused torch AdamW, MLM "
        "logits at every position, unpacked only; vs torch: our seq/s over its, same model "
        "and T. Peak GiB: jax's `peak_bytes_in_use`, torch's `max_memory_allocated`.",
        "- ModernBERT rows: MLM alone (no NSP head), 30% of tokens masked, single-segment "
        "instances, no dropout; the torch peer is ModernBertForMaskedLM (sdpa, logits at the "
        "masked positions only: `sparse_prediction`, as ModernBERT trained).",
    ]
    for row in rows:
        if row.get("profile"):
            lines += profile_markdown(row)
    return "\n".join(lines) + "\n"


def profile_markdown(row: dict[str, Any]) -> list[str]:
    """A profiled row's busiest timelines and ops (`accelerator_rows.summarise_trace`)."""
    profile = row["profile"]
    lines = [
        "",
        f"## Profile: {row['id']}",
        "",
        f"{profile['steps']} steps traced after the timed ones (median step "
        f"{row.get('step_s', 0) * 1e3:.1f} ms); trace: `{os.path.basename(row['profile_path'])}`.",
    ]
    for timeline in profile["lines"]:
        total = timeline["ms_per_step"]
        lines += [
            "",
            f"{timeline['line']}: {total:.2f} ms per step",
            "",
            "| op | ms per step | share |",
            "| --- | ---: | ---: |",
        ]
        lines += [
            f"| `{name}` | {ms:.3f} | {ms / total if total else 0:.1%} |"
            for name, ms in timeline["ops"]
        ]
    return lines


def write_outputs(rows: list[dict[str, Any]], meta: dict[str, Any], out_dir: str) -> None:
    for name, text in (
        ("results.json", json.dumps({"meta": meta, "rows": rows}, indent=1)),
        ("results.md", markdown(rows, meta)),
    ):
        with open(os.path.join(out_dir, name + ".tmp"), "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(os.path.join(out_dir, name + ".tmp"), os.path.join(out_dir, name))


def _append_log(out_dir: str, title: str, log_path: str) -> None:
    with open(log_path, encoding="utf-8") as f:
        text = f.read()[-20_000:]
    with open(os.path.join(out_dir, "rows.log"), "a", encoding="utf-8") as f:
        f.write(f"===== {title}\n{text}\n")


def run(args) -> dict[str, Any]:
    """Probes the device, runs the plan within the budget, writes the outputs; the report."""
    start = time.monotonic()
    os.makedirs(args.output_dir, exist_ok=True)
    open(os.path.join(args.output_dir, "rows.log"), "w").close()
    with tempfile.TemporaryDirectory() as scratch:
        log_path = os.path.join(scratch, "row.log")
        device, _ = run_process({"peer": "probe"}, args.time_budget_s, log_path)
        _append_log(args.output_dir, "probe", log_path)
        if device.pop("status") != "ok":
            raise RuntimeError(f"jax could not see a device: {device.get('error')}")
        return run_rows(args, device, start, log_path)


def run_rows(args, device: dict[str, Any], start: float, log_path: str) -> dict[str, Any]:
    """Runs the plan's rows one by one, rewriting the outputs after each."""
    peak = known_peak_flops(device["device_kind"], args.peak_tflops)
    meta = dict(
        {k: v for k, v in vars(args).items() if k != "argv"},
        **device,
        started=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        command="python -m benchmarks.accelerator_bench " + " ".join(args.argv),
        peak_tflops=peak / 1e12 if peak else None,  # the flag's, the table's, or None
        elapsed_s=0.0,
    )
    rows = build_plan(args, device["platform"])
    took: dict[tuple, float] = {}  # (peer, size, T) -> wall seconds of its last row
    for index, row in enumerate(rows):
        if "status" not in row:
            left = args.time_budget_s - (time.monotonic() - start)
            group = (row["peer"], row["size"], row["seq_len"])
            if left < 1 or took.get(group, 0) > left:
                took_s = (
                    f", a row of its model and T took {took[group]:.0f} s" if group in took else ""
                )
                row.update(status="skipped", error=f"time budget: {left:.0f} s left{took_s}")
            else:
                spec = dict(
                    row,
                    steps=args.steps,
                    warmup=args.warmup,
                    seed=args.seed,
                    prng_impl=args.prng_impl,
                    full_fraction=args.full_fraction,
                    max_instances_per_row=args.max_instances_per_row,
                )
                result, took[group] = run_process(spec, left, log_path)
                _append_log(args.output_dir, row["id"], log_path)
                add_rates(row, result, peak)
                row["wall_s"] = took[group]
        add_peer_ratios(rows)
        meta["elapsed_s"] = time.monotonic() - start
        write_outputs(rows, meta, args.output_dir)
        cells = dict(zip(TABLE_COLUMNS, table_row(row), strict=True))
        if row["status"] == "ok":
            figures = ", ".join(
                f"{name} {cells[name]}" for name in ("seq/s", "tokens/s", "MFU", "compile s")
            )
        else:
            figures = cells["status"]
        print(
            f"[{index + 1}/{len(rows)}] {row['id']}: {figures} ({meta['elapsed_s']:.0f} s elapsed)",
            flush=True,
        )
    return dict(meta=meta, rows=rows)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--sizes", default="base,large,modern", help="comma list of " + ", ".join(SIZES))
    add("--seq_lens", default="", help="comma list of T for every size (default: per size)")
    add("--packed", default="false,true", help="'false', 'true' or both")
    add("--attention", default="einsum,xla,cudnn", help="our attention implementations")
    add("--peer", default="torch", choices=("torch", "none"), help="the torch peer's rows")
    add("--batch", default="", help="rows per step: one number, or 'base:128=256,large:512=16'")
    add("--steps", type=int, default=20, help="timed steps per row (median kept)")
    add("--warmup", type=int, default=3, help="untimed steps first (>= 1: the first compiles)")
    add("--time_budget_s", type=float, default=480.0, help="rows that no longer fit are skipped")
    add("--output_dir", default=os.environ.get("OUT") or "out/accelerator")
    add("--dtype", default="bfloat16", help="our matmul dtype (params stay f32)")
    add("--scan_layers", type=_bool, default=True, help="nn.scan the layers: faster compiles")
    add("--remat_policy", default="none", help="bert_jax.config.REMAT_POLICIES")
    add("--prng_impl", default="threefry2x32", help="the dropout PRNG (train_state.PRNG_IMPLS)")
    # Uniform lengths leave about half of an unpacked row padding (IMDB reviews at T=512: 56%,
    # benchmarks/results/packing.md); a corpus of long documents fills its rows (Shakespeare
    # at 128: 12%).
    add("--full_fraction", type=float, default=0.0, help="instances that fill their row")
    add("--max_instances_per_row", type=int, default=4, help="instance slots of a packed row")
    add("--rows", default="*", help="comma list of row id patterns (fnmatch) to run")
    add(
        "--profile",
        default="",
        help="comma list of row ids (patterns) to trace with jax's "
        "profiler: a Perfetto trace and the busiest ops per step in the report",
    )
    add("--seed", type=int, default=0)
    add("--peak_tflops", type=float, default=None, help="the chip's peak, where the table lacks it")
    args = parser.parse_args(argv)
    if args.warmup < 1 or args.steps < 1:
        parser.error("--warmup and --steps must be >= 1")
    for size in args.sizes.split(","):
        if size not in SIZES:
            parser.error(f"unknown size {size!r}: use {', '.join(SIZES)}")
    args.argv = argv
    return args


def _bool(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return text.lower() == "true"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    report = run(args)
    print(markdown(report["rows"], report["meta"]))


if __name__ == "__main__":
    main()
