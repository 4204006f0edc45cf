"""The report of experiments.recipe_compare: comparison.md, comparison.json and curves.png.

Per label budget, every arm's test entity F1 over all its (seed, subset) runs, its gain over
scratch of its own architecture and its difference from the reference arm, both paired by
(seed, subset) with 95% t-intervals; the linear tagger on the same subsets; per arm the
pretraining's steps, model FLOPs, seconds per step and final held-out MLM accuracy (15% of
the characters masked in every arm); one plot of every arm's held-out MLM curve.
"""

from __future__ import annotations

import json
import os

import numpy as np

from experiments.label_budgets import paired_difference

COMPARISON_VERSION = 1  # comparison.json's schema (bumped when a key changes meaning)
# An ELECTRA arm's held-out MLM is its generator's (a quarter of the encoder's width).
_GENERATOR = " (generator)"
_GENERATOR_NOTE = (
    "; an ELECTRA arm's is its generator's, a quarter of the width of the encoder it "
    "fine-tunes (the discriminator): compare those arms by their fine-tuning"
)


def _generator(info: dict) -> str:
    """The mark of an ELECTRA arm's held-out MLM (its generator's), else nothing."""
    return _GENERATOR if info.get("objective") == "electra" else ""


def _f1(run: dict, labels: int, arm: str) -> list[float]:
    budget = next(b for b in run["label_budgets"] if b["labels"] == labels)
    return budget[arm]


def _interval(d: dict) -> str:
    return f"{100 * d['mean']:+.1f} [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}]"


def summarise(arms: dict, runs: dict, linear: dict, reference: str) -> dict:
    """comparison.json's content: `runs` maps (arm, seed) to that demo's results.json."""
    seeds = sorted({seed for _, seed in runs})
    budgets = [b["labels"] for b in runs[reference, seeds[0]]["label_budgets"]]
    table = []
    for labels in budgets:
        row = {"labels": labels, "arms": {}}
        ref = [f for s in seeds for f in _f1(runs[reference, s], labels, "pretrained")]
        for arm in arms:
            pre = [f for s in seeds for f in _f1(runs[arm, s], labels, "pretrained")]
            scratch = [f for s in seeds for f in _f1(runs[arm, s], labels, "scratch")]
            row["arms"][arm] = {
                "pretrained": pre,
                "scratch": scratch,
                "gain": paired_difference(pre, scratch),
                "vs_reference": None if arm == reference else paired_difference(pre, ref),
            }
        if linear:
            lin = [f for s in seeds for b in linear[s]["label_budgets"] if b["labels"] == labels
                   for f in b["linear"]]  # fmt: skip
            row["linear"] = lin
            row["reference_vs_linear"] = paired_difference(ref, lin)
        table.append(row)
    pretraining = {}
    for arm, info in arms.items():
        held = {s: runs[arm, s]["pretraining"]["held_out"] for s in seeds}
        wall = {s: runs[arm, s].get("wall_time_s", {}).get("pretrain") for s in seeds}
        pretraining[arm] = info | {"held_out": held, "pretrain_wall_s": wall}
    return {"version": COMPARISON_VERSION, "reference": reference, "seeds": seeds,
            "arms": pretraining, "budgets": table}  # fmt: skip


