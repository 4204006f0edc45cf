"""The report of `experiments.retrieval_table` (stage 6): results.md, results.json and
retrieval.png from the stages' result JSONs.

Nothing here runs a model or reads the command line: `report` takes the stages' results
(stage name -> the dict it wrote) and the run's settings, so the table, the paired
intervals and the sentences about BM25 are computed the same from a finished run and
from the fake results of a test.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
from typing import Any

METRICS = ("nDCG@10", "MRR@10", "R@1", "R@10", "R@100")
LEE = ("lee_pearson", "lee_spearman")
ARMS = ("pretrained", "scratch")
# The rows of the table: (result name, label, the figure's label).
FIXED_ROWS = (
    ("bm25", "BM25 (bm25s: Lucene's, k1 1.5, b 0.75, English stopwords, no stemming)", "BM25"),
    (
        "minilm_st",
        "all-MiniLM-L6-v2 as published, by sentence-transformers",
        "MiniLM (sentence-transformers)",
    ),
    ("minilm_ours", "all-MiniLM-L6-v2 as published, by bert_jax", "MiniLM (bert_jax)"),
    (
        "pretrained_raw",
        "pretrained here (MLM), no contrastive step: mean-pooled as it is",
        "pretrained here, no contrastive step",
    ),
    (
        "random_raw",
        "random weights, no contrastive step: mean-pooled as initialised",
        "random weights, no contrastive step",
    ),
    (
        "cpt",
        "contrastive pretraining on raw text, zero labels",
        "contrastive pretraining, zero labels",
    ),
)


def arm_runs(results: dict[str, dict], arm: str) -> list[dict]:
    """The finished runs of `arm`, by seed."""
    runs = [r for name, r in results.items() if name.startswith(f"{arm}_seed")]
    return sorted(runs, key=lambda r: r["seed"])


def paired_seeds(results: dict[str, dict]) -> list[int]:
    """The seeds both arms finished."""
    seeds = [{r["seed"] for r in arm_runs(results, arm)} for arm in ARMS]
    return sorted(seeds[0] & seeds[1])


def mean_std(values: list[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, float("nan")
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def intervals(results: dict[str, dict]) -> dict[str, dict[str, float]]:
    """pretrained - scratch per metric over the paired seeds: mean and 95% t-interval (an
    empty dict with fewer than 2 paired seeds)."""
    from bert_jax.retrieval import paired_interval

    seeds = paired_seeds(results)
    if len(seeds) < 2:
        return {}
    by_seed = {arm: {r["seed"]: r for r in arm_runs(results, arm)} for arm in ARMS}
    out = {}
    for metric in METRICS + LEE:
        a = [by_seed["pretrained"][s][metric] for s in seeds]
        b = [by_seed["scratch"][s][metric] for s in seeds]
        interval = paired_interval(a, b)
        out[metric] = {"mean": interval.mean, "low": interval.low, "high": interval.high}
    return out


def bm25_sentences(results: dict[str, dict]) -> list[str]:
    """Where BM25 wins and loses against each dense row, metric by metric, in words."""
    bm25 = results["bm25"]
    rows = [("all-MiniLM-L6-v2", results.get("minilm_ours") or results.get("minilm_st"))]
    for arm in ARMS:
        runs = arm_runs(results, arm)
        if runs:
            rows.append((f"the {arm} encoder (mean of {len(runs)} seeds)",
                         {m: mean_std([r[m] for r in runs])[0] for m in METRICS}))  # fmt: skip
    sentences = []
    for label, row in rows:
        if not row:
            continue
        wins = [m for m in METRICS if bm25[m] > row[m]]
        losses = [m for m in METRICS if bm25[m] < row[m]]
        gaps = ", ".join(f"{m} {100 * (bm25[m] - row[m]):+.1f}" for m in METRICS)
        if not losses:
            verdict = "BM25 is ahead on every metric"
        elif not wins:
            verdict = "BM25 is behind on every metric"
        else:
            verdict = f"BM25 is ahead on {', '.join(wins)} and behind on {', '.join(losses)}"
        sentences.append(f"Against {label}: {verdict} (BM25 minus it, points: {gaps}).")
    return sentences


def _cell(value: float | None) -> str:
    return "" if value is None else f"{100 * value:.1f}"


def _row(label: str, values: dict, wall: str = "") -> str:
    cells = [_cell(values.get(m)) for m in METRICS] + [
        "" if values.get(k) is None else f"{values[k]:.3f}" for k in LEE
    ]
    return f"| {label} | " + " | ".join(cells) + f" | {wall} |"


def _minutes(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds / 60:.1f} min"


def table(results: dict[str, dict]) -> list[str]:
    """The Markdown table: fixed rows, each arm's mean ± std, the paired difference."""
    head = ("| system | " + " | ".join(METRICS) + " | Lee r | Lee ρ | wall |",
            "| --- |" + " ---: |" * (len(METRICS) + 3))  # fmt: skip
    lines = list(head)
    for name, label, _ in FIXED_ROWS:
        if name in results:
            lines.append(_row(label, results[name], _minutes(results[name].get("wall_seconds"))))
    for arm in ARMS:
        runs = arm_runs(results, arm)
        if not runs:
            continue
        cells = []
        for key in METRICS + LEE:
            mean, std = mean_std([r[key] for r in runs])
            scale, digits = (100, 1) if key in METRICS else (1, 3)
            spread = "" if math.isnan(std) else f" ± {scale * std:.{digits}f}"
            cells.append(f"{scale * mean:.{digits}f}{spread}")
        chain = _chain(results)
        label = {"pretrained": f"pretrained here ({chain}) + contrastive, all pairs",
                 "scratch": "random weights + contrastive (scratch), all pairs"}[arm]  # fmt: skip
        wall = sum(r["wall_seconds"] for r in runs) / len(runs)
        lines.append(f"| {label}, {len(runs)} seeds | " + " | ".join(cells)
                     + f" | {_minutes(wall)} a seed |")  # fmt: skip
    gain = intervals(results)
    if gain:
        cells = []
        for key in METRICS + LEE:
            g = gain[key]
            scale, digits = (100, 1) if key in METRICS else (1, 3)
            cells.append(f"{scale * g['mean']:+.{digits}f} [{scale * g['low']:+.{digits}f}, "
                         f"{scale * g['high']:+.{digits}f}]")  # fmt: skip
        lines.append("| pretrained − scratch, paired by seed (95% t-interval) | "
                     + " | ".join(cells) + " | |")  # fmt: skip
    return lines


