"""Conversion and loading errors name the path and what was expected there (issue 41 item 3).

Junk where a checkpoint's files should be (random bytes under a checkpoint file's name) made
safetensors, TensorFlow's sstable reader or Orbax raise their own errors, naming neither the
file nor the format; a missing path and a workdir whose run saved no checkpoint yet both read
"not a Hugging Face directory ... or a pretraining workdir".
"""

import os
import subprocess
import sys

import numpy as np
import pytest

from bert_jax import convert

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _junk(path, size=3000):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(np.random.default_rng(0).bytes(size))
    return path


@pytest.mark.parametrize(
    "files, named, expected",
    [
        (["model.safetensors"], "model.safetensors", "expected a safetensors file"),
        (
            ["bert_model.ckpt.index", "bert_model.ckpt.data-00000-of-00001"],
            "bert_model.ckpt.index",
            "expected a TF checkpoint index",
        ),
        (["params/_CHECKPOINT_METADATA"], "", "expected a params-only Orbax directory"),
    ],
    ids=["hf", "tf", "orbax"],
)
def test_junk_in_a_checkpoint_file_names_the_file_and_what_was_expected(
    tmp_path, files, named, expected
):
    directory = tmp_path / "junk"
    for name in files:
        _junk(directory / name)
    with pytest.raises(convert.ConversionError) as raised:
        convert.load_pretrained(directory)
    message = str(raised.value)
    assert message.startswith(f"{os.path.join(directory, named).rstrip('/')}: {expected}")
    assert "reading it failed: " in message  # and the library's own reason after it


def test_the_cli_on_a_directory_of_junk_names_the_file(tmp_path):
    _junk(tmp_path / "junk" / "model.safetensors")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bert_jax.convert",
            f"--input={tmp_path / 'junk'}",
            f"--output={tmp_path / 'out'}",
        ],  # fmt: skip
        capture_output=True,
        text=True,
        cwd=REPO,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", JAX_PLATFORMS="cpu"),
    )
    assert result.returncode == 1
    # One line, as `embed` prints its errors (issue 82): no traceback.
    assert "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"convert: {tmp_path / 'junk' / 'model.safetensors'}: expected a safetensors file"
    ), last
    assert not (tmp_path / "out").exists()


def test_a_missing_path_and_a_workdir_with_no_checkpoint_yet_read_differently(tmp_path):
    missing = tmp_path / "no_such_run"
    with pytest.raises(convert.ConversionError, match=r": no such path \(expected "):
        convert.load_pretrained(missing)
    with pytest.raises(convert.ConversionError, match=r": no such path \(expected "):
        convert.detect_format(tmp_path / "bert_model.ckpt")  # a TF prefix that is not there

    workdir = tmp_path / "run"
    (workdir / "checkpoints").mkdir(parents=True)  # as a run makes it before its first save
    (workdir / "metrics.jsonl").write_text("")
    for given in (workdir, workdir / "checkpoints"):
        with pytest.raises(convert.ConversionError) as raised:
            convert.load_pretrained(given)
        assert str(raised.value).startswith(
            f"{given}: no checkpoint saved yet in {workdir / 'checkpoints'} "
        )
