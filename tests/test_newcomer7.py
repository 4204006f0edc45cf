"""Issue 83 (Newcomer 7): the project's .venv runs sentence-transformers as a user would, with
no environment variable set; the test extra holds sentence-transformers' own trainer."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from flax import linen as nn

from bert_jax import convert, embeddings
from bert_jax.config import BertConfig
from bert_jax.convert import sentence_transformers as st_files

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "hello", "world"]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def tiny_export(directory) -> str:
    """A randomly initialised 1-layer BERT written as a sentence-transformers directory."""
    vocab = directory / "vocab.txt"
    vocab.write_text("\n".join(SPECIALS + WORDS) + "\n")
    config = BertConfig(vocab_size=len(SPECIALS) + len(WORDS), hidden_size=16,
                        num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                        max_position_embeddings=16)  # fmt: skip
    module = embeddings.BertForEmbedding(config, "mean")
    ids = jnp.zeros((1, 4), jnp.int32)
    params = nn.unbox(module.init(jax.random.key(0), ids, ids, ids)["params"])
    out = directory / "st"
    convert.save_hf(out, config, params["bert"], vocab_file=str(vocab),
                    extra_json=st_files.module_files("mean", True, 16, 16))  # fmt: skip
    return str(out.resolve())


# What a user's script does: load the export, embed, train a step with sentence-transformers'
# own trainer (it needs `accelerate` and `datasets`, issue 83 item 5).
TRAIN = """
from datasets import Dataset
from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, losses
from sentence_transformers import SentenceTransformerTrainingArguments
from transformers import pipeline

model = SentenceTransformer({export!r}, device="cpu")
print(model.encode(["the cat sat", "hello world"]).shape)
pairs = Dataset.from_dict({{"anchor": ["the cat", "a dog"], "positive": ["sat on", "ran"]}})
args = SentenceTransformerTrainingArguments({out!r}, max_steps=1, per_device_train_batch_size=2,
                                            report_to=[], save_strategy="no", use_cpu=True)