def budget_lines(results: dict[str, dict]) -> list[str]:
    """nDCG@10 of both arms at each pair budget (all pairs last), the paired difference."""
    from bert_jax.retrieval import paired_interval

    budgets = sorted({r["budget"] for r in results.values() if r.get("budget")})
    rows = []
    for budget in [*budgets, None]:
        runs = {
            arm: {
                r["seed"]: r["nDCG@10"]
                for r in results.values()
                if r.get("arm") == arm and r.get("budget") == budget
            }
            for arm in ARMS
        }
        seeds = sorted(set(runs["pretrained"]) & set(runs["scratch"]))
        if not seeds:
            continue
        a, b = ([runs[arm][s] for s in seeds] for arm in ARMS)
        gap = ""
        if len(seeds) >= 2:
            g = paired_interval(a, b)
            gap = f"{100 * g.mean:+.1f} [{100 * g.low:+.1f}, {100 * g.high:+.1f}]"
        pairs = f"{budget:,}" if budget else f"all ({results.get('data', {}).get('pairs', 0):,})"
        rows.append(f"| {pairs} | {len(seeds)} | {100 * sum(a) / len(a):.1f} | "
                    f"{100 * sum(b) / len(b):.1f} | {gap} |")  # fmt: skip
    if not rows:
        return []
    return ["| labelled pairs | seeds | pretrained | scratch | pretrained − scratch (95% t) |",
            "| ---: | ---: | ---: | ---: | --- |", *rows]  # fmt: skip


