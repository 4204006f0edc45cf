"""experiments.demo: the held-out split of the corpus and the report (table, JSON, PNG).

The stages themselves are the project's tools, tested in their own files; running the
whole demo takes tens of minutes and is `make demo`'s job.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from experiments import demo

REPO = Path(__file__).parent.parent


def test_every_20th_document_is_held_out_as_make_pretrain_does(tmp_path):
    documents = [f"scene {i} line one.\nscene {i} line two." for i in range(1, 46)]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(documents) + "\n\n\n")
    counts = demo.split_documents(
        str(corpus), str(tmp_path / "train.txt"), str(tmp_path / "eval.txt")
    )
    assert counts == (43, 2)
    held_out = (tmp_path / "eval.txt").read_text()
    assert (
        held_out
        == "scene 20 line one.\nscene 20 line two.\n\nscene 40 line one.\nscene 40 line two.\n\n"
    )
    train = (tmp_path / "train.txt").read_text().split("\n\n")
    assert train[0] == "scene 1 line one.\nscene 1 line two." and "scene 20 " not in "".join(train)


def test_corpora_are_joined_with_a_document_break(tmp_path):
    from data_pipelines import corpora

    (tmp_path / "a.txt").write_text("a1.\na2.\n\nb1.\n")  # ends without a blank line
    (tmp_path / "b.txt").write_text("\nc1.\nc2.\n\n\n")  # stray blank lines around
    joined = str(tmp_path / "corpus.txt")
    demo.concatenate([str(tmp_path / "a.txt"), str(tmp_path / "b.txt")], joined)
    documents = corpora.read_documents([joined], corpora.ReadStats())
    assert [d.sentences for d in documents] == [["a1.", "a2."], ["b1."], ["c1.", "c2."]]


def _fake_run(directory: Path, dev: list[float], test: float) -> dict:
    directory.mkdir(parents=True)
    log = [{"step": 10 * i, "epoch": i / 3, "loss": 0.7 - 0.1 * i} for i in range(1, 4)]
    (directory / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
    epochs = [{"epoch": i + 1, "dev": {"accuracy": a}} for i, a in enumerate(dev)]
    return {"epochs": epochs, "test": {"test": {"accuracy": test}}, "wall_time_s": 90.0}


def test_report_table_json_and_png(tmp_path):
    pretrain = tmp_path / "pretrain"
    pretrain.mkdir()
    records = [
        {"step": 0, "split": "eval", "loss": 9.7, "mlm_accuracy": 0.0, "nsp_accuracy": 0.5},
        {"step": 50, "split": "train", "loss": 7.0, "mlm_accuracy": 0.1, "nsp_accuracy": 0.55},
        {"step": 100, "split": "eval", "loss": 5.0, "mlm_accuracy": 0.3, "nsp_accuracy": 0.6},
    ]
    (pretrain / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    runs = {
        "pretrained": _fake_run(tmp_path / "polarity_pretrained", [0.70, 0.74], 0.755),
        "from scratch": _fake_run(tmp_path / "polarity_scratch", [0.65, 0.69], 0.712),
    }
    table = demo.report(str(tmp_path), str(pretrain), runs)
    assert "| pretrained | 70.0% / 74.0% | **75.5%** | 1.5 min |" in table
    assert "| from scratch | 65.0% / 69.0% | **71.2%** | 1.5 min |" in table
    assert "pretraining adds +4.3 accuracy points" in table
    assert "held-out MLM accuracy 30.0%" in table
    summary = json.loads((tmp_path / "results.json").read_text())
    assert summary["pretraining_gain_points"] == pytest.approx(4.3)
    assert (tmp_path / "results.md").read_text() == table
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_help():
    result = subprocess.run([sys.executable, "-m", "experiments.demo", "--help"],
                            capture_output=True, text=True, cwd=REPO, timeout=300)  # fmt: skip
    assert "pretrain BERT-tiny on Shakespeare" in result.stdout
    assert "--pretrain_steps" in result.stdout
