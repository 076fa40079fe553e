"""aiocop changes nothing the application can observe: its wrappers are indistinguishable from what they replace.

Every entry of the wrappers table is compared with its original while
detection is on: names, docs and signatures, how it behaves as a class
attribute, how it pickles and copies, and the `os.supports_*` feature sets
that the standard library consults.
"""

from __future__ import annotations

import copy
import inspect
import os
import pickle
import shutil
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

import pytest

import aiocop
from aiocop import _wrappers
from tests.conftest import ROOT, reset_aiocop, run_python

if TYPE_CHECKING:
    from collections.abc import Iterator

_FEATURE_SETS = sorted(name for name in dir(os) if name.startswith("supports_") and isinstance(getattr(os, name), set))


def _outcome(func: Any, *args: Any) -> tuple[str, Any]:
    try:
        return "ok", func(*args)
    except Exception as error:
        return type(error).__name__, None


def _pickled(func: Any) -> list[str]:
    return [_outcome(pickle.dumps, func, protocol)[0] for protocol in range(pickle.HIGHEST_PROTOCOL + 1)]


@pytest.fixture
def patched() -> Iterator[list[Any]]:
    """The live patches (target, original, wrapper, how the original pickled before), detection on."""
    before = {
        t.name: _pickled(getattr(_wrappers._resolve_owner(t.owner), t.attr, None)) for t in _wrappers.PATCH_TARGETS
    }
    aiocop.start_blocking_io_detection()
    try:
        yield [
            (p.target, p.original, getattr(p.owner, p.target.attr), before[p.target.name]) for p in _wrappers._applied
        ]
    finally:
        reset_aiocop()


def _patch_ids() -> list[str]:
    return [t.name for t in _wrappers.PATCH_TARGETS]


@pytest.mark.parametrize("name", _patch_ids())
def test_each_wrapper_is_indistinguishable_from_its_original(patched: list[Any], name: str) -> None:
    found = [(original, wrapper, pickled) for target, original, wrapper, pickled in patched if target.name == name]
    if not found:
        pytest.skip(f"{name} is not wrapped on this Python or platform")
    [(original, wrapper, pickled_before)] = found
    assert wrapper is not original
    for attribute in ("__name__", "__qualname__", "__module__", "__doc__", "__text_signature__"):
        if hasattr(original, attribute):
            assert getattr(wrapper, attribute) == getattr(original, attribute), attribute
    if inspect.isbuiltin(original):
        assert repr(wrapper) == repr(original)
    assert _outcome(inspect.signature, wrapper)[0] == _outcome(inspect.signature, original)[0]
    if _outcome(inspect.signature, original)[0] == "ok":
        assert inspect.signature(wrapper) == inspect.signature(original)
    # Pickled as the original was before aiocop: by reference, and back to a
    # function of the same name (the original, or where patched, the wrapper).
    assert _pickled(wrapper) == pickled_before
    if "ok" in pickled_before:
        assert pickle.loads(pickle.dumps(wrapper)) in (original, wrapper)
    assert copy.copy(wrapper) is wrapper
    assert copy.deepcopy(wrapper) is wrapper
    for feature_set in _FEATURE_SETS:
        assert (original in getattr(os, feature_set)) == (wrapper in getattr(os, feature_set)), feature_set


def test_a_wrapped_function_as_a_class_attribute_is_not_bound() -> None:
    # C builtins are not descriptors: `sleep = time.sleep` in a class body
    # stays a plain function of the instance (never given `self`).
    aiocop.start_blocking_io_detection()
    try:

        class Backoff:
            sleep = time.sleep
            stat = os.stat

        backoff = Backoff()
        backoff.sleep(0)
        assert backoff.stat(ROOT).st_mode == os.lstat(ROOT).st_mode
    finally:
        reset_aiocop()


def test_stop_restores_the_feature_sets(patched: list[Any]) -> None:
    wrappers = [wrapper for _, _, wrapper, _ in patched]
    aiocop.stop()
    for feature_set in _FEATURE_SETS:
        assert not any(w in getattr(os, feature_set) for w in wrappers), feature_set


@pytest.mark.skipif(not shutil.rmtree.avoids_symlink_attacks, reason="no fd-based rmtree on this platform")
def test_shutil_imported_after_start_keeps_its_symlink_protection(tmp_path: Any) -> None:
    # shutil decides at import whether rmtree can use the fd-based functions
    # (checking os.stat and friends against os.supports_*), and copystat whether
    # it can stat a link: import it fresh, after aiocop patched os.stat.
    result = run_python(
        """
        import os, sys
        import aiocop
        aiocop.start_blocking_io_detection()
        import shutil
        root = sys.argv[1]
        os.mkdir(os.path.join(root, "src"))
        with open(os.path.join(root, "src", "f"), "w") as f:
            f.write("x")
        os.symlink(os.path.join(root, "src", "f"), os.path.join(root, "link"))
        shutil.copy2(os.path.join(root, "link"), os.path.join(root, "copy"), follow_symlinks=False)
        shutil.rmtree(os.path.join(root, "src"))
        print(shutil.rmtree.avoids_symlink_attacks, os.path.islink(os.path.join(root, "copy")))
        """,
        str(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True"]


def test_other_audit_hooks_see_only_the_events_cpython_raises() -> None:
    # A sandbox hook that denies os.* events must see exactly what it sees
    # without aiocop: the wrappers hand their events to aiocop alone.
    code = """
        import asyncio, os, sys
        seen = []
        sys.addaudithook(lambda event, args: seen.append(event) if event.startswith(("os.stat", "os.getcwd")) else None)
        if sys.argv[1] == "on":
            import aiocop
            aiocop.start_blocking_io_detection()
        async def main():
            os.stat(".")
            os.getcwd()
            return os.path.exists("/")
        print(asyncio.run(main()), sorted(set(seen)))
        """
    off, on = run_python(code, "off"), run_python(code, "on")
    assert off.returncode == on.returncode == 0, off.stderr + on.stderr
    assert on.stdout == off.stdout


def test_a_process_pool_runs_a_wrapped_function() -> None:
    # run_in_executor(ProcessPoolExecutor(), os.stat, ...) pickles os.stat.
    result = run_python(
        """
        import asyncio, os
        from concurrent.futures import ProcessPoolExecutor
        import aiocop
        aiocop.start_blocking_io_detection()
        async def main():
            with ProcessPoolExecutor(1) as pool:
                return await asyncio.get_running_loop().run_in_executor(pool, os.stat, ".")
        print(asyncio.run(main()).st_mode == os.stat(".").st_mode)
        """,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True"


def test_stdlib_idioms_behave_identically_with_and_without_aiocop(tmp_path: Any) -> None:
    # tests/transparency_idioms.py runs each idiom outside any loop and inside
    # a task; every outcome (result, or exception type, errno and message)
    # must be the same whether aiocop watches or not.
    outputs = {}
    for mode in ("off", "on"):
        work = tmp_path / mode
        work.mkdir()
        done = subprocess.run(
            [sys.executable, os.path.join(ROOT, "tests", "transparency_idioms.py"), mode, str(work)],
            capture_output=True,
            text=True,
            timeout=240,
            env={**os.environ, "PYTHONPATH": ROOT},
            check=False,
        )
        assert done.returncode == 0, done.stderr
        outputs[mode] = done.stdout.splitlines()
    assert len(outputs["off"]) == len(outputs["on"]) >= 50
    different = [(off, on) for off, on in zip(outputs["off"], outputs["on"], strict=True) if off != on]
    assert different == [], "\n".join(f"without: {off}\n   with: {on}" for off, on in different)
