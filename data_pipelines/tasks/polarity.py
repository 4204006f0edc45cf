r"""English sentence polarity: 10,605 Rotten-Tomatoes sentences rated by people (VADER).

Hutto & Gilbert (ICWSM 2014) had at least 20 people rate each sentence of Pang & Lee's
movie-review snippets from -4 to +4; `movieReviewSnippets_GroundTruth.txt` holds
`id <TAB> mean rating <TAB> sentence`, one per CRLF line. It ships only in the *sdist* of
PyPI `vaderSentiment` (`additional_resources/hutto_ICWSM_2014.tar.gz`), not in its wheel.

The task (SST-2-like binary classification), fixed and documented here:
  * label "1" if the mean rating is > 0, "0" if < 0; the 37 sentences whose mean is
    exactly 0 have no polarity and are left out (counted in `PolarityData.num_neutral`);
  * a seeded permutation (numpy `default_rng(SPLIT_SEED)`) of the remaining 10,568
    sentences in file order gives test = the first 1,000, dev = the next 1,000,
    train = the other 8,568. Two sentences occur twice with different ids (and the same
    polarity); they are kept, as the source has them.

Where the file comes from (first that applies): an explicit path (the sdist, the inner
`hutto_ICWSM_2014.tar.gz`, or the extracted text file); the sdist cached in
`~/.cache/bert_jax/`; else the sdist of vadersentiment==3.3.2 fetched from the package
registry into that cache and checked against its pinned sha256 (`data_pipelines.registry`).
Prefetch it with:

  python -m data_pipelines.tasks.polarity [--cache_dir=~/.cache/bert_jax]
"""

from __future__ import annotations

import dataclasses
import io
import logging
import tarfile

import numpy as np

from data_pipelines import registry
from data_pipelines.tasks.formats import SentenceExample, TaskDataError

log = logging.getLogger(__name__)

VADER_VERSION = "3.3.2"
SDIST_NAME = f"vaderSentiment-{VADER_VERSION}.tar.gz"
SDIST = registry.PackageFile(
    "vadersentiment", SDIST_NAME,
    "5d7c06e027fc8b99238edb0d53d970cf97066ef97654009890b83703849632f9",
    prefetch="python -m data_pipelines.tasks.polarity",
)  # fmt: skip
INNER_TARBALL = "additional_resources/hutto_ICWSM_2014.tar.gz"
GROUND_TRUTH = "hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt"
DEFAULT_CACHE_DIR = registry.DEFAULT_CACHE_DIR

LABELS = ("0", "1")  # negative, positive
SPLIT_SEED = 20140601
TEST_SIZE = 1000
DEV_SIZE = 1000


@dataclasses.dataclass(frozen=True)
class RatedSentence:
    id: int
    mean_rating: float  # -4 (most negative) .. +4 (most positive)
    text: str


@dataclasses.dataclass(frozen=True)
class PolarityData:
    train: list[SentenceExample]
    dev: list[SentenceExample]
    test: list[SentenceExample]
    num_rated: int  # sentences in the file
    num_neutral: int  # mean rating exactly 0: no label, left out


def fetch_sdist(cache_dir: str = DEFAULT_CACHE_DIR, *, allow_download: bool = True) -> str:
    """The path of the vaderSentiment sdist in `cache_dir`, downloading it if asked."""
    try:
        return registry.fetch(SDIST, cache_dir, allow_download=allow_download)
    except registry.RegistryError as e:
        raise TaskDataError(str(e)) from e


def _ground_truth_bytes(path: str) -> tuple[bytes, str]:
    """(file contents, display name) from the sdist, the inner tarball or the text file."""
    if not tarfile.is_tarfile(path):
        with open(path, "rb") as f:
            return f.read(), path
    with tarfile.open(path) as outer:
        names = outer.getnames()
        inner_name = next((n for n in names if n.endswith(INNER_TARBALL)), None)
        if inner_name is not None:
            inner_bytes = outer.extractfile(inner_name).read()
            with tarfile.open(fileobj=io.BytesIO(inner_bytes)) as inner:
                return inner.extractfile(GROUND_TRUTH).read(), f"{path}!{inner_name}!{GROUND_TRUTH}"
        if GROUND_TRUTH in names:
            return outer.extractfile(GROUND_TRUTH).read(), f"{path}!{GROUND_TRUTH}"
    raise TaskDataError(f"{path}: holds neither {INNER_TARBALL} nor {GROUND_TRUTH}")


def read_ground_truth(path: str) -> list[RatedSentence]:
    """Parses `movieReviewSnippets_GroundTruth.txt` (or an archive that holds it)."""
    raw, name = _ground_truth_bytes(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise TaskDataError(f"{name}:{line}: not UTF-8 ({e.reason})") from None
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) != 3:
            raise TaskDataError(
                f"{name}:{number}: expected 'id<TAB>mean rating<TAB>sentence', got "
                f"{len(parts)} field(s): {line[:80]!r}"
            )
        try:
            rows.append(RatedSentence(int(parts[0]), float(parts[1]), parts[2].strip()))
        except ValueError:
            raise TaskDataError(
                f"{name}:{number}: id {parts[0]!r} or rating {parts[1]!r} is not a number"
            ) from None
    if not rows:
        raise TaskDataError(f"{name}: no rated sentences")
    return rows


def load(
    path: str | None = None,
    *,
    cache_dir: str = DEFAULT_CACHE_DIR,
    allow_download: bool = True,
) -> PolarityData:
    """The fixed train/dev/test split of the task (see the module docstring)."""
    path = path or fetch_sdist(cache_dir, allow_download=allow_download)
    rated = read_ground_truth(path)
    labeled = [r for r in rated if r.mean_rating != 0]
    if len(labeled) <= TEST_SIZE + DEV_SIZE:
        raise TaskDataError(f"{path}: only {len(labeled)} polar sentences, too few to split")
    order = np.random.default_rng(SPLIT_SEED).permutation(len(labeled))
    examples = [
        SentenceExample(f"rt-{r.id}", r.text, None, "1" if r.mean_rating > 0 else "0")
        for r in (labeled[i] for i in order)
    ]
    data = PolarityData(
        train=examples[TEST_SIZE + DEV_SIZE :],
        dev=examples[TEST_SIZE : TEST_SIZE + DEV_SIZE],
        test=examples[:TEST_SIZE],
        num_rated=len(rated),
        num_neutral=len(rated) - len(labeled),
    )
    log.info(
        "sentence polarity: %d rated, %d neutral left out; train %d, dev %d, test %d",
        data.num_rated, data.num_neutral, len(data.train), len(data.dev), len(data.test),
    )  # fmt: skip
    return data


def main(argv) -> None:
    from absl import flags

    del argv
    data = load(cache_dir=flags.FLAGS.cache_dir)
    for split in ("train", "dev", "test"):
        examples = getattr(data, split)
        positive = sum(e.label == "1" for e in examples)
        print(f"{split:5s} {len(examples):5d} sentences, {positive / len(examples):.1%} positive")
    print(f"{data.num_rated} rated, {data.num_neutral} with mean rating 0 left out")


if __name__ == "__main__":
    from absl import flags

    from data_pipelines import cli

    flags.DEFINE_string("cache_dir", DEFAULT_CACHE_DIR, "Where the vaderSentiment sdist is kept.")
    cli.run(main)
