"""The nine GLUE tasks: readers of the official TSV files, TFDS `glue/*`, submission files.

`data_dir` is one task's directory as the GLUE download script leaves it
(`glue_data/MRPC`, ...), holding `train.tsv`, `dev.tsv`, `test.tsv` (MNLI:
`dev_matched.tsv`, `dev_mismatched.tsv`, `test_matched.tsv`, `test_mismatched.tsv`, and the
diagnostic set AX as `diagnostic.tsv` there or in `../diagnostic/`). The columns read are
those of each official file (CoLA's train/dev files have no header row; test files carry
an `index` column, which the submission TSVs repeat). A row without the expected columns
or with a label outside the task's set is a `TaskDataError` naming the file and line;
`skip_malformed=True` instead skips such rows, logging each (QQP's train file is known to
hold a few broken rows).
"""

from __future__ import annotations

import csv
import dataclasses
import logging
import math
import os
from collections.abc import Sequence

from data_pipelines.tasks.formats import SentenceExample, TaskDataError, field, read_tsv

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Columns:
    """Where one file layout keeps its fields (indices may be negative)."""

    header: bool  # the first line names the columns
    text_a: int
    text_b: int | None = None
    label: int | None = None  # None: unlabeled (test)
    guid: int | None = None  # the `index` column of test files


@dataclasses.dataclass(frozen=True)
class GlueTask:
    name: str  # our short name: cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli
    labels: tuple[str, ...] | None  # class names in id order; None for regression (STS-B)
    labeled: Columns  # train and dev files
    test: Columns
    splits: dict[str, str]  # our split name -> file name
    submission: dict[str, str]  # test split -> file name in the GLUE submission zip
    tfds_splits: dict[str, str]  # our split name -> TFDS split
    tfds_text: tuple[str, ...]  # TFDS feature names of text_a (and text_b)
    score_range: tuple[float, float] | None = None  # a regression target's [low, high]


_PAIR_TEST = Columns(header=True, guid=0, text_a=1, text_b=2)
_BINARY = ("0", "1")
_NLI2 = ("entailment", "not_entailment")
_SPLITS = {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}
_TFDS_SPLITS = {"train": "train", "dev": "validation", "test": "test"}

TASKS: dict[str, GlueTask] = {
    t.name: t
    for t in (
        GlueTask(
            "cola", _BINARY, Columns(header=False, text_a=3, label=1),
            Columns(header=True, guid=0, text_a=1), _SPLITS, {"test": "CoLA.tsv"},
            _TFDS_SPLITS, ("sentence",),
        ),
        GlueTask(
            "sst2", _BINARY, Columns(header=True, text_a=0, label=1),
            Columns(header=True, guid=0, text_a=1), _SPLITS, {"test": "SST-2.tsv"},
            _TFDS_SPLITS, ("sentence",),
        ),
        GlueTask(
            "mrpc", _BINARY, Columns(header=True, text_a=3, text_b=4, label=0),
            Columns(header=True, guid=0, text_a=3, text_b=4), _SPLITS, {"test": "MRPC.tsv"},
            _TFDS_SPLITS, ("sentence1", "sentence2"),
        ),
        GlueTask(
            "stsb", None, Columns(header=True, text_a=7, text_b=8, label=9),
            Columns(header=True, guid=0, text_a=7, text_b=8), _SPLITS, {"test": "STS-B.tsv"},
            _TFDS_SPLITS, ("sentence1", "sentence2"), score_range=(0.0, 5.0),
        ),
        GlueTask(
            "qqp", _BINARY, Columns(header=True, text_a=3, text_b=4, label=5),
            _PAIR_TEST, _SPLITS, {"test": "QQP.tsv"},
            _TFDS_SPLITS, ("question1", "question2"),
        ),
        GlueTask(
            "mnli", ("contradiction", "entailment", "neutral"),
            Columns(header=True, text_a=8, text_b=9, label=-1),
            Columns(header=True, guid=0, text_a=8, text_b=9),
            {
                "train": "train.tsv",
                "dev_matched": "dev_matched.tsv",
                "dev_mismatched": "dev_mismatched.tsv",
                "test_matched": "test_matched.tsv",
                "test_mismatched": "test_mismatched.tsv",
                "test_ax": "diagnostic.tsv",
            },
            {"test_matched": "MNLI-m.tsv", "test_mismatched": "MNLI-mm.tsv", "test_ax": "AX.tsv"},
            {
                "train": "train",
                "dev_matched": "validation_matched",
                "dev_mismatched": "validation_mismatched",
                "test_matched": "test_matched",
                "test_mismatched": "test_mismatched",
            },
            ("premise", "hypothesis"),
        ),
        GlueTask(
            "qnli", _NLI2, Columns(header=True, text_a=1, text_b=2, label=3),
            _PAIR_TEST, _SPLITS, {"test": "QNLI.tsv"},
            _TFDS_SPLITS, ("question", "sentence"),
        ),
        GlueTask(
            "rte", _NLI2, Columns(header=True, text_a=1, text_b=2, label=3),
            _PAIR_TEST, _SPLITS, {"test": "RTE.tsv"},
            _TFDS_SPLITS, ("sentence1", "sentence2"),
        ),
        GlueTask(
            "wnli", _BINARY, Columns(header=True, text_a=1, text_b=2, label=3),
            _PAIR_TEST, _SPLITS, {"test": "WNLI.tsv"},
            _TFDS_SPLITS, ("sentence1", "sentence2"),
        ),
    )
}  # fmt: skip


