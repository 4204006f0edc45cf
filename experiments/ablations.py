r"""The BERT paper's ablations at CPU scale, each beside the paper's own figures.

  python -m experiments.ablations --table=objectives --workdir=workdirs/ablations
  python -m experiments.ablations --table=size --workdir=workdirs/ablations
  python -m experiments.ablations --table=features --workdir=workdirs/ablations

(`make ablations-objectives`, `make ablations-size`, `make ablations-features`.)

- `objectives` (the paper's Table 5, effect of pretraining tasks): BERT-tiny pretrained on
  the polarity demo's corpus (IMDB reviews, `experiments/demo.py --task=polarity` stages 1-3,
  with dynamic masking)
  three times on the same data and budget: "mlm_nsp" (BERT), "mlm" (No NSP: single
  segments) and "ltr" (LTR & No NSP: a causal left-to-right LM, causal in fine-tuning too),
  then each fine-tuned on sentence polarity (SST-2's shape) and VitaminC (MNLI's: claim /
  evidence pairs in 3 classes), --finetune_seeds seeds, beside the same architecture from
  random weights. Every arm's classifier reads the mean of the last layer: without NSP
  nothing trains the [CLS] pooler.
- `size` (Table 6, effect of model size): the `mlm_nsp` recipe at each --sizes (L/H/A,
  intermediate 4H) for --size_pretrain_steps: held-out masked-LM perplexity (exp of the
  held-out MLM loss, the paper's "LM (ppl)") and polarity accuracy.
- `features` (Table 7, the feature-based approach on NER): the real all-MiniLM-L6-v2 on
  English tweet NER, frozen, each layer combination of `bert_jax.feature_based` feeding a
  fresh two-layer BiLSTM (`experiments.feature_based_tagging`), beside the whole model
  fine-tuned (`experiments.finetune_tagging`): entity F1, dev and test.

Every run is resumable: a run whose metrics exist is read, not rerun. Each table writes
<workdir>/<table>/results.md (ours beside the paper, and whether the paper's direction
reproduces) and results.json; docs/paper_tables.md collects them.
"""

from __future__ import annotations

import json
import math
import os
import time

from absl import app, flags, logging

from data_pipelines import cli, recipe

TABLES = ("objectives", "size", "features")
OBJECTIVES = ("mlm_nsp", "mlm", "ltr")
OBJECTIVE_NAMES = {"mlm_nsp": "BERT (MLM + NSP)", "mlm": "No NSP", "ltr": "LTR & No NSP"}


TINY_CONFIG = "experiments/configs/bert_tiny_cpu.py"

# The paper's figures (Devlin et al. 2019), dev sets. Table 5: BERT-Base's pretraining tasks.
PAPER_OBJECTIVES = {
    "columns": ("MNLI-m", "QNLI", "MRPC", "SST-2", "SQuAD F1"),
    "mlm_nsp": (84.4, 88.4, 86.7, 92.7, 88.5),
    "mlm": (83.9, 84.9, 86.5, 92.6, 87.9),
    "ltr": (82.1, 84.3, 77.5, 92.1, 77.8),
}
# Table 6: (L, H, A) -> held-out MLM perplexity, MNLI-m, MRPC, SST-2 accuracy.
PAPER_SIZES = {
    (3, 768, 12): (5.84, 77.9, 79.8, 88.4),
    (6, 768, 3): (5.24, 80.6, 82.2, 90.7),
    (6, 768, 12): (4.68, 81.9, 84.8, 91.3),
    (12, 768, 12): (3.99, 84.4, 86.7, 92.9),
    (12, 1024, 16): (3.54, 85.7, 86.9, 93.3),
    (24, 1024, 16): (3.23, 86.6, 87.8, 93.7),
}
# Table 7: CoNLL-2003 NER dev F1 of BERT-Base, fine-tuned and feature-based.
PAPER_FEATURES = {
    "finetune": 96.4,
    "embeddings": 91.0,
    "second_to_last": 95.6,
    "last": 94.9,
    "sum_last_4": 95.9,
    "concat_last_4": 96.1,
    "sum_all": 95.5,
}


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    mean = sum(values) / len(values)
    variance = sum((v - mean) ** 2 for v in values) / max(len(values) - 1, 1)
    return mean, math.sqrt(variance)


