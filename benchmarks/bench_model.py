r"""Side-by-side speed of BERT pretraining steps: bert_jax vs transformers' Flax and PyTorch.

Measures, at the same shapes on the same random batch (numpy, seeded, shared as .npz):

- `fwdbwd`: loss and gradients w.r.t. every parameter (training mode, dropout on) of the
  encoder + MLM + NSP heads; the loss is MLM cross-entropy at the masked positions plus
  NSP cross-entropy (the HF models compute MLM logits at every position and take the
  loss through `-100` labels, as they are used);
- `train`: the full training step, the above plus AdamW (weight decay 0.01, not on
  biases/LayerNorm): `optax.adamw` for both jax models, `torch.optim.AdamW` for torch;
- `peak`: large matmuls (f32, and bf16 inputs with f32 accumulation) in jax and torch,
  the reference for model-FLOPs utilisation (MFU).

Every peer runs in its own worker process (see `benchmarks/peers.py`); the HF Flax peer
in `.bench_venvs/hf-flax`, created on first use. Steps are interleaved across peers
within each repetition (the start rotates), warm-up excluded; figures are medians and
inter-quartile ranges over all timed steps.

Examples:
  python -m benchmarks.bench_model --sizes=mini --modes=fwdbwd --output_json=/tmp/b.json
  python -m benchmarks.bench_model --sizes=mini,base --modes=fwdbwd,train --reps=10
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np
from tqdm import tqdm

from benchmarks import peers
from bert_jax import telemetry

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEERS_SCRIPT = os.path.join(ROOT, "benchmarks", "peers.py")

# name: (layers, hidden, heads, default batch), intermediate = 4 * hidden.
SIZES = {
    "tiny": (2, 128, 2, 16),
    "mini": (4, 256, 4, 16),
    "base": (12, 768, 12, 8),
    "large": (24, 1024, 16, 8),
}
# Our variants: compute dtype and whether the layers are scanned.
OURS_VARIANTS = {
    "f32": ("float32", False),
    "bf16": ("bfloat16", False),
    "f32_scan": ("float32", True),
    "bf16_scan": ("bfloat16", True),
}


def make_inputs(batch: int, seq: int, preds: int, vocab: int, seed: int) -> dict[str, np.ndarray]:
    """A packed pretraining batch in the original BERT feature layout, from `seed`."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, vocab, size=(batch, seq), dtype=np.int32)
    split = rng.integers(seq // 4, 3 * seq // 4, size=batch)
    ids[:, 0] = 101  # [CLS]
    ids[np.arange(batch), split] = 102  # [SEP] after segment A
    ids[:, -1] = 102
    segment = (np.arange(seq)[None, :] > split[:, None]).astype(np.int32)
    positions = np.stack(
        [
            np.sort(rng.choice(np.arange(1, seq - 1), size=preds, replace=False))
            for _ in range(batch)
        ]
    ).astype(np.int32)
    return {
        "input_ids": ids,
        "input_mask": np.ones((batch, seq), np.int32),
        "segment_ids": segment,
        "masked_lm_positions": positions,
        "masked_lm_ids": rng.integers(1000, vocab, size=(batch, preds), dtype=np.int32),
        "masked_lm_weights": np.ones((batch, preds), np.float32),
        "next_sentence_labels": rng.integers(0, 2, size=(batch,), dtype=np.int32),
    }


def model_dims(size: str, vocab: int) -> dict[str, int]:
    """The "model" entry of a worker spec: what every peer builds its BERT from."""
    layers, hidden, heads, _ = SIZES[size]
    return dict(vocab_size=vocab, hidden_size=hidden, num_layers=layers, num_heads=heads)


def train_flops(dims: dict[str, int], batch: int, seq: int, predictions: int) -> float:
    """Model FLOPs of one training step with MLM logits at `predictions` rows a sequence.

    `bert_jax.telemetry.train_flops_per_step` of the config our worker builds from `dims`:
    the count training logs its MFU with (matmuls only, backward = 2x forward;
    tests/test_model_flops.py checks it against the model).
    """
    return telemetry.train_flops_per_step(peers.ours_config(dims), batch, seq, predictions)


class Worker:
    """One peer process speaking the JSON-lines protocol of `peers.worker_main`."""

    def __init__(self, label: str, python: str, spec: dict[str, Any], log_path: str, env=None):
        self.label = label
        self.log_path = log_path
        self._log = open(log_path, "w", encoding="utf-8")
        self.proc = subprocess.Popen(
            [python, PEERS_SCRIPT, json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            cwd=ROOT,
            env=env,
        )
        self.info = self._read()

    def _read(self) -> dict[str, Any]:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            with open(self.log_path, encoding="utf-8") as f:
                tail = f.read()[-4000:]
            raise RuntimeError(
                f"worker {self.label} exited with {self.proc.returncode}; "
                f"log {self.log_path}:\n{tail}"
            )
        return json.loads(line)

    def time(self, case: str, iters: int) -> list[float]:
        self.proc.stdin.write(json.dumps({"case": case, "iters": iters}) + "\n")
        self.proc.stdin.flush()
        return self._read()["times"]

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.write(json.dumps({"quit": True}) + "\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=60)
        self._log.close()


def plan_size(args, size: str) -> list[dict[str, Any]]:
    """The workers for one model size: peer, python, and the cases each one builds."""
    batch = args.batch or SIZES[size][3]
    model = model_dims(size, args.vocab)
    shape = dict(batch=batch, seq=args.seq, preds=args.preds)
    plans = []
    flag_sets = args.ours_xla_flags.split(";")
    roots = args.ours_roots.split(";") if args.ours_roots else [ROOT]
    combos = [
        (prng, flags, root)
        for prng in args.ours_prng.split(",")
        for flags in flag_sets
        for root in roots
    ]
    for index, (prng, flags, root) in enumerate(combos if "ours" in args.peers else []):
        tag = prng + (f",xla{flag_sets.index(flags)}" if len(flag_sets) > 1 else "")
        tag += f",src{roots.index(root)}" if len(roots) > 1 else ""
        cases = [
            dict(
                name=f"ours[{v},{tag}]",
                mode=m,
                dtype=OURS_VARIANTS[v][0],
                scan=OURS_VARIANTS[v][1],
                peer="ours",
                variant=v,
                xla_flags=flags,
                **shape,
            )
            for m in args.modes
            if m != "peak"
            for v in args.ours_variants.split(",")
        ]
        if index == 0 and "peak" in args.modes:
            cases += [
                dict(name=f"peak[jax,{d}]", mode="matmul", n=args.peak_n, dtype=d, peer="peak")
                for d in ("float32", "bfloat16")
            ]
        plans.append(
            dict(
                peer="ours",
                label=f"ours-{tag.replace(',', '-')}",
                python=sys.executable,
                prng_impl=prng,
                xla_flags=flags,
                root=os.path.abspath(root),
                model=model,
                cases=cases,
            )
        )
    peer_dtypes = ["float32"] + (["bfloat16"] if args.peer_bf16 else [])
    for peer in ("hf_flax", "torch"):
        if peer not in args.peers:
            continue
        cases = [
            dict(
                name=f"{peer}[{'f32' if d == 'float32' else 'bf16'}]",
                mode=m,
                dtype=d,
                peer=peer,
                variant=d,
                **shape,
            )
            for m in args.modes
            if m != "peak"
            for d in peer_dtypes
        ]
        if peer == "torch" and "peak" in args.modes:
            # f32 only: torch's bf16 matmul on a CPU without AVX512-BF16/AMX runs at ~1
            # GFLOP/s here, a minute per timed product at the peak size.
            cases += [
                dict(
                    name="peak[torch,float32]",
                    mode="matmul",
                    n=args.peak_n,
                    dtype="float32",
                    peer="peak",
                )
            ]
        python = sys.executable
        if peer == "hf_flax":
            python = peers.ensure_hf_flax_venv(ROOT, log=logging.info)
        plans.append(dict(peer=peer, label=peer, python=python, model=model, cases=cases))
    for plan in plans:  # a case name is unique within a size: prefix the mode
        for case in plan["cases"]:
            if case["mode"] != "matmul":
                case["name"] = f"{case['mode']}:{case['name']}"
    return plans


def summarise(times: list[float]) -> dict[str, float]:
    q25, median, q75 = np.percentile(times, [25, 50, 75])
    return dict(
        median_s=float(median),
        q25_s=float(q25),
        q75_s=float(q75),
        min_s=float(np.min(times)),
        n=len(times),
    )


def run_size(args, size: str, workdir: str) -> dict[str, Any]:
    """Builds every worker for `size`, times all cases interleaved, returns the records."""
    batch = args.batch or SIZES[size][3]
    inputs_path = os.path.join(workdir, f"inputs_{size}.npz")
    np.savez(inputs_path, **make_inputs(batch, args.seq, args.preds, args.vocab, args.seed))
    workers, order = [], []
    try:
        for plan in plan_size(args, size):
            spec = dict(
                peer=plan["peer"],
                inputs=inputs_path,
                model=plan["model"],
                cases=plan["cases"],
                warmup=args.warmup,
                lr=1e-4,
                prng_impl=plan.get("prng_impl"),
            )
            logging.info("%s: building %s (%d cases)", size, plan["label"], len(plan["cases"]))
            # `root` first: bert_jax is imported from there (a baseline checkout or this tree).
            pythonpath = os.pathsep.join(dict.fromkeys([plan.get("root", ROOT), ROOT]))
            env = dict(os.environ, PYTHONPATH=pythonpath, TF_CPP_MIN_LOG_LEVEL="2")
            if plan.get("xla_flags"):
                env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + plan["xla_flags"]).strip()
            log_path = os.path.join(workdir, f"{size}_{plan['label']}.log")
            worker = Worker(plan["label"], plan["python"], spec, log_path, env)
            logging.info(
                "%s: %s ready in %.0f s, versions %s, first losses %s",
                size,
                plan["label"],
                worker.info["build_s"],
                worker.info["versions"],
                worker.info["first_loss"],
            )
            workers.append((worker, plan))
            order += [(worker, case) for case in plan["cases"]]
        times = {case["name"]: [] for _, case in order}
        per_rep = {case["name"]: [] for _, case in order}
        for rep in tqdm(range(args.reps), desc=f"{size} repetitions"):
            shift = rep % len(order)
            for worker, case in order[shift:] + order[:shift]:
                iters = args.peak_iters if case["mode"] == "matmul" else args.iters
                t = worker.time(case["name"], iters)
                times[case["name"]] += t
                per_rep[case["name"]].append(float(np.mean(t)))
    finally:
        for worker, _ in workers:
            worker.close()
    dims = model_dims(size, args.vocab)
    records = []
    for worker, case in order:
        rec = dict(
            size=size,
            case=case["name"],
            peer=case["peer"],
            mode=case["mode"],
            dtype=case["dtype"],
            versions=worker.info["versions"],
            xla_flags=case.get("xla_flags", ""),
            first_loss=worker.info["first_loss"].get(case["name"]),
            per_rep_mean_s=per_rep[case["name"]],
            **summarise(times[case["name"]]),
        )
        if case["mode"] == "matmul":
            rec["gflops"] = 2 * case["n"] ** 3 / rec["median_s"] / 1e9
        else:
            rec.update(
                variant=case["variant"],
                batch=batch,
                seq=args.seq,
                preds=args.preds,
                scan=case.get("scan"),
            )
            rec["useful_flops"] = train_flops(dims, batch, args.seq, args.preds)
            # The HF peers run the MLM decoder over every position.
            rec["executed_flops"] = (
                rec["useful_flops"]
                if case["peer"] == "ours"
                else train_flops(dims, batch, args.seq, args.seq)
            )
            rec["seq_per_s"] = batch / rec["median_s"]
            rec["useful_gflops"] = rec["useful_flops"] / rec["median_s"] / 1e9
        records.append(rec)
    return dict(size=size, records=records)


def ratios(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """peer median / our median for every (our case, peer case) of the same size and mode."""
    out = []
    for ours in (r for r in records if r["peer"] == "ours"):
        for other in (r for r in records if r["peer"] in ("hf_flax", "torch")):
            if (other["size"], other["mode"]) != (ours["size"], ours["mode"]):
                continue
            paired = np.median(np.array(other["per_rep_mean_s"]) / np.array(ours["per_rep_mean_s"]))
            out.append(
                dict(
                    size=ours["size"],
                    mode=ours["mode"],
                    ours=ours["case"],
                    peer=other["case"],
                    speedup=other["median_s"] / ours["median_s"],
                    paired_speedup=float(paired),
                )
            )
    return out


def headline(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Our fastest case against the faster peer, per size and mode."""
    out = []
    for key in sorted({(r["size"], r["mode"]) for r in records if r["mode"] != "matmul"}):
        group = [r for r in records if (r["size"], r["mode"]) == key]
        ours = [r for r in group if r["peer"] == "ours"]
        others = [r for r in group if r["peer"] != "ours"]
        if not ours or not others:
            continue
        best = min(ours, key=lambda r: r["median_s"])
        peer = min(others, key=lambda r: r["median_s"])
        out.append(
            dict(
                size=key[0],
                mode=key[1],
                ours=best["case"],
                faster_peer=peer["case"],
                speedup=peer["median_s"] / best["median_s"],
            )
        )
    return out


def add_mfu(records: list[dict[str, Any]]) -> dict[str, float]:
    """MFU of every step against the best matmul throughput measured in this run."""
    peaks = {r["case"]: r["gflops"] for r in records if r["mode"] == "matmul"}
    if peaks:
        peak = max(peaks.values())
        for r in records:
            if r["mode"] != "matmul":
                r["mfu"] = r["useful_gflops"] / peak
    return peaks


def print_report(result: dict[str, Any]) -> None:
    records = result["records"]
    print("\nmatmul peaks (GFLOP/s):", {k: round(v, 1) for k, v in result["peaks"].items()})
    header = (
        f"{'size':5} {'case':34} {'median ms':>10} {'IQR ms':>15} {'min ms':>7} {'seq/s':>7} "
        f"{'useful GF/s':>11} {'MFU':>6} {'loss0':>6}"
    )
    print("\n" + header + "\n" + "-" * len(header))
    for r in records:
        if r["mode"] == "matmul":
            continue
        mfu = f"{100 * r['mfu']:5.1f}%" if "mfu" in r else "   n/a"
        print(
            f"{r['size']:5} {r['case']:34} {1e3 * r['median_s']:10.1f} "
            f"{1e3 * r['q25_s']:7.1f}-{1e3 * r['q75_s']:<7.1f} {1e3 * r['min_s']:7.1f} "
            f"{r['seq_per_s']:7.1f} "
            f"{r['useful_gflops']:11.1f} {mfu} {r['first_loss']:6.2f}"
        )
    print("\nspeed-up = peer median / our median (paired: median over repetitions)")
    for r in result["ratios"]:
        print(
            f"{r['size']:5} {r['ours']:34} vs {r['peer']:22} {r['speedup']:5.2f}x "
            f"(paired {r['paired_speedup']:5.2f}x)"
        )
    print("\nheadline: our fastest configuration vs the faster peer")
    for h in result["headline"]:
        print(
            f"{h['size']:5} {h['mode']:7} {h['ours']:34} vs {h['faster_peer']:22} "
            f"{h['speedup']:5.2f}x"
        )


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_model",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("Examples:")[1],
    )
    parser.add_argument("--sizes", default="mini", help=f"comma list of {sorted(SIZES)}")
    parser.add_argument(
        "--modes", default="fwdbwd,train,peak", help="comma list of fwdbwd, train, peak"
    )
    parser.add_argument("--peers", default="ours,hf_flax,torch", help="comma list of peers")
    parser.add_argument(
        "--ours_variants",
        default="f32,bf16,f32_scan,bf16_scan",
        help=f"comma list of {list(OURS_VARIANTS)}",
    )
    parser.add_argument(
        "--ours_prng",
        default="threefry2x32",
        help="comma list of jax PRNG implementations for our dropout "
        "(threefry2x32, rbg, unsafe_rbg); one worker each",
    )
    parser.add_argument(
        "--ours_xla_flags",
        default="",
        help="';'-separated XLA_FLAGS sets for our workers, one worker each "
        "(e.g. ';--xla_cpu_use_xnnpack=true'; an empty entry = none); "
        "cases are tagged xla0, xla1, ... in that order",
    )
    parser.add_argument(
        "--ours_roots",
        default="",
        help="';'-separated source trees to import bert_jax from, one worker each, tagged "
        "src0, src1, ... (e.g. a `git archive` of a baseline commit and '.', to compare a "
        "change with its baseline in one interleaved run); default: this tree",
    )
    parser.add_argument(
        "--peer_bf16",
        action="store_true",
        help="also time the peers in bf16 (HF Flax dtype, torch autocast)",
    )
    parser.add_argument(
        "--batch", type=int, default=0, help="0: 16 for tiny and mini, 8 for base and large"
    )
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--preds", type=int, default=20, help="masked positions per sequence")
    parser.add_argument("--vocab", type=int, default=30522)
    parser.add_argument("--reps", type=int, default=10, help="interleaved repetitions")
    parser.add_argument("--iters", type=int, default=2, help="timed steps per case per rep")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per case")
    parser.add_argument("--peak_n", type=int, default=2048, help="matmul size for the peak")
    parser.add_argument("--peak_iters", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output_json", default="", help="write every figure here")
    args = parser.parse_args(argv)
    for name, allowed in (
        ("sizes", SIZES),
        ("ours_variants", OURS_VARIANTS),
        ("modes", ("fwdbwd", "train", "peak")),
        ("peers", ("ours", "hf_flax", "torch")),
    ):
        values = getattr(args, name).split(",")
        bad = [v for v in values if v not in allowed]
        if bad:
            parser.error(f"--{name}: unknown {bad}; choose from {sorted(allowed)}")
        if name in ("modes", "peers"):
            setattr(args, name, values)
    if args.vocab <= 1000:  # make_inputs draws word ids from [1000, vocab)
        parser.error(f"--vocab={args.vocab}: must be above 1000 (ids 0-999 are left unused)")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    result: dict[str, Any] = dict(
        argv=sys.argv,
        started=time.strftime("%Y-%m-%d %H:%M:%S"),
        machine=dict(
            platform=platform.platform(),
            cpus=os.cpu_count(),
            cpu=_cpu_name(),
            load_before=os.getloadavg(),
        ),
        hf_flax_pins=list(peers.HF_FLAX_PINS),
        records=[],
    )
    with tempfile.TemporaryDirectory(prefix="bench_model_") as workdir:
        for size in args.sizes.split(","):
            result["records"] += run_size(args, size, workdir)["records"]
    result["machine"]["load_after"] = os.getloadavg()
    result["peaks"] = add_mfu(result["records"])
    result["ratios"] = ratios(result["records"])
    result["headline"] = headline(result["records"])
    result["mfu_definition"] = (
        "useful FLOPs = 3 x forward matmul FLOPs with MLM logits only at the masked "
        "positions (same count for every peer), over the best matmul GFLOP/s measured in "
        "this run"
    )
    print_report(result)
    if args.output_json:
        tmp = args.output_json + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
        os.replace(tmp, args.output_json)
        logging.info("wrote %s", args.output_json)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    main()
