"""The table of known loops (`internals.KNOWN_LOOPS`): every list of loops is derived from it."""

from __future__ import annotations

import ast
from pathlib import Path

from aiocop._interception import harmless, internals, loops
from aiocop._interception.internals import KNOWN_LOOPS, LoopFrame
from aiocop._stalls import discovery

_PACKAGE = Path(internals.__file__).resolve().parent.parent


def test_derived_lists_equal_the_lists_written_out_before_the_table() -> None:
    # The lists as they were written out one by one before KNOWN_LOOPS (issue 40): the table changed no behaviour.
    assert (
        LoopFrame("asyncio.events", "_run", "dispatch"),
        LoopFrame("asyncio.base_events", "_run_once", "core"),
        LoopFrame("rloop.loop", "run_forever", "dispatch"),
        LoopFrame("veloxloop", "run_forever", "dispatch"),
        LoopFrame("trio._core._run", "unrolled_run", "dispatch"),
    ) == internals.LOOP_FRAMES
    assert internals.LOOP_PACKAGES == ("asyncio", "uvloop", "winloop", "rloop", "veloxloop", "granian", "trio")
    assert frozenset({"asyncio", "rloop", "veloxloop", "trio"}) == internals.PYTHON_LOOP_PACKAGES
    assert internals.SERVING_LOOP_PACKAGES == ("asyncio", "uvloop", "winloop", "rloop", "veloxloop")
    assert {"leviathan"} <= loops.UNANNOUNCED_LOOP_MODULES  # (tests add their own loop to it)
    assert frozenset({"leviathan"}) == internals.UNANNOUNCED_LOOP_PACKAGES
    assert frozenset(internals.LOOP_PACKAGES) | internals.PYTHON_LOOP_PACKAGES | {"leviathan"} == (
        internals.KNOWN_LOOP_PACKAGES
    )
    bind = [r for r in harmless.HARMLESS if r.event == ("socket.bind",) and r.caller_functions]
    assert [r.caller_modules for r in bind] == [("asyncio", "uvloop", "winloop", "rloop", "veloxloop")]


def test_each_loop_list_is_derived_from_the_table() -> None:
    assert tuple(f for loop in KNOWN_LOOPS for f in loop.frames) == internals.LOOP_FRAMES
    assert tuple(loop.name for loop in KNOWN_LOOPS if loop.internal) == internals.LOOP_PACKAGES
    assert {loop.name for loop in KNOWN_LOOPS if loop.frames} == internals.PYTHON_LOOP_PACKAGES
    assert {loop.name for loop in KNOWN_LOOPS} == internals.KNOWN_LOOP_PACKAGES
    assert tuple(loop.name for loop in KNOWN_LOOPS if loop.serves) == internals.SERVING_LOOP_PACKAGES
    assert {loop.name for loop in KNOWN_LOOPS if not loop.announces} <= loops.UNANNOUNCED_LOOP_MODULES
    assert vars(discovery)["KNOWN_LOOP_PACKAGES"] is internals.KNOWN_LOOP_PACKAGES  # the very set, imported
    # A loop's frames are its own package's.
    for loop in KNOWN_LOOPS:
        assert all(f.module.partition(".")[0] == loop.name for f in loop.frames), loop


def test_no_loop_is_named_outside_the_table() -> None:
    # A loop's name written as a string anywhere else in the package is a list of loops not derived from the
    # table ("asyncio" and "trio" are also modules aiocop imports and patches, so only the others are looked for).
    names = {loop.name for loop in KNOWN_LOOPS} - {"asyncio", "trio"}
    found = []
    for path in sorted(_PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        table = None
        if path.name == "internals.py" and path.parent.name == "_interception":
            table = next(
                n for n in tree.body if isinstance(n, ast.AnnAssign) and ast.unparse(n.target) == "KNOWN_LOOPS"
            )
        skip = {id(n) for n in ast.walk(table)} if table is not None else set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in names and id(node) not in skip:
                found.append(f"{path.relative_to(_PACKAGE)}:{node.lineno}: {node.value!r}")
    assert not found, found


def test_trios_run_module_is_named_once() -> None:
    # trio's run loop module is one fact (its dispatch frame, the home of its run namespace): written once, as
    # internals.TRIO_RUN_MODULE, and imported wherever it is needed (issue 40).
    found = []
    for path in sorted(_PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value == "trio._core._run":
                found.append(f"{path.relative_to(_PACKAGE).as_posix()}:{node.lineno}")
    assert len(found) == 1, found
    assert found[0].startswith("_interception/internals.py:"), found
    assert internals.TRIO_RUN_MODULE == "trio._core._run"
