"""Draws docs/figures/demo_f1.png, the README's demo figure, from demo_results.json.

The figure shows what the README's demo table shows: test entity F1 against the label
budget for the pretrained model, the same architecture from random weights (scratch) and
the linear tagger on character windows, one line per seed. The numbers live in the JSON
(with their date, machine and source) so that the picture is redrawn, never edited.

    python docs/figures/make_demo_figure.py [--results=...] [--output=...]
"""

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server or in CI
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent
# One colour per arm, one line style per seed: the arms must be told apart first.
ARMS = {"pretrained": "tab:blue", "scratch": "tab:orange", "linear": "tab:gray"}
SEED_STYLES = {"0": "-", "1": "--"}
LABELS = {"pretrained": "pretrained", "scratch": "scratch (random init)", "linear": "linear tagger"}


def draw(results: dict, output: Path) -> None:
    budgets = results["labels"]
    fig, ax = plt.subplots(figsize=(5.6, 3.6), dpi=100)
    for seed, arms in results["seeds"].items():
        for arm, colour in ARMS.items():
            mean = arms[arm]["mean"]
            std = arms[arm].get("std")
            ax.errorbar(
                budgets,
                mean,
                yerr=std,
                color=colour,
                linestyle=SEED_STYLES[seed],
                marker="o",
                markersize=4,
                capsize=3,
                label=f"{LABELS[arm]}, seed {seed}",
            )
    ax.set_xscale("log")
    ax.set_xticks(budgets, [f"{b:,}" for b in budgets])
    ax.minorticks_off()
    ax.set_xlabel("labelled sentences")
    ax.set_ylabel("test entity F1 (%)")
    ax.set_ylim(0, 70)
    ax.set_title("make demo: People's Daily NER (mean ± std, 5 subsets)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right", ncol=2)
    stamp = f"{results['date']}, {results['machine'].split(',')[0]}"
    fig.text(0.01, 0.01, stamp, fontsize=6, color="gray")
    fig.tight_layout()
    fig.savefig(output)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=HERE / "demo_results.json", help="JSON in")
    parser.add_argument("--output", type=Path, default=HERE / "demo_f1.png", help="PNG out")
    args = parser.parse_args()
    draw(json.loads(args.results.read_text(encoding="utf-8")), args.output)
    print(f"wrote {args.output} ({args.output.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
