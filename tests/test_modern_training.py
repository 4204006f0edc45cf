"""A ModernBERT in the pretraining loop and in fine-tuning (issue 42 item 3).

`modernbert_tiny_cpu.py` shrunk to test size (H 64, 8 heads, 2 layers: layer 0 global,
layer 1 local with a window of 8 < T = 32; rotary, GeGLU, pre-LN, no biases, no token
types) trains in this process on unmasked synthetic single-segment records, packed and
masked in tf.data at 30%, on a (fsdp 2, tensor 4) mesh of the 8 fake devices. The
same batches on one device give the same losses and weights; the held-out stream is masked
at 15%; a fine-tuning script starts from the workdir.
"""

import json
import os

import jax
import numpy as np
import protobuf_records
import pytest
import synthetic_pretraining as synth

from bert_jax import checkpointing, pretraining_input, sharding, train, train_loop
from bert_jax.train_state import run_keys, sharded_state
from data_pipelines import masking_rules, tfrecord_files
from data_pipelines.tokenization import load_tokenizer
from experiments.configs import modernbert_tiny_cpu

STEPS, WINDOW, P = 6, 8, 10  # P: >= 30% of T = 32
# The whole MiniLM vocab (rounded up to a multiple of 8), not the synthetic records' small
# one: the "trains" check below needs the drop from a uniform guess over 30,528 ids to the
# 2,000 the records use.
VOCAB = 30528


def _single_segments(directory, prefix: str, count: int, seed: int) -> str:
    """Unmasked `[CLS] text [SEP]` records of 6 to 16 tokens (2 to 5 per packed row)."""
    rng = np.random.default_rng(seed)
    path = os.path.join(directory, f"{prefix}-00000.tfrecord")
    with tfrecord_files.TFRecordShardWriter([path]) as writer:
        for _ in range(count):
            ids = rng.integers(1000, 3000, int(rng.integers(6, 17)))
            ids[0], ids[-1] = synth.CLS, synth.SEP
            example = {"input_ids": ids, "segment_ids": np.zeros_like(ids),
                       "word_starts": np.ones_like(ids), "next_sentence_label": 0}  # fmt: skip
            writer.write(protobuf_records.serialize_unmasked(example, max_seq_length=synth.SEQ_LEN))
    return os.path.join(directory, f"{prefix}-*.tfrecord")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("single")
    _single_segments(str(directory), "train", 256, seed=0)
    _single_segments(str(directory), "eval", 64, seed=1)
    return directory


def _config(data_dir):
    config = modernbert_tiny_cpu.get_config()
    config.data.update(
        train_files=f"{data_dir}/train-*.tfrecord", eval_files=f"{data_dir}/eval-*.tfrecord",
        vocab_file=synth.minilm_vocab(), max_seq_length=synth.SEQ_LEN,
        max_predictions_per_seq=P, shuffle_buffer=64,
    )  # fmt: skip
    # Every sharded dimension divides by 8 (heads 8, mlp 256, vocab 30528, embed 64).
    config.model.update(
        vocab_size=VOCAB, hidden_size=64, num_attention_heads=8,
        intermediate_size=256, num_hidden_layers=2,
    )  # fmt: skip
    config.model.local_attention_window = WINDOW  # layer 1 local (every 2nd layer global)
    config.optimizer.update(warmup_steps=2, learning_rate=1e-2)
    config.update(global_batch_size=8, num_train_steps=STEPS, log_every=1, eval_every=0)
    # fsdp 2 x tensor 4 (a (2, 2, 2) mesh diverges from one device on these batches, BERT
    # too: see the issue-42 notes).
    config.update(checkpoint_every=1000, mesh_shape=(1, 2, 4))  # only the last step saves
    return config


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, data_dir):
    """The workdir of a STEPS-step run on the (1, 2, 4) mesh."""
    workdir = tmp_path_factory.mktemp("modern")
    train_loop.train_and_evaluate(_config(data_dir), str(workdir))
    return workdir


def _losses(workdir) -> list[float]:
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    return [r["loss"] for r in map(json.loads, lines) if "loss" in r]


