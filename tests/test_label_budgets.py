"""experiments.label_budgets: the paired label subsets, the paired interval (against
scipy), the recipe's step arithmetic, and real runs of a tiny tagger on a tiny task."""

import dataclasses

import flax.linen as nn
import jax
import numpy as np
import pytest
from finetune_fixtures import TINY
from scipy import stats

from bert_jax.heads import BertForTokenClassification
from data_pipelines.tasks.conll import tag_list
from data_pipelines.tasks.formats import TaggingExample
from data_pipelines.tasks.tagging_tasks import TaggingTask
from data_pipelines.tokenization import load_tokenizer
from experiments import label_budgets as lb

# ------------------------------------------------------------------------ paired_subsets


def test_paired_subsets_are_seeded_sorted_distinct_and_of_the_budget():
    budgets = [1, 5, 20]
    subsets = lb.paired_subsets(50, budgets, 4, seed=3)
    again = lb.paired_subsets(50, budgets, 4, seed=3)
    assert sorted(subsets) == budgets
    for n in budgets:
        assert len(subsets[n]) == 4
        for a, b in zip(subsets[n], again[n], strict=True):
            np.testing.assert_array_equal(a, b)
        for subset in subsets[n]:
            assert len(subset) == n
            assert len(set(subset.tolist())) == n
            assert list(subset) == sorted(subset)
            assert 0 <= subset.min() and subset.max() < 50
    for n in (5, 20):  # subsets of one budget differ (1 of 50, four times, may repeat)
        assert len({tuple(s) for s in subsets[n]}) == 4, n
    other = lb.paired_subsets(50, budgets, 4, seed=4)
    for n in (5, 20):
        assert [tuple(s) for s in other[n]] != [tuple(s) for s in subsets[n]]
    # Drawn from the seed, budget and subset alone: a budget's subsets do not depend on
    # which other budgets are asked for.
    alone = lb.paired_subsets(50, [20], 4, seed=3)
    assert [tuple(s) for s in alone[20]] == [tuple(s) for s in subsets[20]]


def test_a_budget_of_every_sentence_is_every_index():
    subsets = lb.paired_subsets(7, [7], 3, seed=0)
    assert [s.tolist() for s in subsets[7]] == [list(range(7))] * 3


@pytest.mark.parametrize("budget", [0, 8, -1])
def test_a_budget_outside_the_training_set_is_refused(budget):
    with pytest.raises(ValueError, match=f"label budget {budget} "):
        lb.paired_subsets(7, [3, budget], 2, seed=0)


# --------------------------------------------------------------------- paired_difference


@pytest.mark.parametrize("n", [2, 5, 12])
def test_paired_difference_is_scipys_paired_t_interval(n):
    rng = np.random.default_rng(n)
    a = rng.normal(0.6, 0.1, n)
    b = a - rng.normal(0.05, 0.08, n)
    got = lb.paired_difference(a.tolist(), b.tolist())
    interval = stats.ttest_rel(a, b).confidence_interval(0.95)
    assert got["mean"] == pytest.approx(np.mean(a - b), abs=1e-12)
    assert got["low"] == pytest.approx(interval.low, abs=1e-10)
    assert got["high"] == pytest.approx(interval.high, abs=1e-10)


def test_paired_difference_needs_two_pairs():
    with pytest.raises(ValueError, match="at least 2 pairs"):
        lb.paired_difference([0.5], [0.4])
    with pytest.raises(ValueError, match="at least 2 pairs"):
        lb.paired_difference([], [])


# ------------------------------------------------------------------------------ Recipe


def test_recipe_steps_are_epochs_of_batches_within_the_bounds():
    recipe = lb.Recipe(batch_size=16, epochs=10, min_steps=200, max_steps=1000)
    assert recipe.steps(100) == 200  # 10 x 7 batches (the last one partial): raised to 200
    assert recipe.steps(400) == 250  # 10 epochs of 25 batches
    assert recipe.steps(1600) == 1000  # 10 epochs of 100 batches
    assert recipe.steps(40_000) == 1000  # cut to max_steps
    assert lb.Recipe(batch_size=8, epochs=3, min_steps=1, max_steps=100).steps(24) == 9
    assert lb.Recipe(batch_size=8, epochs=3, min_steps=1, max_steps=100).steps(3) == 3


def test_recipe_eval_steps_are_evenly_spaced_and_end_at_the_last_step():
    assert lb.Recipe(evaluations=5).eval_steps(200) == [40, 80, 120, 160, 200]
    assert lb.Recipe(evaluations=5).eval_steps(7) == [2, 3, 5, 6, 7]
    assert lb.Recipe(evaluations=4).eval_steps(10) == [3, 5, 8, 10]
    assert lb.Recipe(evaluations=5).eval_steps(3) == [1, 2, 3]  # fewer steps than scorings
    assert lb.Recipe(evaluations=1).eval_steps(13) == [13]
    for evaluations in (1, 2, 3, 5, 7):
        for steps in range(1, 40):
            got = lb.Recipe(evaluations=evaluations).eval_steps(steps)
            assert got[-1] == steps
            assert len(got) == min(evaluations, steps)
            assert all(0 < a < b for a, b in zip(got, got[1:], strict=False))


