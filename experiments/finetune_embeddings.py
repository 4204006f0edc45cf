r"""Contrastive fine-tuning: a pretrained encoder becomes a sentence-embedding model.

  python -m experiments.finetune_embeddings --config=experiments/configs/embeddings.py \
      --config.init_from=<dir> --config.train_file=pairs.tsv --workdir=workdirs/embeddings

Each step takes `global_batch_size` (query, positive[, negatives]) pairs of `train_file`,
embeds them with the encoder and `pooling`, and minimises the in-batch-negatives ranking loss
(`bert_jax.embeddings.contrastive_loss`): every query against every positive and hard
negative of the *global* batch, however it is split over the mesh, embedded in cached chunks
of `chunk_size` pairs when set. Pairs whose positive text repeats inside a batch do not count
as each other's negatives. The optimizer is the fine-tuning recipe's (AdamW, linear warmup
over `warmup_proportion`, linear decay to 0, clipping).

With `dev_file` (pairs in the same layout), retrieval is scored before training and after:
each dev query against every distinct dev positive, nDCG@10, MRR@10, R@1/10/100
(`bert_jax.retrieval`). Writes to --workdir: `train_log.jsonl` (loss, in-batch accuracy,
learning rate, norms every `log_every` steps), `metrics.json` (before/after retrieval
scores, counts, wall time) and the model in `checkpoint/` with its pooling, which
`experiments.embed --model=<workdir>` and `bert_jax.convert --format=sentence-transformers`
read.
"""

from __future__ import annotations

import json
import logging
import os
import time

import ml_collections
import numpy as np
from absl import flags
from ml_collections import config_flags

from data_pipelines import cli
from experiments import finetune_main

log = logging.getLogger(__name__)

TOKEN_KEYS = ("query", "positive", "negative")


def tokenize_pairs(tokenizer, pairs, max_seq_length: int) -> dict[str, np.ndarray]:
    """(N, T) token and mask arrays of queries and positives ((N, K, T) negatives), padded
    to `max_seq_length`, and `positive_ids`: equal ints for equal positive texts."""
    from bert_jax.embeddings import tokenize

    def arrays(texts):
        ids, _ = tokenize(tokenizer, texts, max_seq_length)
        tokens = np.full((len(ids), max_seq_length), tokenizer.pad_id, np.int32)
        mask = np.zeros_like(tokens)
        for i, row in enumerate(ids):
            tokens[i, : len(row)], mask[i, : len(row)] = row, 1
        return tokens, mask

    out = {}
    out["query_tokens"], out["query_mask"] = arrays(pairs.queries)
    out["positive_tokens"], out["positive_mask"] = arrays(pairs.positives)
    k = len(pairs.negatives[0])
    if k:
        flat = [text for row in pairs.negatives for text in row]
        tokens, mask = arrays(flat)
        out["negative_tokens"] = tokens.reshape(len(pairs), k, max_seq_length)
        out["negative_mask"] = mask.reshape(len(pairs), k, max_seq_length)
    _, out["positive_ids"] = np.unique(np.array(pairs.positives, dtype=object), return_inverse=True)
    out["positive_ids"] = out["positive_ids"].astype(np.int32)
    return out


def batch_indices(num_pairs: int, batch_size: int, seed: int, step: int) -> np.ndarray:
    """The pairs of step `step` (0-based): epoch e's permutation from (seed, e), cut into
    batches; the last partial batch of an epoch is dropped."""
    per_epoch = num_pairs // batch_size
    epoch, index = divmod(step, per_epoch)
    order = np.random.default_rng([seed, epoch]).permutation(num_pairs)
    return order[index * batch_size : (index + 1) * batch_size]


