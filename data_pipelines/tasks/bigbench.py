r"""Real task data from the BIG-bench sdist (PyPI `bigbench==1.0.0`): SQuAD v1.1 dev,
SQuADShifts and VitaminC. Fine-tuning and evaluation only.

Every BIG-bench file carries a canary asking that it never enter a pretraining corpus;
nothing in `data_pipelines.corpora` or `prepare_corpus` reads this module.

The sdist (358 MB) is fetched once into the cache (`data_pipelines.registry`, pinned by
sha256; never `pip install`ed: it pulls TensorFlow and T5) and only the files used are
extracted, under `~/.cache/bert_jax/bigbench-1.0.0/`. Prefetch both with:

  python -m data_pipelines.tasks.bigbench [--cache_dir=~/.cache/bert_jax]

**SQuAD** (`squad_shifts/`, SQuAD JSON): `squaddev_v1.1.json` is the official SQuAD v1.1
dev set as BIG-bench ships it: 48 articles, 2,067 paragraphs, 10,565 questions. Its
`squaddev_v1.1_removed.json` lists, by question id, the answers BIG-bench removed: 27
answers of 23 questions still in the file, and 5 questions that are gone entirely (the
official file has 10,570). `squad_dev` writes the dev file with those 27 answers put back
(each at its text's first occurrence in the context; every one occurs), so the official
v1.1 scorer sees the official gold answers for all 10,565 questions; the 5 missing ones
cannot be scored and are named in the log. `new_wiki`, `nyt`, `reddit` and
`amazon_reviews` (`*_v1.0.json`, 7,936 / 10,056 / 9,767 / 9,877 questions) are
SQuADShifts (Miller et al. 2020): SQuAD-style questions on other text. `squad_train` joins
the ones asked for into one training file, each question with its first answer (the
files give several, as dev sets do). Some answers' offsets miss their text by a character
or more (15 in the dev file, 947 in amazon_reviews; all of them occur in their context):
`finetune_squad --config.realign_mismatched` moves each to its nearest occurrence and logs
it, or `skip_mismatched` drops and counts them; by default they are errors.

**VitaminC** (`vitaminc_fact_verification/task.json`, Schuster et al. 2021): 54,668
claim/evidence pairs in 3 classes, `True` (supports, 27,242), `False` (refutes, 20,169)
and `Neither` (not enough information, 7,257), each example's `input` reading
`"<page>: <evidence>\nClaim: <claim>"`. `vitaminc` splits that into text_a = evidence
(page title included), text_b = claim, the label from `target_scores`. The file has no
split; the one fixed here keeps every Wikipedia page on one side: a page goes to test when
the first byte of sha256(page title) is below 26 (~10%), to dev below 52 (~10%), else to
train, so no evidence sentence of a test page is seen in training.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os

from data_pipelines import registry
from data_pipelines.tasks.formats import SentenceExample, TaskDataError, read_text

log = logging.getLogger(__name__)

SDIST = registry.PackageFile(
    "bigbench", "bigbench-1.0.0.tar.gz",
    "1bb398a5512c6d798cdebe0dfa0ac03f67f6033fa6b39c6ef71df978c7cbc5c2",
    prefetch="python -m data_pipelines.tasks.bigbench",
)  # fmt: skip
TASKS_DIR = "bigbench-1.0.0/bigbench/benchmark_tasks"  # inside the sdist
CACHE_SUBDIR = "bigbench-1.0.0"

SQUAD_DEV = "squaddev_v1.1"
SQUAD_SHIFTS = ("new_wiki_v1.0", "nyt_v1.0", "reddit_v1.0", "amazon_reviews_v1.0")
VITAMINC = "vitaminc_fact_verification/task.json"
VITAMINC_LABELS = ("True", "False", "Neither")  # supports, refutes, not enough info
CLAIM = "\nClaim: "
TEST_BYTE, DEV_BYTE = 26, 52  # sha256(page)[0] < 26: test; < 52: dev; else train


def task_files(
    members: list[str], cache_dir: str = registry.DEFAULT_CACHE_DIR, *, allow_download=True
) -> list[str]:
    """Paths of `members` (relative to benchmark_tasks/), extracted from the sdist once."""
    root = os.path.join(os.path.expanduser(cache_dir), CACHE_SUBDIR)
    wanted = {f"{TASKS_DIR}/{m}": os.path.join(root, *m.split("/")) for m in members}
    if not all(os.path.exists(path) for path in wanted.values()):
        try:
            sdist = registry.fetch(SDIST, cache_dir, allow_download=allow_download)
        except registry.RegistryError as e:
            raise TaskDataError(str(e)) from e
        registry.extract(sdist, wanted)
    return list(wanted.values())


def _load_json(path: str) -> dict:
    try:
        return json.loads(read_text(path))
    except json.JSONDecodeError as e:
        raise TaskDataError(f"{path}:{e.lineno}:{e.colno}: not valid JSON ({e.msg})") from None


def _questions(data: dict, path: str):
    """(paragraph context, question dict) for every question of a SQuAD JSON object."""
    if not isinstance(data.get("data"), list):
        raise TaskDataError(f"{path}: expected an object with a 'data' list (SQuAD layout)")
    for article in data["data"]:
        for paragraph in article.get("paragraphs", []):
            for qa in paragraph.get("qas", []):
                yield paragraph.get("context", ""), qa


def restore_removed_answers(dev: dict, removed: dict, source: str) -> tuple[dict, list[str]]:
    """The dev object with `removed`'s answers put back; returns it and the absent ids."""
    removed = dict(removed.get("removed", {}))
    restored = 0
    for context, qa in _questions(dev, source):
        for text in removed.pop(qa.get("id"), []):
            start = context.find(text)
            if start < 0:
                raise TaskDataError(
                    f"{source}: question {qa.get('id')}: removed answer {text!r} is not in "
                    "its context"
                )
            qa["answers"].append({"text": text, "answer_start": start})
            restored += 1
    log.info("%s: restored %d removed answer(s)", source, restored)
    return dev, sorted(removed)


