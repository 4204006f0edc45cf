"""Fetching pinned package archives from a PEP 503 index (served over HTTP from tmp_path)."""

from __future__ import annotations

import functools
import hashlib
import http.server
import io
import os
import tarfile
import threading
import zipfile

import pytest

from data_pipelines import registry


@pytest.fixture
def serve(tmp_path):
    """Serves tmp_path over HTTP on localhost; yields its base URL."""
    handler = functools.partial(QuietHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def _index(root, name: str, project: str, filename: str, data: bytes, listed_sha=None) -> str:
    """A one-project PEP 503 index in root/name (file and page); returns its served path."""
    (root / name / "files").mkdir(parents=True)
    (root / name / "files" / filename).write_bytes(data)
    sha = listed_sha or hashlib.sha256(data).hexdigest()
    page = root / name / "simple" / project
    page.mkdir(parents=True)
    (page / "index.html").write_text(
        f'<html><body><a href="../../files/{filename}#sha256={sha}">{filename}</a><br/>'
        "</body></html>"
    )
    return f"/{name}/simple"


DATA = b"the archive's bytes\n" * 1000
PINNED = registry.PackageFile(
    "Some.Project_x", "some_project-1.0.tar.gz", hashlib.sha256(DATA).hexdigest(), "make fetch"
)


def test_fetch_downloads_verifies_and_then_serves_the_cache(tmp_path, serve, monkeypatch):
    index = _index(tmp_path, "index", "some-project-x", PINNED.filename, DATA)
    monkeypatch.setenv("PIP_INDEX_URL", serve + index + "/")
    cache = tmp_path / "cache"
    path = registry.fetch(PINNED, str(cache))
    assert path == str(cache / PINNED.filename)
    assert open(path, "rb").read() == DATA
    assert sorted(os.listdir(cache)) == [PINNED.filename]  # no .part left behind
    monkeypatch.setenv("PIP_INDEX_URL", serve + "/nowhere")
    assert registry.fetch(PINNED, str(cache)) == path  # cached: the index is not asked


def test_bytes_that_differ_from_the_pin_are_refused_and_nothing_is_saved(
    tmp_path, serve, monkeypatch
):
    other = b"tampered" + DATA
    listed = hashlib.sha256(other).hexdigest()
    index = _index(tmp_path, "i1", "some-project-x", PINNED.filename, other, listed)
    monkeypatch.setenv("PIP_INDEX_URL", serve + index)
    with pytest.raises(
        registry.RegistryError, match=f"lists {PINNED.filename} with sha256 {listed}"
    ):
        registry.fetch(PINNED, str(tmp_path / "cache"))
    # The index lists the pinned hash but serves other bytes: caught after the download.
    index = _index(tmp_path, "i2", "some-project-x", PINNED.filename, other, PINNED.sha256)
    monkeypatch.setenv("PIP_INDEX_URL", serve + index)
    with pytest.raises(registry.RegistryError, match=f"sha256 {listed} is not the pinned"):
        registry.fetch(PINNED, str(tmp_path / "cache"))
    assert os.listdir(tmp_path / "cache") == []


def test_unlisted_file_unreachable_index_and_no_download_say_what_to_do(
    tmp_path, serve, monkeypatch
):
    index = _index(tmp_path, "index", "some-project-x", "other-2.0.tar.gz", DATA)
    monkeypatch.setenv("PIP_INDEX_URL", serve + index)
    with pytest.raises(registry.RegistryError, match="does not list some_project-1.0.tar.gz"):
        registry.fetch(PINNED, str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_INDEX_URL", serve + "/nowhere")
    with pytest.raises(registry.RegistryError, match="set PIP_INDEX_URL"):
        registry.fetch(PINNED, str(tmp_path / "cache"))
    with pytest.raises(registry.RegistryError, match="fetch it with `make fetch`"):
        registry.fetch(PINNED, str(tmp_path / "cache"), allow_download=False)


@pytest.mark.parametrize("kind", ["tar", "zip"])
def test_extract_copies_members_once_and_names_a_missing_one(tmp_path, kind):
    archive = str(tmp_path / f"a.{kind}")
    members = {"pkg/data/a.json": b'{"a": 1}', "pkg/data/b.txt": b"b\n"}
    if kind == "zip":
        with zipfile.ZipFile(archive, "w") as z:
            for name, data in members.items():
                z.writestr(name, data)
    else:
        with tarfile.open(archive, "w:gz") as t:
            for name, data in members.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    wanted = {m: str(tmp_path / "out" / os.path.basename(m)) for m in members}
    assert registry.extract(archive, wanted) == wanted
    for member, dest in wanted.items():
        assert open(dest, "rb").read() == members[member]
    with open(wanted["pkg/data/b.txt"], "wb") as f:
        f.write(b"kept")  # an extracted file is not rewritten
    registry.extract(archive, wanted)
    assert open(wanted["pkg/data/b.txt"], "rb").read() == b"kept"
    with pytest.raises(registry.RegistryError, match=f"{archive}: has no pkg/missing"):
        registry.extract(archive, {"pkg/missing": str(tmp_path / "out" / "m")})
    assert not os.path.exists(tmp_path / "out" / "m.part")