def cut_to_longest(arrays: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
    """Rows `rows` of every array, the token axis of queries, positives and negatives each
    cut to its own longest text in the batch rounded up to 16 (padding is masked: the
    embeddings are those of the full length; short questions are not run at a passage's
    length)."""
    out = {"positive_ids": arrays["positive_ids"][rows]}
    for kind in TOKEN_KEYS:
        if f"{kind}_mask" not in arrays:
            continue
        mask = arrays[f"{kind}_mask"][rows]
        length = min(mask.shape[-1], -(-max(int(mask.sum(-1).max()), 1) // 16) * 16)
        for key in (f"{kind}_tokens", f"{kind}_mask"):
            out[key] = arrays[key][rows][..., :length]
    return out


def retrieval_scores(model, dev, batch_size: int, mesh=None) -> dict[str, float]:
    """Each dev query against every distinct dev positive: nDCG@10, MRR@10, R@1/10/100."""
    from bert_jax import embeddings, retrieval

    corpus = sorted(set(dev.positives))
    pid = {text: f"p{i}" for i, text in enumerate(corpus)}
    qrels = {f"q{i}": {pid[p]: 1} for i, p in enumerate(dev.positives)}
    q = embeddings.embed_texts(model, dev.queries, batch_size=batch_size, desc="dev queries")
    c = embeddings.embed_texts(model, corpus, batch_size=batch_size, desc="dev passages")
    scores, indices = retrieval.top_k(q, c, min(100, len(corpus)), mesh=mesh)
    run = retrieval.run_from_topk(list(qrels), [pid[t] for t in corpus], scores, indices)
    return retrieval.evaluate(run, qrels)


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
    """The whole fine-tuning run; returns metrics.json's content."""
    import jax

    from bert_jax import embeddings, embeddings_train, finetune_common, sharding
    from bert_jax.config import BertConfig
    from data_pipelines.tasks.pairs import read_pairs

    start = time.time()
    os.makedirs(workdir, exist_ok=True)
    train = read_pairs(config.train_file)
    dev = read_pairs(config.dev_file) if config.dev_file else None
    if len(train) < config.global_batch_size:
        raise ValueError(f"{config.train_file}: {len(train)} pairs < --config.global_batch_size"
                         f"={config.global_batch_size}")  # fmt: skip
    template = embeddings.BertForEmbedding(BertConfig(), config.pooling, config.normalize)
    task = finetune_common.load_task_model(config, template)
    module, params = task.module, task.params
    bert = task.config
    if config.max_seq_length > bert.max_position_embeddings:
        raise ValueError(f"--config.max_seq_length={config.max_seq_length} > the encoder's "
                         f"max_position_embeddings={bert.max_position_embeddings}")  # fmt: skip
    arrays = tokenize_pairs(task.tokenizer, train, config.max_seq_length)
    log.info("%d pairs (%d hard negatives each) from %s; %s pooling, batch %d%s", len(train),
             len(train.negatives[0]), config.train_file, config.pooling, config.global_batch_size,
             f" in chunks of {config.chunk_size}" if config.chunk_size else "")  # fmt: skip

    embeddings_train.check_encoder(config, bert)
    mesh = sharding.create_mesh(config.mesh_shape)
    num_steps = config.num_train_steps
    negatives = len(train.negatives[0])
    # The step aot_compile compiles for a TPU slice: optimizer, sharded state, shardings.
    contrastive = embeddings_train.make_train_step(config, module, mesh, negatives=negatives,
                                                   params=params)  # fmt: skip
    state, step_fn = contrastive.state, contrastive.step
    _, dropout_rng = finetune_common.run_keys(config)

    def current_model(p):
        return embeddings.EmbeddingModel(module, p, task.tokenizer, task.vocab_file,
                                         config.max_seq_length, "config")  # fmt: skip

    metrics: dict = {"train_pairs": len(train), "num_train_steps": num_steps}
    if dev is not None:
        metrics["dev_pairs"] = len(dev)
        metrics["before"] = retrieval_scores(current_model(params), dev, config.eval_batch_size)
        log.info("dev before: %s", _fmt(metrics["before"]))
    from tqdm import tqdm

    history = []
    log_path = os.path.join(workdir, "train_log.jsonl")
    # The mesh is ambient while the step is traced: the model's activation constraints and
    # splash's shard_map read it (embeddings_train).
    with sharding.activation_context(mesh), open(log_path, "w", encoding="utf-8") as log_file:
        progress = tqdm(total=num_steps, desc="contrastive", unit="step")
        for step in range(num_steps):
            rows = batch_indices(len(train), config.global_batch_size, config.seed, step)
            batch = sharding.global_batch(cut_to_longest(arrays, rows), mesh)
            state, step_metrics = step_fn(state, batch, dropout_rng)
            history.append(step_metrics)
            # The bar counts steps whose results are on the host: one step stays in flight.
            if len(history) >= 2:
                jax.block_until_ready(history[-2])
                progress.update(step - progress.n)
            if (step + 1) % config.log_every == 0 or step + 1 == num_steps:
                window = finetune_common.fetch_finite(history, step + 2 - len(history))
                record = {k: float(np.mean([m[k] for m in window])) for k in window[-1]}
                record["learning_rate"] = float(window[-1]["learning_rate"])
                log_file.write(json.dumps({"step": step + 1, **record}) + "\n")
                log_file.flush()
                progress.update(step + 1 - progress.n)
                progress.set_postfix(loss=f"{record['loss']:.4f}",
                                     acc=f"{record['accuracy']:.3f}")  # fmt: skip
                history = []
        progress.close()
    params = jax.device_get(state.params)
    if dev is not None:
        metrics["after"] = retrieval_scores(current_model(params), dev, config.eval_batch_size)
        log.info("dev after: %s", _fmt(metrics["after"]))
    settings = {"pooling": config.pooling, "normalize": bool(config.normalize),
                "max_seq_length": int(config.max_seq_length)}  # fmt: skip
    finetune_common.save_finetuned(
        os.path.join(workdir, "checkpoint"), bert, params, vocab_file=task.vocab_file,
        metadata={"task": "embedding", "embedding": settings, "init_from": config.init_from,
                  "from_scratch": bool(config.from_scratch)},
    )  # fmt: skip
    metrics["wall_seconds"] = round(time.time() - start, 1)
    finetune_common.write_json(os.path.join(workdir, "metrics.json"), metrics)
    return metrics


def _fmt(scores: dict[str, float]) -> str:
    return " ".join(f"{k} {v:.4f}" for k, v in scores.items())


def _run(config, workdir):
    cli.progress_logging("bert_jax", "experiments", __name__)
    try:
        run(config, workdir)
    except (ValueError, FileNotFoundError, IsADirectoryError) as error:
        raise SystemExit(f"finetune_embeddings: {error}") from None


main = finetune_main.make_main(_run, "finetune_embeddings", saves_model=True)

if __name__ == "__main__":
    config_flags.DEFINE_config_file("config", None, "Fine-tuning config file.", lock_config=True)
    flags.DEFINE_string("workdir", None, "Where metrics, logs and the model are written.")
    flags.mark_flags_as_required(["config", "workdir"])
    cli.run(main)