def direction(ours: float, reference: float, paper_delta: float, noise: float) -> str:
    """Whether our change from `reference` goes the paper's way (`paper_delta`): "yes",
    "no", or "within noise" when |ours - reference| <= `noise` (the caller's threshold)."""
    delta = ours - reference
    if abs(delta) <= noise:
        return "within noise"
    return "yes" if (delta > 0) == (paper_delta > 0) else "no"


def parse_size(text: str) -> tuple[int, int, int]:
    """'L/H/A' -> (L, H, A), H divisible by A."""
    try:
        layers, hidden, heads = (int(part) for part in text.split("/"))
    except ValueError:
        raise app.UsageError(f"--sizes: {text!r} is not L/H/A (e.g. 4/256/4)") from None
    if min(layers, hidden, heads) < 1 or hidden % heads:
        raise app.UsageError(f"--sizes: {text!r} needs positive L, H, A with H divisible by A")
    return layers, hidden, heads


def read_json(path: str) -> dict | None:
    """The JSON at `path` if a finished run wrote it (it has `wall_time_s`), else None."""
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    return data if "wall_time_s" in data else None


def held_out(pretrain_dir: str) -> dict:
    """The last held-out evaluation of a pretraining run (its metrics.jsonl)."""
    from bert_jax import telemetry

    records = telemetry.read_metrics(os.path.join(pretrain_dir, "metrics.jsonl"))
    evals = [r for r in records if r["split"] == "eval"]
    if not evals:
        raise ValueError(f"{pretrain_dir}/metrics.jsonl has no held-out evaluation")
    return evals[-1]  # records come in step order


# --- pretraining ---------------------------------------------------------------------------


def make_records(opts, workdir: str, vocab: str, next_sentence: bool) -> str:
    """Dynamic-masking records (unmasked: every objective masks, or shifts, the same text)."""
    out = os.path.join(workdir, "records", "pairs" if next_sentence else "single")
    recipe.make_records(
        opts.corpus_dir, vocab, out, max_seq_length=opts.max_seq_length,
        dupe_factor=opts.dupe_factor, seed=opts.seed, next_sentence=next_sentence,
        masking="dynamic",
    )  # fmt: skip
    return out


def pretrain(
    opts,
    out: str,
    records: str,
    vocab: str,
    *,
    objective: str,
    steps: int,
    size=None,
    learning_rate: float | None = None,
) -> str:
    """One pretraining run of BERT-tiny's config (or `size` = (L, H, A)) at `learning_rate`
    (default --pretrain_learning_rate); returns `out`."""
    predictions = (
        opts.max_seq_length
        if objective == "ltr"
        else recipe.predictions_per_seq(opts.max_seq_length)
    )
    args = [
        "experiments.pretrain", f"--config={TINY_CONFIG}", f"--workdir={out}", "--verbosity=-1",
        f"--config.seed={opts.seed}", f"--config.objective={objective}",
        f"--config.data.train_files={records}/train-*.tfrecord",
        f"--config.data.eval_files={records}/eval.tfrecord",
        f"--config.data.vocab_file={vocab}", "--config.data.dynamic_masking=True",
        f"--config.data.max_seq_length={opts.max_seq_length}",
        f"--config.data.max_predictions_per_seq={predictions}",
        f"--config.global_batch_size={opts.pretrain_batch_size}",
        f"--config.num_train_steps={steps}",
        "--config.optimizer.name=adamw_bias_corrected",  # as the demo: docs/polarity_demo.md
        f"--config.optimizer.learning_rate={learning_rate or opts.pretrain_learning_rate}",
        f"--config.optimizer.warmup_steps={max(steps // 20, 1)}",
        f"--config.log_every={min(50, max(steps // 20, 1))}",
        f"--config.eval_every={max(steps // 6, 1)}",
        f"--config.checkpoint_every={max(steps // 6, 1)}",
    ]  # fmt: skip
    if size is not None:
        layers, hidden, heads = size
        args += [
            f"--config.model.num_hidden_layers={layers}",
            f"--config.model.hidden_size={hidden}",
            f"--config.model.num_attention_heads={heads}",
            f"--config.model.intermediate_size={4 * hidden}",
        ]
    recipe.run(f"pretrain {os.path.basename(out)}", args)
    return out


