"""`convert --overwrite` replaces only an export (bert_jax.convert.output_dir): never the
input or a directory above it, never a directory with other files; the new export is renamed
in before the old one is deleted, and what a killed write leaves is put back or removed by
the next write."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bert_jax.convert import output_dir

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _export(path, marker: str = "old") -> None:
    os.makedirs(path / "params", exist_ok=True)
    (path / "config.json").write_text('{"hidden_size": 4}')
    (path / "vocab.txt").write_text("[PAD]\n")
    (path / "params" / "_METADATA").write_text(marker)


def _write(path, marker: str, overwrite: bool = True) -> None:
    with output_dir.writing_dir(str(path), overwrite) as tmp:
        _export(Path(tmp), marker)


def _hidden(parent) -> list[str]:
    return sorted(n for n in os.listdir(parent) if n.startswith("."))


def test_an_export_is_replaced_and_nothing_is_left_beside_it(tmp_path):
    out = tmp_path / "out"
    _export(out)
    _write(out, "new")
    assert (out / "params" / "_METADATA").read_text() == "new"
    assert _hidden(tmp_path) == []


@pytest.mark.parametrize(
    "other",
    [
        "metrics.jsonl",  # a pretraining workdir
        "checkpoints",
        "notes.md",  # a parent directory with unrelated files
    ],
)
def test_a_directory_with_other_files_is_never_replaced(tmp_path, other):
    out = tmp_path / "out"
    _export(out)
    (out / other).write_text("keep me")
    with pytest.raises(
        FileExistsError,
        match=f"not an export, the only directory ever replaced: it holds files an export "
        f"does not \\({other}",
    ):
        _write(out, "new")
    assert (out / other).read_text() == "keep me" and (out / "config.json").exists()
    assert _hidden(tmp_path) == []


def test_a_file_or_a_directory_without_config_is_not_an_export(tmp_path):
    (tmp_path / "file").write_text("x")
    (tmp_path / "vocab_only").mkdir()
    (tmp_path / "vocab_only" / "vocab.txt").write_text("x")
    assert output_dir.not_an_export(str(tmp_path / "file")) == "it is not a directory"
    assert output_dir.not_an_export(str(tmp_path / "vocab_only")) == "it has no config.json"
    electra = tmp_path / "electra"
    _export(electra)
    _export(electra / "generator")
    assert output_dir.not_an_export(str(electra)) is None
    (electra / "generator" / "events.out").write_text("x")
    assert "generator/events.out" in output_dir.not_an_export(str(electra))


@pytest.mark.parametrize("where", ["itself", "its parent", "its grandparent"])
def test_the_input_and_its_ancestors_are_never_the_output(tmp_path, where):
    workdir = tmp_path / "runs" / "tiny"
    _export(workdir)  # even when it looks like an export
    out = {"itself": workdir, "its parent": workdir.parent, "its grandparent": tmp_path}[where]
    with pytest.raises(FileExistsError, match="it is, or holds, what this conversion reads"):
        output_dir.check_output(str(out), True, (str(workdir / "bert_model.ckpt"),))
    with pytest.raises(FileExistsError, match="what this conversion reads"):  # the vocab file read
        output_dir.check_output(str(out), True, (None, str(workdir / "vocab.txt")))
    output_dir.check_output(str(tmp_path / "runs" / "tiny-hf"), True, (str(workdir),))


def test_cli_refuses_the_input_workdir_and_its_parent_before_reading(tmp_path):
    """The issue's cases: --overwrite removed the input workdir itself, or its parent."""
    workdir = tmp_path / "runs" / "tiny"
    (workdir / "checkpoints").mkdir(parents=True)
    (workdir / "metrics.jsonl").write_text("{}\n")
    (tmp_path / "runs" / "other_run.txt").write_text("keep me")
    for out in (workdir, workdir.parent):
        result = subprocess.run(
            [sys.executable, "-m", "bert_jax.convert", f"--input={workdir}", f"--output={out}",
             "--overwrite"],
            capture_output=True, text=True, timeout=120, cwd=REPO,
            env=dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2"),
        )  # fmt: skip
        assert result.returncode != 0
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith(f"convert: --output={out} exists: it is, or holds, what this")
    assert (workdir / "metrics.jsonl").exists() and (workdir / "checkpoints").is_dir()
    assert (tmp_path / "runs" / "other_run.txt").read_text() == "keep me"


_KILLED_WRITE = """
import os, signal, sys
from bert_jax.convert import output_dir
renames = []
real = os.rename
def rename(src, dst):
    renames.append(dst)
    if len(renames) == {kill_at}:
        os.kill(os.getpid(), signal.SIGKILL)
    real(src, dst)
os.rename = rename
with output_dir.writing_dir(sys.argv[1], overwrite=True) as tmp:
    os.makedirs(os.path.join(tmp, "params"))
    open(os.path.join(tmp, "config.json"), "w").write("{{}}")
    open(os.path.join(tmp, "params", "_METADATA"), "w").write("new")
"""


@pytest.mark.parametrize(
    "kill_at, found",
    [
        (1, "old"),  # killed before anything was renamed: the old export stays
        (2, "old"),  # old renamed aside, new not yet in: the next write puts the old back
        (0, "new"),  # never killed
    ],
)
def test_a_killed_replacement_loses_neither_export(tmp_path, kill_at, found):
    out = tmp_path / "out"
    _export(out)
    script = textwrap.dedent(_KILLED_WRITE.format(kill_at=kill_at))
    result = subprocess.run([sys.executable, "-c", script, str(out)], cwd=REPO, timeout=60)
    assert result.returncode == (-9 if kill_at else 0)
    if kill_at:
        assert _hidden(tmp_path)  # a temporary, an old export aside: what the kill left
        # The next write (here one that is refused: no --overwrite) tidies up first.
        with pytest.raises(FileExistsError, match="pass overwrite=True"):
            _write(out, "never", overwrite=False)
    assert (out / "params" / "_METADATA").read_text() == found
    assert _hidden(tmp_path) == []


def test_a_running_writers_temporary_is_left_alone(tmp_path):
    live = tmp_path / f".out.tmp-{os.getppid()}-abcd"  # a live process: our parent
    dead = tmp_path / ".out.tmp-k3j4h5"  # a name from before names carried a pid
    live.mkdir()
    dead.mkdir()
    _write(tmp_path / "out", "new")
    assert _hidden(tmp_path) == [live.name]


def test_fine_tuning_checks_its_final_save_before_training(tmp_path):
    """<workdir>/checkpoint, which the final save replaces, holds something else: the script
    stops at once (it used to train, then fail or replace it at the end)."""
    workdir = tmp_path / "run"
    (workdir / "checkpoint").mkdir(parents=True)
    (workdir / "checkpoint" / "notes.md").write_text("keep me")
    result = subprocess.run(
        [sys.executable, "-m", "experiments.finetune_classification",
         "--config=experiments/configs/finetune_tiny_polarity.py", f"--workdir={workdir}"],
        capture_output=True, text=True, timeout=120, cwd=REPO,
        env=dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2"),
    )  # fmt: skip
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"finetune_classification: {workdir / 'checkpoint'} exists and is not")
    assert "it holds files an export does not (notes.md)" in last
    assert (workdir / "checkpoint" / "notes.md").read_text() == "keep me"
    assert not (workdir / "train_log.jsonl").exists()
