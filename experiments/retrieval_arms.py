"""The trained rows of `make retrieval` (experiments.retrieval_table; issue 81): contrastive
pretraining on raw text, the supervised arms at each pair budget, and BM25 fusion.

* `held_out_split`: SQuADShifts paragraphs set aside with their questions (never trained
  on, never in the unlabelled text): what the fusion weight is chosen on, never SQuAD dev.
* `write_paragraphs`: the other SQuADShifts paragraphs as unlabelled text (an article a
  document, a sentence a line): in-domain text beside gensim's Wikipedia, no question.
* `contrastive_pretraining`: `experiments.finetune_embeddings` with
  configs/embeddings_contrastive_pretraining.py on that text, from the MLM encoder
  (`--cpt_init=mlm`: MLM -> contrastive pretraining) or from random weights; its model is
  the zero-label row and the pretrained arm's init.
* `supervised`: one arm and seed on all the pairs or on a budget of them (the same
  `budget` pairs for both arms of a seed, drawn from (seed, budget)).
* `fusion`: BM25 with a dense run, by reciprocal rank fusion and by min-max-normalised
  score interpolation whose weight is the best of 0.0, 0.1 ... 1.0 on the held-out pairs;
  on SQuAD dev each against BM25 alone, paired over questions (bootstrap 95%).
"""

from __future__ import annotations

import json
import os
import shutil
import time

import numpy as np
from absl import flags

FLAGS = flags.FLAGS
CPT_CONFIG = "experiments/configs/embeddings_contrastive_pretraining.py"
EMBEDDINGS_CONFIG = "experiments/configs/embeddings.py"
WEIGHTS = tuple(round(0.1 * i, 1) for i in range(11))


def define_flags() -> None:
    flags.DEFINE_integer("heldout_paragraphs", 300, "SQuADShifts paragraphs (with their "
                         "questions) held out to choose the fusion weight on.")  # fmt: skip
    flags.DEFINE_enum("cpt_init", "random", ["mlm", "random"], "Contrastive pretraining "
                      "starts from random weights or from the MLM encoder (mlm: the chain; "
                      "20.1 against 30.5 nDCG@10 in the pilot: retrieval_results.md)")  # fmt: skip
    flags.DEFINE_integer("cpt_steps", 1000, "Contrastive pretraining steps (0: none).")
    flags.DEFINE_integer("cpt_batch_size", 64, "Pairs a contrastive pretraining step.")
    flags.DEFINE_float("cpt_learning_rate", 1e-3, "Peak contrastive pretraining rate.")
    flags.DEFINE_list("budgets", ["640"], "Pair budgets for the supervised arms besides "
                      "all the pairs (the same pairs for both arms of a seed).")  # fmt: skip


RESULT_FLAGS = ("heldout_paragraphs", "cpt_init", "cpt_steps", "cpt_batch_size",
                "cpt_learning_rate", "budgets")  # fmt: skip


def budgets() -> list[int]:
    try:
        values = sorted({int(b) for b in FLAGS.budgets})
    except ValueError as error:
        raise flags.ValidationError(f"--budgets: {error}") from None
    if any(b < FLAGS.finetune_batch_size for b in values):
        least = FLAGS.finetune_batch_size
        raise flags.ValidationError(f"--budgets={','.join(FLAGS.budgets)}: each at least "
                                    f"--finetune_batch_size={least}")  # fmt: skip
    return values


# ----------------------------------------------------------------------------- data


def held_out_split(pairs: list[tuple[str, str]], paragraphs: int, seed: int = 0):
    """(training pairs, held-out pairs): `paragraphs` paragraphs drawn from (seed) with all
    their questions go to the held-out side."""
    distinct = sorted({p for _, p in pairs})
    if paragraphs >= len(distinct):
        raise flags.ValidationError(f"--heldout_paragraphs={paragraphs}: the pairs hold "
                                    f"{len(distinct)} paragraphs")  # fmt: skip
    rng = np.random.default_rng([seed, 81])
    held = {distinct[i] for i in rng.choice(len(distinct), paragraphs, replace=False)}
    return [x for x in pairs if x[1] not in held], [x for x in pairs if x[1] in held]


def write_paragraphs(paths: list[str], exclude, path: str) -> int:
    """The paragraphs of SQuAD files `paths` but `exclude` (texts, whitespace-normalised) as
    a corpus file: an article a document, a sentence a line (pysbd); returns how many."""
    from data_pipelines.corpora import make_sentence_splitter
    from data_pipelines.tasks.squad_retrieval import normalize_text, read_paragraphs

    split = make_sentence_splitter("en")
    excluded = {normalize_text(text) for text in exclude}
    count = 0
    with open(path + ".part", "w", encoding="utf-8") as f:
        for source in paths:
            article = None
            for pid, context, _ in read_paragraphs(source):
                if normalize_text(context) in excluded:
                    continue
                if article is not None and pid.split("-")[0] != article:
                    f.write("\n")  # a blank line: the next article
                article = pid.split("-")[0]
                f.write("\n".join(split(context)) + "\n")
                count += 1
            f.write("\n")
    os.replace(path + ".part", path)
    return count


