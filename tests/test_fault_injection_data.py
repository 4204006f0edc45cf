"""Fault injection on `create_pretraining_data`: what the user sees, and that nothing
half-made looks finished, when the input is not UTF-8 text (another encoding, a binary
file) and when a run dies while renaming its shards into place.

Runs are real `python -m data_pipelines.create_pretraining_data` processes where the user
would see the outcome on stderr, and in-process calls where only files matter. A kill
between renames is a real SIGKILL: the writer's process kills itself right after its
first rename.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

from data_pipelines import tfrecord_files
from data_pipelines.create_pretraining_data import Options, create_pretraining_data

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = "the cat sat on a mat and dog ran to big red house with green door".split()
CAFE_LATIN1 = "the caf\xe9 had a red door .".encode("latin-1")  # \xe9 is not UTF-8


@pytest.fixture
def vocab(tmp_path) -> str:
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", *WORDS]) + "\n")
    return str(path)


def _text(documents: int = 12, seed: int = 0) -> bytes:
    """UTF-8 text in the original input format: 3 sentences per document."""
    rng = np.random.default_rng(seed)
    docs = [
        "\n".join(" ".join(rng.choice(WORDS, 6)) + " ." for _ in range(3)) for _ in range(documents)
    ]
    return ("\n\n".join(docs) + "\n").encode()


def _run_cli(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "data_pipelines.create_pretraining_data", *flags],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _cli_flags(input_file, out_dir, vocab, *extra: str) -> list[str]:
    return [
        f"--input_file={input_file}",
        f"--output_file={out_dir}/out.tfrecord",
        f"--vocab_file={vocab}",
        "--max_seq_length=32",
        "--max_predictions_per_seq=5",
        "--dupe_factor=1",
        *extra,
    ]


def _dead_pid() -> int:
    """The PID of a process that has exited (and been reaped)."""
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


# ------------------------------------------------------------------------------------------
# Input that is not UTF-8 text.


def test_latin1_input_is_named_in_a_warning_with_its_count(tmp_path, vocab):
    latin1 = tmp_path / "latin1.txt"
    # 3 of the 12 documents hold a line of latin-1 (one undecodable byte each): 3 of 36
    # non-blank lines, below the refusal threshold.
    text = _text().split(b"\n\n")
    for i in (0, 4, 8):
        text[i] = CAFE_LATIN1 + b"\n" + text[i]
    latin1.write_bytes(b"\n\n".join(text))
    result = _run_cli(*_cli_flags(latin1, tmp_path / "out", vocab))
    assert result.returncode == 0, result.stderr[-3000:]
    # absl's log format: "W<date> <time> <thread> corpora.py:<line>] <message>".
    assert re.search(
        r"W\d{4} [^\n]* corpora.py:\d+\] "
        + re.escape(
            f"{latin1}: 3 of its 39 non-blank lines are not plain UTF-8 text: 3 undecodable "
            "characters replaced by U+FFFD (training on them as they are)"
        ),
        result.stderr,
    ), result.stderr
    assert sorted(os.listdir(tmp_path / "out")) == ["out.tfrecord", "out.tfrecord.stats.json"]


def test_a_binary_file_is_refused_and_nothing_is_written(tmp_path, vocab):
    good = tmp_path / "good.txt"
    good.write_bytes(_text())
    binary = tmp_path / "ls"
    # Like /bin/ls: an ELF header, machine code (random bytes) with NULs, a few strings.
    rng = np.random.default_rng(0)
    binary.write_bytes(
        b"\x7fELF\x02\x01\x01\x00" + rng.bytes(20_000) + b"\x00usage: ls [OPTION]...\n" * 3
    )
    # The good file comes first: its records are written, then must be discarded.
    result = _run_cli(*_cli_flags(f"{good},{binary}", tmp_path / "out", vocab))
    assert result.returncode == 1
    last_line = result.stderr.strip().splitlines()[-1]
    match = re.fullmatch(
        re.escape(f"create_pretraining_data: {binary}: ")
        + r"(\d+) of its (\d+) non-blank lines \((\d+)%\) are not plain UTF-8 text "
        r"\((\d+) undecodable characters\), more than --max_undecodable_fraction=0.5: is it a "
        r"binary file, or text in another encoding\?",
        last_line,
    )
    assert match, result.stderr
    bad, lines, percent, replaced = map(int, match.groups())
    assert bad > lines / 2 and percent == round(100 * bad / lines) and replaced > 1000
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()  # no shard, no temporary, no stats, no directory

    # The threshold is a flag: with 1 the file is read (and named in a warning).
    result = _run_cli(
        *_cli_flags(f"{good},{binary}", tmp_path / "out", vocab, "--max_undecodable_fraction=1")
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(rf"corpora.py:\d+\] {re.escape(str(binary))}: \d+ of its", result.stderr)
    assert "out.tfrecord" in os.listdir(tmp_path / "out")


# ------------------------------------------------------------------------------------------
# A shard set appears whole or not at all.


def _shards_and_hidden(directory) -> tuple[list[str], list[str]]:
    names = sorted(os.listdir(directory))
    return [n for n in names if n.startswith("out")], [n for n in names if n.startswith(".")]


@pytest.mark.parametrize("failure", [OSError, KeyboardInterrupt])
def test_a_failure_between_renames_leaves_no_shard(tmp_path, vocab, monkeypatch, failure):
    (tmp_path / "in.txt").write_bytes(_text())
    real_replace = os.replace
    calls = []

    def replace_then_fail(source, target):
        if calls:  # the second rename fails (a full disk, Ctrl-C)
            raise failure("injected between renames")
        calls.append(target)
        real_replace(source, target)

    monkeypatch.setattr(os, "replace", replace_then_fail)
    options = Options(
        input_file=str(tmp_path / "in.txt"),
        output_file=str(tmp_path / "out" / "out.tfrecord"),
        vocab_file=vocab,
        max_seq_length=32,
        max_predictions_per_seq=5,
        dupe_factor=1,
        num_output_shards=4,
        show_progress=False,
    )
    with pytest.raises(failure, match="injected"):
        create_pretraining_data(options)
    assert calls == [str(tmp_path / "out" / "out-00000-of-00004.tfrecord")]  # it was renamed
    assert _shards_and_hidden(tmp_path / "out") == ([], [])


_KILL_AFTER_FIRST_RENAME = """
import os, signal, sys
from data_pipelines import tfrecord_files, tfrecord_framing

