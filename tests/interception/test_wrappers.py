"""aiocop changes nothing the application can observe: its wrappers are indistinguishable from what they replace.

Every entry of the wrappers table is compared with its original while
detection is on: names, docs and signatures, how it behaves as a class
attribute, how it pickles and copies, and the `os.supports_*` feature sets
that the standard library consults.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import inspect
import os
import pickle
import shutil
import socket
import subprocess
import sys
import threading
import time
import traceback
import typing
import weakref
from typing import TYPE_CHECKING, Any

import pytest

import aiocop
from aiocop._interception import standin as _standin
from aiocop._interception import wrappers as _wrappers
from tests.conftest import ROOT, Collector, reset_aiocop, run_python
from tests.support.pytester_args import QUIET
from tests.support.transparency_idioms import DOCUMENTED_DIFFERENCES, IDIOMS

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

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
    # What frameworks that introspect callables read: type hints resolve to
    # what they resolve to for the original (a builtin's: {}), and weak
    # references work wherever they work to it (a C method descriptor takes
    # none, its Python wrapper does: documented).
    assert _outcome(typing.get_type_hints, wrapper) == _outcome(typing.get_type_hints, original)
    if _outcome(_weakly_held, original)[0] == "ok" or inspect.isbuiltin(original):
        assert _outcome(_weakly_held, wrapper) == _outcome(_weakly_held, original)
    assert getattr(wrapper, "__self__", None) is getattr(original, "__self__", None)
    for feature_set in _FEATURE_SETS:
        assert (original in getattr(os, feature_set)) == (wrapper in getattr(os, feature_set)), feature_set


def _weakly_held(func: Any) -> bool:
    return weakref.ref(func)() is func


def _found(patched: list[Any], name: str) -> tuple[Any, Any, Any]:
    found = [(target, original, wrapper) for target, original, wrapper, _ in patched if target.name == name]
    if not found:
        pytest.skip(f"{name} is not wrapped on this Python or platform")
    return found[0]


def _kept_in_a_class(func: Any) -> list[Any]:
    # Where programs keep a function: a class attribute (read from the class
    # and from an instance) and a dataclass field's default. What each read
    # gives (the very object? the same repr?), or the error it raises.
    class Holder:
        kept = func

    @dataclasses.dataclass
    class Config:
        opener: Any = func

    def from_an_instance() -> Any:
        # A C method descriptor refuses, as it is read, an instance of another
        # class; a Python function binds, and its call fails with the same
        # error (documented): compared at the call.
        bound = Holder().kept
        return bound() if inspect.ismethod(bound) and inspect.ismethoddescriptor(func) is False else bound

    outcomes = []
    for read in (lambda: Holder.kept, from_an_instance, lambda: Config().opener):
        status, value = _outcome(read)
        outcomes.append((status, value is func, repr(value) == repr(func)) if status == "ok" else (status,))
    return outcomes


@pytest.mark.parametrize("name", _patch_ids())
def test_a_wrapper_kept_in_a_class_or_a_dataclass_default_is_the_very_object(patched: list[Any], name: str) -> None:
    # A class made after start-up, holding the wrapper: it reads back as the
    # object the module holds (same repr, same pickling), as the original
    # would in a class made before. Then stop(): the kept wrapper calls the
    # original at once; start again: it is the module's object once more.
    target, original, wrapper = _found(patched, name)
    assert _kept_in_a_class(wrapper) == _kept_in_a_class(original)
    aiocop.stop()
    if isinstance(wrapper, _standin.BuiltinLike):
        assert wrapper.__func__ is original  # staticmethod's callable: the builtin, with no Python frame between
    else:
        assert wrapper.__code__ is _standin.PASS_THROUGH
    aiocop.start_blocking_io_detection()
    assert getattr(_wrappers._resolve_owner(target.owner), target.attr) is wrapper


def test_a_kept_wrapper_detects_nothing_after_stop_and_again_after_a_new_start(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    aiocop.start_blocking_io_detection()
    try:

        class Kept:
            stat = os.stat
            send = socket.socket.send
            acquire = type(threading.Lock()).acquire  # set on the C type (aiocop._interception.typepatch)

        aiocop.stop()
        monkeypatch.setattr(_wrappers, "_audit_hook", lambda event, args: seen.append(event))

        async def calls() -> None:
            Kept.stat(".")
            a, b = socket.socketpair()
            with a, b:
                Kept.send(a, b"x")
            lock = threading.Lock()
            Kept.acquire(lock)
            lock.release()
            await asyncio.sleep(0)

        asyncio.run(calls())
        assert seen == []
        collector = Collector()
        aiocop.start_blocking_io_detection()
        aiocop.register_slow_task_callback(collector)
        asyncio.run(calls())
        assert "os.stat" in collector.names()
    finally:
        reset_aiocop()


@pytest.mark.parametrize("name", _patch_ids())
def test_a_wrapper_given_what_is_not_its_object_raises_as_the_original(patched: list[Any], name: str) -> None:
    # Called unbound with an object of the wrong type (or a module function
    # with a wrong argument), outside a loop and inside a task: the same
    # exception, the same message, and at most one more traceback entry.
    _, original, wrapper = _found(patched, name)

    def failure(func: Any) -> tuple[str, str, int]:
        try:
            func(object())
        except Exception as error:
            return type(error).__name__, str(error), len(traceback.extract_tb(error.__traceback__))
        return "returned", "", 0

    async def in_a_task(func: Any) -> tuple[str, str, int]:
        return failure(func)

    for where in ("outside a loop", "in a task"):
        if where == "in a task":
            got, expected = asyncio.run(in_a_task(wrapper)), asyncio.run(in_a_task(original))
        else:
            got, expected = failure(wrapper), failure(original)
        assert got[:2] == expected[:2], where
        assert expected[2] <= got[2] <= expected[2] + 1, where


def test_pytest_hides_the_wrapper_frame(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(
        """
        import asyncio, os
        import aiocop

        def test_stat_fails():
            aiocop.start_blocking_io_detection()
            try:
                async def main():
                    os.stat("/no/such/file")
                asyncio.run(main())
            finally:
                aiocop.stop()
        """
    )
    result = pytester.runpytest(*QUIET)
    result.assert_outcomes(failed=1)
    output = result.stdout.str()
    assert "FileNotFoundError" in output
    assert 'os.stat("/no/such/file")' in output
    assert "_interception/wrappers.py" not in output


def test_a_wrapped_call_is_one_frame_deeper_at_most() -> None:
    # The stack the original sees (here a Python original, Event.wait, whose
    # condition's wait counts the frames above it), with aiocop and without.
    def depth_at_the_wait() -> int:
        depth: list[int] = []
        event = threading.Event()

        def counting_wait(timeout: float | None = None) -> bool:
            depth.append(len(traceback.extract_stack()))
            return True

        condition: threading.Condition = vars(event)["_cond"]  # the event's own (CPython's Event)
        condition.wait = counting_wait  # type: ignore[method-assign]  # in place of the real wait

        async def main() -> None:
            event.wait(5)
            depth.append(len(traceback.extract_stack()))

        asyncio.run(main())
        return depth[0] - depth[1]

    without = depth_at_the_wait()
    aiocop.start_blocking_io_detection()
    try:
        assert without <= depth_at_the_wait() <= without + 1
    finally:
        reset_aiocop()


def test_a_wrapped_function_as_a_class_attribute_is_not_bound() -> None:
    # C builtins are not descriptors: `sleep = time.sleep` in a class body
    # stays a plain function of the instance (never given `self`).
    aiocop.start_blocking_io_detection()
    try:

        class Backoff:
            # Typed as attributes of the instance: mypy would read them as methods.
            sleep: Callable[[float], None] = time.sleep
            stat: Callable[[str], os.stat_result] = os.stat

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
# its subprocess is given 60 s: the test's own timeout sits above it, so that bound fires first (issue 36)
@pytest.mark.timeout(90)
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


@pytest.mark.timeout(150)  # two programs in turn, each given 60 s (run_python's default)
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


# its subprocess is given 60 s: the test's own timeout sits above it, so that bound fires first (issue 36)
@pytest.mark.timeout(90)
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


@pytest.mark.timeout(270)  # its program is given 240 s; the test's own timeout sits above it
def test_stdlib_idioms_behave_identically_with_and_without_aiocop(tmp_path: Any) -> None:
    # tests/support/transparency_idioms.py runs each idiom outside any loop and inside
    # a task; every outcome (result, or exception type, errno and message)
    # must be the same whether aiocop watches or not.
    outputs = {}
    for mode in ("off", "on"):
        work = tmp_path / mode
        work.mkdir()
        done = subprocess.run(
            [sys.executable, os.path.join(ROOT, "tests", "support", "transparency_idioms.py"), mode, str(work)],
            capture_output=True,
            text=True,
            timeout=240,
            env={**os.environ, "PYTHONPATH": ROOT},
            check=False,
        )
        assert done.returncode == 0, done.stderr
        outputs[mode] = done.stdout.splitlines()
    assert len(outputs["off"]) == len(outputs["on"]) >= 2 * 45
    different = [(off, on) for off, on in zip(outputs["off"], outputs["on"], strict=True) if off != on]
    undocumented = [(off, on) for off, on in different if _idiom_of(off) not in DOCUMENTED_DIFFERENCES]
    assert undocumented == [], "\n".join(f"without: {off}\n   with: {on}" for off, on in undocumented)


def _idiom_of(line: str) -> str:
    return line.split(" ", 2)[1].rstrip(":")  # "in-loop NAME: returned ..."


def test_the_documented_differences_are_in_the_docs() -> None:
    with open(os.path.join(ROOT, "docs", "concepts", "guarantees.md")) as page:
        text = page.read()
    assert set(IDIOMS) >= DOCUMENTED_DIFFERENCES
    assert [name for name in sorted(DOCUMENTED_DIFFERENCES) if f"`{name}`" not in text] == []


@pytest.mark.parametrize("module", ["os", "threading", "socket", "queue", "time", "select"])
# its subprocess is given 60 s: the test's own timeout sits above it, so that bound fires first (issue 36)
@pytest.mark.timeout(90)
def test_reloading_a_patched_module_keeps_detection_and_prints_nothing(module: str) -> None:
    # importlib.reload() runs the module's code again (os.stat the builtin
    # again, threading.Event a new class): aiocop wraps them again at once,
    # os.stat stays the object it was, and nothing is printed, then or at exit
    # (reloading threading used to end aiocop's threads with a KeyError; aiocop._interception.reload).
    result = run_python(
        """
        import asyncio, importlib, os, queue, socket, sys, threading
        import aiocop
        aiocop.start_blocking_io_detection()
        names = []
        record = lambda event: names.extend(b["name"] for b in event.blocking_events)
        aiocop.detect_slow_tasks(threshold_ms=30, on_slow_task=record)
        stat = os.stat
        importlib.reload(importlib.import_module(sys.argv[1]))
        async def main():
            os.stat(".")
            threading.Event().wait(0.001)
            a, b = socket.socketpair()
            with a, b:
                b.send(b"x")
                a.recv(1)
        asyncio.run(main())
        print(os.stat is stat, sorted(set(names)))
        aiocop.stop()
        print(os.stat is not stat, os.stat(".").st_mode == stat(".").st_mode)
        """,
        module,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    first, second = result.stdout.splitlines()
    assert first == "True ['os.stat', 'socket.socket.recv', 'socket.socket.send', 'threading.Event.wait']"
    assert second == "True True"


# What a program sees of how it was started: printed by the program itself,
# then compared between a plain run and a run under `python -m aiocop run`.
# The stack is cut at aiocop's first frame (aiocop's own, and those of runpy
# that `python -m aiocop` runs in).
_RUN_PROBE = '''
"""The probe's docstring."""
import inspect, os, pickle, re, sys

