"""What the watchdog's discovery of unannounced loops must never do (issue 29, review findings 3-6).

Run by tests/stalls/test_discovery.py in a process of its own (`python -m
tests.support.discovery_cases`), with aiocop not set up: no watchdog runs, and no
loop announces its start. Each case parks threads where it needs them (in a
generator's body: a "step" on the stack; or in a C call: the innermost
frame is the function's own), takes the watchdog's looks itself
(`look`: `Finder.read`, `Finder.look`, and at a scan `Finder.scan`), and
says what happened. Nothing depends on timing: every thread waits on a gate
until the looks are done. Prints one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import uvloop

from aiocop._common.clock import perf_counter
from aiocop._interception import loops as _loops
from aiocop._stalls import discovery as _discovery

if TYPE_CHECKING:
    import contextvars
    from collections.abc import Callable

    from typing_extensions import TypeVarTuple, Unpack

    Ts = TypeVarTuple("Ts")  # call_soon_threadsafe's arguments, as typeshed types them

WAIT_S = 30.0  # for a thread to reach its parking place: a busy machine's worst day


def look(finder: _discovery.Finder, *, scan: bool = False) -> list[Any]:
    """One look of the watchdog's (its poll's discovery calls), from this thread."""
    frames = sys._current_frames()
    frames.pop(threading.get_ident(), None)
    watches, now = _loops.watches, perf_counter()
    readings = finder.read(frames, watches, now, scan=scan)
    found = finder.look(frames, readings, now)
    if scan:
        finder.scan(frames, watches)
    return found


def rows(gate: threading.Event, inside: threading.Event) -> Any:
    yield 1
    inside.set()
    gate.wait(WAIT_S)  # parked inside the generator: a step on this thread's stack
    yield 2


def start(target: Any, *args: Any, name: str) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    thread.start()
    return thread


class Loops:
    """uvloop loops running in threads, unannounced (aiocop is not set up), stopped at the end."""

    def __init__(self) -> None:
        self.running: list[tuple[asyncio.AbstractEventLoop, threading.Thread]] = []

    def stepping(
        self, name: str, gate: threading.Event, new_loop: Any = uvloop.new_event_loop
    ) -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
        # A loop whose task's step waits on `gate` (a hang, as the watchdog would see it).
        loop = new_loop()
        inside = threading.Event()

        async def step() -> None:
            inside.set()
            gate.wait(WAIT_S)

        def run(loop: asyncio.AbstractEventLoop) -> None:
            loop.run_until_complete(step())

        thread = start(run, loop, name=name)
        inside.wait(WAIT_S)
        self.running.append((loop, thread))
        return loop, thread

    def close(self) -> None:
        for loop, thread in self.running:
            if loop.is_running():
                loop.call_soon_threadsafe(loop.stop)
            thread.join(WAIT_S)
            _loops.unregister(thread.ident or 0)
        _discovery._probed.clear()


def wait_for(condition: Any) -> bool:
    event = threading.Event()
    for _ in range(int(WAIT_S * 100)):
        if condition():
            return True
        event.wait(0.01)
    return False


def case_wrong_thread() -> dict[str, object]:
    """A thread outside any loop, iterating a generator, holding another thread's running loop (finding 3).

    That loop runs from a script's frame (`loop.run_forever()` at module
    level): idle, it is found there by the scan, and registers itself from
    its own thread.
    """
    other = uvloop.new_event_loop()
    started = threading.Event()
    other.call_soon(started.set)
    code = compile("loop.run_forever()", "<script>", "exec")
    other_thread = start(exec, code, {"loop": other}, name="uvloop-thread")
    started.wait(WAIT_S)
    gate, inside = threading.Event(), threading.Event()

    def export(loop: asyncio.AbstractEventLoop) -> int:  # sync code; `loop` runs elsewhere
        return sum(1 for _ in rows(gate, inside))

    worker = start(export, other, name="export")
    inside.wait(WAIT_S)
    # The same, in a module-level frame whose globals hold that loop.
    gate2, inside2 = threading.Event(), threading.Event()
    namespace = {"rows": rows, "gate": gate2, "inside": inside2, "loop": other}
    script = start(exec, compile("for _ in rows(gate, inside): pass", "<script>", "exec"), namespace, name="script")
    inside2.wait(WAIT_S)
    try:
        finder = _discovery.Finder()
        look(finder, scan=True)
        wrong = sorted(w.thread_name for w in _loops.watches.values() if w.thread_id != other_thread.ident)
        answered = wait_for(lambda: other_thread.ident in _loops.watches)
        return {"registered_on_wrong_threads": wrong, "registered_on_its_own_thread": answered}
    finally:
        gate.set()
        gate2.set()
        worker.join(WAIT_S)
        script.join(WAIT_S)
        other.call_soon_threadsafe(other.stop)
        other_thread.join(WAIT_S)
        for thread_id in list(_loops.watches):
            _loops.unregister(thread_id)
        _discovery._probed.clear()


def case_stepping_found_at_once() -> dict[str, object]:
    """A loop in its task's step (a hang) is registered at the look that sees it, on its own thread."""
    loops = Loops()
    gate = threading.Event()
    try:
        _, thread = loops.stepping("stepping", gate)
        # One of the application's own class, a subclass of asyncio's (a
        # Python loop: bounded by its own frames, no edge).
        _, own_thread = loops.stepping("own-class", gate, AppLoop)
        found = look(_discovery.Finder())
        threads = {thread.ident: "stepping", own_thread.ident: "own-class"}
        result: dict[str, object] = {
            "found": sorted((threads.get(w.thread_id, w.thread_name), w.base_frame is not None) for w in found)
        }
        gate.set()
        return result
    finally:
        gate.set()
        loops.close()


