"""benchmarks/electra_reference.py: transformers' Electra models trained as `bert_jax.electra`.

The reference's loss and metrics are checked against ours (`bert_jax.electra.electra_loss`) on
the same weights and the same generator samples; its sharing, its sampler and a tiny run end
to end (metrics under our names, the discriminator's encoder imported by `bert_jax.convert`)
in-process."""

from __future__ import annotations

import json
import os

import flax.linen as nn
import jax
import numpy as np
import pytest
import synthetic_pretraining as synthetic
import torch

from benchmarks import electra_reference as reference
from bert_jax import electra
from bert_jax.convert.electra import to_hf_electra_state_dicts

B = 4
# ELECTRA-Small's shape at toy size: E < H for the discriminator, the generator projected.
DISC = synthetic.TINY.replace(embedding_size=32, num_attention_heads=2)
GEN = electra.generator_config(DISC)  # H = 16, one head


def _batch() -> dict[str, np.ndarray]:
    """A masked batch of the pipeline's layout, row 0 with two padding predictions."""
    batch = synthetic.random_batch(B, seed=0)
    batch.pop("next_sentence_labels")
    for key in ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights"):
        batch[key][0, -2:] = 0  # padding predictions: position 0, id 0, weight 0
    return batch


def _ours_and_theirs(batch):
    """Our model with perturbed weights, and transformers' pair holding the same weights."""
    model = electra.ElectraForPreTraining(DISC, GEN)
    inputs = electra.model_inputs(batch, jax.random.key(1))
    params = nn.meta.unbox(jax.jit(model.init)(jax.random.key(0), *inputs))["params"]
    rng = np.random.default_rng(2)  # numpy's: one compile per leaf shape would take seconds
    params = jax.tree.map(lambda x: x + 0.05 * rng.normal(size=x.shape).astype(np.float32), params)
    pair = reference.build_models(DISC, GEN)
    disc_state, gen_state = to_hf_electra_state_dicts(DISC, GEN, params)
    pair.discriminator.load_state_dict({k: torch.tensor(v) for k, v in disc_state.items()})
    pair.generator.load_state_dict({k: torch.tensor(v) for k, v in gen_state.items()})
    pair.modules().eval()
    return model, params, pair


def test_loss_and_every_metric_equal_ours_on_the_same_samples():
    batch = _batch()
    model, params, pair = _ours_and_theirs(batch)
    out = jax.jit(model.apply)({"params": params}, *electra.model_inputs(batch, jax.random.key(3)))
    loss, ours = electra.electra_loss(out, batch)
    sampled = torch.tensor(np.asarray(out.sampled_ids), dtype=torch.int64)
    with torch.no_grad():
        got, theirs = reference.electra_loss(
            pair, reference.to_torch(batch, torch.device("cpu")), lambda _: sampled, 50.0
        )
    assert 0 < float(ours["replaced_fraction"]) < 1  # some samples replaced, some not
    assert 0 < float(ours["disc_recall"]) < 1 or float(ours["disc_precision"]) > 0
    assert sorted(theirs) == sorted(ours)
    for key, value in ours.items():
        assert float(theirs[key]) == pytest.approx(float(value), abs=1e-5), key
    assert float(got) == pytest.approx(float(loss), abs=50 * 1e-5)


def test_the_models_share_embeddings_and_the_generator_decodes_with_the_word_table():
    pair = reference.build_models(DISC, GEN)
    shared = pair.discriminator.electra.embeddings
    assert pair.generator.electra.embeddings is shared
    assert pair.generator.generator_lm_head.weight is shared.word_embeddings.weight
    names = [name for name, _ in pair.modules().named_parameters()]
    assert len(names) == len(set(id(p) for p in pair.modules().parameters()))
    assert not any(n.startswith("generator.electra.embeddings.") for n in names)
    assert "generator.electra.embeddings_project.weight" in names  # E = 32 -> its H = 16


