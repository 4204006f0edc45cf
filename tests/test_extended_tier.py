"""tests/extended_cases.txt (the cases `make test` leaves to `make test-extended`) names only
tests that exist, and leaves every file a test in `make test`."""

import ast
import re
from collections import defaultdict
from pathlib import Path

from conftest import extended_cases

ROOT = Path(__file__).resolve().parent.parent


def _tests_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("test_")
    }


def test_every_moved_case_names_a_test_that_exists():
    for case in extended_cases():
        path, _, name = case.partition("::")
        assert (ROOT / path).is_file(), case
        function = re.sub(r"\[.*\]$", "", name)
        assert function in _tests_of(ROOT / path), case


def test_every_file_keeps_a_test_in_make_test():
    moved = defaultdict(set)  # file -> whole functions moved (no parameter named)
    parametrised = set()
    for case in extended_cases():
        path, _, name = case.partition("::")
        if "[" in name:
            parametrised.add(path)  # one parameter moved: the others stay
        else:
            moved[path].add(name)
    for path, names in moved.items():
        if path in parametrised:
            continue
        assert _tests_of(ROOT / path) - names, f"{path}: every test moved to the extended tier"