class AppLoop(asyncio.SelectorEventLoop):
    """An application's subclass of asyncio's loop."""


class Lazy:
    """The mechanism of django.utils.functional.LazyObject, reduced: `__class__` evaluates the factory."""

    _factory: Callable[[], object]
    _wrapped: object

    def __init__(self, factory: Any) -> None:
        self.__dict__["_factory"] = factory
        self.__dict__["_wrapped"] = None

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        if self._wrapped is None:
            self.__dict__["_wrapped"] = self._factory()
        return type(self._wrapped)


class AppLoopProxy(asyncio.AbstractEventLoop):
    """An application's facade over its loop: asked anything, it runs the application's code (and raises).

    Only what the watchdog might ask of a loop is written: mypy calls it
    abstract where it is made (asyncio's base class is no ABC at run time).
    """

    calls: list[str] = []  # noqa: RUF012

    def is_running(self) -> bool:
        AppLoopProxy.calls.append(threading.current_thread().name)
        raise NotImplementedError

    def call_soon_threadsafe(
        self, callback: Callable[[Unpack[Ts]], object], *args: Unpack[Ts], context: contextvars.Context | None = None
    ) -> Any:
        AppLoopProxy.calls.append(threading.current_thread().name)
        raise NotImplementedError


def case_application_objects() -> dict[str, object]:
    """Lazy proxies and loop facades in the frames looked at: nothing of theirs runs (finding 4)."""
    evaluated: list[str] = []
    AppLoopProxy.calls.clear()

    def load_user() -> dict[str, str]:
        evaluated.append(threading.current_thread().name)
        return {"user": "alice"}

    gate, park = threading.Event(), threading.Lock()
    park.acquire()
    inside = threading.Event()

    def handler() -> int:  # a step on the stack, objects in the frame below it
        user, proxy = Lazy(load_user), AppLoopProxy()  # type: ignore[abstract]  # noqa: F841 - a facade: see its class
        return sum(1 for _ in rows(gate, inside))

    # A script's frame (its locals are a dict: read on every Python) idle in a C call.
    namespace = {"park": park, "user": Lazy(load_user), "proxy": AppLoopProxy()}  # type: ignore[abstract]  # a facade
    code = compile("park.acquire()\npark.release()", "<script>", "exec")
    threads = [start(handler, name="handler"), start(exec, code, namespace, name="script")]
    inside.wait(WAIT_S)
    wait_for(lambda: all(_top_is_script(t) for t in threads[1:]))
    failed = None
    finder = _discovery.Finder()
    try:
        look(finder, scan=True)
        look(finder)
    except Exception as exc:  # the look must not fail
        failed = repr(exc)
    gate.set()
    park.release()
    for thread in threads:
        thread.join(WAIT_S)
    return {"lazy_evaluated_on": evaluated, "proxy_asked_on": list(AppLoopProxy.calls), "look_failed": failed}


def _top_is_script(thread: threading.Thread) -> bool:
    frame = sys._current_frames().get(thread.ident or 0)
    return frame is not None and frame.f_code.co_filename == "<script>"


