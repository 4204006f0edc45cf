"""Classification on your own files (issue 75 item 5): TSV, CSV and JSONL with text[,
text_b], label; the label set from the training file; numbers regress; a bad row or an
unknown label named by file and line; end to end through finetune_classification."""

from __future__ import annotations

import json

import pytest
from finetune_fixtures import TINY, minilm_vocab, pretrained_params

from bert_jax import convert
from data_pipelines.tasks.formats import TaskDataError
from data_pipelines.tasks.sentence_tasks import own_task
from experiments import finetune_classification as ftc
from experiments.configs import finetune_own_classification

ROWS = [("a wonderful film", "pos"), ("a dreadful film", "neg"), ("great acting, truly", "pos"),
        ("terrible plot", "neg")] * 4  # fmt: skip


def _write(path, rows, kind=None):
    kind = kind or path.suffix.lstrip(".")
    if kind == "jsonl":
        path.write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in rows))
    elif kind == "csv":
        path.write_text("text,label\n" + "".join(f'"{t}",{y}\n' for t, y in rows))
    else:
        path.write_text("text\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in rows))
    return str(path)


@pytest.mark.parametrize("suffix", [".tsv", ".csv", ".jsonl"])
def test_each_format_reads_the_same_examples(tmp_path, suffix):
    task = own_task(_write(tmp_path / f"train{suffix}", ROWS))
    assert task.labels == ("neg", "pos")
    assert [(e.text_a, e.label) for e in task.splits["train"]] == ROWS
    assert task.metrics == ("accuracy",)


def test_pairs_and_numbers_to_regress_on(tmp_path):
    path = tmp_path / "sts.tsv"
    path.write_text("text\ttext_b\tlabel\na cat\ta kitten\t4.5\na car\ta tree\t0\n")
    task = own_task(str(path))
    assert task.labels is None and task.metrics == ("pearson", "spearman")
    assert task.splits["train"][0].text_b == "a kitten" and task.splits["train"][0].label == 4.5
    classes = tmp_path / "stars.tsv"
    classes.write_text("text\tlabel\nok\t1\nbad\t0\n")
    assert own_task(str(classes)).labels == ("0", "1")  # integers stay classes
    assert own_task(str(classes), label_type="number").labels is None


@pytest.mark.parametrize(
    "dev,message",
    [
        ("text\tlabel\nfine\tmeh\n", r"dev.tsv:2: label 'meh' is not one of the training labels"),
        ("text\tlabel\n\tpos\n", r"dev.tsv:2: no 'text'"),
        ("text\tlabel\nfine\n", r"dev.tsv:2: 1 fields, the header has 2"),
        ("sentence\tlabel\nfine\tpos\n", r"dev.tsv:1: the header .* has no 'text' column"),
    ],
)
def test_a_bad_row_is_named_by_file_and_line(tmp_path, dev, message):
    (tmp_path / "dev.tsv").write_text(dev)
    with pytest.raises(TaskDataError, match=message):
        own_task(_write(tmp_path / "train.tsv", ROWS), str(tmp_path / "dev.tsv"))


def test_fine_tuning_on_own_files_end_to_end(tmp_path):
    hf = convert.save_hf(tmp_path / "hf", TINY, pretrained_params(), vocab_file=minilm_vocab())
    config = finetune_own_classification.get_config()
    config.update(
        init_from=str(hf), train_file=_write(tmp_path / "train.tsv", ROWS),
        dev_file=_write(tmp_path / "dev.csv", ROWS[:8]),
        test_file=_write(tmp_path / "test.jsonl", ROWS[:4]), max_seq_length=16,
        train_batch_size=8, eval_batch_size=8, num_epochs=2, log_every=1,
    )  # fmt: skip
    ftc.finetune(config, str(tmp_path / "run"))
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert saved["num_examples"] == {"train": 16, "dev": 8, "test": 4}
    assert 0.0 <= saved["epochs"][-1]["dev"]["accuracy"] <= 1.0
    assert 0.0 <= saved["test"]["test"]["accuracy"] <= 1.0  # results["test"][split]
    predictions = (tmp_path / "run" / "predictions_test.tsv").read_text().splitlines()
    assert len(predictions) == 5 and predictions[1].split("\t")[2] in ("neg", "pos")


def test_the_bounds_table_names_the_readers_label_types():
    from bert_jax import config_bounds
    from data_pipelines.tasks import own_files

    assert config_bounds.LABEL_TYPES == own_files.LABEL_TYPES