def function():
    pass

def shown(value):
    return re.sub(r" at 0x[0-9a-f]+", "", repr(value))

print(sorted((k, type(v).__name__ if k == "__builtins__" else shown(v)) for k, v in globals().items() if k[:2] == "__"))
print(type(__loader__).__name__, getattr(__loader__, "name", None), getattr(__loader__, "path", None))
print(sys.argv, sys.path[0], sys._getframe().f_code.co_filename)
print(sys.modules["__main__"] is sys.modules[__name__], pickle.loads(pickle.dumps(function)) is function)
stack = []
for info in inspect.stack():
    if f"{os.sep}aiocop{os.sep}" in info.filename:
        break
    stack.append((info.filename, info.function))
print(stack)
if "fail" in sys.argv:
    raise ValueError("the program's own error")
'''


def _run(cwd: Any, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")},
        check=False,
    )


def _traceback_of(stderr: str) -> str:
    start = stderr.index("Traceback")
    return stderr[start : stderr.index("ValueError", start)]


@pytest.mark.parametrize(
    "how", [("script", "probe.py"), ("script", "sub/probe.py"), ("module", "pkg.probe"), ("module", "pkg")]
)
@pytest.mark.parametrize("fail", [False, True])
def test_the_cli_runs_a_program_as_python_does(tmp_path: Any, how: tuple[str, str], fail: bool) -> None:
    # __name__, __file__, __loader__, __spec__, __builtins__, sys.argv,
    # sys.path[0], the stack under the program and the traceback of its
    # uncaught error: as with `python script.py` / `python -m module`.
    (tmp_path / "sub").mkdir()
    (tmp_path / "pkg").mkdir()
    for path in ("probe.py", "sub/probe.py", "pkg/probe.py", "pkg/__main__.py"):
        (tmp_path / path).write_text(_RUN_PROBE)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    kind, target = how
    program = ([target] if kind == "script" else ["-m", target]) + ["an", "--arg"] + (["fail"] if fail else [])
    plain = _run(tmp_path, *program)
    watched = _run(tmp_path, "-m", "aiocop", "run", *program)
    assert watched.stdout == plain.stdout
    assert (watched.returncode, plain.returncode) == ((1, 1) if fail else (0, 0)), watched.stderr
    if fail:
        assert _traceback_of(watched.stderr) == _traceback_of(plain.stderr)


def test_the_cli_main_called_in_process_runs_the_program_the_same_way(tmp_path: Any) -> None:
    # aiocop._commands.cli.main() (the CLI run from another program's process) runs
    # the program under its own functions, but with the same globals,
    # sys.argv and sys.path[0]; and puts the caller's back afterwards.
    (tmp_path / "probe.py").write_text(_RUN_PROBE)
    plain = _run(tmp_path, "probe.py", "an", "--arg")
    called = _run(
        tmp_path,
        "-c",
        "import sys; from aiocop._commands.cli import main; "
        "argv, path0, mod = sys.argv[:], sys.path[0], sys.modules['__main__']; "
        "status = main(['run', 'probe.py', 'an', '--arg']); "
        "print(status, sys.argv == argv, sys.path[0] == path0, sys.modules['__main__'] is mod)",
    )
    assert called.returncode == 0, called.stderr
    # Everything but the stack (aiocop's functions are under the program here).
    assert called.stdout.splitlines()[:4] == plain.stdout.splitlines()[:4]
    assert called.stdout.splitlines()[-1] == "0 True True True"
