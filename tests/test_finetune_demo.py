"""experiments.demo: the held-out split of the corpus, the report (table, JSON, PNG), and a
tiny run of every stage of each task (the real demo takes half an hour: `make demo`)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_captured

from data_pipelines import recipe
from experiments import demo, demo_finetune

REPO = Path(__file__).parent.parent


def test_every_20th_document_is_held_out_as_make_pretrain_does(tmp_path):
    documents = [f"scene {i} line one.\nscene {i} line two." for i in range(1, 46)]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(documents) + "\n\n\n")
    counts = recipe.split_documents(
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
    recipe.concatenate([str(tmp_path / "a.txt"), str(tmp_path / "b.txt")], joined)
    documents = corpora.read_documents([joined], corpora.ReadStats())
    assert [d.sentences for d in documents] == [["a1.", "a2."], ["b1."], ["c1.", "c2."]]


def test_the_recipe_passes_the_records_kind_to_create_pretraining_data(tmp_path, monkeypatch):
    """Sentence pairs by default; single segments, unmasked, for the "ltr" objective."""
    calls = []
    monkeypatch.setattr(recipe, "run", lambda stage, args: calls.append(args))
    common = dict(max_seq_length=64, dupe_factor=1, seed=0)
    recipe.make_records(str(tmp_path), "vocab.txt", str(tmp_path / "pairs"), **common)
    recipe.make_records(
        str(tmp_path), "vocab.txt", str(tmp_path / "ltr"), **common,
        next_sentence=False, masking="dynamic",
    )  # fmt: skip
    assert len(calls) == 4  # train and eval records, twice
    for args in calls[:2]:
        assert "--next_sentence=true" in args and "--masking=static" in args
    for args in calls[2:]:
        assert "--next_sentence=false" in args and "--masking=dynamic" in args


def _pretraining_log(directory: Path) -> None:
    directory.mkdir()
    records = [
        {"step": 0, "split": "eval", "loss": 9.7, "mlm_accuracy": 0.0},
        {"step": 50, "split": "train", "loss": 7.0, "mlm_accuracy": 0.1},
        {"step": 100, "split": "eval", "loss": 5.5, "mlm_accuracy": 0.2},
        # step 100 re-run after a resume: the last record of a step counts
        {"step": 100, "split": "eval", "loss": 5.0, "mlm_accuracy": 0.3},
    ]
    (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def _budget(labels, pretrained, scratch, optimizer="adamw_bias_corrected"):
    from experiments.label_budgets import paired_difference

    return {"labels": labels, "steps": 300, "optimizer": optimizer, "pretrained": pretrained,
            "scratch": scratch, "difference": paired_difference(pretrained, scratch)}  # fmt: skip


def test_report_table_json_and_png(tmp_path, parse_demo_flags):
    parse_demo_flags("--seed=3")
    _pretraining_log(tmp_path / "pretrain")
    budgets = [
        _budget(100, [0.20, 0.22, 0.24], [0.10, 0.13, 0.13]),
        _budget(1600, [0.50, 0.50, 0.50], [0.47, 0.46, 0.48]),
    ]
    comparison = _budget(100, [0.18, 0.20, 0.22], [0.10, 0.10, 0.10], optimizer="adamw")
    linear = [{"labels": 100, "linear": [0.30, 0.32, 0.34]}]  # no row for 1,600: none shown
    finetuning = {"budgets": budgets, "optimizer_comparison": comparison, "recipe": {"a": 1},
                  "linear": linear}  # fmt: skip
    fill = [{"text": "[MASK][MASK]说", "entity": "江泽", "type": "PER",
             "predictions": [["江", "李"], ["泽", "鹏"]]}]  # fmt: skip
    extra = {"fill_mask": fill, "wall_time_s": {"total": 60.0}}
    text = demo.report(str(tmp_path), str(tmp_path / "pretrain"), finetuning, extra)
    # Paired differences 10, 9, 11 points: mean 10, t(2) interval 10 ± 4.303 * 1 / sqrt(3).
    assert "| 100 | 22.0 ± 2.0 | 12.0 ± 1.7 | +10.0 [+7.5, +12.5] | 32.0 ± 2.0 |" in text
    assert "| 1,600 | 50.0 ± 0.0 | 47.0 ± 1.0 | +3.0 [+0.5, +5.5] |\n" in text
    assert "linear tagger |" in text.splitlines()[0]
    assert "- 100: 20.0 22.0 24.0 / 10.0 13.0 13.0" in text
    assert "adamw_bias_corrected 22.0 / 12.0, adamw 20.0 / 10.0" in text
    assert "[MASK][MASK]说 (PER 江泽): 江 李 | 泽 鹏" in text
    assert "held-out MLM accuracy 30.0%" in text and "(seed 3, 100 steps)" in text
    assert "Pretraining (modern recipe)" in text
    summary = json.loads((tmp_path / "results.json").read_text())
    assert summary["label_budgets"] == budgets and summary["seed"] == 3
    assert summary["task"] == "peoples_daily_ner"
    assert summary["optimizer_comparison"] == comparison and summary["fill_mask"] == fill
    assert summary["linear"] == linear and summary["pretraining"]["recipe"] == "modern"
    assert [r["step"] for r in summary["pretraining"]["held_out"]] == [0, 100]
    assert summary["pretraining"]["held_out"][-1]["mlm_accuracy"] == 0.3
    assert summary["pretraining"]["objective"] == "mlm"
    assert (tmp_path / "results.md").read_text() == text
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.extended  # fits the tagger on two subsets: 17 s of make test's budget; CI runs it
def test_the_linear_tagger_fits_in_the_background_on_the_demos_subsets(tmp_path, parse_demo_flags):
    from benchmarks.ner_linear_reference import linear_reference

    parse_demo_flags(
        "--seed=4", "--label_budgets=20,12", "--subsets=2", "--dev_sentences=30",
        "--test_sentences=40",
    )  # fmt: skip
    background = demo.linear_reference(str(tmp_path))
    assert background.process is not None
    rows = background.result()
    assert rows == linear_reference(["20", "12"], 2, 4, 30, 40)
    assert [r["labels"] for r in rows] == [12, 20] and len(rows[0]["linear"]) == 2
    again = demo.linear_reference(str(tmp_path))  # the same settings: read back
    assert again.process is None and again.result() == rows


def test_each_task_has_its_defaults_and_a_flag_given_wins(parse_demo_flags):
    parse_demo_flags()
    assert demo.setting("corpora") == ["peoples_daily_unlabelled"]
    assert demo.setting("label_budgets") == ["100", "400", "1600"]
    parse_demo_flags("--task=polarity", "--subsets=4")
    assert demo.setting("corpora") == ["imdb"] and demo.setting("subsets") == 4
    assert demo.setting("finetune_optimizer") == "adamw"  # the polarity demo's, unchanged


def test_small_polarity_budgets_train_at_least_the_minimum_steps():
    # --finetune_epochs=3 --min_finetune_steps=300, the polarity demo's defaults
    assert demo_finetune.finetune_epochs(8568, 32, 3, 300) == 3  # 267 steps per epoch
    assert demo_finetune.finetune_epochs(1000, 32, 3, 300) == 10  # 31 per epoch
    assert demo_finetune.finetune_epochs(250, 32, 3, 300) == 43  # 7 per epoch
    assert demo_finetune.finetune_epochs(10, 32, 3, 300) == 300  # one (short) step per epoch


def test_an_electra_recipes_report_names_its_generator_and_discriminator(
    tmp_path, parse_demo_flags
):
    # A model pretrained elsewhere (benchmarks/electra_reference.py's export) is named.
    parse_demo_flags("--recipe=electra", f"--pretrained_dir={tmp_path / 'pretrain'}")
    (tmp_path / "pretrain").mkdir()
    held_out = {"step": 100, "split": "eval", "loss": 12.0, "mlm_accuracy": 0.25,
                "disc_accuracy": 0.9}  # fmt: skip
    (tmp_path / "pretrain" / "metrics.jsonl").write_text(json.dumps(held_out) + "\n")
    finetuning = {"budgets": [_budget(100, [0.2, 0.3], [0.1, 0.1])], "recipe": {}}
    text = demo.report(str(tmp_path), str(tmp_path / "pretrain"), finetuning, {})
    assert "held-out MLM accuracy of the generator 25.0%" in text
    assert "replaced-token detection accuracy 90.0%" in text and "fills in" not in text
    summary = json.loads((tmp_path / "results.json").read_text())
    assert summary["pretraining"]["objective"] == "electra"
    assert summary["pretraining"]["held_out"][-1]["disc_accuracy"] == 0.9
    assert summary["pretraining"]["pretrained_dir"] == str(tmp_path / "pretrain")
    assert f"Pretraining (electra recipe, `{tmp_path / 'pretrain'}`)" in text


def test_a_model_pretrained_elsewhere_must_have_the_corpus_vocab(tmp_path, parse_demo_flags):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n的\n")
    model = tmp_path / "model"
    model.mkdir()
    parse_demo_flags(f"--pretrained_dir={model}")
    with pytest.raises(demo.app.UsageError, match="model/vocab.txt is not the corpus's vocab"):
        demo.pretrained_model(str(vocab))  # none there
    (model / "vocab.txt").write_text(vocab.read_text().replace("的", "是"))
    with pytest.raises(demo.app.UsageError, match="model/vocab.txt is not the corpus's vocab"):
        demo.pretrained_model(str(vocab))
    (model / "vocab.txt").write_text(vocab.read_text())
    assert demo.pretrained_model(str(vocab)) == (str(model), str(vocab))


def test_a_model_pretrained_elsewhere_with_a_tokenizer_json_is_tuned_with_it(
    tmp_path, parse_demo_flags
):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n的\n")
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.json").write_text("{}")  # read by the tools that tokenize
    parse_demo_flags(f"--pretrained_dir={model}")
    assert demo.pretrained_model(str(vocab)) == (str(model), str(model / "tokenizer.json"))
    (model / "vocab.txt").write_text("[PAD]\n")  # a vocab.txt is still the one read, as before
    with pytest.raises(demo.app.UsageError, match="model/vocab.txt is not the corpus's vocab"):
        demo.pretrained_model(str(vocab))


def test_cli_help():
    result = subprocess.run([sys.executable, "-m", "experiments.demo", "--help"],
                            capture_output=True, text=True, cwd=REPO, timeout=300)  # fmt: skip
    assert "People's Daily" in result.stdout and "--task" in result.stdout
    assert "--label_budgets" in result.stdout and "--seed" in result.stdout


@pytest.mark.extended  # about 3 minutes
def test_a_tiny_ner_demo_end_to_end(tmp_path):
    """Every stage: the real corpus, 20 pretraining steps, two small budgets, two subsets."""
    workdir = tmp_path / "demo"
    command = [
        sys.executable, "-m", "experiments.demo", f"--workdir={workdir}",
        f"--corpus_dir={tmp_path / 'corpus'}", "--pretrain_steps=20", "--pretrain_batch_size=8",
        "--label_budgets=24,16", "--subsets=2", "--min_finetune_steps=4",
        "--max_finetune_steps=6", "--finetune_batch_size=8", "--dev_sentences=40",
        "--test_sentences=200",
        "--finetune_learning_rates=1e-3,3e-3", "--seed=1", "--compare_finetune_optimizers",
    ]  # fmt: skip
    result = run_captured(command, timeout=900, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((workdir / "results.json").read_text())
    budgets = summary["label_budgets"]
    assert [b["labels"] for b in budgets] == [16, 24]  # sorted
    for budget in budgets:
        for arm in ("pretrained", "scratch"):
            assert len(budget[arm]) == 2 and all(0 <= f <= 1 for f in budget[arm])
            runs = budget[f"{arm}_runs"]
            # One learning rate per budget and arm, chosen from the grid, for every subset.
            assert {r["learning_rate"] for r in runs} == {budget["learning_rate"][arm]}
            assert budget["learning_rate"][arm] in (1e-3, 3e-3)
            assert [r["test"]["f1"] for r in runs] == budget[arm]
        difference = budget["difference"]
        assert difference["low"] <= difference["mean"] <= difference["high"]
    comparison = summary["optimizer_comparison"]
    assert comparison["labels"] == 16 and comparison["optimizer"] == "adamw"
    assert budgets[0]["optimizer"] == "adamw_bias_corrected"
    assert summary["pretraining"]["objective"] == "mlm"
    assert summary["pretraining"]["recipe"] == "modern"  # the default recipe
    held_out = summary["pretraining"]["held_out"]
    assert held_out[0]["step"] == 0 and held_out[-1]["step"] == 20
    linear = summary["linear"]  # the linear tagger on the same subsets and sentences
    assert [row["labels"] for row in linear] == [16, 24]
    assert all(len(row["linear"]) == 2 and 0 <= min(row["linear"]) for row in linear)
    assert len(summary["fill_mask"]) == 6
    assert all(len(f["predictions"]) == len(f["entity"]) for f in summary["fill_mask"])
    assert (workdir / "curves.png").exists()
    assert "| 16 |" in result.stdout and "| 24 |" in result.stdout
    assert "test n=200," in result.stdout
    # Orbax's INFO lines stay out of the console.
    assert "orbax" not in result.stderr.lower()
    # Every run is stored: a rerun reuses them all (and the pretraining) and reports the same.
    again = run_captured(command, timeout=900, cwd=REPO)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((workdir / "results.json").read_text())["label_budgets"] == budgets
    # The workdir belongs to --seed=1: another seed is refused before anything runs.
    other = subprocess.run([*command[:-1], "--seed=2"], capture_output=True, text=True,
                           cwd=REPO, timeout=300)  # fmt: skip
    assert other.returncode != 0 and "--seed=1 (now 2)" in other.stderr


@pytest.mark.slow
def test_a_tiny_polarity_demo_end_to_end(tmp_path):
    """--task=polarity: every stage on 60 reviews, 30 pretraining steps, two budgets."""
    from data_pipelines import prepare_corpus

    corpus_dir = tmp_path / "corpus"
    documents = prepare_corpus.corpus_documents("imdb", limit=60)
    prepare_corpus.write_corpus(documents, str(corpus_dir / "corpus.txt"), show_progress=False)
    workdir = tmp_path / "demo"
    command = [
        sys.executable, "-m", "experiments.demo", "--task=polarity", f"--workdir={workdir}",
        f"--corpus_dir={corpus_dir}", "--vocab_size=600", "--pretrain_steps=30",
        "--pretrain_batch_size=8", "--label_budgets=64,40", "--subsets=2",
        "--finetune_epochs=1", "--min_finetune_steps=2", "--seed=1",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((workdir / "results.json").read_text())
    budgets = summary["label_budgets"]
    assert [b["labels"] for b in budgets] == [40, 64]  # sorted
    for budget in budgets:
        assert budget["seeds"] == [2, 3]  # --seed=1 with 2 fine-tuning seeds
        for arm in ("pretrained", "scratch"):
            assert len(budget[arm]) == 2 and all(0 <= a <= 1 for a in budget[arm])
    recipe = workdir / "finetune" / "mean_lr0.0003_epochs1_min2_adamw"  # the fine-tuning flags
    run = json.loads((recipe / "40_labels" / "scratch_seed3" / "metrics.json").read_text())
    assert run["num_examples"]["train"] == 40
    assert summary["recipe"] == {"pooling": "mean", "learning_rate": 3e-4, "optimizer": "adamw"}
    assert summary["pretraining"]["optimizer"] == "adamw_bias_corrected"
    assert summary["pretraining"]["objective"] == "mlm_nsp"
    held_out = summary["pretraining"]["held_out"]
    assert held_out[0]["step"] == 0 and held_out[-1]["step"] == 30
    assert (workdir / "curves.png").exists()
    assert "| 40 |" in result.stdout and "| 64 |" in result.stdout