loss = losses.MultipleNegativesRankingLoss(model)
SentenceTransformerTrainer(model=model, args=args, train_dataset=pairs, loss=loss).train()
print("trained")
"""


def test_the_venv_runs_sentence_transformers_and_its_trainer_without_use_tf(tmp_path):
    """transformers finds TensorFlow here and, unless told, loads its TF classes, which need a
    Keras this .venv does not install: `import sentence_transformers` failed."""
    export = tiny_export(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("USE_TF", "USE_TORCH")}
    env["HF_HUB_OFFLINE"] = "1"
    script = TRAIN.format(export=export, out=str(tmp_path / "trained"))
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "(2, 16)" in done.stdout and "trained" in done.stdout, done.stdout


def finetuned_workdir(directory):
    """What `experiments.finetune_embeddings` leaves: checkpoint/ (our encoder, no pooler,
    its settings and base model in finetuned.json) and metrics.json (dev scores)."""
    from bert_jax import finetune_common

    vocab = directory / "vocab.txt"
    vocab.write_text("\n".join(SPECIALS + WORDS) + "\n")
    config = BertConfig(vocab_size=len(SPECIALS) + len(WORDS), hidden_size=16,
                        num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                        max_position_embeddings=16)  # fmt: skip
    module = embeddings.BertForEmbedding(config, "mean", True)
    ids = jnp.zeros((1, 4), jnp.int32)
    params = nn.unbox(module.init(jax.random.key(0), ids, ids, ids)["params"])
    workdir = directory / "run"
    settings = {"pooling": "mean", "normalize": True, "max_seq_length": 16}
    finetune_common.save_finetuned(
        str(workdir / "checkpoint"), config, params, vocab_file=str(vocab),
        metadata={"task": "embedding", "embedding": settings, "init_from": "/models/minilm",
                  "from_scratch": False, "objective": "contrastive"},
    )  # fmt: skip
    scores = {"nDCG@10": 0.25, "MRR@10": 0.2, "R@1": 0.125, "R@10": 0.5, "R@100": 1.0}
    metrics = {"before": scores, "after": {**scores, "nDCG@10": 0.75}}
    finetune_common.write_json(str(workdir / "metrics.json"), metrics)
    return workdir


def test_an_embedding_export_has_a_card_no_made_up_pooler_and_loads_by_relative_path(
    tmp_path, monkeypatch, capfd
):
    """Issue 83 item 5: without README.md, SentenceTransformer("bj-st") looked "bj-st" up on
    the hub (5 retries offline) before reading the directory; the export of a run without a
    pooler carried one initialised at random, which transformers serves as pooler_output."""
    import huggingface_hub
    from safetensors import safe_open

    st = __import__("sentence_transformers")
    workdir = finetuned_workdir(tmp_path)
    done = subprocess.run([sys.executable, "-m", "bert_jax.convert",
                           f"--input={workdir / 'checkpoint'}", f"--output={tmp_path / 'bj-st'}",
                           "--format=sentence-transformers"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    card = (tmp_path / "bj-st" / "README.md").read_text()
    for said in ("/models/minilm", "mean pooling", "L2-normalised", "16 tokens", "no pooler"):
        assert said in card, card
    after = next(line for line in card.splitlines() if line.startswith("| after |"))
    assert "0.7500" in after, card
    with safe_open(tmp_path / "bj-st" / "model.safetensors", "np") as f:
        assert not [k for k in f.keys() if "pooler" in k]

    asked = []

    def no_hub(*args, **kwargs):
        asked.append((args, kwargs))
        raise huggingface_hub.errors.LocalEntryNotFoundError("offline")

    original = huggingface_hub.hf_hub_download
    for module in list(sys.modules.values()):
        if getattr(module, "hf_hub_download", None) is original:
            monkeypatch.setattr(module, "hf_hub_download", no_hub)
    monkeypatch.chdir(tmp_path)
    capfd.readouterr()
    model = st.SentenceTransformer("bj-st", device="cpu")
    assert not asked, asked
    assert model.encode(["the cat sat"]).shape == (1, 16)
    assert model[0].auto_model.pooler is None
    assert "newly initialized" not in capfd.readouterr().err


def _help(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "experiments.finetune_embeddings", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_help_lists_the_config_keys_with_their_defaults_and_comments():
    """Issue 83 item 5: --help listed only --config and --workdir."""
    listed = _help("--help", "--config=experiments/configs/embeddings.py")
    assert "--config.global_batch_size=64  # pairs per step" in listed, listed
    assert "--config.train_file=''  # TSV: query, positive[, negatives]" in listed, listed
    # A key the file inherits (finetune_base.py), with the comment written there.
    assert "--config.learning_rate=5e-05  # peak, after warmup" in listed, listed
    bare = _help("-h")  # no config named: how to list them, and the files that run the tool
    assert "--config=<file> with --help" in bare, bare
    assert "experiments/configs/embeddings.py" in bare, bare


TOOL = """
from data_pipelines import cli


def main(argv):
    import jax

    print(jax.devices())


cli.run(main)
"""


def test_a_cpu_run_has_no_tpu_probe_line_and_a_chosen_backend_still_fails_loudly(tmp_path):
    """Issue 83 item 5: every run logged "Unable to initialize backend 'tpu': ... libtpu.so"
    (JAX registers its TPU backend where libtpu is not installed too)."""
    from data_pipelines import cli

    hardware = cli._jax_hardware_utils()
    if hardware.num_available_tpu_chips_and_device_id()[0] or cli._has_gpu(hardware):
        pytest.skip("an accelerator host: JAX's probe is left as it is")
    script = tmp_path / "tool.py"
    script.write_text(TOOL)
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    env["PYTHONPATH"] = REPO

    def start(**extra):
        return subprocess.run([sys.executable, str(script)], env={**env, **extra},
                              capture_output=True, text=True, timeout=120)  # fmt: skip

    done = start()
    assert done.returncode == 0 and "CpuDevice" in done.stdout, done.stderr
    assert "Unable to initialize backend" not in done.stderr, done.stderr
    chosen = start(JAX_PLATFORMS="tpu")  # the user's choice: its failure is not hidden
    assert chosen.returncode != 0 and "Unable to initialize backend 'tpu'" in chosen.stderr