# -------------------------------------------------------------------------- entity_spans


def test_entity_spans_of_a_bio_sentence():
    tags = ("B-PER", "I-PER", "O", "B-LOC", "B-LOC", "I-LOC", "I-LOC", "O", "O", "B-ORG")
    example = TaggingExample("x", tuple("abcdefghij"), tags)
    assert lb.entity_spans(example) == [(0, 2), (3, 4), (4, 7), (9, 10)]
    assert lb.entity_spans(TaggingExample("y", ("a", "b"), ("O", "O"))) == []


# ------------------------------------------------------------------ TaggingRunner, run_arm

PEOPLE = ("tom", "ann", "bob", "eve")
PLACES = ("paris", "rome", "oslo", "lima")
FILLER = ("went", "to", "saw", "in", "the", "and", "today", "met", "a", "big", "city")
SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def _sentences(rng: np.random.Generator, count: int, guid: str) -> list[TaggingExample]:
    """3-9 words; people are PER, places LOC, "new york" one LOC of two words."""
    examples = []
    for i in range(count):
        words, tags = [], []
        while len(words) < rng.integers(3, 10):
            kind = rng.integers(5)
            if kind == 0:
                words.append(str(rng.choice(PEOPLE)))
                tags.append("B-PER")
            elif kind == 1:
                words.append(str(rng.choice(PLACES)))
                tags.append("B-LOC")
            elif kind == 2 and len(words) < 8:
                words += ["new", "york"]
                tags += ["B-LOC", "I-LOC"]
            else:
                words.append(str(rng.choice(FILLER)))
                tags.append("O")
        examples.append(TaggingExample(f"{guid}:{i}", tuple(words), tuple(tags)))
    return examples


@pytest.fixture(scope="module")
def tagging(tmp_path_factory):
    """(task, tokenizer, module, init params): a 2-layer H=32 tagger on a 26-token vocab."""
    vocab = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    vocab.write_text("\n".join(SPECIAL + PEOPLE + PLACES + FILLER + ("new", "york")) + "\n")
    tokenizer = load_tokenizer(str(vocab), do_lower_case=True)
    rng = np.random.default_rng(0)
    splits = {
        "train": _sentences(rng, 48, "train"),
        "dev": _sentences(rng, 16, "dev"),
        "test": _sentences(rng, 16, "test"),
    }
    task = TaggingTask("toy", tag_list(splits["train"]), splits)
    config = dataclasses.replace(TINY, vocab_size=32, max_position_embeddings=32)
    module = BertForTokenClassification(config, len(task.tags))
    ids = np.zeros((1, 16), np.int32)
    params = jax.jit(lambda r: nn.unbox(module.init(r, ids, ids, ids)["params"]))(jax.random.key(0))
    return task, tokenizer, module, jax.tree.map(np.asarray, params)


@pytest.fixture(scope="module")
def runner(tagging) -> lb.TaggingRunner:
    """Both tests' runner: one compiled step for every run of the module."""
    task, tokenizer, module, _ = tagging
    recipe = lb.Recipe(
        learning_rates=(1e-4, 1e-2), batch_size=8, epochs=4, min_steps=8, max_steps=100,
        evaluations=4,
    )  # fmt: skip
    # Every sentence is at most 11 pieces: each batch pads to 16, one shape.
    return lb.TaggingRunner(task, tokenizer, module, recipe, max_seq_length=16, eval_batch_size=16)


def _same(a: lb.RunResult, b: lb.RunResult) -> bool:
    return dataclasses.replace(a, wall_time_s=0) == dataclasses.replace(b, wall_time_s=0)


