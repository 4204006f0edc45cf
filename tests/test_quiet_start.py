"""A tool's start-up prints none of the known-harmless lines (issue 75, item 6) and every
other warning: libtpu's probe on a machine without TPU, TensorFlow's oneDNN and CPU-feature
INFO lines, Orbax's warning of our own jax.Array handler (`cli.quiet_known_noise`,
`checkpointing`)."""

import os
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What every run printed before (a tiny pretraining run on a CPU machine with libtpu).
KNOWN = [
    "Failed to find host bounds for accelerator type",
    "TPU_WORKER_HOSTNAMES",
    "oneDNN custom operations are on",
    "cpu_feature_guard",
    "rebuild TensorFlow with the appropriate compiler flags",
    "overriding jax.Array",
]

TOOL = """
import warnings

from absl import logging

from data_pipelines import cli


def main(argv):
    import tensorflow as tf

    tf.constant(1)  # TensorFlow's start-up
    import jax

    from bert_jax import checkpointing

    checkpointing.make_manager({directory!r})  # registers the CPU array handler
    print(jax.devices())
    logging.warning("an unrelated absl warning")
    warnings.warn("an unrelated Python warning")


cli.run(main)
"""


def test_a_tool_starts_without_the_known_harmless_lines_and_with_the_others(tmp_path):
    script = tmp_path / "tool.py"
    script.write_text(textwrap.dedent(TOOL.format(directory=str(tmp_path / "checkpoints"))))
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("JAX_PLATFORMS", "TF_CPP_MIN_LOG_LEVEL", "XLA_FLAGS", "USE_TF")
    }
    # libtpu probes (and prints) only where it holds its lockfile: other test processes
    # may hold it, so the probe runs here whatever they do.
    env |= {"ALLOW_MULTIPLE_LIBTPU_LOAD": "1", "PYTHONPATH": REPO}
    done = subprocess.run(
        [sys.executable, str(script)], env=env, cwd=REPO, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "CpuDevice" in done.stdout
    printed = [line for line in KNOWN if line in done.stderr]
    assert not printed, done.stderr
    assert "an unrelated absl warning" in done.stderr
    assert "UserWarning: an unrelated Python warning" in done.stderr
