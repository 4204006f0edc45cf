"""Every token-tagging task by name, with its splits and tag set.

Names: `tweet_ner` (English tweets, `tasks.tweet_ner`), `peoples_daily_ner` (Chinese,
`tasks.peoples_daily_ner`), `msra_ner` (Chinese, the SIGHAN 2006 MSRA benchmark,
`tasks.msra_ner`), and `conll` for any CoNLL-format files (CoNLL-2003
`eng.train` / `eng.testa` / `eng.testb`, WNUT, ...) given by path.
"""

from __future__ import annotations

import dataclasses

from data_pipelines.tasks import msra_ner, peoples_daily_ner, tweet_ner
from data_pipelines.tasks.conll import read_conll, tag_list
from data_pipelines.tasks.formats import TaggingExample


@dataclasses.dataclass
class TaggingTask:
    name: str
    tags: tuple[str, ...]  # the training tags, "O" first
    splits: dict[str, list[TaggingExample]]  # "train", "dev", "test" (test may be absent)


def load_tagging_task(
    name: str, *, train_file: str = "", dev_file: str = "", test_file: str = "",
    tag_column: int = -1,
) -> TaggingTask:  # fmt: skip
    """Reads `name`; for "conll" the files are required (test_file may be "")."""
    if name == "tweet_ner":
        data = tweet_ner.load(train_file or None)
        splits = {"train": data.train, "dev": data.dev, "test": data.test}
    elif name == "peoples_daily_ner":
        data = peoples_daily_ner.load(train_file or None)
        splits = {"train": data.train, "dev": data.dev, "test": data.test}
    elif name == "msra_ner":
        data = msra_ner.load(train_file or None)
        splits = {"train": data.train, "dev": data.dev, "test": data.test}
    elif name == "conll":
        if not (train_file and dev_file):
            raise ValueError("task 'conll' needs train_file and dev_file (test_file optional)")
        files = {"train": train_file, "dev": dev_file, "test": test_file}
        splits = {s: read_conll(p, tag_column=tag_column) for s, p in files.items() if p}
    else:
        raise ValueError(
            f"unknown tagging task {name!r}: use 'tweet_ner', 'peoples_daily_ner', 'msra_ner' "
            "or 'conll'"
        )
    return TaggingTask(name, tag_list(splits["train"]), splits)
