"""experiments.retrieval_table (`make retrieval`): the report and its intervals on fake stage
results, the stages' resume rule, the flags it refuses, and (extended) a tiny run of every
stage on the real data, stopped-and-rerun (the real one takes ~40 minutes)."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.stats
from conftest import run_captured

from data_pipelines.tasks.squad_retrieval import RetrievalSet, normalize_text
from experiments import retrieval_report, retrieval_table

REPO = Path(__file__).parent.parent
METRICS = ("nDCG@10", "MRR@10", "R@1", "R@10", "R@100")


def _scores(base: float, lee: float = 0.3) -> dict:
    return {m: min(base + 0.05 * i, 1.0) for i, m in enumerate(METRICS)} | {
        "lee_pearson": lee, "lee_spearman": lee - 0.02, "wall_seconds": 60.0,
        "load_average": [1.0, 2.0],
    }  # fmt: skip


def _fake_results(pretrained: list[float], scratch: list[float]) -> dict:
    results = {
        "data": {"corpus": {"documents": 102, "sentences": 18000, "characters": 2_500_000},
                 "pairs": 37000, "shifts": ["new_wiki_v1.0"], "wall_seconds": 30.0},
        # BM25 ahead of MiniLM at the top of the ranking, behind further down.
        "bm25": _scores(0.70) | {"R@100": 0.90, "question_word_overlap": 0.57},
        "minilm_st": _scores(0.60) | {"R@100": 0.97},
        "minilm_ours": _scores(0.60) | {"R@100": 0.97, "max_abs_diff": 2e-7, "pooling": "mean",
                                        "normalize": True, "max_seq_length": 256},
        "pretrain": {"steps": 100, "held_out_mlm_accuracy": 0.31, "wall_seconds": 600.0},
    }  # fmt: skip
    for arm, values in (("pretrained", pretrained), ("scratch", scratch)):
        for seed, value in enumerate(values):
            results[f"{arm}_seed{seed}"] = _scores(value, lee=0.2) | {"arm": arm, "seed": seed}
    return results


SETTINGS = {
    "seeds": [0, 1, 2], "preset": "tiny", "recipe": "modern", "vocab_size": 8000,
    "pretrain_steps": 100, "pretrain_batch_size": 32, "pretrain_seq_length": 128,
    "pretrain_learning_rate": None, "shifts": ["new_wiki_v1.0"], "finetune_steps": 10,
    "finetune_batch_size": 32, "finetune_learning_rate": 5e-4, "scale": 20.0,
    "max_seq_length": 192, "dev_articles": 0, "questions": 10565, "passages": 2067,
}  # fmt: skip


def _t_interval(diff):
    return scipy.stats.t.interval(0.95, len(diff) - 1, loc=np.mean(diff),
                                  scale=np.std(diff, ddof=1) / math.sqrt(len(diff)))  # fmt: skip


def test_the_report_writes_the_table_intervals_and_figure(tmp_path):
    pretrained, scratch = [0.30, 0.34, 0.31], [0.20, 0.21, 0.25]
    results = _fake_results(pretrained, scratch)
    text = retrieval_report.report(str(tmp_path), results, SETTINGS, total_seconds=1800)

    diff = np.subtract(pretrained, scratch)  # nDCG@10 is the base value in _scores
    low, high = _t_interval(diff)
    row = next(line for line in text.splitlines() if line.startswith("| pretrained − scratch"))
    assert (
        row.split("|")[2].strip()
        == f"{100 * diff.mean():+.1f} [{100 * low:+.1f}, {100 * high:+.1f}]"
    )
    assert "yes: pretraining pays" in text
    # mean ± std of each arm, in points
    arm_row = next(line for line in text.splitlines() if line.startswith("| pretrained here"))
    assert f"{100 * np.mean(pretrained):.1f} ± {100 * np.std(pretrained, ddof=1):.1f}" in arm_row
    assert "2.0e-07" in text  # MiniLM: bert_jax against sentence-transformers
    assert "57% of a question's words" in text
    minilm = next(line for line in text.splitlines() if line.startswith("- Against all-MiniLM"))
    assert "BM25 is ahead on nDCG@10, MRR@10, R@1, R@10 and behind on R@100" in minilm
    assert "seed 1 34.0 / 21.0" in text
    # 30 s of data, 60 s for each of 3 fixed rows and 6 runs, 600 s of pretraining
    assert "The stages took 19.5 min in all" in text and "this invocation 30.0 min" in text

    summary = json.loads((tmp_path / "results.json").read_text())
    gain = summary["pretrained_minus_scratch"]["nDCG@10"]
    assert gain["low"] == pytest.approx(low) and gain["high"] == pytest.approx(high)
    assert summary["stages"]["bm25"]["R@100"] == 0.90
    assert (tmp_path / "results.md").read_text().strip() == text.strip()
    assert (tmp_path / "retrieval.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_interval_holding_zero_is_not_called_a_gain(tmp_path):
    results = _fake_results([0.30, 0.20, 0.26], [0.25, 0.26, 0.24])
    text = retrieval_report.report(str(tmp_path), results, SETTINGS, total_seconds=60)
    assert "not shown: the interval holds zero" in text and "pretraining pays" not in text


def test_one_seed_gives_no_interval_but_a_table(tmp_path):
    results = _fake_results([0.30], [0.20])
    text = retrieval_report.report(str(tmp_path), results, SETTINGS | {"seeds": [0]},
                                   total_seconds=60)  # fmt: skip
    assert "Fewer than two paired seeds" in text
    assert not any(line.startswith("| pretrained − scratch") for line in text.splitlines())
    assert "| 30.0 |" in next(line for line in text.splitlines() if "pretrained here" in line)


def test_a_stage_runs_once_and_a_failed_one_runs_again(tmp_path):
    calls = []

    def body():
        calls.append(1)
        return {"value": len(calls)}

    stages = retrieval_table.Stages(str(tmp_path))
    assert stages.run("bm25", body)["value"] == 1
    written = json.loads((tmp_path / "results" / "bm25.json").read_text())
    assert written["value"] == 1 and written["wall_seconds"] >= 0
    assert len(written["load_average"]) == 2
    # A rerun (a new process) reads the result instead of running the stage.
    assert retrieval_table.Stages(str(tmp_path)).run("bm25", body)["value"] == 1
    assert len(calls) == 1

    def fails():
        raise RuntimeError("stopped")

    with pytest.raises(RuntimeError):
        stages.run("pretrain", fails)
    assert not (tmp_path / "results" / "pretrain.json").exists()
    assert not list((tmp_path / "results").glob("*.tmp"))
    assert stages.run("pretrain", body)["value"] == 2


def test_dev_subset_keeps_the_first_articles_questions_and_paragraphs():
    dev = RetrievalSet(
        queries={"q1": "a?", "q2": "b?", "q3": "c?"},
        corpus={"0-0": "A.", "0-1": "B.", "1-0": "C."},
        qrels={"q1": {"0-0": 1}, "q2": {"0-1": 1}, "q3": {"1-0": 1}},
    )
    one = retrieval_table.dev_subset(dev, 1)
    assert list(one.corpus) == ["0-0", "0-1"] and list(one.queries) == ["q1", "q2"]
    assert one.qrels == {"q1": {"0-0": 1}, "q2": {"0-1": 1}}
    assert retrieval_table.dev_subset(dev, 0) is dev


def _table(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "experiments.retrieval_table", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=60)  # fmt: skip


@pytest.mark.parametrize(
    "args, message",
    [
        (["--seeds=1,1"], "--seeds=1,1: give distinct integer seeds"),
        (["--seeds=a"], "--seeds: invalid literal"),
        (["--finetune_batch_size=1"], "--finetune_batch_size=1: the loss needs 2 pairs"),
        (["--shifts=new_wiki_v1.0,squad"], "--shifts: squad; choose from"),
        (["--max_seq_length=8"], "--max_seq_length=8: choose 16 to 512"),
    ],
)
def test_bad_flags_are_one_line_before_any_work(tmp_path, args, message):
    result = _table(f"--workdir={tmp_path / 'w'}", *args)
    assert result.returncode != 0
    assert message in result.stderr
    assert not (tmp_path / "w").exists()


def test_a_workdir_made_with_other_flags_is_refused(tmp_path):
    workdir = tmp_path / "w"
    workdir.mkdir()
    (workdir / "retrieval_flags.json").write_text(json.dumps({"finetune_steps": 7}))
    result = _table(f"--workdir={workdir}")
    assert result.returncode != 0
    assert "--finetune_steps=7 (now " in result.stderr
    assert not (workdir / "results").exists()


def test_help_exits_0_and_names_the_flags():
    result = _table("--help")
    assert result.returncode == 0
    for flag in ("--workdir", "--seeds", "--pretrain_steps", "--finetune_steps", "--preset"):
        assert flag in result.stdout


# ----------------------------------------------------------------------------- extended


@pytest.mark.extended
def test_a_tiny_run_of_every_stage_resumes_after_a_stage_is_lost(tmp_path):
    workdir = tmp_path / "retrieval"
    args = [
        sys.executable, "-m", "experiments.retrieval_table", f"--workdir={workdir}",
        "--seeds=0,1", "--preset=tiny", "--pretrain_steps=4", "--pretrain_batch_size=8",
        "--pretrain_seq_length=32", "--vocab_size=1000", "--shifts=new_wiki_v1.0",
        "--finetune_steps=3", "--finetune_batch_size=8", "--max_seq_length=48",
        "--eval_batch_size=32", "--dev_articles=1", "--minilm_reference", "--cpt_steps=4",
        "--cpt_batch_size=16", "--budgets=16", "--heldout_paragraphs=20",
    ]  # fmt: skip
    env = {**os.environ, "USE_TF": "0"}
    first = run_captured(args, timeout=900, cwd=REPO, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    results = workdir / "results"
    names = {p.stem for p in results.glob("*.json")}
    runs = {f"{arm}{b}_seed{s}" for arm in ("pretrained", "scratch") for b in ("", "_b16")
            for s in (0, 1)}  # fmt: skip
    assert names == {"data", "bm25", "minilm_st", "minilm_ours", "pretrain", "pretrained_raw",
                     "random_raw", "cpt", "fusion", *runs}  # fmt: skip
    fusion = json.loads((results / "fusion.json").read_text())
    assert set(fusion["systems"]) == {"minilm", "cpt", "pretrained_seed0"}
    assert fusion["heldout_paragraphs"] == 20
    budget = json.loads((results / "pretrained_b16_seed1.json").read_text())
    assert budget["train_pairs"] == 16 and budget["budget"] == 16
    # The held-out paragraphs are neither trained on nor in the unlabelled text.
    held = {line.split("\t")[1].strip() for line in open(workdir / "heldout.tsv")}
    assert len(held) == 20
    assert not held & {line.split("\t")[1].strip() for line in open(workdir / "pairs.tsv")}
    assert not any(h.split(". ")[0] in (workdir / "paragraphs.txt").read_text() for h in held)
    ours = json.loads((results / "minilm_ours.json").read_text())
    st = json.loads((results / "minilm_st.json").read_text())
    assert ours["max_abs_diff"] < 1e-5
    assert ours["nDCG@10"] == pytest.approx(st["nDCG@10"], abs=1e-3)
    # No dev paragraph among the training pairs, and no dev article in the corpus.
    dev = json.loads(Path(_squad_dev()).read_text())
    dev_paragraphs = {normalize_text(p["context"]) for a in dev["data"] for p in a["paragraphs"]}
    with open(workdir / "pairs.tsv", encoding="utf-8") as f:
        trained = {normalize_text(line.split("\t")[1]) for line in f}
    assert len(trained) > 1000 and not trained & dev_paragraphs
    corpus = (workdir / "wikipedia" / "corpus.txt").read_text()
    assert "Super Bowl 50" not in corpus and "Anarchism" in corpus
    text = (workdir / "results.md").read_text()
    assert "| pretrained − scratch, paired by seed" in text
    assert (workdir / "retrieval.png").stat().st_size > 10_000

    # A lost stage (as a stop in the middle of it leaves) runs again; the others are read.
    before = json.loads((results / "scratch_seed1.json").read_text())
    (results / "scratch_seed1.json").unlink()
    second = run_captured(args, timeout=600, cwd=REPO, env=env)
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.stderr.count("done before") == len(names) - 1
    assert "[scratch_seed1] starting" in second.stderr
    again = json.loads((results / "scratch_seed1.json").read_text())
    assert again["nDCG@10"] == pytest.approx(before["nDCG@10"], abs=0.02)


def _squad_dev() -> str:
    from data_pipelines.tasks import bigbench

    return bigbench.squad_dev(allow_download=False)


def test_questions_are_not_run_at_the_passages_length():
    """finetune_embeddings cuts queries, positives and negatives each to its own longest text
    (rounded up to 16): SQuAD questions (~14 pieces) beside 192-piece paragraphs were half of
    a contrastive step's tokens when all three were cut to the longest of any."""
    from experiments.finetune_embeddings import cut_to_longest

    def padded(lengths, width=64):
        mask = np.array([[1] * n + [0] * (width - n) for n in lengths], np.int32)
        return mask * 7, mask

    arrays = {"positive_ids": np.arange(3, dtype=np.int32)}
    for kind, lengths in (("query", [5, 12, 3]), ("positive", [40, 20, 33]),
                          ("negative", [17, 1, 2])):  # fmt: skip
        arrays[f"{kind}_tokens"], arrays[f"{kind}_mask"] = padded(lengths)
    cut = cut_to_longest(arrays, np.array([0, 2]))
    assert cut["query_tokens"].shape == (2, 16)  # 5 and 3 pieces: one block of 16
    assert cut["positive_tokens"].shape == (2, 48)  # 40 pieces
    assert cut["negative_mask"].shape == (2, 32)  # 17 pieces
    assert cut["positive_ids"].tolist() == [0, 2]
    assert cut["query_mask"].sum() == 8 and cut["positive_mask"].sum() == 73