real_replace = os.replace
def replace(source, target):
    real_replace(source, target)
    os.kill(os.getpid(), signal.SIGKILL)
os.replace = replace
with tfrecord_files.TFRecordShardWriter(sys.argv[1], num_shards=4) as writer:
    writer.write_framed(tfrecord_framing.frame_records([b"record%d" % i for i in range(8)]))
"""


def test_a_kill_between_renames_is_refused_by_readers_and_removed_by_the_next_run(tmp_path, vocab):
    from data_pipelines import input_pipeline  # imports TensorFlow: the reader's side

    out = tmp_path / "out"
    killed = subprocess.run(
        [sys.executable, "-c", _KILL_AFTER_FIRST_RENAME, str(out / "out.tfrecord")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    # One rename happened: a shard under its final name (no single rename can publish four),
    # the other three hidden, and the journal of the renames.
    shards, hidden = _shards_and_hidden(out)
    assert shards == ["out-00000-of-00004.tfrecord"]
    assert len(hidden) == 4 and sum(".incomplete-" in n for n in hidden) == 3, hidden
    [journal] = [n for n in hidden if ".renaming-" in n]
    pid = journal.rsplit("-", 1)[1]

    # A reader refuses the partial set (`dir/*` also matches the hidden files: skipped).
    for pattern in (f"{out}/out-*", f"{out}/*"):
        with pytest.raises(ValueError, match=rf"pid {pid}.*stopped while renaming.*run it again"):
            input_pipeline.list_files(pattern)

    # The next run removes the partial set and the temporaries, naming them on stderr.
    (tmp_path / "in.txt").write_bytes(_text())
    result = _run_cli(*_cli_flags(tmp_path / "in.txt", out, vocab, "--num_output_shards=2"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert (
        f"] removed the partial shard set of a run (pid {pid}) killed while renaming it into "
        f"place: {out}/out-00000-of-00004.tfrecord\n"
    ) in result.stderr
    for name in hidden:
        assert f"{out}/{name}" in result.stderr
    assert _shards_and_hidden(out) == (
        ["out-00000-of-00002.tfrecord", "out-00000-of-00002.tfrecord.stats.json"]
        + ["out-00001-of-00002.tfrecord"],
        [],
    )
    assert input_pipeline.list_files(f"{out}/out-*.tfrecord") == [
        f"{out}/out-0000{i}-of-00002.tfrecord" for i in range(2)
    ]

    # A set whose (live) writer is renaming it now: the reader is told to wait.
    live_journal = out / f".out-00000-of-00002.tfrecord.renaming-{os.getpid()}"
    renames = [["x", f"{out}/out-00001-of-00002.tfrecord"]]
    live_journal.write_text(json.dumps({"renames": renames, "journals": []}))
    with pytest.raises(ValueError, match="renaming them into place now: wait"):
        input_pipeline.list_files(f"{out}/out-*.tfrecord")


def test_stale_temporaries_of_dead_runs_are_removed_live_ones_kept(tmp_path, caplog):
    out = tmp_path / "out"
    out.mkdir()
    dead = _dead_pid()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stale = out / f".eval.tfrecord.incomplete-{dead}"
        live = out / f".eval.tfrecord.incomplete-{sleeper.pid}"
        live_journal = out / f".eval.tfrecord.renaming-{sleeper.pid}"
        for path in (stale, live, live_journal):
            path.write_bytes(b"half a shard")
        unrelated = out / ".eval.tfrecord.incomplete"  # another tool's name: not ours
        unrelated.write_text("")
        with caplog.at_level(logging.WARNING, logger="data_pipelines.tfrecord_files"):
            with tfrecord_files.TFRecordShardWriter(str(out / "train.tfrecord")) as writer:
                writer.write(b"record")
        assert sorted(os.listdir(out)) == sorted(
            [live.name, live_journal.name, unrelated.name, "train.tfrecord"]
        )
        assert [r.getMessage() for r in caplog.records] == [
            f"removed 1 file(s) left by runs that are no longer running: {stale}"
        ]
    finally:
        sleeper.kill()
        sleeper.wait()