# --- fine-tuning ---------------------------------------------------------------------------


def classification_config(opts, task: str, init_from: str, vocab: str, seed: int, scratch: bool):
    """The demo's fine-tuning recipe (mean pooling, 3e-4, 3 epochs) for `task`."""
    from experiments.configs import finetune_tiny_polarity

    config = finetune_tiny_polarity.get_config()
    config.task, config.init_from, config.vocab_file = task, init_from, vocab
    config.learning_rate, config.pooling, config.num_epochs = 3e-4, "mean", 3
    config.seed, config.from_scratch = seed, scratch
    config.eval_every_epochs = config.num_epochs  # dev once, at the end
    if task == "vitaminc":  # pairs: claim and evidence need more than polarity's 64 pieces
        config.max_seq_length = 128
        config.max_train_examples = opts.vitaminc_train_examples
    return config


def finetune_classifier(out: str, config) -> float:
    """Test accuracy of one fine-tuning run (read back when it already ran)."""
    from experiments import finetune_classification

    metrics = read_json(os.path.join(out, "metrics.json"))
    if metrics is None:
        metrics = finetune_classification.finetune(config, out, show_progress=False)
    return metrics["test"]["test"]["accuracy"]


def finetune_arms(opts, workdir: str, arms: dict[str, str | None], vocab: str, tasks) -> dict:
    """{task: {arm: [test accuracy per seed]}} for every arm (name -> pretraining dir;
    "scratch" -> random weights in the first arm's architecture)."""
    from tqdm import tqdm

    seeds = [opts.seed * opts.finetune_seeds + i for i in range(opts.finetune_seeds)]
    jobs = [(task, arm, seed) for task in tasks for arm in arms for seed in seeds]
    scores: dict = {task: {arm: [] for arm in arms} for task in tasks}
    logging.set_verbosity(logging.ERROR)  # the bar is the progress; errors still show
    for task, arm, seed in tqdm(jobs, desc="finetune", unit="run"):
        init_from = arms[arm] or next(iter(arms.values()))
        config = classification_config(
            opts, task, init_from, vocab, seed, scratch=arms[arm] is None
        )
        out = os.path.join(workdir, "finetune", task, f"{arm}_seed{seed}")
        scores[task][arm].append(finetune_classifier(out, config))
    logging.set_verbosity(logging.INFO)
    return scores


# --- the tables ----------------------------------------------------------------------------


def objectives_table(opts, workdir: str, vocab: str) -> tuple[str, dict]:
    """Table 5: the three objectives on the same data and budget, fine-tuned alike."""
    pairs = make_records(opts, workdir, vocab, True)
    single = make_records(opts, workdir, vocab, False)
    arms = {}
    for name in OBJECTIVES:
        records = pairs if name == "mlm_nsp" else single
        out = os.path.join(workdir, "pretrain", name)
        arms[name] = pretrain(opts, out, records, vocab, objective=name, steps=opts.pretrain_steps)
    pretraining = {name: held_out(arms[name]) for name in OBJECTIVES}
    tasks = ("polarity", "vitaminc")
    scores = finetune_arms(opts, workdir, {**arms, "scratch": None}, vocab, tasks)
    return format_objectives(scores, pretraining), {"scores": scores, "held_out": pretraining}


