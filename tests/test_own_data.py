"""A newcomer's own run (issue 75): the held-out set is evaluated after the last step
whatever eval_every says, and said so at the start; the progress bar counts steps whose
results are on the host, not steps dispatched."""

from __future__ import annotations

import json
import logging
import types

import numpy as np
import pytest
import synthetic_pretraining as synth

from bert_jax import telemetry, train_loop


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("data")
    synth.write_records(str(directory), "train", 2, 64, seed=0)
    synth.write_records(str(directory), "eval", 1, 32, seed=1)
    return directory


def test_a_run_shorter_than_eval_every_is_evaluated_after_its_last_step(tmp_path, data_dir, caplog):
    config = synth.tiny_config(str(data_dir))
    config.model.num_hidden_layers = 1  # what is checked does not depend on the depth
    config.data.eval_files = str(data_dir / "eval-*")
    config.num_train_steps = 3
    config.eval_every = 500
    config.eval_steps = 1
    config.log_every = 1
    with caplog.at_level(logging.WARNING):
        train_loop.train_and_evaluate(config, str(tmp_path / "run"))
    records = telemetry.read_metrics(str(tmp_path / "run" / "metrics.jsonl"))
    assert [r["step"] for r in records if r["split"] == "eval"] == [0, 3]
    assert "eval_every=500 > the run's 3 steps" in caplog.text


def test_the_bar_shows_a_step_once_its_results_are_on_the_host():
    class Bar:
        n = 0

        def update(self, k):
            self.n += k

    waited = []
    loop = types.SimpleNamespace(progress=Bar(), pending=[])
    real = train_loop.jax.block_until_ready
    train_loop.jax.block_until_ready = lambda x: waited.append(x) or x
    try:
        for step in (1, 2, 3):
            loop.pending.append((step, {"loss": np.float32(step)}))
            train_loop._Pretraining._show_finished_steps(loop)
    finally:
        train_loop.jax.block_until_ready = real
    assert loop.progress.n == 2  # step 3 still in flight: not counted
    assert [w["loss"] for w in waited] == [1, 2]  # each shown step was waited for


def test_dynamic_masking_writes_one_copy_unless_told_and_static_keeps_ten(tmp_path):
    import subprocess
    import sys

    from data_pipelines.create_pretraining_data import default_dupe_factor

    assert (default_dupe_factor("dynamic"), default_dupe_factor("static")) == (1, 10)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat.\nit was warm.\n\na dog ran.\nit barked.\n")
    counts = {}
    for name, extra in (("dynamic", []), ("dynamic3", ["--dupe_factor=3"])):
        out = tmp_path / f"{name}.tfrecord"
        subprocess.run(
            [sys.executable, "-m", "data_pipelines.create_pretraining_data",
             f"--input_file={corpus}", f"--output_file={out}",
             f"--vocab_file={synth.minilm_vocab()}",
             "--masking=dynamic", "--max_seq_length=16", *extra],
            check=True, capture_output=True,
        )  # fmt: skip
        stats = json.loads(next(tmp_path.glob(f"{name}*.json")).read_text())
        counts[name] = stats["options"]["dupe_factor"]
    assert counts == {"dynamic": 1, "dynamic3": 3}


def test_a_missing_vocab_file_is_one_line_naming_the_tool_and_the_file(tmp_path):
    import subprocess
    import sys

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a line.\n\nanother.\n")
    result = subprocess.run(
        [sys.executable, "-m", "data_pipelines.create_pretraining_data", f"--input_file={corpus}",
         f"--output_file={tmp_path / 'out.tfrecord'}", f"--vocab_file={tmp_path / 'none.txt'}"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"create_pretraining_data: vocab file not found: {tmp_path / 'none.txt'}")  # fmt: skip
    assert "Traceback" not in result.stderr


def test_build_vocab_bpe_keeps_case_by_default_as_modernberts_tokenizer(tmp_path):
    import subprocess
    import sys

    from tokenizers import Tokenizer

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("Paris is a City in France.\nLondon is a City too.\n" * 20)
    out = tmp_path / "tok" / "tokenizer.json"
    subprocess.run(
        [sys.executable, "-m", "data_pipelines.build_vocab", "--model_type=bpe",
         f"--input_file={corpus}", f"--output_file={out}", "--vocab_size=320"],
        check=True, capture_output=True,
    )  # fmt: skip
    assert Tokenizer.from_file(str(out)).normalizer.normalize_str("Paris") == "Paris"