def test_a_run_stops_at_its_best_dev_step_repeats_exactly_and_compiles_once(tagging, runner):
    params = tagging[3]
    assert runner.num_train == 48
    subset = np.arange(0, 48, 2)  # 24 sentences: 3 batches an epoch, 12 steps
    first = runner.run(params, subset, learning_rate=1e-2, seed=1)
    assert first.steps == 12 and first.learning_rate == 1e-2
    assert sorted(first.dev_f1) == [3, 6, 9, 12]
    assert first.chosen_step in first.dev_f1
    assert first.dev_f1[first.chosen_step] == max(first.dev_f1.values())
    assert len(set(first.dev_f1.values())) > 1, first.dev_f1  # the choice is not moot
    assert first.dev_f1[first.chosen_step] > 0.5, first.dev_f1  # it learns the toy task
    assert set(first.test) >= {"precision", "recall", "f1"} and 0 <= first.test["f1"] <= 1

    again = runner.run(params, subset, learning_rate=1e-2, seed=1)
    assert _same(first, again)
    other_seed = runner.run(params, subset, learning_rate=1e-2, seed=2)
    assert other_seed.dev_f1 != first.dev_f1  # the seed reaches dropout and data order

    # Another peak rate and another length (16 sentences: 2 batches an epoch, 8 steps)
    # reuse the one compiled step: the rate is an argument, not a constant.
    longer = runner.run(params, np.arange(16), learning_rate=3e-3, seed=1)
    assert longer.steps == 8 and sorted(longer.dev_f1) == [2, 4, 6, 8]
    assert runner._step._cache_size() == 1


def test_run_arm_chooses_the_rate_by_subset_0s_best_dev_f1_and_reuses_stored_runs(tagging, runner):
    params = tagging[3]
    rates = runner.recipe.learning_rates
    subsets = lb.paired_subsets(runner.num_train, [24], 2, seed=5)[24]
    # The independent reference: each rate's subset-0 run, made directly.
    direct = {lr: runner.run(params, subsets[0], learning_rate=lr, seed=7) for lr in rates}
    best = {lr: max(r.dev_f1.values()) for lr, r in direct.items()}
    assert best[1e-4] != best[1e-2], best
    for run in direct.values():
        assert run.dev_f1[run.chosen_step] == best[run.learning_rate]
    expected = max(rates, key=best.get)

    store, made = {}, []

    def cache(name, make):
        if name not in store:
            made.append(name)
            store[name] = make()
        return store[name]

    chosen, runs = lb.run_arm(runner, params, subsets, seed=7, cache=cache)
    assert chosen == expected
    assert len(runs) == 2 and [r.learning_rate for r in runs] == [chosen, chosen]
    assert _same(runs[0], direct[chosen])  # subset 0 keeps its trial run
    assert len(made) == 3 == len(set(made))  # 2 trials, then subset 1 at the chosen rate
    # Subset k runs with seed + k.
    assert _same(runs[1], runner.run(params, subsets[1], learning_rate=chosen, seed=8))

    # A second call finds every run stored and runs nothing.
    chosen_again, runs_again = lb.run_arm(runner, params, subsets, seed=7, cache=cache)
    assert len(made) == 3
    assert chosen_again == chosen and all(a is b for a, b in zip(runs, runs_again, strict=True))


def test_fill_mask_padded_and_jitted_predicts_as_each_sentence_alone(tagging):
    """The demo's fill-mask examples: one jitted pass over padded sentences and padded
    masked positions gives each sentence's own logits (the module applied to the sentence
    at its length, its entity's positions alone): the same top tokens. On the demo's
    default (modern) positions and norms: rotary positions see the padding's offsets, if
    any leaked."""
    from bert_jax.heads import BertForPreTraining
    from data_pipelines.tasks.tagging_features import encode_tagged

    task, tokenizer, _, _ = tagging
    config = dataclasses.replace(
        TINY, vocab_size=32, max_position_embeddings=32, position_encoding="rotary",
        norm_placement="pre",
    )  # fmt: skip
    module = BertForPreTraining(config, next_sentence=False)
    ids = np.zeros((1, 16), np.int32)
    init = jax.jit(lambda r: nn.unbox(module.init(r, ids, ids, ids, ids[:, :2])["params"]))
    params = init(jax.random.key(1))
    # Entities of 1 and 2 words in sentences of several lengths: padded to 2 positions.
    examples = [(e, s) for e in task.splits["test"] for s in lb.entity_spans(e)][:6]
    assert {end - start for _, (start, end) in examples} == {1, 2}
    top_k = 4
    alone = jax.jit(lambda *arrays: module.apply({"params": params}, *arrays).mlm_logits)
    got = lb.fill_mask(module, params, tokenizer, examples, top_k=top_k, max_seq_length=16)
    for (example, (start, end)), row in zip(examples, got, strict=True):
        features = encode_tagged([example], tokenizer, 16, sorted(set(example.tags)))
        length = int(features.input_mask.sum())
        positions = features.word_positions[0][start:end]
        masked = features.input_ids[:, :length].copy()
        masked[0, positions] = tokenizer.mask_id
        logits = alone(
            masked, features.input_mask[:, :length], features.segment_ids[:, :length],
            positions[None],
        )[0]  # fmt: skip
        expected = np.argsort(-np.asarray(logits), axis=-1)[:, :top_k]
        assert row["predictions"] == [tokenizer.convert_ids_to_tokens(r) for r in expected]
        assert row["entity"] == "".join(example.words[start:end])
        assert row["text"].count("[MASK]") == end - start