def format_objectives(scores: dict, pretraining: dict) -> str:
    """Table 5's Markdown: the paper's rows, ours, and the direction of each change."""
    tasks = list(scores)
    paper = PAPER_OBJECTIVES
    rows = [
        "| pretraining | paper: " + " / ".join(paper["columns"]) + " | "
        + " | ".join(f"ours: {t} (test acc.)" for t in tasks) + " | held-out LM accuracy |",
        "| --- | --- |" + " ---: |" * (len(tasks) + 1),
    ]  # fmt: skip
    stats = {t: {arm: mean_std(v) for arm, v in scores[t].items()} for t in tasks}
    for arm in (*OBJECTIVES, "scratch"):
        ours = " | ".join(
            f"{100 * stats[t][arm][0]:.1f} ± {100 * stats[t][arm][1]:.1f}" for t in tasks
        )
        paper_row = " / ".join(f"{v:.1f}" for v in paper[arm]) if arm in paper else "-"
        accuracy = pretraining.get(arm, {}).get("mlm_accuracy")
        lm = "-" if accuracy is None else f"{100 * accuracy:.1f}"
        name = OBJECTIVE_NAMES.get(arm, "no pretraining (random weights)")
        rows.append(f"| {name} | {paper_row} | {ours} | {lm} |")
    lines = ["", "Direction of each change from BERT (the paper's: every task falls):"]
    for arm in OBJECTIVES[1:]:
        for t in tasks:
            (ours, std), (base, base_std) = stats[t][arm], stats[t]["mlm_nsp"]
            # Two standard errors of the difference of the two means (over the seeds).
            runs, base_runs = len(scores[t][arm]), len(scores[t]["mlm_nsp"])
            noise = 2 * math.sqrt(std**2 / runs + base_std**2 / base_runs)
            verdict = direction(ours, base, -1.0, noise)
            lines.append(f"- {OBJECTIVE_NAMES[arm]}, {t}: {100 * (ours - base):+.1f} points "
                         f"({verdict})")  # fmt: skip
    lines.append(
        "\nHeld-out LM accuracy: masked-token accuracy for the MLM objectives, next-token "
        "accuracy for LTR (not comparable across the two)."
    )
    return "\n".join(rows + lines) + "\n"


def size_table(opts, workdir: str, vocab: str) -> tuple[str, dict]:
    """Table 6: held-out MLM perplexity and polarity accuracy against model size."""
    pairs = make_records(opts, workdir, vocab, True)
    sizes = [parse_size(s) for s in opts.sizes]
    arms, pretraining = {}, {}
    for size in sizes:
        name = "L{}_H{}_A{}".format(*size)
        out = os.path.join(workdir, "pretrain", name)
        arms[name] = pretrain(
            opts, out, pairs, vocab, objective="mlm_nsp", steps=opts.size_pretrain_steps, size=size
        )
        pretraining[name] = held_out(out)
    scores = finetune_arms(opts, workdir, arms, vocab, ("polarity",))
    return format_sizes(sizes, pretraining, scores), {"held_out": pretraining, "scores": scores}