def budget_pairs(workdir: str, budget: int, seed: int) -> str:
    """The pairs file of `budget` pairs of pairs.tsv drawn from (seed, budget)."""
    path = os.path.join(workdir, "budgets", f"pairs_{budget}_seed{seed}.tsv")
    if not os.path.exists(path):
        with open(os.path.join(workdir, "pairs.tsv"), encoding="utf-8") as f:
            lines = f.readlines()
        rows = np.random.default_rng([seed, budget]).choice(len(lines), budget, replace=False)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".part", "w", encoding="utf-8") as f:
            f.writelines(lines[i] for i in sorted(rows))
        os.replace(path + ".part", path)
    return path


# ----------------------------------------------------------------------------- training


def cpt_dir(workdir: str) -> str:
    return os.path.join(workdir, "contrastive_pretraining")


def contrastive_pretraining(workdir: str, vocab: str, score) -> dict:
    """Trains the zero-label encoder (resuming a stopped run) and scores it with `score(model,
    save)`."""
    from bert_jax import embeddings
    from data_pipelines import recipe

    out = cpt_dir(workdir)
    corpora = [os.path.join(workdir, "wikipedia", "corpus.txt"),
               os.path.join(workdir, "paragraphs.txt")]  # fmt: skip
    init = [f"--config.init_from={os.path.join(workdir, 'pretrain')}"]
    if FLAGS.cpt_init == "random":
        init.append("--config.from_scratch=True")
    recipe.run("contrastive pretraining", [
        "experiments.finetune_embeddings", f"--config={CPT_CONFIG}", f"--workdir={out}",
        *init, f"--config.vocab_file={vocab}", f"--config.corpus_files={','.join(corpora)}",
        f"--config.global_batch_size={FLAGS.cpt_batch_size}",
        f"--config.num_train_steps={FLAGS.cpt_steps}",
        f"--config.learning_rate={FLAGS.cpt_learning_rate}",
        "--config.optimizer=adamw_bias_corrected", f"--config.scale={FLAGS.scale}",
        "--config.max_seq_length=128", "--config.query_max_seq_length=64", "--config.seed=0",
        f"--config.checkpoint_every={max(FLAGS.cpt_steps // 4, 1)}", "--config.log_every=25",
    ])  # fmt: skip
    with open(os.path.join(out, "metrics.json"), encoding="utf-8") as f:
        trained = json.load(f)
    model = embeddings.load_embedding_model(out, max_seq_length=FLAGS.max_seq_length)
    result = score(model, os.path.join(workdir, "results", "cpt_dev.npy"))
    return result | {"train_seconds": trained["wall_seconds"], "steps": FLAGS.cpt_steps,
                     "passages": trained.get("train_passages"), "init": FLAGS.cpt_init}  # fmt: skip


def run_name(arm: str, seed: int, budget: int | None) -> str:
    return f"{arm}_seed{seed}" if budget is None else f"{arm}_b{budget}_seed{seed}"