def squad_dev(cache_dir: str = registry.DEFAULT_CACHE_DIR, *, allow_download=True) -> str:
    """The SQuAD v1.1 dev file with BIG-bench's removed answers restored (written once)."""
    dev_path, removed_path = task_files(
        [f"squad_shifts/{SQUAD_DEV}.json", f"squad_shifts/{SQUAD_DEV}_removed.json"],
        cache_dir, allow_download=allow_download,
    )  # fmt: skip
    out = dev_path.replace(".json", "_restored.json")
    if not os.path.exists(out):
        dev, absent = restore_removed_answers(
            _load_json(dev_path), _load_json(removed_path), dev_path
        )
        if absent:
            log.warning(
                "%s: %d question(s) of the official dev set are absent from BIG-bench's copy "
                "and cannot be scored: %s", dev_path, len(absent), ", ".join(absent),
            )  # fmt: skip
        _write_json(out, dev)
    return out


def squad_train(
    shifts: tuple[str, ...] = SQUAD_SHIFTS,
    cache_dir: str = registry.DEFAULT_CACHE_DIR,
    *,
    allow_download=True,
) -> str:
    """One training file of the SQuADShifts sets `shifts`, first answer per question."""
    unknown = sorted(set(shifts) - set(SQUAD_SHIFTS))
    if unknown or not shifts:
        raise ValueError(f"shifts {unknown or '()'}: choose from {SQUAD_SHIFTS}")
    paths = task_files([f"squad_shifts/{s}.json" for s in shifts], cache_dir,
                       allow_download=allow_download)  # fmt: skip
    out = os.path.join(os.path.dirname(paths[0]), f"train_{'+'.join(shifts)}.json")
    if not os.path.exists(out):
        articles = []
        for shift, path in zip(shifts, paths, strict=True):
            data = _load_json(path)
            for context, qa in _questions(data, path):
                if not qa.get("answers"):
                    raise TaskDataError(f"{path}: question {qa.get('id')} has no answer")
                del context
                qa["answers"] = qa["answers"][:1]
            for article in data["data"]:
                article["title"] = f"{shift}/{article.get('title', '')}"
            articles += data["data"]
        _write_json(out, {"version": "1.1", "data": articles})
    return out


def _write_json(path: str, data) -> None:
    with open(path + ".part", "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False)
    os.replace(path + ".part", path)


@dataclasses.dataclass(frozen=True)
class VitaminCData:
    train: list[SentenceExample]
    dev: list[SentenceExample]
    test: list[SentenceExample]


def page_split(page: str) -> str:
    """'test', 'dev' or 'train' for a Wikipedia page title (see the module docstring)."""
    byte = hashlib.sha256(page.encode("utf-8")).digest()[0]
    return "test" if byte < TEST_BYTE else "dev" if byte < DEV_BYTE else "train"


def read_vitaminc(path: str) -> VitaminCData:
    """VitaminC's examples from BIG-bench's task.json, split by page."""
    task = _load_json(path)
    examples = task.get("examples")
    if not isinstance(examples, list) or not examples:
        raise TaskDataError(f"{path}: expected a non-empty 'examples' list (BIG-bench layout)")
    splits: dict[str, list[SentenceExample]] = {"train": [], "dev": [], "test": []}
    for i, example in enumerate(examples):
        where = f"{path}: example {i}"
        text = example.get("input")
        if not isinstance(text, str) or text.count(CLAIM) != 1:
            raise TaskDataError(f"{where}: 'input' is not '<page>: <evidence>{CLAIM!r}<claim>'")
        evidence, claim = text.split(CLAIM)
        page, sep, _ = evidence.partition(": ")
        scores = example.get("target_scores", {})
        label = [name for name, score in scores.items() if score == 1]
        if sorted(scores) != sorted(VITAMINC_LABELS) or len(label) != 1:
            raise TaskDataError(
                f"{where}: target_scores {scores} is not one 1 among {VITAMINC_LABELS}"
            )
        if not sep or not evidence.strip() or not claim.strip():
            raise TaskDataError(f"{where}: empty page, evidence or claim in {text!r}")
        splits[page_split(page)].append(SentenceExample(str(i), evidence, claim, label[0]))
    return VitaminCData(**splits)


def vitaminc(cache_dir: str = registry.DEFAULT_CACHE_DIR, *, path: str = "") -> VitaminCData:
    """VitaminC from `path` (a task.json), else from the cached sdist."""
    return read_vitaminc(path or task_files([VITAMINC], cache_dir)[0])


def main(argv) -> None:
    del argv
    from absl import flags

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    cache_dir = flags.FLAGS.cache_dir
    print("SQuAD v1.1 dev:", squad_dev(cache_dir))
    print("SQuADShifts training file:", squad_train(SQUAD_SHIFTS, cache_dir))
    data = vitaminc(cache_dir)
    print(f"VitaminC: {len(data.train)} train, {len(data.dev)} dev, {len(data.test)} test")


if __name__ == "__main__":
    from absl import flags

    from data_pipelines import cli

    flags.DEFINE_string("cache_dir", registry.DEFAULT_CACHE_DIR, "Where the sdist is kept.")
    cli.run(main)