FUSION_LABELS = {"minilm": "all-MiniLM-L6-v2 (published)", "cpt": "ours, zero labels",
                 "pretrained_seed0": "ours, pretrained + all pairs (seed 0)"}  # fmt: skip


def fusion_lines(results: dict[str, dict]) -> list[str]:
    """BM25 + each dense run: RRF and the interpolation (its held-out weight), nDCG@10 and
    the paired bootstrap interval over questions against BM25 alone."""
    fusion = results.get("fusion", {}).get("systems", {})
    if not fusion:
        return []
    bm25 = results["bm25"]["nDCG@10"]
    lines = ["| BM25 + | fusion | weight | nDCG@10 | R@10 | − BM25 (nDCG@10, 95% over questions) |",
             "| --- | --- | ---: | ---: | ---: | --- |"]  # fmt: skip
    for name, system in fusion.items():
        for kind in ("rrf", "interpolated"):
            f = system[kind]
            g = f["minus_bm25"]
            weight = f"{system['weight']:.1f}" if kind == "interpolated" else "k = 60"
            lines.append(f"| {FUSION_LABELS.get(name, name)} | {kind} | {weight} | "
                         f"{_cell(f['nDCG@10'])} | {_cell(f['R@10'])} | {100 * g['mean']:+.1f} "
                         f"[{100 * g['low']:+.1f}, {100 * g['high']:+.1f}] |")  # fmt: skip
    return [*lines, "", f"BM25 alone: nDCG@10 {_cell(bm25)}. The interpolation's weight (the "
            "dense run's share after min-max normalisation per query) is the best of 0.0, "
            "0.1 ... 1.0 on the held-out SQuADShifts pairs, never on SQuAD dev."]  # fmt: skip


def _chain(results: dict[str, dict]) -> str:
    """What the pretrained arm's encoder went through before its supervised pairs."""
    cpt = results.get("cpt")
    if not cpt:
        return "MLM"
    return ("MLM -> contrastive pretraining" if cpt.get("init") == "mlm"
            else "contrastive pretraining from random weights")  # fmt: skip


def verdict(results: dict[str, dict]) -> str:
    """Does pretraining pay? Read off the nDCG@10 interval."""
    gain = intervals(results).get("nDCG@10")
    if not gain:
        return "Fewer than two paired seeds: no interval for pretrained - scratch."
    mean, low, high = (100 * gain[k] for k in ("mean", "low", "high"))
    if low > 0:
        answer = "yes: pretraining pays"
    elif high < 0:
        answer = "no: the pretrained encoder is worse"
    else:
        answer = "not shown: the interval holds zero"
    return (f"Does pretraining ({_chain(results)}) pay for retrieval here? {answer} (nDCG@10 "
            f"{mean:+.1f} points [{low:+.1f}, {high:+.1f}] over {len(paired_seeds(results))} "
            "paired seeds).")  # fmt: skip


def stage_minutes(results: dict[str, dict]) -> float:
    return sum(r.get("wall_seconds", 0.0) for r in results.values()) / 60


def stage_times(results: dict[str, dict]) -> list[str]:
    lines = ["| stage | wall | load average (start, end) |", "| --- | ---: | --- |"]
    for name, result in results.items():
        if "wall_seconds" in result:
            load = result.get("load_average", [])
            lines.append(f"| {name} | {_minutes(result['wall_seconds'])} | "
                         f"{', '.join(f'{x:.1f}' for x in load)} |")  # fmt: skip
    return lines