def supervised(workdir: str, arm: str, seed: int, budget: int | None, score) -> dict:
    """One arm and seed from its start (a stopped run's leftovers removed first), on all the
    pairs (`budget` None) or on `budget_pairs`; scored by `score(model, save)`."""
    from bert_jax import embeddings
    from data_pipelines import recipe

    name = run_name(arm, seed, budget)
    out = os.path.join(workdir, "contrastive", name)
    shutil.rmtree(out, ignore_errors=True)
    pairs = os.path.join(workdir, "pairs.tsv") if budget is None else budget_pairs(
        workdir, budget, seed)  # fmt: skip
    init = (os.path.join(cpt_dir(workdir), "checkpoint") if arm == "pretrained" and FLAGS.cpt_steps
            else os.path.join(workdir, "pretrain"))  # fmt: skip
    recipe.run(name, [
        "experiments.finetune_embeddings", f"--config={EMBEDDINGS_CONFIG}", f"--workdir={out}",
        f"--config.init_from={init}", f"--config.from_scratch={arm == 'scratch'}",
        f"--config.seed={seed}", f"--config.train_file={pairs}",
        f"--config.global_batch_size={FLAGS.finetune_batch_size}",
        f"--config.num_train_steps={FLAGS.finetune_steps}",
        f"--config.learning_rate={FLAGS.finetune_learning_rate}",
        "--config.optimizer=adamw_bias_corrected",
        f"--config.scale={FLAGS.scale}", f"--config.max_seq_length={FLAGS.max_seq_length}",
        f"--config.query_max_seq_length={min(64, FLAGS.max_seq_length)}",
        "--config.pooling=mean", "--config.normalize=True",
        f"--config.eval_batch_size={FLAGS.eval_batch_size}",
    ])  # fmt: skip
    with open(os.path.join(out, "metrics.json"), encoding="utf-8") as f:
        trained = json.load(f)
    with open(os.path.join(out, "train_log.jsonl"), encoding="utf-8") as f:
        last = [json.loads(line) for line in f if line.strip()][-1]
    model = embeddings.load_embedding_model(out)
    eval_start = time.time()
    save = os.path.join(workdir, "results", f"{name}_dev.npy") if seed == 0 else ""
    result = score(model, save)
    return result | {
        "arm": arm, "seed": seed, "budget": budget, "train_pairs": trained["train_pairs"],
        "train_seconds": trained["wall_seconds"],
        "eval_seconds": round(time.time() - eval_start, 1),
        "final_loss": last["loss"], "final_accuracy": last["accuracy"],
    }  # fmt: skip


# ----------------------------------------------------------------------------- fusion


def _dense_run(queries: np.ndarray, passages: np.ndarray, qids, pids) -> dict:
    from bert_jax import retrieval

    scores, indices = retrieval.top_k(queries, passages, min(100, len(pids)))
    return retrieval.run_from_topk(list(qids), list(pids), scores, indices)


def _retrieval_set(pairs: list[tuple[str, str]]):
    from data_pipelines.tasks.squad_retrieval import RetrievalSet

    paragraphs = list(dict.fromkeys(p for _, p in pairs))
    pid = {p: f"h{i}" for i, p in enumerate(paragraphs)}
    queries, qrels = {}, {}
    for i, (question, paragraph) in enumerate(pairs):
        queries[f"hq{i}"] = question
        qrels[f"hq{i}"] = {pid[paragraph]: 1}
    return RetrievalSet(queries, {pid[p]: p for p in paragraphs}, qrels)


def fusion(dev, heldout_pairs, dense: dict[str, tuple], bm25_dev: dict) -> dict:
    """For each dense system (name -> (embed function, its dev embeddings .npy)): the fusion
    weight chosen on the held-out pairs, and on SQuAD dev the metrics of RRF and of the
    interpolation, each against BM25 alone (nDCG@10 paired over questions)."""
    from bert_jax import retrieval

    held = _retrieval_set(heldout_pairs)
    bm25_held = retrieval.bm25_run(held.queries, held.corpus)
    bm25_per_query = retrieval.per_query(bm25_dev, dev.qrels)
    out = {"heldout_questions": len(held.queries), "heldout_paragraphs": len(held.corpus),
           "systems": {}}  # fmt: skip
    for name, (embed, npy) in dense.items():
        q = np.asarray(embed(list(held.queries.values()), "held-out questions"), np.float32)
        p = np.asarray(embed(list(held.corpus.values()), "held-out paragraphs"), np.float32)
        run_held = _dense_run(q, p, held.queries, held.corpus)
        chosen = {w: retrieval.evaluate(retrieval.fuse_scores(run_held, bm25_held, w),
                                        held.qrels)["nDCG@10"] for w in WEIGHTS}  # fmt: skip
        weight = max(WEIGHTS, key=lambda w: (chosen[w], -abs(w - 0.5)))
        vectors = np.load(npy)
        n = len(dev.queries)
        run_dev = _dense_run(vectors[:n], vectors[n:], dev.queries, dev.corpus)
        system = {"weight": weight, "heldout_nDCG@10_by_weight": chosen}
        kinds = {"rrf": retrieval.fuse_rrf([run_dev, bm25_dev]),
                 "interpolated": retrieval.fuse_scores(run_dev, bm25_dev, weight)}  # fmt: skip
        for kind, fused in kinds.items():
            metrics = retrieval.evaluate(fused, dev.qrels)
            per = retrieval.per_query(fused, dev.qrels)
            qids = list(dev.qrels)
            gain = retrieval.paired_interval([per[q] for q in qids],
                                             [bm25_per_query[q] for q in qids],
                                             method="bootstrap", n_resamples=2000)  # fmt: skip
            system[kind] = metrics | {"minus_bm25": {"mean": gain.mean, "low": gain.low,
                                                     "high": gain.high}}  # fmt: skip
        out["systems"][name] = system
    return out
