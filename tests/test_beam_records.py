"""data_pipelines.beam_records: on Beam's DirectRunner (2 worker processes) the records and
stats of create_pretraining_data for the same flags and seed, byte for byte, for sentence
pairs and single segments, a WordPiece vocab.txt and a tokenizer.json; bad input fails with
the tool's one-line messages.

The pipeline runs in `.venv-beam` (`make beam-venv`, which `make test` builds: apache-beam
needs protobuf < 7, which the main .venv's sentencepiece cannot import under); the tool runs
here.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from create_data_fixtures import MAX_PRED, MAX_SEQ, _minilm_vocab, _options, _write_documents

from data_pipelines import build_vocab, embedded_corpora
from data_pipelines.create_pretraining_data import create_pretraining_data

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEAM_PYTHON = os.path.join(REPO, ".venv-beam", "bin", "python")
MULTI_PROCESS = ["--runner=DirectRunner", "--direct_num_workers=2",
                 "--direct_running_mode=multi_processing"]  # fmt: skip
IN_PROCESS = ["--runner=DirectRunner", "--direct_running_mode=in_memory"]

pytestmark = pytest.mark.skipif(
    not os.path.exists(BEAM_PYTHON), reason=".venv-beam is missing: make beam-venv"
)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    scenes = embedded_corpora.shakespeare_documents(split_sentences=False, max_plays=2)
    documents = [d.sentences[:40] for d in list(scenes)[:21]]  # 21: a last chunk of one joins
    return _write_documents(tmp_path_factory.mktemp("corpus") / "small.txt", documents)


@pytest.fixture(scope="module")
def tokenizer_json(corpus, tmp_path_factory) -> str:
    directory = tmp_path_factory.mktemp("bpe")
    with open(corpus, encoding="utf-8") as f:
        lines = [line for line in f if line.strip()]
    path = str(directory / "tokenizer.json")
    build_vocab.train_bpe(iter(lines), path, vocab_size=400, do_lower_case=False)
    return path


def _flags(options) -> list[str]:
    """The command line of `options` (the tool's flags)."""
    return [
        f"--input_file={options.input_file}",
        f"--output_file={options.output_file}",
        f"--vocab_file={options.vocab_file}",
        f"--max_seq_length={options.max_seq_length}",
        f"--max_predictions_per_seq={options.max_predictions_per_seq}",
        f"--dupe_factor={options.dupe_factor}",
        f"--random_seed={options.random_seed}",
        f"--num_output_shards={options.num_output_shards}",
        f"--documents_per_chunk={options.documents_per_chunk}",
        f"--masking={options.masking}",
        f"--{'' if options.next_sentence else 'no'}next_sentence",
        f"--{'' if options.do_whole_word_mask else 'no'}do_whole_word_mask",
        f"--{'' if options.do_lower_case else 'no'}do_lower_case",
    ]


def _beam(args: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run(
        [BEAM_PYTHON, "-m", "data_pipelines.beam_records", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def _contents(paths) -> list[bytes]:
    result = []
    for path in paths:
        with open(path, "rb") as f:
            result.append(f.read())
    return result


def _comparable(stats: dict) -> dict:
    """The stats but for where and how fast the files were written, and the process count."""
    stats = dict(stats, options=dict(stats["options"]))
    for key in ("timing", "output_files"):
        stats.pop(key)
    for key in ("output_file", "num_workers", "show_progress"):
        stats["options"].pop(key)
    return stats


@pytest.mark.parametrize(
    "kind, vocab",
    [
        ("pairs", "vocab.txt"),
        ("single", "tokenizer.json"),
        pytest.param("pairs", "tokenizer.json", marks=pytest.mark.extended),
        pytest.param("single", "vocab.txt", marks=pytest.mark.extended),
    ],
)
def test_the_records_and_stats_equal_the_tool_s(kind, vocab, corpus, tokenizer_json, tmp_path):
    vocab_file = _minilm_vocab() if vocab == "vocab.txt" else tokenizer_json
    common = dict(
        vocab_file=vocab_file,
        do_lower_case=vocab == "vocab.txt",
        dupe_factor=2,
        random_seed=11,
        num_output_shards=3,
        documents_per_chunk=4,
        next_sentence=kind == "pairs",
        do_whole_word_mask=kind == "single",
    )
    (tmp_path / "tool").mkdir()
    tool_options = _options(tmp_path / "tool", corpus, num_workers=2, **common)
    expected = create_pretraining_data(tool_options)
    beam_options = _options(tmp_path / "beam", corpus, **common)
    run = _beam(_flags(beam_options) + MULTI_PROCESS)
    assert run.returncode == 0, run.stderr[-3000:]
    with open(expected["output_files"][0] + ".stats.json") as f:
        expected = json.load(f)
    with open(os.path.join(tmp_path / "beam", "out-00000-of-00003.tfrecord.stats.json")) as f:
        stats = json.load(f)
    assert [os.path.basename(p) for p in stats["output_files"]] == [
        os.path.basename(p) for p in expected["output_files"]
    ]
    assert _contents(stats["output_files"]) == _contents(expected["output_files"])
    assert _comparable(stats) == _comparable(expected)
    assert stats["chunks"] == 5 and stats["instances"] > 0  # 21 documents in chunks of 4
    assert (MAX_SEQ, MAX_PRED) == (stats["options"]["max_seq_length"],
                                   stats["options"]["max_predictions_per_seq"])  # fmt: skip


def _tool_error(options) -> str:
    with pytest.raises(Exception) as caught:
        create_pretraining_data(options)
    return str(caught.value)


def _beam_error(options, runner: list[str]) -> str:
    run = _beam(_flags(options) + runner)
    assert run.returncode != 0
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("beam_records: "), run.stderr[-3000:]
    return last.removeprefix("beam_records: ")


def test_bad_input_fails_with_the_tool_s_one_line_messages(corpus, tmp_path):
    # Text that is not UTF-8: the error is raised in a worker process, said here.
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"\xff\xfe\x00bad\n" * 20 + b"\n" + b"\xc3\x28 worse\n" * 20)
    inputs = f"{corpus},{binary}"
    message = _tool_error(_options(tmp_path, inputs))
    assert str(binary) in message and "UTF-8" in message
    assert _beam_error(_options(tmp_path, inputs), MULTI_PROCESS) == message
    # No documents at all.
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n\n")
    message = _tool_error(_options(tmp_path, str(empty)))
    assert message == f"no documents in the input {empty}"
    assert _beam_error(_options(tmp_path, str(empty)), IN_PROCESS) == message
    # A missing vocabulary: refused before the pipeline starts.
    missing = _options(tmp_path, corpus, vocab_file=str(tmp_path / "no_vocab.txt"))
    message = _tool_error(missing)
    assert "no_vocab.txt" in message
    assert _beam_error(missing, IN_PROCESS) == message
    assert not [f for f in os.listdir(tmp_path) if f.startswith(("out", ".out"))]


def _make(*args, env=None) -> str:
    run = subprocess.run(
        ["make", "-s", "--no-print-directory", "BUCKET=gs://bkt", "PROJECT=p", *args],
        cwd=REPO, capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def test_make_tpu_data_switches_runner():
    # direct: beam_records on worker 0, in the same local paths as the default.
    assert "RUNNER=direct" in _make("tpu-data", "RUNNER=direct", "DRY_RUN=1")
    local = _make("tpu-data-local", "RUNNER=direct", "DRY_RUN=1", "TPU_LOCAL_DATA=/wb")
    assert local.count("-m data_pipelines.beam_records") == 8
    assert local.count("--runner=DirectRunner") == 8
    # dataflow: 8 jobs from here, straight into the bucket, as dry runs unless submitted.
    commands = _make("tpu-data", "RUNNER=dataflow", "DRY_RUN=1").splitlines()
    commands = [c for c in commands if "data_pipelines.beam_records" in c]
    assert len(commands) == 8
    for command in commands:
        assert "--runner=DataflowRunner" in command and command.endswith("--dry_run")
        assert "--output_file=gs://bkt/wikibooks/seq" in command


@pytest.mark.extended
def test_make_tpu_data_on_dataflow_prints_the_jobs(tmp_path):
    # The dry runs themselves: no account, no file read, and no file left (a pipeline built
    # and never run keeps its temporary directory unless it is removed).
    text = _make("tpu-data", "RUNNER=dataflow", env={**os.environ, "TMPDIR": str(tmp_path)})
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("beam-pipeline-temp")]
    jobs, decoder, at = [], json.JSONDecoder(), text.find("{")
    while at != -1:
        job, end = decoder.raw_decode(text, at)
        jobs.append(job)
        at = text.find("{", end)
    assert len(jobs) == 8
    for job in jobs:
        assert job["runner"] == "DataflowRunner"
        assert job["pipeline_options"]["temp_location"] == "gs://bkt/dataflow/tmp"
        assert job["output_files"]["first"].startswith("gs://bkt/wikibooks/seq")
        assert "MakeChunk" in job["steps"]
