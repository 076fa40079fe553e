"""The tables in tests/conftest.py that mark tests `timing`, `cost` and `integration` name what exists.

A test renamed or moved would otherwise lose its marker without a word, and
run beside the rest of the suite instead of on its own (issue 36).
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests import conftest

TESTS = Path(__file__).resolve().parent


def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test")
    }


def test_every_module_named_in_a_marker_table_exists() -> None:
    modules = {conftest.module_key(path) for path in TESTS.rglob("test_*.py")}
    named = conftest.TIMING_MODULES | conftest.COST_MODULES | conftest.INTEGRATION_MODULES
    assert named - modules == set()


def _names_outside(modules: frozenset[str]) -> set[str]:
    names: set[str] = set()
    for path in TESTS.rglob("test_*.py"):
        if conftest.module_key(path) not in modules:
            names |= _test_names(path)
    return names


def test_every_test_named_in_a_marker_table_exists_outside_the_modules_marked_whole() -> None:
    assert conftest.TIMING_TESTS - _names_outside(conftest.TIMING_MODULES) == set()
    assert conftest.INTEGRATION_TESTS - _names_outside(conftest.INTEGRATION_MODULES) == set()