# ----------------------------------------------------------------------------- issue 81


def test_the_budget_table_pairs_each_budgets_seeds_and_the_fusion_table_its_intervals(tmp_path):
    results = _fake_results([0.30, 0.34, 0.31], [0.20, 0.21, 0.25])
    small = {"pretrained": [0.25, 0.27, 0.22], "scratch": [0.10, 0.12, 0.15]}
    for arm, values in small.items():
        for seed, value in enumerate(values):
            results[f"{arm}_b640_seed{seed}"] = _scores(value) | {
                "arm": arm, "seed": seed, "budget": 640}  # fmt: skip
    results["fusion"] = {"systems": {"cpt": {
        "weight": 0.3,
        "rrf": _scores(0.72) | {"minus_bm25": {"mean": 0.02, "low": 0.01, "high": 0.03}},
        "interpolated": _scores(0.74) | {"minus_bm25": {"mean": 0.04, "low": 0.03, "high": 0.05}},
    }}}  # fmt: skip
    text = retrieval_report.report(str(tmp_path), results, SETTINGS, total_seconds=60)
    row = next(line for line in text.splitlines() if line.startswith("| 640 |"))
    diff = np.subtract(small["pretrained"], small["scratch"])
    low, high = _t_interval(diff)
    assert row.split("|")[2:5] == [" 3 ", " 24.7 ", " 12.3 "]
    assert (
        row.split("|")[5].strip()
        == f"{100 * diff.mean():+.1f} [{100 * low:+.1f}, {100 * high:+.1f}]"
    )
    assert next(line for line in text.splitlines() if line.startswith("| all (37,000) |"))
    interpolated = next(line for line in text.splitlines() if "| interpolated |" in line)
    assert interpolated.split("|")[1:7] == [" ours, zero labels ", " interpolated ", " 0.3 ",
                                            " 74.0 ", " 89.0 ", " +4.0 [+3.0, +5.0] "]  # fmt: skip


