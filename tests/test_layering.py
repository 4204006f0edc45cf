"""Dependencies point one way: data_pipelines <- bert_jax <- experiments <- benchmarks.

A package may import those to its left, never one to its right, not even inside a function
(DESIGN.md). Every import statement of every module is read with `ast`, relative imports
resolved against the module's package; `tests/` may import anything.
"""

from __future__ import annotations

import ast
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYERS = ("data_pipelines", "bert_jax", "experiments", "benchmarks")  # lowest first


def _python_files(root: str, package: str) -> list[str]:
    paths = []
    for directory, _, files in os.walk(os.path.join(root, package)):
        paths += [os.path.join(directory, f) for f in files if f.endswith(".py")]
    return sorted(paths)


def imported_modules(root: str, path: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the file at `path`, at any depth."""
    parts = os.path.relpath(path, root).removesuffix(".py").split(os.sep)
    # A relative import starts from the file's directory: an __init__.py's own package or a
    # module's parent.
    package = parts[:-1]
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            if node.module:
                # `from a.b import c`: c is an attribute or a submodule of a.b; a.b decides.
                found.append((node.lineno, ".".join([*base, node.module])))
            else:
                # `from .. import c`: each c is a module of the resolved package.
                found += [(node.lineno, ".".join([*base, a.name])) for a in node.names]
    return sorted(found)


def upward_imports(package: str, root: str = REPO) -> list[str]:
    """'file:line imports X' for every import in `package` of a layer above it."""
    above = LAYERS[LAYERS.index(package) + 1 :]
    bad = []
    for path in _python_files(root, package):
        for line, name in imported_modules(root, path):
            if name.split(".")[0] in above:
                bad.append(f"{os.path.relpath(path, root)}:{line} imports {name}")
    return bad


@pytest.mark.parametrize("package", LAYERS)
def test_no_upward_imports(package):
    assert _python_files(REPO, package), f"no Python files under {package}/"
    bad = upward_imports(package)
    allowed = LAYERS[: LAYERS.index(package)]
    assert not bad, f"{package} may import only {allowed}:\n" + "\n".join(bad)


def test_the_check_sees_imports_in_functions_and_relative_ones(tmp_path):
    package = tmp_path / "bert_jax" / "sub"
    package.mkdir(parents=True)
    (tmp_path / "bert_jax" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("from . import mod\n")
    (package / "mod.py").write_text(
        "import numpy\n"
        "from data_pipelines import masking\n"
        "def f():\n"
        "    from experiments import pretrain\n"
        "    if True:\n"
        "        import benchmarks.bench_model as b\n"
        "from ... import benchmarks, data_pipelines\n"
        "from .. import sharding\n"
        "from .other import x\n"
    )
    assert imported_modules(str(tmp_path), str(package / "mod.py")) == [
        (1, "numpy"),
        (2, "data_pipelines"),
        (4, "experiments"),
        (6, "benchmarks.bench_model"),
        (7, "benchmarks"),
        (7, "data_pipelines"),
        (8, "bert_jax.sharding"),
        (9, "bert_jax.sub.other"),
    ]
    assert imported_modules(str(tmp_path), str(package / "__init__.py")) == [
        (1, "bert_jax.sub.mod")
    ]
    assert upward_imports("bert_jax", str(tmp_path)) == [
        "bert_jax/sub/mod.py:4 imports experiments",
        "bert_jax/sub/mod.py:6 imports benchmarks.bench_model",
        "bert_jax/sub/mod.py:7 imports benchmarks",
    ]
