"""Stage 6 of the demo (`experiments.demo`): the report of a finished run.

`<workdir>/results.md` (the table the demo prints), `results.json` and `curves.png`: test
score against label budget for both arms (pretrained and from scratch), with the paired
difference and its 95% interval; the pretraining curves from the run's metrics.jsonl; and,
for the NER task, the pretrained model filling in masked entities of held-out sentences
(`fill_mask_examples`; not for an ELECTRA recipe, whose encoder has no MLM head). The
run's settings come in as `flags` (flag name -> value, the task's defaults applied), so
nothing here reads the command line.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from experiments.configs import demo_arms

ARMS = ("pretrained", "scratch")
# The held-out pretraining metrics results.json keeps (ELECTRA's: its generator's MLM and
# the discriminator's accuracy).
HELD_OUT_METRICS = ("step", "loss", "mlm_accuracy", "nsp_accuracy", "disc_accuracy")
NER_TASK = "peoples_daily_ner"


def _points(values: list[float]) -> str:
    return " ".join(f"{100 * v:.1f}" for v in values)


def _mean_std(values: list[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    variance = sum((v - mean) ** 2 for v in values) / max(len(values) - 1, 1)
    return mean, math.sqrt(variance)


def fill_mask_examples(pretrain_dir: str, vocab: str, count: int = 6) -> list[dict]:
    """The pretrained MLM on held-out NER test sentences with one entity masked: the first
    sentences of at most 40 characters holding a 2-3 character entity, two of each type."""
    from bert_jax import convert
    from data_pipelines.tasks.tagging_tasks import load_tagging_task
    from data_pipelines.tokenization import load_tokenizer
    from experiments import label_budgets as lb

    task = load_tagging_task(NER_TASK)
    chosen, per_type = [], {}
    for example in task.splits["test"]:
        spans = [s for s in lb.entity_spans(example) if 2 <= s[1] - s[0] <= 3]
        if len(example.words) > 40 or not spans:
            continue
        kind = example.tags[spans[0][0]][2:]
        if per_type.get(kind, 0) < count // 3:
            per_type[kind] = per_type.get(kind, 0) + 1
            chosen.append((example, spans[0]))
    config, params, _ = convert.load_pretrained(pretrain_dir, model="auto")
    from bert_jax.heads import BertForPreTraining

    module = BertForPreTraining(config, next_sentence=False)
    return lb.fill_mask(module, params, load_tokenizer(vocab, do_lower_case=True), chosen)


def report(
    workdir: str, pretrain_dir: str, finetuning: dict, extra: dict, flags: dict[str, Any]
) -> str:
    """Writes results.md / results.json / curves.png; returns the Markdown report.

    Args:
        flags: the demo's settings by flag name (the task's defaults applied): task, recipe, seed,
            test_sentences, corpora, pretrain_steps, pretrain_batch_size,
            pretrain_learning_rate, pretrain_optimizer, max_seq_length.
    """
    from bert_jax import telemetry

    pretraining = telemetry.read_metrics(os.path.join(pretrain_dir, "metrics.jsonl"))
    evals = [r for r in pretraining if r["split"] == "eval"]
    budgets = finetuning["budgets"]
    ner = flags["task"] == "ner"
    metric = "entity F1" if ner else "accuracy"
    linear = {row["labels"]: row["linear"] for row in finetuning.get("linear", [])}
    objective = demo_arms.ARMS[flags["recipe"]].objective if ner else "mlm_nsp"
    text = (
        _budget_table(budgets, linear, metric)
        + _run_note(budgets, evals[-1], objective, ner, flags)
        + _details(budgets, linear, finetuning.get("optimizer_comparison"), extra)
    )
    summary = _summary(finetuning, extra, flags, objective, evals, ner)
    with open(os.path.join(workdir, "results.md"), "w", encoding="utf-8") as f:
        f.write(text)
    with open(os.path.join(workdir, "results.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2, ensure_ascii=False)
    plot(os.path.join(workdir, "curves.png"), pretraining, budgets, metric)
    return text


def _budget_table(budgets: list[dict], linear: dict[int, list[float]], metric: str) -> str:
    """The Markdown table: per label budget, each arm's mean ± std, the paired gain with its
    interval and, when the run has it, the linear tagger's score."""
    rows = [f"| labelled sentences | pretrained, test {metric} | from scratch | "
            "gain (points), 95% interval |" + (" linear tagger |" if linear else ""),
            "| ---: | ---: | ---: | ---: |" + (" ---: |" if linear else "")]  # fmt: skip
    for budget in budgets:
        (pre, pre_std), (scr, scr_std) = (_mean_std(budget[arm]) for arm in ARMS)
        d = budget["difference"]
        row = (f"| {budget['labels']:,} | {100 * pre:.1f} ± {100 * pre_std:.1f} | "
               f"{100 * scr:.1f} ± {100 * scr_std:.1f} | {100 * d['mean']:+.1f} "
               f"[{100 * d['low']:+.1f}, {100 * d['high']:+.1f}] |")  # fmt: skip
        if budget["labels"] in linear:
            lin, lin_std = _mean_std(linear[budget["labels"]])
            row += f" {100 * lin:.1f} ± {100 * lin_std:.1f} |"
        rows.append(row)
    return "\n".join(rows)


