r"""Multiple choice in the BERT paper's SWAG shape: one sequence per choice, one score each.

Each choice of an example becomes the pair (context, ending) as the tokenizer's model takes
it: BERT's `[CLS] context [SEP] ending [SEP]` (token types 0 then 1), a tokenizer.json's
own post-processor's (RoBERTa's `<s> context </s></s> ending </s>`); a model scores every
sequence and the softmax runs over the example's choices. Truncation is the tokenizer's
pair rule (`Tokenizer.encode_for_model_batch`: BERT's, the longer side loses its last
piece until the pair fits; a tokenizer.json's, the `tokenizers` library's longest-first),
counted and logged.

The task, `goal_step_wikihow` (step inference; Zhang, Lyu and Callison-Burch 2020,
in the BIG-bench sdist, `data_pipelines.tasks.bigbench`): given a wikiHow goal ("The most
reasonable step of 'Solve an Algebraic Expression' is"), pick which of 4 steps belongs to
it ("Know the order of operations" against steps of other articles): 2,250 examples, the
correct choice spread evenly over the 4 places (580 / 565 / 562 / 543), chance 25%. It is
chosen for being SWAG's shape (a context and candidate continuations, 4 choices) with more
than 1,000 examples, short enough for CPU fine-tuning (58 characters of context, one short
line per ending). The file has no split; the one fixed here is a seeded permutation (numpy
`default_rng(SPLIT_SEED)`) of the examples in file order: test = the first 500, dev = the
next 250, train = the other 1,500.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Sequence

import numpy as np

from data_pipelines import registry
from data_pipelines.tasks import bigbench
from data_pipelines.tasks.formats import TaskDataError, read_text

log = logging.getLogger(__name__)

STEP_INFERENCE = "goal_step_wikihow/step_inference/task.json"
SPLIT_SEED = 2020
TEST_SIZE = 500
DEV_SIZE = 250


@dataclasses.dataclass(frozen=True)
class MultipleChoiceExample:
    guid: str
    context: str
    endings: tuple[str, ...]
    label: int | None  # the index of the correct ending


@dataclasses.dataclass
class MultipleChoiceTask:
    name: str
    num_choices: int
    splits: dict[str, list[MultipleChoiceExample]]  # "train", "dev", "test"


@dataclasses.dataclass
class ChoiceFeatures:
    input_ids: np.ndarray  # (N, K, T) int32, padded with the tokenizer's pad id
    input_mask: np.ndarray  # (N, K, T) int32
    segment_ids: np.ndarray  # (N, K, T) int32
    labels: np.ndarray  # (N,) int32 index of the correct choice
    num_truncated: int  # choice sequences that did not fit in T

    def __len__(self) -> int:
        return len(self.input_ids)


def read_bigbench_choices(path: str) -> list[MultipleChoiceExample]:
    """A BIG-bench multiple-choice task.json: `input` is the context, `target_scores`'
    keys the endings (in file order) with exactly one scored 1."""
    try:
        examples = json.loads(read_text(path)).get("examples")
    except json.JSONDecodeError as e:
        raise TaskDataError(f"{path}:{e.lineno}:{e.colno}: not valid JSON ({e.msg})") from None
    if not isinstance(examples, list) or not examples:
        raise TaskDataError(f"{path}: expected a non-empty 'examples' list (BIG-bench layout)")
    out = []
    for i, example in enumerate(examples):
        where = f"{path}: example {i}"
        context, scores = example.get("input"), example.get("target_scores")
        if not isinstance(context, str) or not context.strip():
            raise TaskDataError(f"{where}: no 'input' text")
        if not isinstance(scores, dict) or [v == 1 for v in scores.values()].count(True) != 1:
            raise TaskDataError(f"{where}: target_scores {scores} has not exactly one 1")
        endings = tuple(scores)
        if len(endings) != len(out[0].endings if out else endings):
            raise TaskDataError(
                f"{where}: {len(endings)} choices where the examples before have "
                f"{len(out[0].endings)}"
            )
        if not all(e.strip() for e in endings):
            raise TaskDataError(f"{where}: an empty ending")
        label = [v == 1 for v in scores.values()].index(True)
        out.append(MultipleChoiceExample(str(i), context.strip(), endings, label))
    return out


def load_multiple_choice_task(
    name: str, path: str | None = None, cache_dir: str = registry.DEFAULT_CACHE_DIR
) -> MultipleChoiceTask:
    """The task `name` ("goal_step_wikihow") from `path` (its task.json), else the cache."""
    if name != "goal_step_wikihow":
        raise ValueError(f"unknown multiple-choice task {name!r}: use 'goal_step_wikihow'")
    examples = read_bigbench_choices(path or bigbench.task_files([STEP_INFERENCE], cache_dir)[0])
    order = np.random.default_rng(SPLIT_SEED).permutation(len(examples))
    test, dev, train = np.split(order, [TEST_SIZE, TEST_SIZE + DEV_SIZE])
    splits = {s: [examples[i] for i in sorted(part)]
              for s, part in (("train", train), ("dev", dev), ("test", test))}  # fmt: skip
    return MultipleChoiceTask(name, len(examples[0].endings), splits)


def encode_choices(
    examples: Sequence[MultipleChoiceExample],
    tokenizer,
    max_seq_length: int,
    *,
    name: str = "examples",
) -> ChoiceFeatures:
    """The pair (context, ending) of every choice, as the tokenizer lays pairs out:
    (N, K, T) arrays."""
    if max_seq_length < 3:
        raise ValueError(f"max_seq_length must be at least 3, got {max_seq_length}")
    n, k = len(examples), len(examples[0].endings)
    for example in examples:
        if len(example.endings) != k:
            raise TaskDataError(f"{name}: example {example.guid} has not {k} choices")
    ids = np.full((n, k, max_seq_length), tokenizer.pad_id, np.int32)
    mask, segments = np.zeros_like(ids), np.zeros_like(ids)
    inputs = tokenizer.encode_for_model_batch(
        [e.context for e in examples for _ in e.endings],
        [ending for e in examples for ending in e.endings],
        max_seq_length,
    )
    truncated = 0
    for i, (tokens, type_ids, cut) in enumerate(inputs):
        row, choice = divmod(i, k)
        truncated += cut
        ids[row, choice, : len(tokens)] = tokens
        segments[row, choice, : len(tokens)] = type_ids
        mask[row, choice, : len(tokens)] = 1
    if truncated:
        log.warning("%s: %d of %d choice sequences are longer than max_seq_length=%d and were "
                    "truncated", name, truncated, n * k, max_seq_length)  # fmt: skip
    labels = np.asarray([e.label for e in examples], np.int32)
    return ChoiceFeatures(ids, mask, segments, labels, truncated)