# Each task's official metrics, by `bert_jax.scoring` name (the first is the task's
# headline score).
METRICS = {
    "cola": ("matthews_corrcoef",),
    "sst2": ("accuracy",),
    "mrpc": ("f1", "accuracy"),
    "stsb": ("pearson", "spearman"),
    "qqp": ("accuracy", "f1"),
    "mnli": ("accuracy",),
    "qnli": ("accuracy",),
    "rte": ("accuracy",),
    "wnli": ("accuracy",),
}


def get_task(name: str) -> GlueTask:
    key = name.lower().replace("-", "")
    if key not in TASKS:
        raise ValueError(f"unknown GLUE task {name!r}; choose one of {sorted(TASKS)}")
    return TASKS[key]


def split_path(task: GlueTask, data_dir: str, split: str) -> str:
    """The file of `split`; AX may also sit in GLUE's separate `diagnostic/` directory."""
    if split not in task.splits:
        raise ValueError(f"GLUE {task.name} has no split {split!r}; it has {sorted(task.splits)}")
    path = os.path.join(data_dir, task.splits[split])
    if split == "test_ax" and not os.path.exists(path):
        path = os.path.join(
            os.path.dirname(os.path.normpath(data_dir)), "diagnostic", "diagnostic.tsv"
        )
    return path


def read_split(
    task: GlueTask | str, data_dir: str, split: str, *, skip_malformed: bool = False
) -> list[SentenceExample]:
    """The examples of one split (test splits are unlabeled) from the official TSV."""
    task = get_task(task) if isinstance(task, str) else task
    path = split_path(task, data_dir, split)
    columns = task.test if split.startswith("test") else task.labeled
    if split == "test_ax":  # diagnostic.tsv: index, sentence1, sentence2
        columns = _PAIR_TEST
    examples, skipped = [], 0
    for line, row in read_tsv(path, skip_header=columns.header):
        try:
            examples.append(_example(task, columns, path, split, line, row))
        except TaskDataError as e:
            if not skip_malformed:
                raise
            skipped += 1
            log.warning("skipping malformed row: %s", e)
    if skipped:
        log.warning("%s: skipped %d malformed row(s), kept %d", path, skipped, len(examples))
    if not examples:
        raise TaskDataError(f"{path}: no examples")
    return examples


def _example(task, columns: Columns, path, split, line, row) -> SentenceExample:
    needed = [
        i for i in (columns.text_a, columns.text_b, columns.label, columns.guid) if i is not None
    ]
    width = max(i if i >= 0 else -i - 1 for i in needed) + 1
    if len(row) < width:
        raise TaskDataError(
            f"{path}:{line}: expected at least {width} tab-separated fields for GLUE {task.name}, "
            f"got {len(row)}"
        )
    text_a = field(path, line, row, columns.text_a, "text_a")
    text_b = None if columns.text_b is None else field(path, line, row, columns.text_b, "text_b")
    guid = f"{split}-{line}" if columns.guid is None else row[columns.guid]
    label = None
    if columns.label is not None:
        label = row[columns.label]
        if task.labels is None:
            try:
                label = float(label)
            except ValueError:
                raise TaskDataError(f"{path}:{line}: score {label!r} is not a number") from None
            check_score(task, label, f"{path}:{line}")
        elif label not in task.labels:
            raise TaskDataError(
                f"{path}:{line}: label {label!r} is not one of GLUE {task.name}'s "
                f"{list(task.labels)}"
            )
    return SentenceExample(guid, text_a, text_b, label)


def check_score(task: GlueTask, score: float, where: str) -> None:
    """Refuses a regression target that is not finite or outside the task's range: one such
    score trains (STS-B at 500: loss in the thousands) or stops at a non-finite loss later
    without naming its row."""
    low, high = task.score_range or (-math.inf, math.inf)
    if not math.isfinite(score) or not low <= score <= high:
        raise TaskDataError(
            f"{where}: score {score!r} is outside GLUE {task.name}'s range [{low:g}, {high:g}]"
        )


def read_tfds(
    task: GlueTask | str, split: str, *, data_dir: str | None = None
) -> list[SentenceExample]:
    """The examples of one split from TFDS `glue/<task>` (prepared beforehand; no download)."""
    import tensorflow_datasets as tfds

    task = get_task(task) if isinstance(task, str) else task
    if split not in task.tfds_splits:
        raise ValueError(f"TFDS glue/{task.name} has no split for {split!r}")
    builder = tfds.builder(f"glue/{task.name}", data_dir=data_dir)
    dataset = builder.as_dataset(split=task.tfds_splits[split])
    names = None if task.labels is None else builder.info.features["label"].names
    labeled = not split.startswith("test")
    examples = []
    for record in tfds.as_numpy(dataset):
        texts = [record[k].decode("utf-8") for k in task.tfds_text]
        label = None
        if labeled and task.labels is None:
            label = float(record["label"])
            check_score(task, label, f"TFDS glue/{task.name} {split} idx {int(record['idx'])}")
        elif labeled:
            name = names[int(record["label"])]
            # TFDS names CoLA/SST-2/... classes in words; ours are their ids, as in the TSVs.
            label = name if name in task.labels else str(int(record["label"]))
        examples.append(
            SentenceExample(
                str(int(record["idx"])), texts[0], texts[1] if len(texts) > 1 else None, label
            )
        )
    return examples


def write_submission(
    path: str, task: GlueTask | str, guids: Sequence[str], predictions: Sequence
) -> None:
    """A GLUE-server TSV: `index<TAB>prediction`, label names (STS-B: scores clipped to 0..5)."""
    task = get_task(task) if isinstance(task, str) else task
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(["index", "prediction"])
        for guid, prediction in zip(guids, predictions, strict=True):
            if task.labels is None:
                value = f"{min(max(float(prediction), 0.0), 5.0):.3f}"
            else:
                value = task.labels[int(prediction)]
            writer.writerow([guid, value])
    os.replace(tmp, path)