def report(
    workdir: str, results: dict[str, dict], settings: dict[str, Any], *, total_seconds: float
) -> str:
    """Writes results.md, results.json and retrieval.png to `workdir`; returns results.md.

    Args:
        results: stage name -> its result (`experiments.retrieval_table` stages: data, bm25,
            minilm_st, minilm_ours, pretrain, <arm>_seed<S>).
        settings: the run's flags by name, and the dev set's `questions` and `passages`.
        total_seconds: the command's wall time (this run's; stages done before count 0).
    """
    s = settings
    ours = results.get("minilm_ours", {})
    pretrain = results.get("pretrain", {})
    data = results.get("data", {})
    corpus = data.get("corpus", {})
    date = datetime.date.today().isoformat()
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs ({platform.platform(terse=True)})"
    lines = [
        f"# SQuAD v1.1 dev as passage retrieval ({date})",
        "",
        f"{s['questions']:,} questions against {s['passages']:,} paragraphs (the paragraph "
        "holding the answer is the one relevant passage); nDCG@10, MRR@10 and recall in %, by "
        "ir-measures. Lee r / ρ: Pearson / Spearman correlation of the embeddings' cosines "
        "with people's similarity ratings of Lee et al.'s 50 documents (1,225 pairs; people "
        "agree with each other at ~0.6), zero-shot.",
        "",
        *table(results),
        "",
        verdict(results),
        "",
    ]
    if "max_abs_diff" in ours:
        lines += [f"MiniLM through bert_jax and through sentence-transformers: the largest "
                  f"difference between their {s['questions'] + s['passages']:,} dev "
                  f"embeddings is {ours['max_abs_diff']:.1e} (pooling {ours['pooling']}, "
                  f"normalised: {ours['normalize']}, {ours['max_seq_length']} pieces).",
                  ""]  # fmt: skip
    if budget := budget_lines(results):
        lines += ["## Pretraining against scratch at each pair budget", "", *budget, ""]
    if fused := fusion_lines(results):
        lines += ["## BM25 fused with dense runs", "", *fused, ""]
    lines += ["## Where BM25 wins", ""]
    overlap = results.get("bm25", {}).get("question_word_overlap")
    if overlap is not None:
        lines += [f"SQuAD's questions were written by people looking at the paragraph: "
                  f"{100 * overlap:.0f}% of a question's words (stopwords aside) occur in its "
                  "paragraph, on average, which is the signal BM25 ranks by.", ""]  # fmt: skip
    lines += [f"- {sentence}" for sentence in bm25_sentences(results)] + [""]
    lines += [
        "## What was trained here",
        "",
        f"- Encoder: `{s['preset']}` ({s['recipe']} recipe, experiments/configs/demo_arms.py), "
        f"pretrained by masked LM for {s['pretrain_steps']:,} steps of "
        f"{s['pretrain_batch_size']} x {s['pretrain_seq_length']} pieces on gensim's "
        f"English Wikipedia pages ({corpus.get('documents', '?')} pages, "
        f"{corpus.get('sentences', 0):,} sentences, {corpus.get('characters', 0):,} "
        f"characters; a {s['vocab_size']:,}-piece WordPiece vocab of that text); held-out "
        f"MLM accuracy {_percent(pretrain.get('held_out_mlm_accuracy'))}.",
        *_cpt_line(results.get("cpt")),
        f"- Contrastive fine-tuning of both arms: {data.get('pairs', 0):,} SQuADShifts "
        f"(question, paragraph) pairs ({', '.join(data.get('shifts', []))}; no dev "
        f"paragraph among them), {s['finetune_steps']:,} steps of {s['finetune_batch_size']} "
        f"pairs (in-batch negatives, scale {s['scale']}), peak learning rate "
        f"{s['finetune_learning_rate']}, mean pooling; texts cut to {s['max_seq_length']} "
        f"pieces in training and evaluation. Seeds {', '.join(map(str, s['seeds']))}: "
        "data order and dropout, and scratch's initialisation; one pretrained encoder.",
        "",
        "Per seed (nDCG@10, pretrained / scratch): "
        + "; ".join(_per_seed(results, seed) for seed in paired_seeds(results))
        + ".",
        "",
        "## Wall time",
        "",
        f"Machine: {machine}. The stages took {stage_minutes(results):.1f} min in all (each "
        f"timed by the run that did it); this invocation {total_seconds / 60:.1f} min.",
        "",
        *stage_times(results),
        "",
    ]
    text = "\n".join(lines)
    summary = {"date": date, "machine": machine, "settings": settings, "stages": results,
               "pretrained_minus_scratch": intervals(results),
               "stage_minutes": round(stage_minutes(results), 1),
               "total_seconds": round(total_seconds, 1)}  # fmt: skip
    for name, content in (("results.md", text), ("results.json", json.dumps(summary, indent=2))):
        path = os.path.join(workdir, name)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.write(content + "\n")
        os.replace(path + ".tmp", path)
    figure(results, os.path.join(workdir, "retrieval.png"))
    return text


