r"""Embedded corpus: Jane Austen's six novels, from the Debian package `r-cran-janeaustenr`.

The R package `janeaustenr` keeps each novel as a character vector of text lines (Project
Gutenberg's, wrapped at ~70 columns, blank lines between paragraphs) in R's lazy-load
database `data/Rdata.rdb` with its index `data/Rdata.rdx`. The index is a gzipped RDS
file naming each object's byte offset and length in the `.rdb`; each object there is a
4-byte big-endian length followed by a zlib stream of R's serialisation. PyPI `rdata`
parses both (no R needed).

Where the files come from (first that applies): an explicit `data_dir`; an R library
where the package is installed (`apt-get install r-cran-janeaustenr`); the copy extracted
in `~/.cache/bert_jax/janeaustenr/`; else `apt-get download r-cran-janeaustenr` (the
Debian archive, 1.6 MB; run `apt-get update` first on a fresh machine) is unpacked there
with `dpkg-deb -x`. Prefetch it with:

  python -m data_pipelines.austen [--cache_dir=~/.cache/bert_jax]

Documents are chapters (272 in all): the title pages, chapter and volume headings and the
closing "THE END" / "FINIS" (and the editorial note after it) are dropped, the wrapped
lines of a paragraph are joined, and Gutenberg's `_italics_` markers removed.
"""

from __future__ import annotations

import glob as globlib
import logging
import os
import re
import shutil
import struct
import subprocess
import tempfile
import warnings
import zlib
from collections.abc import Iterable, Iterator, Sequence

from data_pipelines.corpora import Document, make_sentence_splitter, split_document

log = logging.getLogger(__name__)

DEBIAN_PACKAGE = "r-cran-janeaustenr"
DEFAULT_CACHE_DIR = os.path.join("~", ".cache", "bert_jax")
# R libraries where Debian installs the package (its data directory below each).
R_LIBRARIES = ("/usr/lib/R/site-library", "/usr/local/lib/R/site-library")
DATA_SUBDIR = os.path.join("janeaustenr", "data")
DATABASE = "Rdata"  # data/Rdata.rdb + data/Rdata.rdx

# In publication order; these are the object names in the database.
NOVELS = (
    "sensesensibility",
    "prideprejudice",
    "mansfieldpark",
    "emma",
    "northangerabbey",
    "persuasion",
)

_CHAPTER = re.compile(r"^(CHAPTER|Chapter)\s+([IVXLC]+|\d+)\.?$")
_VOLUME = re.compile(r"^(VOLUME|Volume)\s+([IVXLC]+|\d+)\.?$")
_THE_END = re.compile(r"^(THE END|FINIS|Finis)\.?$")
_ITALICS = re.compile(r"_([^_]*)_")


class AustenDataError(RuntimeError):
    """The novels cannot be found, fetched or parsed."""


def find_data_dir(cache_dir: str = DEFAULT_CACHE_DIR, *, allow_download: bool = True) -> str:
    """The `janeaustenr/data` directory, fetching the Debian package into the cache if asked."""
    cache_dir = os.path.expanduser(cache_dir)
    for root in (*R_LIBRARIES, cache_dir):
        candidate = os.path.join(root, DATA_SUBDIR)
        if os.path.isfile(os.path.join(candidate, DATABASE + ".rdx")):
            return candidate
    target = os.path.join(cache_dir, DATA_SUBDIR)
    if not allow_download:
        raise AustenDataError(
            f"the Jane Austen novels are not in {target} nor in an R library; fetch them with "
            f"`python -m data_pipelines.austen` (apt-get download {DEBIAN_PACKAGE})"
        )
    if not (shutil.which("apt-get") and shutil.which("dpkg-deb")):
        raise AustenDataError(
            f"apt-get and dpkg-deb are needed to fetch the Debian package {DEBIAN_PACKAGE}"
        )
    os.makedirs(cache_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir) as scratch:
        _run(["apt-get", "download", DEBIAN_PACKAGE], cwd=scratch, hint=(
            "the package lists may be missing: run `apt-get update` (as root) first"
        ))  # fmt: skip
        debs = globlib.glob(os.path.join(scratch, f"{DEBIAN_PACKAGE}_*.deb"))
        if len(debs) != 1:
            raise AustenDataError(f"apt-get download left {debs or 'no .deb'} in {scratch}")
        unpacked = os.path.join(scratch, "root")
        _run(["dpkg-deb", "-x", debs[0], unpacked], cwd=scratch)
        found = [os.path.join(unpacked, lib.lstrip("/"), DATA_SUBDIR) for lib in R_LIBRARIES]
        found = [f for f in found if os.path.isdir(f)]
        if not found:
            raise AustenDataError(f"{debs[0]} has no {DATA_SUBDIR} directory")
        # Renamed into place whole, so an interrupted fetch leaves nothing that looks complete.
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.replace(found[0], target)
    log.info("Unpacked %s into %s", DEBIAN_PACKAGE, target)
    return target


