"""Multiple choice (the BERT paper's SWAG shape): the head against transformers' PyTorch
`BertForMultipleChoice`, the choice encoding, the BIG-bench reader and the script end to end.

Runs on 8 fake CPU devices with the 2-layer H=32 BERT of tests/finetune_fixtures.py and a
fixture cut from BIG-bench's goal_step_wikihow/step_inference/task.json (its first 12
examples, in the file's layout).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import jax
import numpy as np
import pytest
from finetune_fixtures import TINY, minilm_vocab, pretrained_params, write_all

from bert_jax import convert
from bert_jax.heads import BertForMultipleChoice
from data_pipelines.tasks import multiple_choice
from data_pipelines.tasks.formats import TaskDataError
from data_pipelines.tasks.multiple_choice import (
    MultipleChoiceExample,
    encode_choices,
    read_bigbench_choices,
)
from data_pipelines.tokenization import load_tokenizer
from experiments import finetune_multiple_choice
from experiments.configs import finetune_minilm_multiple_choice

FIXTURE = str(
    Path(__file__).parent / "fixtures" / "tasks" / "bigbench" / "step_inference_task.json"
)


def test_scores_equal_transformers_bert_for_multiple_choice(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf_config = transformers.BertConfig(
        vocab_size=TINY.vocab_size, hidden_size=TINY.hidden_size,
        num_hidden_layers=TINY.num_hidden_layers, num_attention_heads=TINY.num_attention_heads,
        intermediate_size=TINY.intermediate_size,
        max_position_embeddings=TINY.max_position_embeddings,
    )  # fmt: skip
    torch.manual_seed(0)
    reference = transformers.BertForMultipleChoice(hf_config).eval()
    with torch.no_grad():  # a non-zero head, so the test sees it
        reference.classifier.bias.fill_(0.3)
    reference.save_pretrained(tmp_path / "hf")
    config, params, _ = convert.load_pretrained(tmp_path / "hf", model=BertForMultipleChoice(TINY))
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 1000, size=(3, 4, 12)).astype(np.int32)  # (B, K, T)
    mask = np.ones_like(ids)
    mask[0, 1, 7:] = 0  # padded choices
    mask[2, :, 9:] = 0
    types = np.zeros_like(ids)
    types[..., 6:] = 1
    ours = BertForMultipleChoice(config).apply({"params": params}, ids, mask, types)
    with torch.no_grad():
        theirs = reference(
            input_ids=torch.tensor(ids, dtype=torch.long),
            attention_mask=torch.tensor(mask, dtype=torch.long),
            token_type_ids=torch.tensor(types, dtype=torch.long),
        ).logits.numpy()
    assert ours.shape == theirs.shape == (3, 4)
    np.testing.assert_allclose(np.asarray(ours), theirs, atol=1e-5)
    # One choice alone scores what it scores among the others (choices never interact).
    alone = BertForMultipleChoice(config).apply(
        {"params": params}, ids[:1, 2:3], mask[:1, 2:3], types[:1, 2:3]
    )
    np.testing.assert_allclose(np.asarray(alone)[0, 0], np.asarray(ours)[0, 2], atol=1e-5)


def test_each_choice_is_context_sep_ending_sep_and_truncation_is_counted():
    tokenizer = load_tokenizer(minilm_vocab(), do_lower_case=True)
    example = MultipleChoiceExample("7", "The goal is", ("bake a cake", "sleep"), 1)
    features = encode_choices([example], tokenizer, 8)
    cls, sep = tokenizer.cls_id, tokenizer.sep_id
    context = tokenizer.encode_batch(["The goal is"])[0]
    for choice, ending in enumerate(example.endings):
        pieces = tokenizer.encode_batch([ending])[0]
        expected = [cls, *context, sep, *pieces, sep]
        if len(expected) > 8:  # 3 + 4 pieces > 5: the longer side, then B on the tie, loses
            assert (len(context), len(pieces)) == (3, 4)  # "ba ##ke a cake"
            expected = [cls, *context, sep, *pieces[:2], sep]
        n = len(expected)
        assert features.input_ids[0, choice, :n].tolist() == expected
        assert features.input_ids[0, choice, n:].tolist() == [0] * (8 - n)
        assert features.input_mask[0, choice].tolist() == [1] * n + [0] * (8 - n)
        first_b = expected.index(sep) + 1
        assert features.segment_ids[0, choice].tolist() == [0] * first_b + [1] * (n - first_b) + [
            0
        ] * (8 - n)
    assert features.labels.tolist() == [1]
    assert features.num_truncated == 1  # "bake a cake" + 3 context pieces + 3 > 8


def test_bigbench_reader_keeps_the_file_order_of_choices_and_names_bad_examples(tmp_path):
    examples = read_bigbench_choices(FIXTURE)
    with open(FIXTURE, encoding="utf-8") as f:
        raw = json.load(f)["examples"]
    assert len(examples) == len(raw) == 12
    for example, source in zip(examples, raw, strict=True):
        assert example.context == source["input"].strip()
        assert example.endings == tuple(source["target_scores"])
        assert source["target_scores"][example.endings[example.label]] == 1
    good = raw[0]
    cases = [
        ({**good, "target_scores": {"a": 1, "b": 1}}, "example 1: target_scores"),
        ({**good, "input": " "}, "example 1: no 'input' text"),
        ({**good, "target_scores": {"a": 1, "b": 0}}, "example 1: 2 choices where"),
    ]
    for bad, message in cases:
        path = tmp_path / "task.json"
        path.write_text(json.dumps({"examples": [good, bad]}))
        with pytest.raises(TaskDataError, match=f"task.json: {message}"):
            read_bigbench_choices(str(path))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return write_all(tmp_path_factory.mktemp("ckpt"), pretrained_params())


def test_finetune_end_to_end_on_the_step_inference_fixture(checkpoints, tmp_path, monkeypatch):
    monkeypatch.setattr(multiple_choice, "TEST_SIZE", 2)
    monkeypatch.setattr(multiple_choice, "DEV_SIZE", 2)
    config = finetune_minilm_multiple_choice.get_config()
    config.data_file = FIXTURE
    config.init_from = str(checkpoints["hf"])
    config.max_seq_length = 32
    config.train_batch_size = 8
    config.eval_batch_size = 8
    config.num_epochs = 2
    config.learning_rate = 1e-3
    config.log_every = 1
    results = finetune_multiple_choice.finetune(config, str(tmp_path), show_progress=False)
    assert results["num_examples"] == {"train": 8, "dev": 2, "test": 2}
    assert results["chance_accuracy"] == 0.25 and results["num_choices"] == 4
    assert results["num_train_steps"] == 2
    assert 0.0 <= results["test"]["accuracy"] <= 1.0
    with open(tmp_path / "predictions_test.tsv", encoding="utf-8") as f:
        rows = [line.rstrip("\n").split("\t") for line in f]
    assert rows[0] == ["guid", "label", "prediction", "chosen_ending", "probabilities"]
    task = multiple_choice.load_multiple_choice_task("goal_step_wikihow", FIXTURE)
    for row, example in zip(rows[1:], task.splits["test"], strict=True):
        probs = [float(p) for p in row[4].split()]
        assert row[3] == example.endings[int(row[2])] and abs(sum(probs) - 1) < 1e-4
        assert int(row[2]) == int(np.argmax(probs))
    logged = [json.loads(line) for line in open(tmp_path / "train_log.jsonl")]
    assert [r["step"] for r in logged] == [1, 2]
    assert os.path.exists(tmp_path / "checkpoint" / "finetuned.json")


def test_a_few_steps_reduce_the_loss():
    """The choice loss trains: 40 steps on one batch fit its 4-way labels."""
    import optax

    from bert_jax import sharding
    from bert_jax.train_state import make_step, sharded_state

    model = BertForMultipleChoice(TINY.replace(hidden_dropout_prob=0.0))
    rng = np.random.default_rng(1)
    batch = {
        "input_ids": rng.integers(5, 2000, size=(4, 4, 16)).astype(np.int32),
        "input_mask": np.ones((4, 4, 16), np.int32),
        "segment_ids": np.zeros((4, 4, 16), np.int32),
        "labels": np.array([0, 1, 2, 3], np.int32),
    }
    mesh = sharding.create_mesh((1, 1, 1), devices=jax.devices()[:1])
    tx = optax.adam(3e-3)
    sample = [np.zeros((1, 16), np.int32)] * 3
    state, _ = sharded_state(model, tx, mesh, sample, rng=jax.random.key(0))
    step = jax.jit(
        make_step(
            lambda p, b, r: finetune_multiple_choice.train_loss(p, b, r, model=model),
            tx,
            lambda s: 3e-3,
        )
    )
    losses = []
    for _ in range(40):
        state, metrics = step(state, batch, jax.random.key(1))
        losses.append(float(metrics["loss"]))
    assert losses[0] == pytest.approx(np.log(4), abs=0.1)  # a fresh head: near uniform
    assert losses[-1] < 0.25 * losses[0]