def test_the_config_is_a_modern_encoder_on_packed_rows_masked_at_30_percent(data_dir):
    config = _config(data_dir)
    cfg = train.model_config(config, VOCAB)
    assert cfg.non_bert_fields() and cfg.position_encoding == "rotary"
    assert (cfg.feed_forward, cfg.norm_placement, cfg.linear_bias) == ("glu", "pre", False)
    assert 0 < cfg.local_attention_window < config.data.max_seq_length
    assert config.objective == "mlm" and config.data.pack and config.data.dynamic_masking
    assert (config.data.masked_lm_prob, config.data.eval_masked_lm_prob) == (0.30, 0.15)


def test_held_out_rows_are_masked_at_15_percent_training_rows_at_30(data_dir):
    """Each packed instance of n tokens gets round(n x rate) predictions (at least 1, at
    most P): the training rate in the training stream, 15% in the held-out one."""
    config = _config(data_dir)
    tokenizer = load_tokenizer(config.data.vocab_file, do_lower_case=True)
    train_data = pretraining_input.train_input(
        config, None, pretraining_input.masking_config(config, tokenizer)
    )
    for stream, rate in (
        (train_data, 0.30),
        (pretraining_input.eval_input(config, tokenizer), 0.15),
    ):
        batch = next(stream)
        ids = batch["instance_ids"]  # (B, T): slot + 1, 0 on padding
        expected = [
            sum(int(masking_rules.num_to_predict([(row == k).sum()], rate, P)[0])
                for k in range(1, row.max() + 1))
            for row in ids
        ]  # fmt: skip
        assert (ids.max(1) > 1).any()  # rows hold several instances
        np.testing.assert_array_equal(batch["masked_lm_weights"].sum(1), expected)


def test_a_packed_windowed_run_on_a_mesh_trains_and_equals_one_device(workdir, data_dir):
    losses = _losses(workdir)
    assert len(losses) == STEPS and losses[-1] < losses[0] - 0.3, losses
    # The same batches (the pipeline's, from its start) through the same step on one device.
    config = _config(data_dir)
    tokenizer = load_tokenizer(config.data.vocab_file, do_lower_case=True)
    mesh = sharding.create_mesh((1, 1, 1), jax.devices()[:1])
    run = train.setup(config, mesh, tokenizer.vocab_size)
    init_rng, dropout_rng = run_keys(config.seed, config.prng_impl)
    state, _ = sharded_state(run.model, run.tx, mesh, run.inputs, rng=init_rng)
    stream = pretraining_input.train_input(
        config, None, pretraining_input.masking_config(config, tokenizer)
    )
    single = []
    with sharding.activation_context(mesh, run.rules):
        for _ in range(STEPS):
            batch = sharding.global_batch(next(stream), mesh, run.rules)
            state, metrics = run.train_step(state, batch, dropout_rng)
            single.append(float(metrics["loss"]))
    np.testing.assert_allclose(losses, single, rtol=2e-5)
    manager = checkpointing.make_manager(workdir / "checkpoints", async_save=False)
    try:
        saved, _, _ = checkpointing.restore(manager, None, None)
    finally:
        manager.close()
    layer = ("bert", "encoder", "layer_1", "intermediate", "kernel")  # (H, 2, F): GeGLU's
    ours, theirs = saved["params"], state.params
    for key in layer:
        ours, theirs = ours[key], theirs[key]
    assert np.shape(ours) == (64, 2, 256)
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=1e-4, atol=1e-6)


def test_a_workdir_fine_tunes_a_classifier(workdir, tmp_path):
    """finetune_classification reads the ModernBERT workdir: its encoder as trained, the
    pooler (an mlm-only model has none) fresh."""
    from experiments import finetune_classification as ftc
    from experiments.configs import finetune_glue

    glue = os.path.join(os.path.dirname(__file__), "fixtures", "tasks", "glue", "SST-2")
    config = finetune_glue.get_config("sst2")
    config.unlock()
    config.update(
        data_dir=glue, init_from=str(workdir), max_seq_length=32, train_batch_size=8,
        eval_batch_size=8, num_epochs=1, log_every=1,
    )  # fmt: skip
    ftc.finetune(config, str(tmp_path))
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert saved["init_step"] == STEPS
    assert 0.0 <= saved["epochs"][-1]["dev"]["accuracy"] <= 1.0