def _run(command: list[str], *, cwd: str, hint: str = "") -> None:
    log.info("%s", " ".join(command))
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if result.returncode:
        raise AustenDataError(
            f"{' '.join(command)} failed (exit {result.returncode}): "
            f"{result.stderr.strip()[-1000:]}" + (f"\n{hint}" if hint else "")
        )


def read_lazyload_database(directory: str, name: str = DATABASE) -> dict[str, list[str]]:
    """Every character vector in an R lazy-load database `<name>.rdb` / `<name>.rdx`."""
    import rdata

    index_path = os.path.join(directory, name + ".rdx")
    database_path = os.path.join(directory, name + ".rdb")
    try:
        index = rdata.read_rds(index_path)
        variables = index["variables"]
    except Exception as e:  # rdata raises several types for a file it cannot parse
        raise AustenDataError(f"{index_path}: not an R lazy-load index ({e})") from e
    with open(database_path, "rb") as f:
        database = f.read()
    objects = {}
    for key, (offset, length) in variables.items():
        key, offset, length = str(key), int(offset), int(length)
        record = database[offset : offset + length]
        if len(record) != length or length < 4:
            raise AustenDataError(
                f"{database_path}: object {key!r} at bytes {offset}..{offset + length} is "
                f"past the end of the file ({len(database)} bytes)"
            )
        (expected,) = struct.unpack(">I", record[:4])
        try:
            serialized = zlib.decompress(record[4:])
        except zlib.error as e:
            raise AustenDataError(f"{database_path}: object {key!r}: {e}") from e
        if len(serialized) != expected:
            raise AustenDataError(
                f"{database_path}: object {key!r} inflates to {len(serialized)} bytes, "
                f"its header says {expected}"
            )
        with warnings.catch_warnings():
            # A record is a bare serialisation, without the RDS/RDA header rdata looks for.
            warnings.filterwarnings("ignore", "Unknown file type", UserWarning)
            value = rdata.conversion.convert(rdata.parser.parse_data(serialized))
        objects[key] = [str(line) for line in value]
    return objects


def parse_novel(lines: Iterable[str]) -> list[Document]:
    """One document per chapter, one paragraph per blank-line-separated block of lines.

    Everything before the first chapter heading (title pages, prefaces) and from a closing
    "THE END" / "FINIS" on is dropped, as are volume headings.
    """
    chapters: list[Document] = []
    paragraphs: list[str] = []
    paragraph: list[str] = []
    started = False

    def end_paragraph() -> None:
        if paragraph:
            text = " ".join(_ITALICS.sub(r"\1", " ".join(paragraph)).split())
            if text:
                paragraphs.append(text)
            paragraph.clear()

    def end_chapter() -> None:
        end_paragraph()
        if paragraphs:
            chapters.append(Document(list(paragraphs), needs_split=True))
            paragraphs.clear()

    for raw in lines:
        line = raw.strip()
        if _CHAPTER.match(line):
            end_chapter()
            started = True
        elif _THE_END.match(line):
            break
        elif not started or _VOLUME.match(line):
            continue
        elif line:
            paragraph.append(line)
        else:
            end_paragraph()
    end_chapter()
    return chapters


def austen_documents(
    *,
    data_dir: str = "",
    split_sentences: bool = True,
    novels: Sequence[str] = NOVELS,
    cache_dir: str = DEFAULT_CACHE_DIR,
) -> Iterator[Document]:
    """The chapters of the novels, in order, split into sentences with pysbd if asked."""
    texts = read_lazyload_database(data_dir or find_data_dir(cache_dir))
    missing = [n for n in novels if n not in texts]
    if missing:
        raise AustenDataError(f"no novel(s) {missing} in the database; it has {sorted(texts)}")
    splitter = make_sentence_splitter("en") if split_sentences else None
    for novel in novels:
        for chapter in parse_novel(texts[novel]):
            yield split_document(chapter, splitter) if splitter else chapter


def main(argv) -> None:
    del argv
    from absl import flags

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    directory = find_data_dir(flags.FLAGS.cache_dir)
    texts = read_lazyload_database(directory)
    for novel in NOVELS:
        chapters = parse_novel(texts[novel])
        words = sum(len(p.split()) for c in chapters for p in c.sentences)
        print(f"{novel}: {len(chapters)} chapters, {words} words")
    print(f"from {directory}")


if __name__ == "__main__":
    from absl import flags

    from data_pipelines import cli

    flags.DEFINE_string("cache_dir", DEFAULT_CACHE_DIR, "Where the unpacked package is kept.")
    cli.run(main)