def format_sizes(sizes, pretraining: dict, scores: dict) -> str:
    rows = [
        "| L | H | A | held-out MLM perplexity | polarity test acc. |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    perplexities = []
    for size in sizes:
        name = "L{}_H{}_A{}".format(*size)
        perplexity = math.exp(pretraining[name]["mlm_loss"])
        perplexities.append(perplexity)
        mean, std = mean_std(scores["polarity"][name])
        rows.append(f"| {size[0]} | {size[1]} | {size[2]} | {perplexity:.2f} | "
                    f"{100 * mean:.1f} ± {100 * std:.1f} |")  # fmt: skip
    falls = all(b < a for a, b in zip(perplexities, perplexities[1:], strict=False))
    paper = ["", "The paper's (BERT-Base's recipe, dev sets): L / H / A: LM perplexity, "
             "MNLI-m / MRPC / SST-2"]  # fmt: skip
    for (layers, hidden, heads), (ppl, *accs) in PAPER_SIZES.items():
        paper.append(f"- {layers} / {hidden} / {heads}: {ppl:.2f}, "
                     + " / ".join(f"{a:.1f}" for a in accs))  # fmt: skip
    verdict = ("yes: it falls with every size" if falls
               else "no: it does not fall with every size")  # fmt: skip
    paper.append(f"\nHeld-out perplexity falls with model size, as in the paper: {verdict}.")
    return "\n".join(rows + paper) + "\n"


def features_table(opts, workdir: str) -> tuple[str, dict]:
    """Table 7: MiniLM's frozen layers through a BiLSTM vs fine-tuning, tweet NER F1."""
    from experiments import feature_based_tagging, finetune_tagging
    from experiments.configs import feature_based_tweet_ner, finetune_minilm_tweet_ner

    results = {}
    for combination in opts.combinations:
        out = os.path.join(workdir, combination)
        metrics = read_json(os.path.join(out, "metrics.json"))
        if metrics is None:
            config = feature_based_tweet_ner.get_config()
            config.layers, config.seed = combination, opts.seed
            metrics = feature_based_tagging.finetune(config, out)
        results[combination] = metrics["final"]
    out = os.path.join(workdir, "finetune")
    metrics = read_json(os.path.join(out, "metrics.json"))
    if metrics is None:
        config = finetune_minilm_tweet_ner.get_config()
        config.seed = opts.seed
        metrics = finetune_tagging.finetune(config, out)
    results["finetune"] = metrics["final"]
    results = {"finetune": results.pop("finetune"), **results}  # the reference row first
    return format_features(results), results


def format_features(results: dict) -> str:
    rows = [
        "| system | paper: CoNLL-2003 dev F1 (BERT-Base) | ours: tweet NER dev F1 | test F1 |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, scores in results.items():
        paper = PAPER_FEATURES.get(name)
        paper_text = "-" if paper is None else f"{paper:.1f}"
        label = "fine-tune all layers" if name == "finetune" else name
        rows.append(f"| {label} | {paper_text} | {100 * scores['dev']['f1']:.1f} | "
                    f"{100 * scores['test']['f1']:.1f} |")  # fmt: skip
    lines = ["", "The paper's directions, on dev F1:"]
    dev = {name: scores["dev"]["f1"] for name, scores in results.items()}
    features = {k: v for k, v in dev.items() if k != "finetune"}
    if "finetune" in dev and features:
        best = max(features, key=features.get)
        lines.append(f"- fine-tuning beats every feature-based row: "
                     f"{'yes' if dev['finetune'] > features[best] else 'no'} "
                     f"(best feature-based: {best})")  # fmt: skip
    if "embeddings" in features and len(features) > 1:
        worst = min(features, key=features.get)
        lines.append(f"- the embeddings alone are the weakest features: "
                     f"{'yes' if worst == 'embeddings' else f'no ({worst} is)'}")  # fmt: skip
    if {"concat_last_4", "last"} <= set(features):
        beats = features["concat_last_4"] > features["last"]
        lines.append(
            f"- concatenating the last four beats the last layer: {'yes' if beats else 'no'}"
        )
    return "\n".join(rows + lines) + "\n"


# The flags that decide each table's records, pretrained models and fine-tuning runs (the
# ones whose outputs a rerun reuses): a table's workdir holds one set.
_PRETRAINING_FLAGS = (
    "corpus_dir", "seed", "pretrain_batch_size", "pretrain_learning_rate", "max_seq_length",
    "dupe_factor", "vocab_size",
)  # fmt: skip
RUN_FLAGS = {
    "objectives": (*_PRETRAINING_FLAGS, "pretrain_steps", "vitaminc_train_examples"),
    "size": (*_PRETRAINING_FLAGS, "size_pretrain_steps"),
    "features": ("seed",),
}


def check_workdir(opts, workdir: str, table: str) -> None:
    """Refuses a table's workdir made with other values of its RUN_FLAGS (its runs would be
    reused); the flags of the other tables do not matter to it."""
    current = {name: getattr(opts, name) for name in RUN_FLAGS[table]}
    cli.check_same_flags(workdir, "ablation_flags.json", current)


def main(argv):
    opts = flags.FLAGS
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    start = time.time()
    table = opts.table
    # Absolute paths: Orbax refuses relative checkpoint directories.
    workdir = os.path.abspath(os.path.join(opts.workdir, table))
    os.makedirs(workdir, exist_ok=True)
    opts.corpus_dir = os.path.abspath(opts.corpus_dir)
    check_workdir(opts, workdir, table)
    if table == "features":
        markdown, data = features_table(opts, workdir)
    else:
        vocab = recipe.prepare_corpus(["imdb"], opts.corpus_dir, opts.vocab_size)
        build = objectives_table if table == "objectives" else size_table
        markdown, data = build(opts, workdir, vocab)
    data["wall_time_s"] = time.time() - start
    write_results(workdir, markdown, data)


def write_results(workdir: str, markdown: str, data: dict) -> None:
    """<workdir>/results.md and results.json (with `wall_time_s`), and the table printed."""
    with open(os.path.join(workdir, "results.md"), "w", encoding="utf-8") as f:
        f.write(markdown)
    with open(os.path.join(workdir, "results.json"), "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)
    print("\n" + markdown)
    print(f"Wrote {workdir}/results.md and results.json ({data['wall_time_s'] / 60:.1f} min)")


def define_flags() -> None:
    """The command line (defined when run, so the module imports beside other tools)."""
    flags.DEFINE_enum("table", None, TABLES, "Which of the paper's tables to run.")
    flags.DEFINE_string("workdir", "workdirs/ablations", "Records, runs and results (per table).")
    flags.DEFINE_string("corpus_dir", "workdirs/imdb", "The demo's corpus and vocab (shared).")
    flags.DEFINE_integer("seed", 0, "Seeds the records, the pretraining and the fine-tuning seeds.")
    flags.DEFINE_integer("pretrain_steps", 3_600, "Pretraining steps per objective (the demo's).")
    # 1,200 steps left every size on the unigram plateau (held-out MLM loss 6.23 at L2/H128,
    # 6.21 at L4/H128): the demo's 3,600 get past it (5.08 at L2/H128).
    flags.DEFINE_integer("size_pretrain_steps", 3_600, "Pretraining steps per model size.")
    flags.DEFINE_integer("pretrain_batch_size", 64, "Pretraining sequences per step.")
    flags.DEFINE_float("pretrain_learning_rate", 1e-3, "Peak pretraining learning rate.")
    flags.DEFINE_integer("max_seq_length", 64, "Pretraining sequence length (pieces).")
    flags.DEFINE_integer("dupe_factor", 2, "Copies of the training corpus in the records.")
    flags.DEFINE_integer("vocab_size", 8000, "WordPiece vocabulary size (the demo's).")
    # On a 2-core CPU shared with a second job 4/128/2 took about 1.1 s a step and 4/256/4 1.9 s
    # (over an hour at 3,600 steps): the ladder grows from below rather than above.
    flags.DEFINE_list(
        "sizes",
        ["2/32/1", "2/64/1", "2/128/2", "4/128/2"],
        "Model sizes L/H/A for --table=size, smallest first (parameters grow along the list).",
    )
    flags.DEFINE_integer("finetune_seeds", 3, "Fine-tuning seeds per arm and task.")
    flags.DEFINE_integer("vitaminc_train_examples", 10_000, "VitaminC training pairs per run.")
    flags.DEFINE_list(
        "combinations",
        ["embeddings", "second_to_last", "last", "sum_last_4", "concat_last_4", "sum_all",
         "scalar_mix"],
        "Layer combinations for --table=features (bert_jax.feature_based.COMBINATIONS).",
    )  # fmt: skip


if __name__ == "__main__":
    define_flags()
    flags.mark_flag_as_required("table")
    cli.run(main, stop_on_sigterm=True)
