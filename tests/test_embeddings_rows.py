"""Each host makes only its own rows of a contrastive batch (issue 81): the rows processes
make, end to end, are the one-process batch bit for bit, for pairs made from raw text
(crops and sentence -> passage, k passages a document) and for a pairs file; and a batch's
widths are multiples of 128 under splash attention (16 otherwise), which the configs'
lengths must allow."""

from __future__ import annotations

import dataclasses
import os

os.environ.setdefault("USE_TF", "0")

import ml_collections
import numpy as np
import pytest
from finetune_fixtures import minilm_vocab

from bert_jax import config_bounds, embeddings_train
from bert_jax.config import BertConfig, ConfigError
from data_pipelines import crop_pairs
from data_pipelines.tokenization import load_tokenizer
from experiments import finetune_embeddings
from experiments.configs import (
    embeddings_contrastive_pretraining_tpu,
    embeddings_modernbert_base_tpu,
)

WORDS = ("river mill bridge grain autumn violin harbour orchestra desert well market dunes "
         "salt dates winter mountain pass castle hill guard").split()  # fmt: skip
BATCH = 16


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(minilm_vocab(), do_lower_case=True)


@pytest.fixture(scope="module")
def documents():
    """40 documents of 3-9 sentences of 3-14 words, drawn from a fixed seed."""
    rng = np.random.default_rng(0)
    return [[" ".join(rng.choice(WORDS, rng.integers(3, 15))) + "."
             for _ in range(rng.integers(3, 10))] for _ in range(40)]  # fmt: skip


def _split(make, processes: int) -> dict[str, np.ndarray]:
    """The batch as `processes` hosts make it, each its own rows, end to end."""
    share = BATCH // processes
    parts = [make(slice(p * share, (p + 1) * share)) for p in range(processes)]
    return {k: np.concatenate([part[k] for part in parts]) for k in parts[0]}


def _same(whole: dict[str, np.ndarray], split: dict[str, np.ndarray]) -> None:
    assert whole.keys() == split.keys()
    for key, value in whole.items():
        assert value.dtype == split[key].dtype, key
        np.testing.assert_array_equal(value, split[key], err_msg=key)


@pytest.mark.parametrize("rule", ["crop", "sentence"])
@pytest.mark.parametrize("k", [1, 2])
def test_processes_rows_end_to_end_are_the_whole_batch(tokenizer, documents, rule, k):
    passages = crop_pairs.make_passages(documents, tokenizer, 40)
    rules = crop_pairs.PairRules(token_deletion=0.1, passages_per_document=k,
                                 sentence_fraction=1.0 if rule == "sentence" else 0.0)  # fmt: skip

    def stream():  # each host has its own
        return crop_pairs.PairStream(passages, tokenizer, rules, BATCH, 24, 42, seed=5)

    whole = stream()
    for step in (0, 1, whole.per_epoch + 2):  # a later epoch's order too
        batch = whole.batch(step)
        for processes in (2, 4):
            hosts = [stream() for _ in range(processes)]
            _same(batch, _split(lambda rows, s=step, h=hosts: h[0].batch(s, rows), processes))
            share = BATCH // processes
            # Each host alone, from its own stream (nothing carried between hosts' calls).
            own = [h.batch(step, slice(p * share, (p + 1) * share)) for p, h in enumerate(hosts)]
            _same(batch, {key: np.concatenate([o[key] for o in own]) for key in batch})


def test_each_row_is_its_own_pair_and_fits_the_width(tokenizer, documents):
    """Row r is `make_pair` from (seed, step, r) on its passage, as before the rows were
    split: the width, from the longest its passages can give, never cuts one."""
    passages = crop_pairs.make_passages(documents, tokenizer, 40)
    rules = crop_pairs.PairRules(token_deletion=0.1, keep_sentence=0.0)
    stream = crop_pairs.PairStream(passages, tokenizer, rules, BATCH, 24, 42, seed=5)
    room = 24 - tokenizer.num_special_tokens(False), 42 - tokenizer.num_special_tokens(False)
    for step in range(4):
        batch, ids = stream.batch(step), stream.passage_ids(step)
        for kind, length in (("query", 24), ("positive", 42)):
            width = batch[f"{kind}_tokens"].shape[1]
            assert width % 16 == 0 or width == length
            assert width <= length
        for row, passage in enumerate(ids):
            rng = np.random.default_rng([5, step, row, 7])
            pair = crop_pairs.make_pair(rng, passages.sentences[passage], rules)[:2]
            for kind, pieces, cut in zip(("query", "positive"), pair, room, strict=True):
                want = tokenizer.with_special_tokens(pieces[:cut].tolist())[0]
                n = int(batch[f"{kind}_mask"][row].sum())
                assert batch[f"{kind}_tokens"][row, :n].tolist() == want


