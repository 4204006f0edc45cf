r"""Plots a pretraining run's curves from `<workdir>/metrics.jsonl` into one PNG.

  python -m experiments.plot_metrics WORKDIR [--output=PNG]

e.g. `python -m experiments.plot_metrics workdirs/tiny` writes workdirs/tiny/metrics.png.

Panels: loss, MLM accuracy and NSP accuracy (train and held-out eval), learning rate,
gradient and update norms, and throughput (sequences/s) with MFU. A resumed run logs
the steps after its checkpoint again; the last record of each step wins, as it is the
one the finished run's state descends from.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

from absl import app, flags, logging

from bert_jax import telemetry
from bert_jax.telemetry import SPLITS, MetricsFileError
from data_pipelines import cli

METRICS_FILE = "metrics.jsonl"

# (title, metrics on the left axis, its label, log scale, metric on a right-hand axis)
PANELS: tuple[tuple[str, tuple[str, ...], str, bool, str | None], ...] = (
    ("loss (MLM + NSP)", ("loss",), "", False, None),
    ("MLM accuracy", ("mlm_accuracy",), "", False, None),
    ("NSP accuracy", ("nsp_accuracy",), "", False, None),
    ("learning rate", ("learning_rate",), "", False, None),
    ("gradient and update norms", ("grad_norm", "update_norm"), "global L2 norm", True, None),
    ("throughput", ("sequences_per_second",), "sequences / s", False, "mfu"),
)

Records = dict[str, dict[int, dict[str, float]]]  # split -> step -> scalars


def read_metrics(path: str) -> Records:
    """A metrics.jsonl by split and step (`telemetry.read_metrics`: the last record of a step
    wins).

    Raises:
      MetricsFileError: the file is missing or empty, or a line is not a JSON object with
        an integer `step`, a `split` in SPLITS and numeric scalars.
    """
    records: Records = {split: {} for split in SPLITS}
    for record in telemetry.read_metrics(path):
        scalars = {k: v for k, v in record.items() if k not in ("step", "split")}
        records[record["split"]][record["step"]] = scalars
    return records


def curve(records: Records, split: str, metric: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one metric in one split, by step; steps lacking it are skipped."""
    by_step = records[split]
    steps = sorted(s for s in by_step if metric in by_step[s])
    return steps, [by_step[s][metric] for s in steps]


def build_figure(records: Records, title: str = ""):
    """A matplotlib `Figure` (Agg canvas, no pyplot state) with one axis per panel."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(15, 8.5), layout="constrained")
    axes = figure.subplots(2, 3).ravel()
    for ax, (panel_title, metrics, ylabel, log_scale, right) in zip(axes, PANELS, strict=True):
        ax.set_title(panel_title)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        drawn = 0
        for metric in metrics:
            for split in SPLITS:
                steps, values = curve(records, split, metric)
                if not steps:
                    continue
                label = f"{split} {metric}" if len(metrics) > 1 else split
                style = "-" if split == "train" else "o-"
                ax.plot(steps, values, style, label=label, markersize=3)
                drawn += 1
        if right is not None:
            steps, values = curve(records, "train", right)
            if steps:
                twin = ax.twinx()
                twin.plot(steps, values, "--", color="tab:red", label=right)
                twin.set_ylabel(right, color="tab:red")
                drawn += 1
        if log_scale and drawn and all(v > 0 for m in metrics for v in _values(records, m)):
            ax.set_yscale("log")
        if drawn:
            ax.legend(loc="best", fontsize="small")
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
        ax.grid(alpha=0.3)
    if title:
        figure.suptitle(title)
    return figure


def _values(records: Records, metric: str) -> list[float]:
    return [v for split in SPLITS for v in curve(records, split, metric)[1] if math.isfinite(v)]


def plot_metrics(workdir: str, output: str | None = None) -> str:
    """Writes the PNG of `<workdir>/metrics.jsonl` (default `<workdir>/metrics.png`)."""
    records = read_metrics(os.path.join(workdir, METRICS_FILE))
    output = output or os.path.join(workdir, "metrics.png")
    figure = build_figure(records, title=os.path.basename(os.path.normpath(workdir)))
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    partial = output + ".tmp"  # never leave a half-written PNG under the final name
    figure.savefig(partial, format="png", dpi=100)
    os.replace(partial, output)
    return output


FLAGS = flags.FLAGS


def main(argv: Sequence[str]) -> None:
    if len(argv) != 2:
        raise app.UsageError("usage: python -m experiments.plot_metrics WORKDIR [--output=PNG]")
    try:
        output = plot_metrics(argv[1], FLAGS.output)
    except MetricsFileError as e:
        raise SystemExit(f"plot_metrics: {e}") from None
    logging.info("wrote %s", output)


if __name__ == "__main__":
    flags.DEFINE_string("output", None, "PNG to write (default: WORKDIR/metrics.png).")
    cli.run(main)
