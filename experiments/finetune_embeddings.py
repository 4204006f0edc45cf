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

Multi-host: every process runs the same command, reads the pairs and puts only its own rows
of each global batch on its devices; process 0 holds the workdir and writes the log, the
model and the metrics. On a Cloud TPU pod slice add --distributed on every worker
(`jax.distributed.initialize()` finds its peers), as docs/tpu.md launches pretraining:

  gcloud compute tpus tpu-vm ssh <tpu> --zone=<zone> --worker=all --command="cd ~/bert_jax && \
      .venv/bin/python -m experiments.finetune_embeddings --distributed \
      --config=experiments/configs/embeddings_modernbert_base_tpu.py:pod \
      --config.train_file=msmarco_triplets.tsv --workdir=runs/embeddings_pod"

Elsewhere give each process --coordinator_address=<process 0's host>:<port>,
--num_processes and --process_id (CPU processes reduce over gloo).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time

import ml_collections
import numpy as np
from absl import flags
from ml_collections import config_flags

from bert_jax import distributed
from data_pipelines import cli
from experiments import finetune_main

log = logging.getLogger(__name__)

TOKEN_KEYS = ("query", "positive", "negative")


def tokenize_pairs(
    tokenizer, pairs, max_seq_length: int, query_length: int = 0
) -> dict[str, np.ndarray]:
    """(N, T) token and mask arrays of queries and positives ((N, K, T) negatives), padded
    to `max_seq_length` (queries to `query_length` when set), and `positive_ids`: equal ints
    for equal positive texts."""
    from bert_jax.embeddings import tokenize

    def arrays(texts, length=max_seq_length):
        ids, _ = tokenize(tokenizer, texts, length)
        tokens = np.full((len(ids), length), tokenizer.pad_id, np.int32)
        mask = np.zeros_like(tokens)
        for i, row in enumerate(ids):
            tokens[i, : len(row)], mask[i, : len(row)] = row, 1
        return tokens, mask

    out = {}
    out["query_tokens"], out["query_mask"] = arrays(pairs.queries, query_length or max_seq_length)
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


