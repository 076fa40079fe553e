"""What tests/conftest.py keeps true of the suite as a whole.

The tables that mark tests `timing`, `cost`, `integration` and `repo` name
what exists: a test renamed or moved would otherwise lose its marker without a
word, and run beside the rest of the suite instead of on its own (issue 36).
And no test leaves a loop's runtime threads running (issue 37).
"""

from __future__ import annotations

import ast
import gc
import sys
import time
from pathlib import Path

import pytest

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
    named = conftest.TIMING_MODULES | conftest.COST_MODULES | conftest.INTEGRATION_MODULES | conftest.REPO_MODULES
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
    assert conftest.REPO_TESTS - _names_outside(conftest.REPO_MODULES) == set()


@pytest.mark.skipif(sys.platform != "linux", reason="the guard reads the kernel's thread list (/proc), Linux only")
def test_the_runtime_threads_of_a_loop_are_seen_and_end_when_it_is_freed() -> None:
    # What `_no_loop_runtime_left` looks for is there while a veloxloop loop
    # that ran its executor lives, and gone once the closed loop is freed.
    veloxloop = pytest.importorskip("veloxloop")
    before = conftest._runtime_threads()
    loop = veloxloop.new_event_loop()
    try:
        loop.run_until_complete(loop.run_in_executor(None, int))
        started = {name for tid, name in conftest._runtime_threads().items() if tid not in before}
        assert any(name.startswith("veloxloop-") for name in started), started
    finally:
        loop.close()
    del loop
    gc.collect()
    deadline = time.monotonic() + 10
    while (left := set(conftest._runtime_threads()) - set(before)) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not left