def _run_note(
    budgets: list[dict], final: dict, objective: str, ner: bool, flags: dict[str, Any]
) -> str:
    """The paragraph under the table: the test set, the runs per budget and the pretraining
    run with its last held-out metrics (`final`)."""
    runs = len(budgets[0]["pretrained"])
    if objective == "electra":  # its MLM is the generator's; the encoder is the discriminator
        heldout = (f"held-out MLM accuracy of the generator {final['mlm_accuracy']:.1%}, "
                   f"replaced-token detection accuracy {final['disc_accuracy']:.1%}")  # fmt: skip
    else:
        heldout = f"held-out MLM accuracy {final['mlm_accuracy']:.1%}" + (
            "" if ner else f", NSP accuracy {final['nsp_accuracy']:.1%}"
        )
    what = (
        f"People's Daily NER (PER/LOC/ORG), test n={flags['test_sentences'] or 2000:,}" if ner
        else "Sentence polarity (Rotten Tomatoes), test n=1,000"
    )  # fmt: skip
    return (
        f"\n\n{what}, mean ± std over {runs} {'label subsets' if ner else 'fine-tuning seeds'}"
        " per budget, shared by both arms; the gain is the mean paired difference with its 95%"
        f" t-interval. Pretraining ({flags['recipe']} recipe"
        + (f", `{flags['pretrained_dir']}`" if flags.get("pretrained_dir") else "")
        + f") on {'+'.join(flags['corpora'])} "
        f"(seed {flags['seed']}, "
        f"{final['step']} steps): {heldout}.\n"
    )


def _details(
    budgets: list[dict], linear: dict[int, list[float]], comparison: dict | None, extra: dict
) -> str:
    """What follows: the linear tagger's note, every subset's scores, the fine-tuning
    optimizer comparison and the masked entities filled in, each when the run has it."""
    text = ""
    if linear:
        text += (
            "\nThe linear tagger: a logistic regression on character windows "
            "(benchmarks.ner_linear_reference), the same subsets, dev and test sentences.\n"
        )
    text += "\nPer subset (pretrained / scratch):\n\n" + "".join(
        f"- {b['labels']:,}: {_points(b['pretrained'])} / {_points(b['scratch'])}\n"
        for b in budgets
    )
    if comparison:
        first = budgets[0]
        text += (
            f"\nFine-tuning optimizer at {first['labels']:,} labels (same subsets; the learning"
            " rate chosen by the same rule), mean test F1 pretrained / scratch: "
            + ", ".join(
                f"{b['optimizer']} {100 * _mean_std(b['pretrained'])[0]:.1f} / "
                f"{100 * _mean_std(b['scratch'])[0]:.1f}"
                for b in (first, comparison)
            )
            + ".\n"
        )
    if extra.get("fill_mask"):
        text += (
            "\nThe pretrained model fills in a masked entity of held-out test sentences (its"
            " top 5 per character):\n\n"
        )
    for item in extra.get("fill_mask", []):
        guesses = " | ".join(" ".join(p) for p in item["predictions"])
        text += f"- {item['text']} ({item['type']} {item['entity']}): {guesses}\n"
    return text


def _summary(
    finetuning: dict, extra: dict, flags: dict[str, Any], objective: str, evals: list[dict],
    ner: bool,
) -> dict:  # fmt: skip
    """results.json: the fine-tuning results, the pretraining run's settings and its held-out
    metrics, and `extra` (the filled-in entities, the wall time)."""
    return {
        "task": NER_TASK if ner else "polarity",
        "seed": flags["seed"],
        "label_budgets": finetuning["budgets"],
        **{k: v for k, v in finetuning.items() if k != "budgets"},
        "pretraining": {
            "recipe": flags["recipe"],
            "pretrained_dir": flags.get("pretrained_dir"),
            "corpora": flags["corpora"],
            "steps": flags["pretrain_steps"],
            "batch_size": flags["pretrain_batch_size"],
            "learning_rate": flags["pretrain_learning_rate"],
            "optimizer": flags["pretrain_optimizer"],
            "objective": objective,
            "max_seq_length": flags["max_seq_length"],
            "held_out": [{k: r[k] for k in HELD_OUT_METRICS if k in r} for r in evals],
        },
        **extra,
    }


def plot(path: str, pretraining: list[dict], budgets: list[dict], metric: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from scipy import stats

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    labels = [b["labels"] for b in budgets]
    for arm, name in zip(ARMS, ("pretrained", "from scratch"), strict=True):
        stat = [_mean_std(b[arm]) for b in budgets]
        half = [
            stats.t.ppf(0.975, len(b[arm]) - 1) * s / math.sqrt(len(b[arm]))
            for b, (_, s) in zip(budgets, stat, strict=True)
        ]
        axes[0].errorbar(
            labels, [100 * m for m, _ in stat], [100 * h for h in half], marker="o",
            capsize=3, label=f"{name} (95% interval of the mean)",
        )  # fmt: skip
    axes[0].set(title=f"test {metric}", xlabel="labelled sentences", xscale="log",
                ylabel=f"{metric} (%)")  # fmt: skip
    for split, style in (("train", "-"), ("eval", "o--")):
        points = [r for r in pretraining if r["split"] == split and "loss" in r]
        axes[1].plot([r["step"] for r in points], [r["loss"] for r in points], style, label=split)
    axes[1].set(title="pretraining loss", xlabel="step", ylabel="loss")
    evals = [r for r in pretraining if r["split"] == "eval"]
    axes[2].plot([r["step"] for r in evals], [100 * r["mlm_accuracy"] for r in evals], "o-",
                 label="held out")  # fmt: skip
    axes[2].set(title="pretraining, masked-LM accuracy", xlabel="step", ylabel="accuracy (%)")
    for ax in axes:
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
