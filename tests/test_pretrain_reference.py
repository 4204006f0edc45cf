"""benchmarks/pretrain_reference.py on the demo's recipe: dynamic masking, the "mlm"
objective and `adamw_bias_corrected`, each checked against ours (our input pipeline as
`bert_jax.train` drives it, `bert_jax.optim`), in-process and at tiny sizes. The full run
(export and import check) is exercised by hand: benchmarks/README.md."""

from __future__ import annotations

import os

import jax
import ml_collections
import numpy as np
import optax
import protobuf_records
import pytest
import synthetic_pretraining as synthetic
import torch
import transformers

from benchmarks import pretrain_reference as reference
from bert_jax import optim, pretraining_input
from data_pipelines import tfrecord_files
from data_pipelines.tokenization import load_tokenizer

T = synthetic.SEQ_LEN


def write_unmasked(directory: str, num_files: int, per_file: int) -> str:
    """Unmasked single-segment records of random tokens (the demo's kind), and their vocab
    beside them (`synthetic.vocab_of`); returns a glob."""
    rng = np.random.default_rng(0)
    synthetic.write_vocab(synthetic.vocab_of(directory))
    paths = [os.path.join(directory, f"train-{i:03d}.tfrecord") for i in range(num_files)]
    with tfrecord_files.TFRecordShardWriter(paths) as writer:
        for i in range(num_files * per_file):
            length = int(rng.integers(T // 2, T + 1))
            ids = rng.integers(1000, 3000, length)
            ids[0], ids[-1] = synthetic.CLS, synthetic.SEP
            example = {
                "input_ids": ids,
                "segment_ids": np.zeros(length, np.int64),
                "word_starts": np.ones(length, np.int64),
                "next_sentence_label": 0,
            }
            record = protobuf_records.serialize_unmasked(example, max_seq_length=T)
            writer.write(record, shard=i % num_files)
    return os.path.join(directory, "train-*.tfrecord")


def test_dynamic_masking_batches_are_ours(tmp_path):
    """With `data.dynamic_masking` the reference reads the batches, masks included, that
    our training loop reads (`pretraining_input.train_input`), in the same order."""
    config = synthetic.tiny_config(str(tmp_path))
    config.objective = "mlm"
    config.data.dynamic_masking = True
    config.data.train_files = write_unmasked(str(tmp_path), num_files=2, per_file=12)
    tokenizer = load_tokenizer(config.data.vocab_file, do_lower_case=config.data.do_lower_case)
    mask_config = pretraining_input.masking_config(config, tokenizer)
    ours = pretraining_input.train_input(config, None, mask_config)
    theirs = reference.batches(config, config.data.train_files, config.seed, mask_config)
    for _ in range(3):  # 24 records, batch 8: one epoch
        want, got = next(ours), next(theirs)
        assert sorted(got) == sorted(want)
        assert got["masked_lm_weights"].sum() > 0  # masked here, not read as masked records
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def _optimizer_config(name: str) -> ml_collections.ConfigDict:
    """bert_tiny_cpu.py's optimizer block, with a large rate and decay so that both show."""
    from experiments.configs import bert_tiny_cpu

    config = bert_tiny_cpu.get_config().optimizer
    config.update(name=name, learning_rate=0.1, warmup_steps=2, weight_decay=0.1)
    config.max_grad_norm = 0.0  # clipping is the same code path for either name
    return config


def test_adamw_bias_corrected_updates_as_ours():
    """`optimizer.name="adamw_bias_corrected"`: torch's AdamW with the reference's decay mask
    and schedule moves the weights as `bert_jax.optim`'s, LayerNorm and biases undecayed."""
    config = _optimizer_config("adamw_bias_corrected")
    rng = np.random.default_rng(0)
    shapes = {"dense.weight": (3, 4), "dense.bias": (3,), "LayerNorm.weight": (3,)}
    start = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
    grads = [{k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()} for _ in "abcd"]

    module = torch.nn.Module()
    module.dense, module.LayerNorm = torch.nn.Linear(4, 3), torch.nn.LayerNorm(3)
    module.load_state_dict({**{k: torch.tensor(v) for k, v in start.items()},
                            "LayerNorm.bias": torch.zeros(3)})  # fmt: skip
    optimizer, scheduler = reference.make_optimizer(module, config, num_updates=6)
    # Ours names the same tensors as flax does: kernel, bias, LayerNorm scale.
    flax_names = {"dense.weight": ("dense", "kernel"), "dense.bias": ("dense", "bias"),
                  "LayerNorm.weight": ("LayerNorm", "scale")}  # fmt: skip
    params = {"dense": {}, "LayerNorm": {}}
    for name, (outer, inner) in flax_names.items():
        params[outer][inner] = jax.numpy.asarray(start[name])
    ours = optim.make_optimizer(config, num_train_steps=6)
    state = ours.init(params)
    for grad in grads:
        for name, param in module.named_parameters():
            param.grad = torch.tensor(grad.get(name, np.zeros(param.shape, np.float32)))
        optimizer.step()
        scheduler.step()
        tree = {"dense": {}, "LayerNorm": {}}
        for name, (outer, inner) in flax_names.items():
            tree[outer][inner] = jax.numpy.asarray(grad[name])
        updates, state = ours.update(tree, state, params)
        params = optax.apply_updates(params, updates)
    for name, (outer, inner) in flax_names.items():
        got, want = dict(module.named_parameters())[name].detach().numpy(), params[outer][inner]
        # f32 rounding of two operation orders (torch decays before the Adam step); a missed
        # decay or bias correction is off by 1e-3 or more here.
        np.testing.assert_allclose(got, np.asarray(want), rtol=1e-5, atol=1e-6, err_msg=name)
    with pytest.raises(ValueError, match="--config.optimizer.name='lamb'"):
        reference.make_optimizer(module, _optimizer_config("lamb"), num_updates=6)


def test_mlm_objective_drops_next_sentence(tmp_path):
    """`objective="mlm"`: the loss is the MLM term alone (ours has no NSP head then);
    "ltr" and "electra" are refused naming --config.objective."""
    hf = transformers.BertConfig(
        vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=T,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.BertForPreTraining(hf).eval()
    batch = synthetic.random_batch(4, seed=0)
    batch["input_ids"] %= 64
    batch["masked_lm_ids"] %= 64
    inputs = reference.to_torch(batch, torch.device("cpu"))
    both, with_nsp = reference.pretraining_loss(model, inputs)
    alone, mlm_only = reference.pretraining_loss(model, inputs, next_sentence=False)
    assert sorted(mlm_only) == ["loss", "mlm_accuracy", "mlm_loss"]
    assert alone.item() == with_nsp["mlm_loss"].item()
    assert both.item() == pytest.approx(alone.item() + with_nsp["nsp_loss"].item())
    config = synthetic.tiny_config(str(tmp_path))
    for name in ("ltr", "electra"):
        config.objective = name
        with pytest.raises(ValueError, match=f"--config.objective='{name}'"):
            reference.run(config, str(tmp_path / name))