def _cpt_line(cpt: dict | None) -> list[str]:
    if not cpt:
        return []
    start = "the MLM encoder" if cpt.get("init") == "mlm" else "random weights"
    return [f"- Contrastive pretraining (zero labels): {cpt.get('steps', 0):,} steps from {start} "
            f"on {cpt.get('passages', 0):,} passages of the Wikipedia pages and the SQuADShifts "
            "training paragraphs (experiments/configs/embeddings_contrastive_pretraining.py); "
            "the pretrained arm starts from it."]  # fmt: skip


def _percent(value: float | None) -> str:
    return "?" if value is None else f"{100 * value:.1f}%"


def _per_seed(results: dict[str, dict], seed: int) -> str:
    values = [next(r for r in arm_runs(results, arm) if r["seed"] == seed) for arm in ARMS]
    return f"seed {seed} {_cell(values[0]['nDCG@10'])} / {_cell(values[1]['nDCG@10'])}"


def figure(results: dict[str, dict], path: str) -> None:
    """Left: every system's metrics (the arms' seeds as dots over their mean); right: the
    paired difference pretrained - scratch with its 95% interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = [(short, results[name]) for name, _, short in FIXED_ROWS if name in results]
    arms = [(arm, arm_runs(results, arm)) for arm in ARMS if arm_runs(results, arm)]
    gain = intervals(results)
    ratios = [2, 1] if gain else [1]
    fig, axes = plt.subplots(1, len(ratios), figsize=(13 if gain else 8, 5.5), squeeze=False,
                             gridspec_kw={"width_ratios": ratios})  # fmt: skip
    ax = axes[0][0]
    count = len(systems) + len(arms)
    width = 0.8 / max(count, 1)
    for i, (label, values) in enumerate(systems):
        xs = [j + (i - count / 2 + 0.5) * width for j in range(len(METRICS))]
        ax.bar(xs, [100 * values[m] for m in METRICS], width, label=label)
    for k, (arm, runs) in enumerate(arms):
        i = len(systems) + k
        xs = [j + (i - count / 2 + 0.5) * width for j in range(len(METRICS))]
        means = [100 * mean_std([r[m] for r in runs])[0] for m in METRICS]
        ax.bar(xs, means, width, label=f"{arm} + contrastive ({len(runs)} seeds)")
        for x, m in zip(xs, METRICS, strict=True):
            ax.plot([x] * len(runs), [100 * r[m] for r in runs], "k.", markersize=4)
    ax.set_xticks(range(len(METRICS)), METRICS)
    ax.set_ylabel("%")
    ax.set_ylim(0, 100)
    ax.set_title("SQuAD v1.1 dev, questions -> paragraphs")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=3)
    if gain:
        ax = axes[0][1]
        means = [100 * gain[m]["mean"] for m in METRICS]
        errors = [[100 * (gain[m]["mean"] - gain[m]["low"]) for m in METRICS],
                  [100 * (gain[m]["high"] - gain[m]["mean"]) for m in METRICS]]  # fmt: skip
        ax.errorbar(range(len(METRICS)), means, yerr=errors, fmt="o", capsize=4)
        ax.axhline(0, color="grey", linewidth=0.8)
        ax.set_xticks(range(len(METRICS)), METRICS)
        ax.set_ylabel("points")
        ax.set_title("pretrained − scratch (95% interval over seeds)")
    fig.tight_layout()
    fig.savefig(path + ".tmp.png", dpi=110)
    plt.close(fig)
    os.replace(path + ".tmp.png", path)
