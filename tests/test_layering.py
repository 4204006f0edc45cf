"""Dependencies point one way: data_pipelines <- bert_jax <- experiments <- benchmarks.

A package may import those to its left, never one to its right, not even inside a function
(docs/code_layout.md). Every import statement of every module is read with `ast`, relative
imports resolved against the module's package; `tests/` may import anything.

Nor do modules import one another round a circle (`test_no_import_circles`), not even
inside a function: the names two modules share live in the one that owns them, or in a
lower one both import.
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


def _module_names(root: str) -> dict[str, str]:
    """Dotted name -> file of every module of the repo's packages (a package by its name)."""
    modules = {}
    for package in LAYERS:
        for path in _python_files(root, package):
            parts = os.path.relpath(path, root).removesuffix(".py").split(os.sep)
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def import_graph(root: str = REPO) -> dict[str, set[str]]:
    """Module -> the repo's modules it imports, at module level or inside a function.

    `from a import b` imports module `a.b` where that is a module, else (a name of) `a`;
    `import a.b.c` imports `a.b.c`, or the nearest of its parents that is a module.
    """
    modules = _module_names(root)

    def found(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in modules.items():
        package = module.split(".") if path.endswith("__init__.py") else module.split(".")[:-1]
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
        targets = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets |= {found(alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                parent = ".".join([*base, node.module] if node.module else base)
                for alias in node.names:
                    child = f"{parent}.{alias.name}"
                    targets.add(child if child in modules else found(parent))
        graph[module] = targets - {None, module}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every group of modules that import one another round a circle (Tarjan's strongly
    connected components of more than one module), each sorted, one circle spelled out."""
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(graph.get(module, ())):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = []
            while not group or group[-1] != module:
                group.append(stack.pop())
                on_stack.discard(group[-1])
            if len(group) > 1:
                circles.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(circles)


def _spelled(circle: list[str], graph: dict[str, set[str]]) -> str:
    """'a -> b -> a': one path round `circle` from its first module."""
    members, path = set(circle), [circle[0]]
    while True:
        step = sorted(graph[path[-1]] & members)
        ahead = [m for m in step if m == circle[0] and len(path) > 1] or [
            m for m in step if m not in path
        ]
        if not ahead:  # every onward module seen: close on the first one seen
            path.append(next(m for m in path if m in step))
            return " -> ".join(path)
        path.append(ahead[0])
        if ahead[0] == circle[0]:
            return " -> ".join(path)


def test_no_import_circles():
    graph = import_graph()
    circles = import_circles(graph)
    assert not circles, (
        "modules that import one another (at module level or in a function); move the names "
        "they share to the module that owns them, or to a lower one both import:\n"
        + "\n".join(f"{', '.join(circle)}: {_spelled(circle, graph)}" for circle in circles)
    )


def test_the_circle_check_sees_function_level_and_from_imports(tmp_path):
    package = tmp_path / "bert_jax"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "writer.py").write_text("from bert_jax.reader import Error\n")
    (package / "reader.py").write_text("def f():\n    from bert_jax import writer\n")
    (package / "low.py").write_text("import numpy\n")
    (package / "sub" / "a.py").write_text("from . import b\nfrom .. import low\n")
    (package / "sub" / "b.py").write_text("from bert_jax.sub.c import x\n")
    (package / "sub" / "c.py").write_text("def g():\n    import bert_jax.sub.a\n")
    graph = import_graph(str(tmp_path))
    assert graph["bert_jax.writer"] == {"bert_jax.reader"}
    assert graph["bert_jax.reader"] == {"bert_jax.writer"}
    assert graph["bert_jax.sub.a"] == {"bert_jax.sub.b", "bert_jax.low"}
    assert import_circles(graph) == [
        ["bert_jax.reader", "bert_jax.writer"],
        ["bert_jax.sub.a", "bert_jax.sub.b", "bert_jax.sub.c"],
    ]
    assert _spelled(["bert_jax.sub.a", "bert_jax.sub.b", "bert_jax.sub.c"], graph) == (
        "bert_jax.sub.a -> bert_jax.sub.b -> bert_jax.sub.c -> bert_jax.sub.a"
    )
    (package / "reader.py").write_text("import numpy\n")  # the circle broken
    assert import_circles(import_graph(str(tmp_path))) == [
        ["bert_jax.sub.a", "bert_jax.sub.b", "bert_jax.sub.c"]
    ]
