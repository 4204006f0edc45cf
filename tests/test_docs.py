"""The docs cannot drift from the repository: every relative link and image in README.md,
docs/ and benchmarks/ resolves (an `#anchor` into a Markdown file to one of its headings,
by GitHub's slug rules), every `make` target and `python -m` tool the README names exists
(test_cli checks that each such tool answers --help), the README stays a front door
(at most 160 lines) and docs/README.md indexes every page under docs/.

File reads and regexes only: no subprocess, well under a second."""

import fnmatch
import re
from pathlib import Path

from test_cli import TOOLS

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
README_MAX_LINES = 160

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
# [text](target) and ![alt](target); the target ends at whitespace or ")" (a title after
# it is allowed). Nested brackets in the text are not used in these docs.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)
MAKE_TARGET_DEF = re.compile(r"^([a-z][a-z0-9-]*)\s*:(?!=)", re.M)
MAKE_USE = re.compile(r"\bmake\s+((?:[a-z][a-z0-9*-]*\s*)+)")
PYTHON_M = re.compile(r"\bpython(?:3(?:\.\d+)?)?\s+-m\s+([A-Za-z_][\w.]*)")


def _markdown_files() -> list[Path]:
    pages = [*sorted((REPO / "docs").rglob("*.md")), *sorted((REPO / "benchmarks").rglob("*.md"))]
    return [README, *pages]


def _rel(path: Path, root: Path = REPO) -> str:
    return str(path.relative_to(root))


def _prose_lines(path: Path):
    """(line number, text) of each line outside fenced code blocks, inline code removed."""
    in_fence = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            yield number, INLINE_CODE.sub("", line)


def _code_snippets(path: Path):
    """(line number, code) of each fenced code line and each inline code span."""
    in_fence = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            yield number, line.split(" #", 1)[0]  # a shell comment is prose
        else:
            for match in INLINE_CODE.finditer(line):
                yield number, match.group(2)


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: link text kept, lowercase, punctuation dropped
    (letters, digits, '_', '-' and spaces stay), spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    anchors, seen = set(), {}
    in_fence = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        match = None if in_fence else HEADING.match(line)
        if match:
            slug = github_slug(match.group(2))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def broken_links(path: Path, root: Path = REPO) -> list[str]:
    """One 'file:line: ...' message (the file relative to `root`) per relative link or
    image of `path` that does not resolve."""
    problems = []
    for number, line in _prose_lines(path):
        for match in LINK.finditer(line):
            target = match.group(1)
            if SCHEME.match(target):
                continue
            file_part, _, anchor = target.partition("#")
            resolved = (path.parent / file_part).resolve() if file_part else path
            where = f"{_rel(path, root)}:{number}"
            if not resolved.exists():
                problems.append(f"{where}: {target!r} names no file ({file_part} does not exist)")
            elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
                problems.append(f"{where}: {target!r}: {resolved.name} has no heading #{anchor}")
    return problems


def test_every_relative_link_and_image_resolves():
    problems = [p for path in _markdown_files() for p in broken_links(path)]
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_the_link_check_finds_a_broken_link_and_anchor(tmp_path):
    (tmp_path / "real.md").write_text("# A `code` heading: yes, and_more\n\n## Twice\n## Twice\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](real.md#a-code-heading-yes-and_more) [ok](real.md#twice-1) [ok](#top)\n"
        "# Top\n"
        "![gone](figures/missing.png)\n"
        "[bad anchor](real.md#nowhere) [web](https://example.com/x.md)\n"
        "```\n[not a link](in/code.md)\n```\n"
    )
    assert broken_links(page, root=tmp_path) == [
        "page.md:3: 'figures/missing.png' names no file (figures/missing.png does not exist)",
        "page.md:4: 'real.md#nowhere': real.md has no heading #nowhere",
    ]


def test_readme_is_a_front_door():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md: {len(lines)} lines, over {README_MAX_LINES}: move detail to docs/"
    )


def _make_targets() -> set[str]:
    makefiles = (REPO / "Makefile", REPO / "tpu.mk")
    return {t for f in makefiles for t in MAKE_TARGET_DEF.findall(f.read_text(encoding="utf-8"))}


def test_every_make_target_the_readme_names_exists():
    targets = _make_targets()
    assert {"demo", "test", "help"} <= targets
    named, problems = 0, []
    for number, code in _code_snippets(README):
        for match in MAKE_USE.finditer(code):
            for word in match.group(1).split():
                named += 1
                if not fnmatch.filter(targets, word):
                    problems.append(
                        f"README.md:{number}: `make {word}`: no such target in Makefile, tpu.mk"
                    )
    assert named >= 5, "README.md names no make target in code: nothing was checked"
    assert not problems, "\n".join(problems)


def test_every_python_m_tool_the_readme_names_runs_through_cli():
    # TOOLS (test_cli) is every module whose main runs through data_pipelines.cli; test_cli
    # checks that each answers -h and --help.
    modules = {t.removesuffix(".py").removesuffix("/__main__").replace("/", ".") for t in TOOLS}
    named, problems = 0, []
    for number, code in _code_snippets(README):
        for module in PYTHON_M.findall(code):
            named += 1
            if module not in modules:
                problems.append(
                    f"README.md:{number}: `python -m {module}` is no tool of this repository "
                    "that parses its flags through data_pipelines.cli"
                )
    assert named >= 3, "README.md names no python -m tool in code: nothing was checked"
    assert not problems, "\n".join(problems)


def test_the_docs_index_links_every_page():
    index = REPO / "docs" / "README.md"
    linked = set()
    for _, line in _prose_lines(index):
        for target in LINK.findall(line):
            if not SCHEME.match(target):
                linked.add((index.parent / target.partition("#")[0]).resolve())
    missing = [
        _rel(page)
        for page in sorted((REPO / "docs").rglob("*.md"))
        if page != index and page.resolve() not in linked
    ]
    assert not missing, "docs/README.md: no link to " + ", ".join(missing)