def report(workdir: str, arms: dict, runs: dict, linear: dict, reference: str,
           calibration: dict | None) -> str:  # fmt: skip
    """Writes comparison.md / comparison.json / curves.png; returns the Markdown."""
    summary = summarise(arms, runs, linear, reference)
    summary["calibration"] = calibration
    seeds = summary["seeds"]
    timed = (calibration or {}).get("arms", {})
    lines = ["| arm | what changes | steps | model PFLOPs | s/step | held-out MLM |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for arm, info in summary["arms"].items():
        mlm = " / ".join(f"{100 * info['held_out'][s][-1]['mlm_accuracy']:.1f}%" for s in seeds)
        mlm += _generator(info)
        rate = timed.get(arm, {}).get("seconds_per_step")
        lines.append(f"| {arm} | {info['description']} | {info['steps']:,} | "
                     f"{info['pretrain_flops'] / 1e15:.2f} | "
                     f"{'-' if rate is None else f'{rate:.3f}'} | {mlm} |")  # fmt: skip
    text = "\n".join(lines) + (
        f"\n\nPretraining at equal wall time (the reference, {reference}, takes the demo's steps);"
        f" held-out MLM accuracy at the end, 15% masked, seed {' / '.join(map(str, seeds))}"
        f"{_GENERATOR_NOTE if any(map(_generator, summary['arms'].values())) else ''}.\n"
    )
    for row in summary["budgets"]:
        text += (f"\n**{row['labels']:,} labelled sentences** (test entity F1 %, mean ± std over "
                 f"{len(row['arms'][reference]['pretrained'])} runs: seeds x subsets)\n\n"
                 f"| arm | pretrained | scratch (same architecture) | gain over scratch | "
                 f"minus {reference} |\n| --- | ---: | ---: | ---: | ---: |\n")  # fmt: skip
        for arm, cell in row["arms"].items():
            pre, scr = np.asarray(cell["pretrained"]), np.asarray(cell["scratch"])
            versus = "-" if cell["vs_reference"] is None else _interval(cell["vs_reference"])
            text += (f"| {arm} | {100 * pre.mean():.1f} ± {100 * pre.std(ddof=1):.1f} | "
                     f"{100 * scr.mean():.1f} ± {100 * scr.std(ddof=1):.1f} | "
                     f"{_interval(cell['gain'])} | {versus} |\n")  # fmt: skip
        if "linear" in row:
            lin = np.asarray(row["linear"])
            text += (f"| linear tagger (character windows) | {100 * lin.mean():.1f} ± "
                     f"{100 * lin.std(ddof=1):.1f} | | | {reference} minus linear: "
                     f"{_interval(row['reference_vs_linear'])} |\n")  # fmt: skip
    with open(os.path.join(workdir, "comparison.md"), "w", encoding="utf-8") as f:
        f.write(text)
    with open(os.path.join(workdir, "comparison.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    plot(os.path.join(workdir, "curves.png"), summary)
    return text


def plot(path: str, summary: dict) -> None:
    """Held-out MLM accuracy against pretraining FLOPs, every arm (each seed a line), and
    test F1 against label budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for i, (arm, info) in enumerate(summary["arms"].items()):
        color = f"C{i}"
        for k, (seed, held) in enumerate(info["held_out"].items()):
            flops = [r["step"] * info["flops_per_step"] / 1e15 for r in held]
            accuracy = [100 * r["mlm_accuracy"] for r in held]
            style = "o-" if k == 0 else "s--"
            axes[0].plot(flops, accuracy, style, color=color,
                         label=f"{arm}{_generator(info)} (seed {seed})",
                         markersize=3)  # fmt: skip
        labels = [row["labels"] for row in summary["budgets"]]
        means = [100 * np.mean(row["arms"][arm]["pretrained"]) for row in summary["budgets"]]
        axes[1].plot(labels, means, "o-", color=color, label=arm)
    if summary["budgets"] and "linear" in summary["budgets"][0]:
        axes[1].plot([r["labels"] for r in summary["budgets"]],
                     [100 * np.mean(r["linear"]) for r in summary["budgets"]], "k:",
                     label="linear tagger")  # fmt: skip
    axes[0].set(title="held-out masked LM (15% masked)", xlabel="pretraining model PFLOPs",
                ylabel="accuracy (%)")  # fmt: skip
    axes[1].set(title="test entity F1, pretrained", xlabel="labelled sentences", xscale="log",
                ylabel="F1 (%)")  # fmt: skip
    for ax in axes:
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