def text_lengths(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each pair's query, positive and longest negative in tokens (`tokenize_pairs`' masks)."""
    lengths = {}
    for kind in TOKEN_KEYS:
        if f"{kind}_mask" in arrays:
            counts = arrays[f"{kind}_mask"].sum(-1)
            lengths[kind] = counts.max(-1) if counts.ndim > 1 else counts
    return lengths


def cut_to_longest(
    arrays: dict[str, np.ndarray], rows: np.ndarray, mine: slice = slice(None),
    multiple: int = 16, lengths: dict[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:  # fmt: skip
    """Rows `rows[mine]` (this host's share of the batch `rows`) of every array, the token
    axis of queries, positives and negatives each cut to its own longest text in the batch
    `rows` rounded up to `multiple` (`crop_pairs.padded_width`; padding is masked: the
    embeddings are those of the full length; short questions are not run at a passage's
    length). `lengths`: `text_lengths(arrays)`, kept by the caller for every step."""
    from data_pipelines.crop_pairs import padded_width

    lengths = lengths if lengths is not None else text_lengths(arrays)
    local = rows[mine]
    out = {"positive_ids": arrays["positive_ids"][local]}
    for kind, counts in lengths.items():
        tokens = arrays[f"{kind}_tokens"]
        width = padded_width(int(counts[rows].max()), tokens.shape[-1], multiple)
        for key in (f"{kind}_tokens", f"{kind}_mask"):
            out[key] = arrays[key][local][..., :width]
    return out


def retrieval_scores(model, dev, batch_size: int, mesh=None) -> dict[str, float]:
    """Each distinct dev query against every distinct dev positive: nDCG@10, MRR@10,
    R@1/10/100. A query text that repeats is one query, every positive it has relevant."""
    from bert_jax import embeddings, retrieval

    corpus = sorted(set(dev.positives))
    pid = {text: f"p{i}" for i, text in enumerate(corpus)}
    queries = list(dict.fromkeys(dev.queries))
    qid = {text: f"q{i}" for i, text in enumerate(queries)}
    qrels: dict[str, dict[str, int]] = {qid[q]: {} for q in queries}
    for query, positive in zip(dev.queries, dev.positives, strict=True):
        qrels[qid[query]][pid[positive]] = 1
    q = embeddings.embed_texts(model, queries, batch_size=batch_size, desc="dev queries")
    c = embeddings.embed_texts(model, corpus, batch_size=batch_size, desc="dev passages")
    scores, indices = retrieval.top_k(q, c, min(100, len(corpus)), mesh=mesh)
    run = retrieval.run_from_topk(list(qrels), [pid[t] for t in corpus], scores, indices)
    return retrieval.evaluate(run, qrels)


class PairsFile:
    """The batches of a pairs TSV: step s's rows from (seed, epoch)'s permutation."""

    def __init__(self, config, tokenizer, multiple: int = 16):
        from data_pipelines.tasks.pairs import read_pairs

        self.pairs = read_pairs(config.train_file)
        if len(self.pairs) < config.global_batch_size:
            raise ValueError(f"{config.train_file}: {len(self.pairs)} pairs < "
                             f"--config.global_batch_size={config.global_batch_size}")  # fmt: skip
        self.negatives = len(self.pairs.negatives[0])
        self.arrays = tokenize_pairs(tokenizer, self.pairs, config.max_seq_length,
                                     config.get("query_max_seq_length", 0))  # fmt: skip
        self.lengths = text_lengths(self.arrays)
        self.batch_size, self.seed, self.multiple = config.global_batch_size, config.seed, multiple
        self.mlm_predictions, self.tokenizer = _mlm_predictions(config), tokenizer
        self.counts = {"train_pairs": len(self.pairs)}
        self.describe = (f"{len(self.pairs)} pairs ({self.negatives} hard negatives each) "
                         f"from {config.train_file}")  # fmt: skip

    def batch(self, step: int, rows: slice = slice(None)) -> dict[str, np.ndarray]:
        """Rows `rows` (this host's) of step `step`'s batch, cut to the batch's longest."""
        pairs = batch_indices(len(self.pairs), self.batch_size, self.seed, step)
        out = cut_to_longest(self.arrays, pairs, rows, self.multiple, self.lengths)
        if self.mlm_predictions:  # the positives masked too (mlm_weight), row r's own draws
            from data_pipelines.crop_pairs import masked_lm_rows

            out |= masked_lm_rows(out["positive_tokens"], out["positive_mask"],
                                  range(self.batch_size)[rows], self.tokenizer, seed=self.seed,
                                  step=step, predictions=self.mlm_predictions)  # fmt: skip
        return out


def _mlm_predictions(config) -> int:
    """P, the masked positions of a positive where the loss has a masked-LM term; else 0."""
    from bert_jax.embeddings_train import mlm_predictions

    return mlm_predictions(config)


class CorpusPairs:
    """Pairs made from raw text each step (`data_pipelines.crop_pairs`): contrastive
    pretraining, no labels."""

    negatives = 0

    def __init__(self, config, tokenizer, multiple: int = 16):
        from data_pipelines import crop_pairs

        files = [f.strip() for f in config.corpus_files.split(",") if f.strip()]
        documents = [d for f in files for d in crop_pairs.read_documents(f)]
        query = config.get("query_max_seq_length", 0) or config.max_seq_length
        passages = crop_pairs.make_passages(
            documents, tokenizer, config.max_seq_length - tokenizer.num_special_tokens(False)
        )
        rules = crop_pairs.PairRules(
            config.crop_min_ratio, config.crop_max_ratio, config.token_deletion,
            config.sentence_fraction, config.keep_sentence, config.passages_per_document,
        )  # fmt: skip
        self.stream = crop_pairs.PairStream(
            passages, tokenizer, rules, config.global_batch_size, query, config.max_seq_length,
            config.seed, source=f"--config.corpus_files={config.corpus_files}", multiple=multiple,
            mlm_predictions=_mlm_predictions(config),
        )  # fmt: skip
        self.counts = {"train_passages": len(passages), "train_documents": len(documents)}
        self.describe = (f"{len(passages)} passages of {len(documents)} documents in "
                         f"{', '.join(files)} (crops, sentence -> passage)")  # fmt: skip

    def batch(self, step: int, rows: slice = slice(None)) -> dict[str, np.ndarray]:
        """Rows `rows` (this host's) of step `step`'s batch: only those pairs are made."""
        return self.stream.batch(step, rows)


def pair_source(config, tokenizer, multiple: int = 16):
    """The config's training pairs: a pairs file, or pairs made from raw text; each batch's
    widths rounded up to `multiple` (`embeddings_train.width_multiple`)."""
    if bool(config.get("corpus_files")) == bool(config.train_file):
        raise ValueError("give --config.train_file (a pairs TSV) or --config.corpus_files (raw "
                         "text, one sentence a line), one of the two")  # fmt: skip
    return (
        CorpusPairs(config, tokenizer, multiple)
        if config.get("corpus_files")
        else PairsFile(config, tokenizer, multiple)
    )


def resume_state(config, workdir: str, state, shardings):
    """(state, first step, manager): the newest readable save in `<workdir>/state` when the
    run was stopped before (refused when it was another config's), else the given state."""
    from bert_jax import checkpoint_reading, checkpointing
    from bert_jax.config import ConfigError

    manager = checkpointing.make_manager(os.path.join(workdir, "state"), max_to_keep=1)
    if manager.latest_step() is None:
        return state, 0, manager
    abstract = checkpoint_reading.abstract_like(state, shardings)
    restored, positions, saved = checkpoint_reading.restore(manager, None, abstract,
                                                            set_aside=True)  # fmt: skip
    now = checkpointing.config_to_json(config)
    differ = sorted(k for k in set(now) | set(saved) if now.get(k) != saved.get(k))
    if differ:
        shown = ", ".join(f"{k}={saved.get(k)!r} (now {now.get(k)!r})" for k in differ[:3])
        raise ConfigError(f"{workdir} holds a stopped run of another config: {shown}; resume "
                          "it with its own values or use another --workdir")  # fmt: skip
    step = int(positions[0]["step"])
    log.info("resuming %s at step %d", workdir, step)
    return restored, step, manager


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
    """The whole fine-tuning run; returns metrics.json's content."""
    import jax

    from bert_jax import checkpointing, embeddings, embeddings_train, finetune_common, sharding
    from bert_jax.config import BertConfig
    from bert_jax.finetune_signals import signals_between_steps
    from data_pipelines.tasks.pairs import read_pairs

    start = time.time()
    os.makedirs(workdir, exist_ok=True)
    dev = read_pairs(config.dev_file) if config.dev_file else None
    template = embeddings.BertForEmbedding(BertConfig(), config.pooling, config.normalize)
    task = finetune_common.load_task_model(config, template)
    module, params = task.module, task.params
    bert = task.config
    if embeddings_train.mlm_weight(config):  # the MLM head: init_from's, else a fresh one
        head = embeddings_train.pretrained_mlm_head(config, bert)
        log.info("masked-LM term x %s, %s", config.mlm_weight,
                 "the MLM head of --config.init_from" if head else "a fresh MLM head")  # fmt: skip
        params = {**params, "mlm": head} if head is not None else params
    if config.max_seq_length > bert.max_position_embeddings:
        raise ValueError(f"--config.max_seq_length={config.max_seq_length} > the encoder's "
                         f"max_position_embeddings={bert.max_position_embeddings}")  # fmt: skip
    # Batches are padded to their longest text rounded up to 16, 128 under splash attention.
    source = pair_source(config, task.tokenizer, embeddings_train.width_multiple(config, bert))
    log.info("%s; %s pooling, batch %d%s", source.describe, config.pooling,
             config.global_batch_size,
             f" in chunks of {config.chunk_size}" if config.chunk_size else "")  # fmt: skip

    embeddings_train.check_encoder(config, bert)
    mesh = sharding.create_mesh(config.mesh_shape)
    num_steps = config.num_train_steps
    # The step aot_compile compiles for a TPU slice: optimizer, sharded state, shardings.
    contrastive = embeddings_train.make_train_step(
        config, module, mesh, negatives=source.negatives, params=params
    )
    state, step_fn = contrastive.state, contrastive.step
    _, dropout_rng = finetune_common.run_keys(config)
    state, first, manager = resume_state(config, workdir, state, contrastive.shardings)
    rows = sharding.process_rows(mesh, config.global_batch_size)  # this process's share

    def current_model(p):
        return embeddings.EmbeddingModel(module, p, task.tokenizer, task.vocab_file,
                                         config.max_seq_length, "config")  # fmt: skip

    metrics: dict = {"num_train_steps": num_steps, **source.counts}
    if dev is not None:
        metrics["dev_pairs"] = len(dev)
        metrics["before"] = retrieval_scores(current_model(params), dev, config.eval_batch_size)
        log.info("dev before: %s", _fmt(metrics["before"]))
    from tqdm import tqdm

    history = []
    log_path = os.path.join(workdir, "train_log.jsonl")
    every = config.get("checkpoint_every", 0)
    config_json = checkpointing.config_to_json(config)

    def save(step):
        checkpointing.save(manager, step, state, [{"step": step}], config_json)
        checkpointing.finish_saves(manager)

    if first == 0 and os.path.exists(log_path) and jax.process_index() == 0:
        # An earlier run's log is kept beside this one's, never overwritten.
        kept = next(f"{log_path}.{n}" for n in range(1, 10**6)
                    if not os.path.exists(f"{log_path}.{n}"))  # fmt: skip
        os.replace(log_path, kept)
        log.info("the earlier run's %s kept as %s", log_path, kept)
    # The mesh is ambient while the step is traced: the model's activation constraints and
    # splash's shard_map read it (embeddings_train). SIGTERM / Ctrl-C to any process stops
    # every process after the same step (`finetune_signals.signals_between_steps`).
    log_target = log_path if jax.process_index() == 0 else os.devnull  # process 0 logs
    with sharding.activation_context(mesh), open(log_target, "a", encoding="utf-8") as log_file, \
            signals_between_steps(manager) as boundary:  # fmt: skip
        progress = tqdm(total=num_steps, initial=first, desc="contrastive", unit="step",
                        disable=jax.process_index() != 0)  # fmt: skip
        window_start = time.time()
        for step in range(first, num_steps):
            batch = sharding.global_batch(source.batch(step, rows), mesh)  # our rows only
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
                seconds = time.time() - window_start
                record["steps_per_second"] = round(len(window) / max(seconds, 1e-9), 4)
                window_start = time.time()
                log_file.write(json.dumps({"step": step + 1, **record}) + "\n")
                log_file.flush()
                progress.update(step + 1 - progress.n)
                progress.set_postfix(loss=f"{record['loss']:.4f}",
                                     acc=f"{record['accuracy']:.3f}")  # fmt: skip
                history = []
            signum = boundary.stop_after(step + 1)
            if signum:  # SIGTERM / Ctrl-C: saved after the step, resumed there
                progress.close()
                save(step + 1)
                raise finetune_common.Stopped(
                    signum, f"at step {step + 1} of {num_steps}: the train state is saved "
                    f"in {os.path.join(workdir, 'state')}; rerun the same command to resume",
                )  # fmt: skip
            if every and (step + 1) % every == 0 and step + 1 < num_steps:
                save(step + 1)
        progress.close()
    params = host_params(state.params)
    params = {"bert": params["bert"]} if "mlm" in params else params  # the MLM head: not saved
    dims = embeddings_train.matryoshka_dims(config, bert.hidden_size)[1:]  # the prefixes
    if dev is not None:
        metrics["after"] = retrieval_scores(current_model(params), dev, config.eval_batch_size)
        log.info("dev after: %s", _fmt(metrics["after"]))
        if dims:  # Matryoshka: the same embeddings cut to each prefix, re-normalised
            metrics["after_dims"] = {str(d): retrieval_scores(
                current_model(params)._replace(truncate_dim=d), dev, config.eval_batch_size)
                for d in dims}  # fmt: skip
    settings = {"pooling": config.pooling, "normalize": bool(config.normalize),
                "max_seq_length": int(config.max_seq_length)}  # fmt: skip
    if dims:
        settings["matryoshka_dims"] = [bert.hidden_size, *dims]
    if jax.process_index() != 0:  # process 0 writes the model and the metrics
        return metrics
    with finetune_common.final_save(f"{workdir}/checkpoint and metrics.json"):
        finetune_common.save_finetuned(
            os.path.join(workdir, "checkpoint"), bert, params, vocab_file=task.vocab_file,
            metadata={"task": "embedding", "embedding": settings, "init_from": config.init_from,
                      "from_scratch": bool(config.from_scratch),
                      "do_lower_case": config.do_lower_case,
                      "train_file": config.train_file or None,
                      "corpus_files": config.get("corpus_files") or None,
                      "objective": "contrastive_pretraining" if config.get("corpus_files")
                      else "contrastive"},
        )  # fmt: skip
        metrics["wall_seconds"] = round(time.time() - start, 1)
        finetune_common.write_json(os.path.join(workdir, "metrics.json"), metrics)
    shutil.rmtree(os.path.join(workdir, "state"), ignore_errors=True)  # complete: not needed
    return metrics


def host_params(params):
    """The trained params as host arrays, whole on every process (each process's devices
    hold only their shards of a multi-process mesh's arrays)."""
    import jax

    if jax.process_count() == 1:
        return jax.device_get(params)
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(params, tiled=True)


def _fmt(scores: dict[str, float]) -> str:
    return " ".join(f"{k} {v:.4f}" for k, v in scores.items())


TOOL = "finetune_embeddings"
LOGGERS = ("bert_jax", "experiments", __name__)


def _run(config, workdir):
    import jax

    cli.progress_logging(*LOGGERS)
    if jax.process_index() != 0:  # process 0 says how the run goes; the others only warn
        for name in LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)
    try:
        run(config, workdir)
    except (ValueError, FileNotFoundError, IsADirectoryError) as error:
        raise SystemExit(f"finetune_embeddings: {error}") from None


_process_zero_main = finetune_main.make_main(_run, TOOL, saves_model=True)
_other_process_main = finetune_main.make_main(_run, TOOL, saves_model=True, holds_workdir=False)


def main(argv):
    """`finetune_main`'s main, after `jax.distributed` starts where the flags ask for a
    multi-process run (`bert_jax.distributed`): there process 0 alone holds the workdir,
    sets an earlier run's results aside and records the finished run."""
    flag_values = flags.FLAGS
    distributed.check_or_exit(flag_values, TOOL)
    if not distributed.start(flag_values):
        return _process_zero_main(argv)
    import jax

    return (_process_zero_main if jax.process_index() == 0 else _other_process_main)(argv)


if __name__ == "__main__":
    config_flags.DEFINE_config_file("config", None, "Fine-tuning config file.", lock_config=True)
    flags.DEFINE_string("workdir", None, "Where metrics, logs and the model are written.")
    distributed.define_flags()  # multi-host: --distributed, or --coordinator_address, ...
    flags.mark_flags_as_required(["config", "workdir"])
    cli.run(main)
