"""Every tool's command line (data_pipelines.cli): `--help` and `-h` exit 0, and a config
override naming no key is one line naming it and the closest valid keys."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", JAX_PLATFORMS="cpu")


def _absl_tools() -> list[str]:
    """Every module run as `python -m ...` that parses its flags with absl."""
    tools = []
    for package in ("bert_jax", "data_pipelines", "experiments", "benchmarks"):
        for path in sorted((REPO / package).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            if '__name__ == "__main__"' in text and re.search(r"^\s*from absl import", text, re.M):
                tools.append(str(path.relative_to(REPO)))
    return tools


TOOLS = _absl_tools()


def _module(tool: str) -> str:
    return tool.removesuffix(".py").replace("/", ".")


def _run(module: str, *args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_tools_are_found():
    tools = _absl_tools()
    assert "experiments/pretrain.py" in tools and "bert_jax/convert/__main__.py" in tools
    assert "data_pipelines/create_pretraining_data.py" in tools


@pytest.mark.parametrize("tool", TOOLS)
def test_every_tool_runs_through_cli_run(tool):
    text = (REPO / tool).read_text(encoding="utf-8")
    assert "cli.run(" in text and "app.run(" not in text


@pytest.mark.parametrize("tool", TOOLS)
def test_h_prints_the_help_and_exits_0(tool):
    result = _run(_module(tool), "-h")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Try --helpfull to get a list of all flags." in result.stdout
    assert "Traceback" not in result.stderr


# The demo's functions read its flags (its tests parse them in-process); recipe_compare
# runs the demo's stages with the demo's flags, and adds its own to them.
DEFINES_FLAGS_AT_IMPORT = {"experiments/demo.py", "experiments/recipe_compare.py"}


def test_importing_a_tool_defines_no_flags():
    # A module that defines its flags at import cannot be imported beside another that
    # defines the same names (absl's DuplicateFlagError): tools define them when run.
    modules = [_module(t) for t in TOOLS if t not in DEFINES_FLAGS_AT_IMPORT]
    code = (
        "import importlib, sys\n"
        "from absl import flags\n"
        "for name in sys.argv[1:]:\n"
        "    importlib.import_module(name)\n"
        "defined = flags.FLAGS.flags_by_module_dict()\n"
        "print(sorted(n for n in sys.argv[1:] if n in defined))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, *modules], cwd=REPO, env=ENV, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout == "[]\n"


@pytest.mark.parametrize("flag", ["--help", "-?", "--helpshort", "--helpfull"])
def test_every_help_flag_exits_0(flag):
    result = _run("experiments.pretrain", flag)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "--workdir: Checkpoints, metrics.jsonl and TensorBoard events." in result.stdout


def test_bad_flags_still_exit_1():
    result = _run("experiments.pretrain", "--no_such_flag")
    assert result.returncode == 1
    assert "FATAL Flags parsing error: Unknown command line flag 'no_such_flag'" in result.stderr


CONFIG = ["--config=experiments/configs/bert_tiny_cpu.py", "--workdir=unused"]


@pytest.mark.parametrize(
    "override, expected",
    [
        # A top-level typo of a nested key: ml_collections gives a bare AttributeError.
        (
            "--config.learnig_rate=1",
            "--config.learnig_rate: the config has no key 'learnig_rate'; "
            "did you mean --config.optimizer.learning_rate?",
        ),
        (
            "--config.optimizer.learnig_rate=1",
            "--config.optimizer.learnig_rate: the config has no key 'optimizer.learnig_rate'; "
            "did you mean --config.optimizer.learning_rate?",
        ),
        (
            "--config.optimiser.learning_rate=1",
            "--config.optimiser.learning_rate: the config has no key 'optimiser'; "
            "did you mean --config.optimizer.learning_rate?",
        ),
        (
            "--config.batch_size=8",
            "--config.batch_size: the config has no key 'batch_size'; "
            "did you mean --config.global_batch_size?",
        ),
        # Nothing close: the keys at that level.
        (
            "--config.data.zzz=1",
            "--config.data.zzz: the config has no key 'data.zzz'; valid keys in 'data': "
            "allow_eval_in_train, allow_vocab_change, do_lower_case, dynamic_masking, eval_files, "
            "masked_lm_prob, max_instances_per_row, max_predictions_per_seq, max_seq_length, "
            "num_streams, on_change, pack, shuffle_buffer, train_files, vocab_file, "
            "whole_word_mask",
        ),
    ],
)
def test_an_unknown_config_key_is_one_line_with_the_closest_keys(override, expected):
    result = _run("experiments.pretrain", *CONFIG, override)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [f"FATAL Flags parsing error: {expected}"]
    assert not result.stdout


def test_a_bad_config_value_is_still_absls_error():
    result = _run("experiments.pretrain", *CONFIG, "--config.seed=abc")
    assert result.returncode == 1
    assert "FATAL Flags parsing error: flag --config.seed=abc" in result.stderr
    assert "Traceback" not in result.stderr
