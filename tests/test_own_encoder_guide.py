"""docs/own_encoder.md runs as written: its ```sh blocks, in order, in one bash.

The default tier only checks that every `python -m` module the guide names exists; the
extended tier runs every command with the first block's sizes made tiny (its variables
read the environment) and `SOURCE` a ModernBERT built here with transformers (random
weights, our byte-level BPE tokenizer): records, pretraining from scratch and continued,
export, fine-tuning and feature extraction, then loads both exports in transformers.
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

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "own_encoder.md"
ROOT = GUIDE.parents[1]


def guide_blocks() -> list[str]:
    """The guide's ```sh blocks, in order."""
    blocks = re.findall(r"^```sh\n(.*?)^```$", GUIDE.read_text(encoding="utf-8"), re.M | re.S)
    assert len(blocks) >= 8, "the guide lost its command blocks"
    return blocks


def guide_script() -> str:
    return "\n".join(guide_blocks())


def test_every_module_the_guide_runs_exists():
    modules = re.findall(r"python -m ([\w.]+)", guide_script())
    assert {"data_pipelines.build_vocab", "experiments.pretrain", "bert_jax.convert"} <= set(
        modules
    )
    for module in modules:
        assert importlib.util.find_spec(module) is not None, module
    for config in re.findall(r"--config=(experiments/configs/\w+\.py)", guide_script()):
        assert (ROOT / config).is_file(), config


def _tiny_modernbert(directory: Path, corpus: Path) -> None:
    """A transformers ModernBertForMaskedLM with random weights and our BPE tokenizer."""
    import torch
    import transformers

    from data_pipelines import build_vocab
    from data_pipelines.tokenization import load_tokenizer

    directory.mkdir()
    lines = corpus.read_text(encoding="utf-8").splitlines()[:3000]
    build_vocab.train_bpe(
        iter(lines), str(directory / "tokenizer.json"), vocab_size=512, do_lower_case=False
    )
    tok = load_tokenizer(str(directory))
    config = transformers.ModernBertConfig(
        vocab_size=tok.vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=2, max_position_embeddings=256, local_attention=32,
        global_attn_every_n_layers=2, pad_token_id=tok.pad_id, cls_token_id=tok.cls_id,
        sep_token_id=tok.sep_id, bos_token_id=tok.cls_id, eos_token_id=tok.sep_id,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.ModernBertForMaskedLM(config).save_pretrained(directory)


@pytest.mark.extended
def test_the_guide_runs_as_written(tmp_path, xla_cache):
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "own"
    env = {
        **subprocess_env(xla_cache, devices=1),
        "OUT": str(out),
        "VOCAB_SIZE": "1000",
        "STEPS": "4",
        "EPOCHS": "1",
        "SOURCE": str(tmp_path / "source"),
        # `python` is this interpreter, as in an activated virtual environment.
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    sizes, corpus, *rest = guide_blocks()
    # The corpus first, then the source model 4b continues is made from it (as a user
    # would download one), then everything else: every block as the guide has it.
    bash = ["bash", "-euo", "pipefail", "-c"]
    result = run_captured([*bash, sizes + corpus], 900, env=env, cwd=ROOT)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    _tiny_modernbert(tmp_path / "source", out / "corpus.txt")
    script = "\n".join([sizes, *rest])
    result = run_captured([*bash, script], 1800, env=env, cwd=ROOT)
    assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]

    for name in ("scratch_hf", "continued_hf"):
        model = transformers.AutoModelForMaskedLM.from_pretrained(out / name)
        assert type(model).__name__ == "ModernBertForMaskedLM", name
        tokenizer = transformers.AutoTokenizer.from_pretrained(out / name)
        assert tokenizer.is_fast and tokenizer.mask_token == "[MASK]"
    source = json.loads((tmp_path / "source" / "config.json").read_text())
    continued = json.loads((out / "continued_hf" / "config.json").read_text())
    assert continued["vocab_size"] == source["vocab_size"]
    assert continued["hidden_size"] == source["hidden_size"] == 64
    metrics = json.loads((out / "polarity" / "metrics.json").read_text())
    assert metrics, "fine-tuning wrote no metrics"
    mine = json.loads((out / "mine" / "metrics.json").read_text())  # section 7: own labels
    assert mine["num_examples"]["train"] == 2 and "accuracy" in mine["epochs"][-1]["dev"]
    features = (out / "features.jsonl").read_text().splitlines()
    assert len(features) == 2