def test_a_pairs_files_rows_end_to_end_are_the_whole_batch(tokenizer, tmp_path):
    rng = np.random.default_rng(1)

    def text(low, high):
        return " ".join(rng.choice(WORDS, rng.integers(low, high)))

    path = tmp_path / "pairs.tsv"
    path.write_text("".join(f"{text(2, 6)}\t{text(4, 30)}\t{text(3, 20)}\n" for _ in range(40)),
                    encoding="utf-8")  # fmt: skip
    config = ml_collections.ConfigDict({"train_file": str(path), "global_batch_size": BATCH,
                                        "max_seq_length": 48, "query_max_seq_length": 16,
                                        "seed": 2})  # fmt: skip
    source = finetune_embeddings.PairsFile(config, tokenizer)
    for step in (0, 1, 3):
        batch = source.batch(step)
        assert batch["negative_tokens"].shape[:2] == (BATCH, 1)
        for processes in (2, 4):
            _same(batch, _split(lambda rows, s=step: source.batch(s, rows), processes))


@pytest.mark.parametrize("attention, multiple", [("einsum", 16), ("splash", 128)])
def test_widths_are_multiples_of_128_under_splash_and_16_otherwise(attention, multiple):
    config = ml_collections.ConfigDict({"max_seq_length": 512, "query_max_seq_length": 128})
    encoder = BertConfig(attention_implementation=attention)
    assert embeddings_train.width_multiple(config, encoder) == multiple
    for longest in (1, 15, 16, 17, 64, 100, 129, 300, 511, 512, 900):
        width = crop_pairs.padded_width(longest, 512, multiple)
        assert width % multiple == 0 and min(longest, 512) <= width <= 512
        assert width - longest < multiple or width == 512


def test_splash_widths_divide_into_the_tiles_shorter_than_the_texts():
    """A width above a splash tile must be a multiple of it: 384 tokens do not divide into
    the local layers' tiles of 256, so a 512-token run pads to 256 or 512."""
    modern = BertConfig.from_preset("modernbert_base", attention_implementation="splash")
    assert modern.local_attention_window and modern.splash_local_block == 256
    global_only = dataclasses.replace(modern, local_attention_window=0)  # tiles of 1,024
    for seq, multiple, without_local in ((256, 128, 128), (512, 256, 128), (2048, 1024, 1024)):
        config = ml_collections.ConfigDict({"max_seq_length": seq, "query_max_seq_length": 128})
        assert embeddings_train.width_multiple(config, modern) == multiple
        assert embeddings_train.width_multiple(config, global_only) == without_local


def test_splash_refuses_lengths_its_tiles_do_not_divide(tokenizer, documents):
    config = ml_collections.ConfigDict({"max_seq_length": 256, "query_max_seq_length": 64})
    with pytest.raises(ConfigError, match=r"^--config.query_max_seq_length=64 under "
                       r"attention_implementation='splash': a multiple of 128"):  # fmt: skip
        embeddings_train.width_multiple(config, BertConfig(attention_implementation="splash"))
    assert embeddings_train.width_multiple(config, BertConfig()) == 16  # einsum: any length
    # The contrastive TPU config's 64-token queries: refused under splash at load, in one line.
    pod = embeddings_contrastive_pretraining_tpu.get_config("pod")
    config_bounds.check(pod, "finetune", devices=64)  # einsum, as it ships
    pod.model_overrides.attention_implementation = "splash"
    with pytest.raises(ConfigError, match=r"query_max_seq_length=64 under .*'splash'"):
        config_bounds.check(pod, "finetune", devices=64)
    pod.query_max_seq_length = 128
    config_bounds.check(pod, "finetune", devices=64)
    # A stream under splash pads every batch to multiples of 128, at most its lengths.
    passages = crop_pairs.make_passages(documents, tokenizer, 126)
    stream = crop_pairs.PairStream(passages, tokenizer, crop_pairs.PairRules(), BATCH, 128,
                                   256, seed=0, multiple=128)  # fmt: skip
    for step in range(3):
        batch = stream.batch(step)
        assert batch["query_tokens"].shape[1] == 128
        assert batch["positive_tokens"].shape[1] in (128, 256)


@pytest.mark.parametrize("variant", ["recipe", "pod"])
def test_the_splash_tpu_configs_pass_the_rule(variant):
    config = embeddings_modernbert_base_tpu.get_config(variant)
    assert config.model_overrides.attention_implementation == "splash"
    config_bounds.check(config, "finetune")
    assert not list(config_bounds.splash_widths(config, "splash"))
