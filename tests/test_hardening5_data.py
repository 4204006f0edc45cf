"""Issue 82 (Hardening 5), the data tools' and the tree's parts: more output shards than
instances, Beam's temporary directories, every module's --help, one-line errors of
create_pretraining_data and build_vocab, a step set aside twice, WORKDIR with a space.

Every case runs the command a user runs (a subprocess each, but the --help of every module:
a fork each of one warm interpreter; the tools answer in under a second, before any heavy
import) and checks the exit status, the last line, that no traceback was printed and that
nothing was left behind.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from create_data_fixtures import _minilm_vocab, _options, _write_documents

from data_pipelines import create_pretraining_data as cpd
from data_pipelines import embedded_corpora

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEAM_PYTHON = os.path.join(REPO, ".venv-beam", "bin", "python")
needs_beam = pytest.mark.skipif(
    not os.path.exists(BEAM_PYTHON), reason=".venv-beam is missing: make beam-venv"
)


def _run(module: str, *args: str, python: str = sys.executable, cwd: str = REPO, env=None):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    return subprocess.run(
        [python, "-m", module, *args], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip


def _one_line_error(run, tool: str) -> str:
    """The last stderr line of a refused run: nonzero, no traceback, `<tool>: ...`."""
    assert run.returncode not in (0, None), run.stderr[-2000:]
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{tool}: "), run.stderr[-2000:]
    return last


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    """9 Shakespeare scenes of 12 lines: a few dozen instances."""
    scenes = embedded_corpora.shakespeare_documents(split_sentences=False, max_plays=1)
    documents = [d.sentences[:12] for d in list(scenes)[:9]]
    return _write_documents(tmp_path_factory.mktemp("corpus") / "small.txt", documents)


# --- item 7: more output shards than instances -----------------------------------------------


def _contents(paths) -> list[bytes]:
    out = []
    for path in paths:
        with open(path, "rb") as f:
            out.append(f.read())
    return out


@pytest.mark.parametrize("shards", [5000, 60])
def test_more_shards_than_instances_are_capped_one_instance_each(corpus, tmp_path, caplog, shards):
    # The case: 5000 shards asked for; today all are written, most of them empty.
    with caplog.at_level(logging.WARNING):
        stats = cpd.create_pretraining_data(
            _options(tmp_path / "asked", corpus, num_output_shards=shards)
        )
    made = stats["instances"]
    assert 1 < made < 60
    written = sorted(os.listdir(tmp_path / "asked"))
    assert len([f for f in written if f.endswith(".tfrecord")]) == made  # no empty shard
    assert stats["output_files"][0].endswith(f"out-00000-of-{made:05d}.tfrecord")
    assert stats["records_per_file"] == [1] * made
    assert stats["options"]["num_output_shards"] == shards  # what was asked, as asked
    warning = [r.getMessage() for r in caplog.records if "--num_output_shards" in r.getMessage()]
    assert len(warning) == 1
    assert f"--num_output_shards={shards} is more than the {made} instances" in warning[0]
    assert f"instead of {shards - made} empty ones" in warning[0]
    # The same set, byte for byte, that asking for exactly that many shards writes.
    exact = cpd.create_pretraining_data(
        _options(tmp_path / "exact", corpus, num_output_shards=made)
    )
    assert [os.path.basename(p) for p in exact["output_files"]] == [
        os.path.basename(p) for p in stats["output_files"]
    ]
    assert _contents(exact["output_files"]) == _contents(stats["output_files"])


def test_listed_output_files_beyond_the_instances_are_named_in_a_warning(corpus, tmp_path, caplog):
    # Files listed one by one are written as named (a reader may expect them), with a warning.
    names = [str(tmp_path / f"part{i}.tfrecord") for i in range(60)]
    with caplog.at_level(logging.WARNING):
        stats = cpd.create_pretraining_data(_options(tmp_path, corpus, output_file=",".join(names)))
    assert stats["output_files"] == names
    empty = 60 - stats["instances"]
    assert empty > 0 and stats["records_per_file"].count(0) == empty
    message = " ".join(r.getMessage() for r in caplog.records)
    assert f"--output_file names 60 files but {stats['instances']} instances" in message
    assert f"{empty} of them empty" in message


def test_the_help_says_what_happens_to_shards_beyond_the_instances():
    run = _run("data_pipelines.create_pretraining_data", "--help")
    assert run.returncode == 0
    flat = " ".join(run.stdout.split())
    assert "at most one per instance" in flat and "a warning naming both counts" in flat


# --- item 9: create_pretraining_data and build_vocab in one line -----------------------------


def _inputs(directory) -> dict[str, str]:
    files = {
        "empty": "",
        "blank": "\n\n\n",
        "spaces": "  \n\t\n \n",
        "one_line": "To be, or not to be, that is the question.\n",
        "one_document": "To be, or not to be.\nThat is the question.\nWhether 'tis nobler.\n",
    }
    for name, text in files.items():
        (directory / f"{name}.txt").write_text(text)
    return {name: str(directory / f"{name}.txt") for name in files}


CREATE_CASES = [
    # (input, extra flags, what the line names)
    ("empty", [], "no documents in the input {input}"),
    ("blank", [], "no documents in the input {input}"),
    ("spaces", ["--nonext_sentence"], "no documents in the input {input}"),
    ("one_line", [], "{input} has 1 non-empty document(s): next sentence prediction needs"),
    ("one_document", [], "{input} has 1 non-empty document(s)"),
    ("one_line", ["--num_output_shards=0"], "--num_output_shards must be >= 1, got 0"),
    ("one_line", ["--num_output_shards=-3"], "--num_output_shards must be >= 1, got -3"),
    ("one_line", ["--dupe_factor=0"], "--dupe_factor must be >= 1, got 0"),
    ("one_line", ["--masked_lm_prob=1.5"], "--masked_lm_prob must be in (0, 1], got 1.5"),
    ("one_line", ["--max_seq_length=3"], "--max_seq_length must be >= 5"),
]


@pytest.mark.parametrize("name, flags, expected", CREATE_CASES)
def test_create_pretraining_data_refuses_in_one_line(tmp_path, name, flags, expected):
    inputs = _inputs(tmp_path)
    out = tmp_path / "records" / "deeper"
    run = _run(
        "data_pipelines.create_pretraining_data", f"--input_file={inputs[name]}",
        f"--output_file={out}/train.tfrecord", f"--vocab_file={_minilm_vocab()}", *flags,
    )  # fmt: skip
    last = _one_line_error(run, "create_pretraining_data")
    assert expected.format(input=inputs[name]) in last
    assert not (tmp_path / "records").exists()  # not even the directory it made


def test_create_pretraining_data_unwritable_output_in_one_line(corpus, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    run = _run(
        "data_pipelines.create_pretraining_data", f"--input_file={corpus}",
        f"--output_file={blocker}/out.tfrecord", f"--vocab_file={_minilm_vocab()}",
    )  # fmt: skip
    assert str(blocker) in _one_line_error(run, "create_pretraining_data")
    assert blocker.read_text() == ""
    # An output that is a directory: refused at the start, not after the run, naming it.
    directory = tmp_path / "records"
    directory.mkdir()
    run = _run(
        "data_pipelines.create_pretraining_data", f"--input_file={corpus}",
        f"--output_file={directory}", f"--vocab_file={_minilm_vocab()}",
    )  # fmt: skip
    last = _one_line_error(run, "create_pretraining_data")
    assert f"--output_file: {directory} is a directory" in last
    assert os.listdir(directory) == [] and "instances" not in run.stdout


@pytest.fixture(scope="module")
def text(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("text") / "small.txt"
    path.write_text("".join(f"the quick brown fox jumps over a lazy dog {i}\n" for i in range(200)))
    return str(path)


VOCAB_CASES = [
    # (input, flags, what the line names); the output is <tmp>/vocab/<name>
    ("empty", ["--output_file={out}/vocab.txt"], "no text in the input {input}"),
    ("blank", ["--output_file={out}/vocab.txt"], "no text in the input {input}"),
    ("spaces", ["--output_file={out}/sp.model", "--model_type=sentencepiece"],
     "no text in the input {input}"),
    ("empty", ["--output_file={out}/tokenizer.json", "--model_type=bpe", "--vocab_size=400"],
     "no text in the input {input}"),
    ("text", ["--output_file={out}/vocab.txt", "--vocab_size=3"],
     "--vocab_size=3 is too small for --model_type=wordpiece: at least 6"),
    ("text", ["--output_file={out}/vocab.txt", "--vocab_size=7", "--num_unused=5"],
     "--vocab_size=7 is too small for --model_type=wordpiece: at least 11"),
    ("text", ["--output_file={out}/tokenizer.json", "--model_type=bpe", "--vocab_size=3"],
     "--vocab_size=3 is too small for --model_type=bpe"),
    ("text", ["--output_file={out}/sp.model", "--model_type=sentencepiece", "--vocab_size=3"],
     "--vocab_size=3 is too small for --model_type=sentencepiece"),
    ("text", ["--output_file={out}/vocab.txt", "--model_type=bpe", "--vocab_size=400"],
     "a bpe --output_file must be named tokenizer.json, got {out}/vocab.txt"),
    ("text", ["--output_file={out}/vocab.txt", "--model_type=sentencepiece"],
     "a sentencepiece --output_file must end in .model, got {out}/vocab.txt"),
    ("text", ["--output_file={out}/tokenizer.json"], "a wordpiece --output_file is a vocab.txt"),
    ("text", ["--output_file={out}/sp.model", "--model_type=sentencepiece",
              "--vocab_size=30000"],
     "--vocab_size=30000 is more than sentencepiece can learn from {input}: at most"),
    ("text", ["--output_file={out}/sp.model", "--model_type=sentencepiece", "--vocab_size=12"],
     "--vocab_size=12 is below the"),
    ("text", ["--output_file={out}/vocab.txt", "--num_unused=-1"], "--num_unused must be >= 0"),
]  # fmt: skip


@pytest.mark.parametrize("name, flags, expected", VOCAB_CASES)
def test_build_vocab_refuses_in_one_line(tmp_path, text, name, flags, expected):
    inputs = {**_inputs(tmp_path), "text": text}
    out = tmp_path / "vocab"
    flags = [f.format(out=out) for f in flags]
    run = _run("data_pipelines.build_vocab", f"--input_file={inputs[name]}", *flags)
    last = _one_line_error(run, "build_vocab")
    assert expected.format(input=inputs[name], out=out) in last
    assert not out.exists()  # nothing written, not even the directory


def test_build_vocab_onto_a_directory_in_one_line(tmp_path, text):
    run = _run("data_pipelines.build_vocab", f"--input_file={text}", f"--output_file={tmp_path}")
    assert f"--output_file={tmp_path} is a directory" in _one_line_error(run, "build_vocab")
    assert os.listdir(tmp_path) == []


# --- item 8: Beam's temporary directories ----------------------------------------------------


def _beam(tmp_path, *args: str):
    """beam_records in .venv-beam on the DirectRunner, with TMPDIR a directory of its own."""
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir(exist_ok=True)
    run = _run("data_pipelines.beam_records", *args, python=BEAM_PYTHON,
               env={"TMPDIR": str(tmpdir)})  # fmt: skip
    return run, sorted(os.listdir(tmpdir))


def _beam_flags(input_file, out, *extra) -> list[str]:
    return [
        f"--input_file={input_file}", f"--output_file={out}", f"--vocab_file={_minilm_vocab()}",
        "--max_seq_length=128", "--max_predictions_per_seq=20", "--dupe_factor=1",
        "--random_seed=5", "--runner=DirectRunner", *extra,
    ]  # fmt: skip


MODES = ["in_memory", pytest.param("multi_processing", marks=pytest.mark.extended)]


@needs_beam
@pytest.mark.parametrize("mode", MODES)
def test_a_beam_run_leaves_nothing_in_tmpdir_and_caps_shards_as_the_tool(corpus, tmp_path, mode):
    # Also item 7 on Beam: 500 shards asked for, the tool's capped set byte for byte.
    out = tmp_path / "beam" / "out.tfrecord"
    extra = [f"--direct_running_mode={mode}", "--direct_num_workers=2", "--num_output_shards=500"]
    run, left = _beam(tmp_path, *_beam_flags(corpus, out, *extra))
    assert run.returncode == 0, run.stderr[-3000:]
    assert left == []  # no beam-temp*, tmp*, beam-requirements-cache
    tool = cpd.create_pretraining_data(
        _options(tmp_path / "tool", corpus, dupe_factor=1, random_seed=5, num_output_shards=500)
    )
    shards = sorted(p for p in os.listdir(out.parent) if p.endswith(".tfrecord"))
    assert shards == [os.path.basename(p) for p in tool["output_files"]]
    assert len(shards) == tool["instances"] < 500
    assert _contents([out.parent / s for s in shards]) == _contents(tool["output_files"])
    assert "--num_output_shards=500 is more than the" in run.stderr


@needs_beam
@pytest.mark.parametrize("mode", MODES)
def test_a_failed_beam_run_leaves_nothing_in_tmpdir(corpus, tmp_path, mode):
    # Text that is not UTF-8 fails the pipeline inside a worker.
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"\xff\xfe\x00bad\n" * 20 + b"\n" + b"\xc3\x28 worse\n" * 20)
    out = tmp_path / "out" / "train.tfrecord"
    flags = _beam_flags(f"{corpus},{binary}", out, f"--direct_running_mode={mode}",
                        "--direct_num_workers=2")  # fmt: skip
    run, left = _beam(tmp_path, *flags)
    assert run.returncode != 0  # Beam's worker logs its own traceback before our line
    assert str(binary) in run.stderr.strip().splitlines()[-1]
    assert left == []
    assert not out.parent.exists()  # nor the output directory it made
    # No documents: fails after the pipeline ran.
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    run, left = _beam(tmp_path, *_beam_flags(empty, out, f"--direct_running_mode={mode}"))
    last = _one_line_error(run, "beam_records")
    assert last == f"beam_records: no documents in the input {empty}"
    assert left == [] and not out.parent.exists()
    # An output that is a directory: refused before the pipeline starts.
    run, left = _beam(tmp_path, *_beam_flags(corpus, tmp_path, f"--direct_running_mode={mode}"))
    assert f"--output_file: {tmp_path} is a directory" in _one_line_error(run, "beam_records")
    assert left == []


@needs_beam
def test_beam_records_help_in_its_own_venv(tmp_path):
    # .venv-beam has no ml_collections, which the help's config-key listing imports.
    run = _run("data_pipelines.beam_records", "--help", python=BEAM_PYTHON, cwd=str(tmp_path),
               env={"PYTHONPATH": REPO})  # fmt: skip
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert "--num_output_shards:" in run.stdout and "--[no]dry_run:" in run.stdout
    assert os.listdir(tmp_path) == []


@needs_beam
def test_a_beam_run_stopped_by_sigterm_leaves_nothing(corpus, tmp_path):
    import signal
    import time

    with open(corpus) as f:
        text = f.read()
    big = tmp_path / "big.txt"
    big.write_text("\n".join([text] * 200))
    tmpdir, out = tmp_path / "tmpdir", tmp_path / "out" / "train.tfrecord"
    tmpdir.mkdir()
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TMPDIR": str(tmpdir)}
    flags = _beam_flags(big, out, "--direct_running_mode=multi_processing",
                        "--direct_num_workers=2", "--dupe_factor=10")  # fmt: skip
    process = subprocess.Popen(
        [BEAM_PYTHON, "-m", "data_pipelines.beam_records", *flags], cwd=REPO, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not any(p.name.startswith("beam-temp") for p in tmpdir.glob("*/*")):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.1)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert stderr.strip().splitlines()[-1].startswith("beam_records: stopped by SIGTERM")
    assert os.listdir(tmpdir) == [] and not out.parent.exists()


# --- item 8: every module's --help -----------------------------------------------------------


def _modules_with_main() -> list[str]:
    """Every module of the four packages with a `__main__` guard, as `python -m` names it."""
    found = []
    for package in ("data_pipelines", "bert_jax", "experiments", "benchmarks"):
        for root, _, files in os.walk(os.path.join(REPO, package)):
            for name in sorted(files):
                if not name.endswith(".py"):
                    continue
                with open(os.path.join(root, name), encoding="utf-8") as f:
                    if not re.search(r"^if __name__ == .__main__.:", f.read(), re.M):
                        continue
                module = os.path.relpath(os.path.join(root, name[:-3]), REPO)
                found.append(module.replace(os.sep, ".").removesuffix(".__main__"))
    return sorted(found)


# `python -m MODULE --help` for many modules from one interpreter: each module runs in a child
# forked from it (the libraries most modules import, absl and numpy, are imported once,
# before the fork), in a directory of its own, with an audit hook that names every file it
# opens for writing, renames, removes or makes (Python's bytecode cache aside): a rewrite
# shows even when it writes the same bytes (git status would not), and only that child's
# writes count (not those of whoever else edits the tree meanwhile). Prints {module: exit}.
_FORKED_HELP = r"""
import json, os, runpy, sys, traceback
import absl.app, absl.flags, absl.logging, numpy
WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
CHANGES = {"os.rename", "os.replace", "os.remove", "os.unlink", "os.mkdir", "os.rmdir",
           "shutil.rmtree", "os.truncate", "os.symlink", "os.link", "shutil.copyfile"}