def test_the_discriminator_loss_reaches_the_embeddings_but_not_the_generator():
    batch = reference.to_torch(_batch(), torch.device("cpu"))
    pair = reference.build_models(DISC, GEN)
    pair.modules().eval()
    loss, metrics = reference.electra_loss(pair, batch, reference.torch_sampler(0), 50.0)
    mlm_only, _ = reference.electra_loss(pair, batch, reference.torch_sampler(0), 0.0)
    weights = list(pair.generator.electra.encoder.parameters())
    full = torch.autograd.grad(loss, weights, retain_graph=True)
    alone = torch.autograd.grad(mlm_only, weights, retain_graph=True)
    for a, b in zip(full, alone, strict=True):
        torch.testing.assert_close(a, b)
    word_table = pair.discriminator.electra.embeddings.word_embeddings.weight
    (disc_grad,) = torch.autograd.grad(loss - mlm_only, [word_table])
    assert disc_grad.abs().sum() > 0 and metrics["disc_loss"] > 0


def test_the_sampler_follows_the_softmax():
    logits = torch.log(torch.tensor([[[0.7, 0.2, 0.1, 0.0]]])).expand(2000, 10, -1)
    drawn = reference.torch_sampler(0)(logits)
    assert drawn.shape == (2000, 10)
    share = torch.bincount(drawn.flatten(), minlength=4).float() / drawn.numel()
    # 20,000 draws: a share's standard error is at most 0.0033
    torch.testing.assert_close(share, torch.tensor([0.7, 0.2, 0.1, 0.0]), atol=0.015, rtol=0)
    torch.testing.assert_close(
        reference.torch_sampler(0)(logits), reference.torch_sampler(0)(logits)
    )


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> str:
    directory = str(tmp_path_factory.mktemp("electra_reference_records"))
    synthetic.write_records(directory, "train", num_files=2, per_file=16, seed=0)
    synthetic.write_records(directory, "eval", num_files=1, per_file=16, seed=1)
    return directory


def _config(records: str):
    config = synthetic.tiny_config(records)
    config.objective = "electra"
    config.update(num_train_steps=4, log_every=2, eval_every=2)
    return config


def test_a_tiny_run_logs_our_metrics_and_exports_an_encoder_we_import(records, tmp_path):
    out = tmp_path / "run"
    final = reference.run(_config(records), str(out))  # the import check raises on a mismatch
    with open(out / "metrics.jsonl", encoding="utf-8") as f:
        lines = [json.loads(line) for line in f]
    train = [r for r in lines if r["split"] == "train"]
    evals = [r for r in lines if r["split"] == "eval"]
    assert [r["step"] for r in train] == [2, 4] and [r["step"] for r in evals] == [0, 2, 4]
    assert {"mlm_accuracy", "disc_loss", "replaced_fraction", "grad_norm"} <= set(train[0])
    assert final["eval_disc_loss"] == pytest.approx(evals[-1]["disc_loss"])
    assert sorted(os.listdir(out)) == sorted(
        ["config.json", "metrics.jsonl", "model.safetensors", "tensorboard",
         "special_tokens_map.json", "tokenizer_config.json", "vocab.txt"]
    )  # fmt: skip
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertModel"]
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]  # no temporary left


def test_refuses_what_transformers_electra_cannot_mirror(records, tmp_path):
    config = _config(records)
    config.objective = "mlm"
    with pytest.raises(ValueError, match="--config.objective='mlm'"):
        reference.run(config, str(tmp_path / "a"))
    config = _config(records)
    config.model.position_encoding = "rotary"
    with pytest.raises(ValueError, match="position_encoding"):
        reference.run(config, str(tmp_path / "b"))
    config = _config(records)
    config.optimizer.schedule = "wsd"
    with pytest.raises(ValueError, match="--config.optimizer.schedule='wsd'"):
        reference.run(config, str(tmp_path / "c"))
    assert not os.listdir(tmp_path)