def case_one_bad_thread() -> dict[str, object]:
    """One thread whose examination fails: the look goes on with the others, said once (finding 4)."""
    loops = Loops()
    gate, inside = threading.Event(), threading.Event()
    records: list[logging.LogRecord] = []

    class Recording(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Recording()
    logger = logging.getLogger("aiocop")
    logger.addHandler(handler)
    original = _discovery._step_edge
    bad = start(lambda: sum(1 for _ in rows(gate, inside)), name="bad")
    inside.wait(WAIT_S)

    def step_edge(frame: Any) -> Any:
        if _frames_thread(frame) == bad.ident:
            raise RuntimeError("an object no one foresaw")
        return original(frame)

    _discovery._step_edge = step_edge
    failed = None
    try:
        _, good = loops.stepping("good", gate)
        finder = _discovery.Finder()
        found: list[Any] = []
        try:
            for _ in range(3):
                found += look(finder)
                examined = finder.threads.get(bad.ident or 0)
                if examined is not None:
                    examined.cpu = None  # walk it again, as if it had used CPU
        except Exception as exc:
            failed = repr(exc)
        return {
            "look_failed": failed,
            "found": [w.thread_id == good.ident for w in found],
            "logged": len([r for r in records if "unannounced" in r.getMessage()]),
        }
    finally:
        _discovery._step_edge = original
        logger.removeHandler(handler)
        gate.set()
        bad.join(WAIT_S)
        loops.close()


def _frames_thread(frame: Any) -> int | None:
    return next((tid for tid, f in sys._current_frames().items() if f is frame), None)


def case_keep_alive() -> dict[str, object]:
    """Objects the application deletes are freed right away, whatever the watchdog looked at (finding 5)."""
    freed: dict[str, bool] = {}
    closed: list[str] = []

    class Connection:
        def __init__(self, name: str) -> None:
            self.name = name

        def __del__(self) -> None:
            closed.append(self.name)

    park, gate, inside = threading.Lock(), threading.Event(), threading.Event()
    park.acquire()

    def idle() -> None:  # the innermost frame, in a C call (what the scan reads for an idle C loop)
        conn = Connection("idle")
        park.acquire()
        del conn
        freed["idle"] = "idle" in closed
        park.release()

    def stepping() -> None:  # a step on the stack, the connection in the frame below it
        conn = Connection("stepping")
        for _ in rows(gate, inside):
            pass
        del conn
        freed["stepping"] = "stepping" in closed

    threads = [start(idle, name="idle"), start(stepping, name="stepping")]
    inside.wait(WAIT_S)
    wait_for(lambda: _top_name(threads[0]) == "idle")
    finder = _discovery.Finder()
    look(finder, scan=True)
    look(finder)
    gate.set()
    park.release()
    for thread in threads:
        thread.join(WAIT_S)
    return {"freed_at_del": freed}


def _top_name(thread: threading.Thread) -> str:
    frame = sys._current_frames().get(thread.ident or 0)
    return "" if frame is None else frame.f_code.co_name


def case_parked_threads() -> dict[str, object]:
    """A look reads the CPU clocks of threads that may start a step, not of parked ones (finding 6)."""
    park = threading.Lock()
    park.acquire()
    parking = threading.Semaphore(0)

    def parked() -> None:
        parking.release()
        park.acquire()

    threads = [start(parked, name=f"parked-{i}") for i in range(50)]
    for _ in threads:
        parking.acquire()
    clocks = {time.pthread_getcpuclockid(t.ident or 0) for t in threads}
    reads = [0]
    original = _discovery._read

    def counting(clock: int | None) -> float | None:
        reads[0] += clock in clocks
        return original(clock)

    finder = _discovery.Finder()
    # Scans until one sees them all where the previous one did (a thread
    # still on its way into acquire() used CPU since): parked.
    idents = {t.ident for t in threads}
    wait_for(lambda: not look(finder, scan=True) and not idents & finder.hot.keys())
    _discovery._read = counting
    try:
        look(finder)
        finder.quiet(_loops.watches)
        per_look = reads[0]
        reads[0] = 0
        look(finder, scan=True)
        per_scan = reads[0]
    finally:
        _discovery._read = original  # (the parked threads stay parked: daemons, gone with this process)
    return {"clock_reads_per_look": per_look, "clock_reads_per_scan": per_scan}


def main() -> None:
    cases = {
        "wrong_thread": case_wrong_thread,
        "stepping": case_stepping_found_at_once,
        "application_objects": case_application_objects,
        "one_bad_thread": case_one_bad_thread,
        "keep_alive": case_keep_alive,
        "parked_threads": case_parked_threads,
    }
    print(json.dumps({name: case() for name, case in cases.items()}))


if __name__ == "__main__":
    main()