def hook(event, args):
    if not (event in CHANGES or event == "open" and isinstance(args[2], int) and args[2] & WRITE):
        return
    path = os.fsdecode(args[0]) if isinstance(args[0], (str, bytes, os.PathLike)) else ""
    if path and "__pycache__" not in path and not path.startswith(("/dev/", "/proc/")):
        os.write(2, f"\nWROTE {event} {path}\n".encode())
codes = {}
for module in sys.argv[2:]:
    directory = os.path.join(sys.argv[1], module)
    os.mkdir(directory)
    log = os.open(directory + ".log", os.O_WRONLY | os.O_CREAT)
    pid = os.fork()
    if pid == 0:
        os.chdir(directory)  # a relative write would land here
        os.dup2(log, 1)
        os.dup2(log, 2)
        sys.addaudithook(hook)
        sys.argv = [module, "--help"]
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else stop.code is not None
            if isinstance(stop.code, str):
                print(stop.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(code))
    os.close(log)
    codes[module] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
print(json.dumps(codes))
"""


def _git_status() -> list[str]:
    """`git status --porcelain` but for Python sources, which people may be editing meanwhile
    (the audit hook is what sees a help's own writes; this sees any data file changed)."""
    status = subprocess.run(
        ["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    return [line for line in status.splitlines() if not line.endswith(".py")]


def test_every_module_s_help_prints_usage_exits_0_and_writes_nothing(tmp_path):
    modules = _modules_with_main()
    assert {
        "data_pipelines.wordpiece_rules",
        "benchmarks.peers",
        "bert_jax.convert",
        "benchmarks.accelerator_rows",
        "data_pipelines.beam_records",
    } <= set(modules)
    assert len(modules) > 40
    status = _git_status()
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": REPO}
    halves = [modules[0::2], modules[1::2]]  # two processes: two cores
    processes = [
        subprocess.Popen([sys.executable, "-c", _FORKED_HELP, str(tmp_path), *half], cwd=tmp_path,
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for half in halves
    ]  # fmt: skip
    codes = {}
    for process in processes:
        stdout, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr[-3000:]
        codes.update(json.loads(stdout.strip().splitlines()[-1]))
    assert sorted(codes) == modules
    failures = []
    for module, code in codes.items():
        with open(tmp_path / f"{module}.log") as f:
            said = f.read()
        lower = said.lower()
        # absl's help: the docstring, the flags, "Try --helpfull"; argparse's: "usage:".
        usage = any(w in lower for w in ("usage", "flags:", "--helpfull")) and len(said) > 80
        if code != 0 or "traceback" in lower or not usage:
            failures.append(f"{module}: exit {code}: {said[-300:]}")
        wrote = [line for line in said.splitlines() if line.startswith("WROTE ")]
        if wrote or os.listdir(tmp_path / module):
            failures.append(f"{module}: {wrote} {os.listdir(tmp_path / module)}")
    assert failures == []
    assert _git_status() == status


def test_wordpiece_rules_writes_its_table_only_when_asked(tmp_path):
    # Asked (elsewhere than the package, which --help must leave alone): the table.
    run = _run("data_pipelines.wordpiece_rules", "--output_dir", str(tmp_path))
    assert run.returncode == 0, run.stderr[-2000:]
    (written,) = os.listdir(tmp_path)
    assert re.fullmatch(r"unicode-[\d.]+\.json", written)
    with open(tmp_path / written) as f:
        assert "removed" in json.load(f)
    with open(os.path.join(REPO, "data_pipelines", "unicode_classes", written)) as f:
        shipped = f.read()
    assert (tmp_path / written).read_text() == shipped  # the scan the package ships
    run = _run("data_pipelines.wordpiece_rules", "--bogus")
    assert run.returncode != 0 and "Traceback" not in run.stderr


@pytest.mark.parametrize("module", ["benchmarks.peers", "benchmarks.accelerator_rows"])
def test_benchmark_workers_say_their_usage(module, tmp_path):
    for flag in ("--help", "-h"):
        run = _run(module, flag)
        assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr[-2000:]
        assert "usage: python -m " + module in run.stdout
    # Anything but their JSON argument: the usage line, exit 2, no traceback.
    for args in ([], ["not json"], ["{}", "x", "y", "z"]):
        run = _run(module, *args, cwd=str(tmp_path), env={"PYTHONPATH": REPO})
        assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-2000:]
        assert "usage: python -m " + module in run.stderr
    assert os.listdir(tmp_path) == []


# --- item 9: a step set aside again ----------------------------------------------------------


def test_a_step_set_aside_again_gets_a_new_name(tmp_path, caplog):
    from bert_jax import checkpointing

    directory = tmp_path / "checkpoints"
    manager = checkpointing.make_manager(directory, async_save=False)
    states = {}
    for step in (1, 2):
        states[step] = {"step": np.int32(step),
                        "params": {"k": np.full((8, 8), step, np.float32)}}  # fmt: skip
        checkpointing.save(manager, step, states[step], [{"step": step}], {"lr": 0.1})
    manager.close()
    # An earlier run set step 2 aside once already, and a rerun saved it again: unreadable
    # again (its state metadata gone).
    (directory / "2.unreadable").mkdir()
    (directory / "2.unreadable" / "kept").write_text("the first one")
    for again in (2, 3):
        (directory / "2" / "state" / "_METADATA").unlink()
        manager = checkpointing.make_manager(directory, async_save=False)
        with caplog.at_level(logging.WARNING):
            state, _, _ = checkpointing.restore(manager, None, None, set_aside=True)
        assert int(state["step"]) == 1
        assert (directory / f"2.unreadable.{again}" / "state").is_dir()
        assert f"renamed {directory / '2'} to {directory / '2'}.unreadable.{again}" in caplog.text
        manager.close()
        manager = checkpointing.make_manager(directory, async_save=False)
        assert manager.all_steps() == [1]  # the aside names are no steps
        checkpointing.save(manager, 2, states[2], [{"step": 2}], {"lr": 0.1})  # the rerun
        manager.close()
    assert (directory / "2.unreadable" / "kept").read_text() == "the first one"
    assert sorted(os.listdir(directory)) == ["1", "2", "2.unreadable", "2.unreadable.2",
                                             "2.unreadable.3"]  # fmt: skip


def test_a_save_that_does_not_read_back_is_set_aside_beside_an_earlier_one(tmp_path, monkeypatch):
    from bert_jax import checkpointing

    directory = tmp_path / "checkpoints"
    manager = checkpointing.make_manager(directory, max_to_keep=1)  # async, as in training
    state = {"step": np.int32(1), "params": {"k": np.ones((8, 8), np.float32)}}
    checkpointing.save(manager, 1, state, [{"step": 1}], {})
    checkpointing.finish_saves(manager)
    (directory / "2.unreadable").mkdir()  # an earlier run's step 2, set aside

    def unreadable(step_dir, expected):
        raise ValueError("its metadata does not read")

    monkeypatch.setattr(checkpointing, "check_readable", unreadable)
    checkpointing.save(manager, 2, dict(state, step=np.int32(2)), [{"step": 2}], {})
    with pytest.raises(checkpointing.CheckpointError) as error:
        checkpointing.finish_saves(manager)
    manager.close()
    assert f"set aside as {directory / '2'}.unreadable.2; step 1 is the last good one" in str(
        error.value
    )
    assert sorted(os.listdir(directory)) == ["1", "2.unreadable", "2.unreadable.2"]


def test_aside_names_count_up(tmp_path):
    from bert_jax.checkpoint_reading import aside_name

    step = tmp_path / "6"
    step.mkdir()
    assert aside_name(step) == tmp_path / "6.unreadable"
    (tmp_path / "6.unreadable").write_text("a file, not a directory")
    (tmp_path / "6.unreadable.2").mkdir()
    assert aside_name(step) == tmp_path / "6.unreadable.3"


# --- item 9: Makefile variables with spaces --------------------------------------------------


@pytest.mark.parametrize("workdir", ["runs/a b", "a\tb", "", "x y z"])
def test_make_refuses_a_workdir_with_a_space(tmp_path, workdir):
    run = subprocess.run(
        ["make", "-n", "--no-print-directory", "features", "clean", f"WORKDIR={workdir}"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode != 0
    assert "WORKDIR" in run.stderr and "space" in run.stderr, run.stderr
    assert run.stdout == ""  # no command was even printed


def test_make_takes_a_workdir_without_spaces():
    run = subprocess.run(
        ["make", "-n", "--no-print-directory", "features", "WORKDIR=runs/a_b"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "mkdir -p runs/a_b/features" in run.stdout