def test_held_out_paragraphs_take_all_their_questions_and_budgets_are_paired_by_seed(tmp_path):
    from experiments import retrieval_arms

    pairs = [(f"q{i}", f"paragraph {i % 10}") for i in range(50)]
    train, held = retrieval_arms.held_out_split(pairs, 3)
    assert len({p for _, p in held}) == 3 and len(held) == 15
    assert not {p for _, p in held} & {p for _, p in train} and len(train) == 35
    assert retrieval_arms.held_out_split(pairs, 3) == (train, held)  # from the seed alone
    (tmp_path / "pairs.tsv").write_text("".join(f"{q}\t{p}\n" for q, p in train))
    first = Path(retrieval_arms.budget_pairs(str(tmp_path), 8, 0)).read_text().splitlines()
    again = Path(retrieval_arms.budget_pairs(str(tmp_path), 8, 0)).read_text().splitlines()
    other = Path(retrieval_arms.budget_pairs(str(tmp_path), 8, 1)).read_text().splitlines()
    assert first == again and len(first) == 8 == len(set(first)) and first != other
    squad = {"data": [{"paragraphs": [{"context": "One sentence. And another one.", "qas": []},
                                      {"context": "Held out.", "qas": []}]},
                      {"paragraphs": [{"context": "A second article.", "qas": []}]}]}  # fmt: skip
    (tmp_path / "squad.json").write_text(json.dumps(squad))
    text = tmp_path / "paragraphs.txt"
    count = retrieval_arms.write_paragraphs([str(tmp_path / "squad.json")], ["Held  out."],
                                            str(text))  # fmt: skip
    assert count == 2
    assert text.read_text() == "One sentence.\nAnd another one.\n\nA second article.\n\n"
