"""benchmarks.studies.continued_gain: its flags and its held-out split (the run itself is a
measurement of several CPU minutes, docs/own_encoder.md; nothing here trains)."""

import pytest

from benchmarks.studies import continued_gain


def test_help_and_a_bad_flag_are_one_line_each(capsys):
    with pytest.raises(SystemExit) as exit_help:
        continued_gain.parse_args(["--help"])
    assert exit_help.value.code == 0 and "--continue_steps" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_bad:
        continued_gain.parse_args(["--eval_steps=0"])
    assert exit_bad.value.code == 2
    assert "--eval_steps=0 must be positive" in capsys.readouterr().err


def test_every_nth_document_is_held_out_and_no_document_is_in_both(tmp_path):
    documents = [f"scene {i} line one.\nscene {i} line two." for i in range(1, 24)]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(documents) + "\n\n\n", encoding="utf-8")
    train, heldout = tmp_path / "train.txt", tmp_path / "heldout.txt"
    assert continued_gain._split_scenes(str(corpus), str(train), str(heldout), 10) == (21, 2)
    held = heldout.read_text(encoding="utf-8").strip().split("\n\n")
    kept = train.read_text(encoding="utf-8").strip().split("\n\n")
    assert held == [documents[9], documents[19]]
    assert sorted(held + kept) == sorted(documents) and not set(held) & set(kept)
