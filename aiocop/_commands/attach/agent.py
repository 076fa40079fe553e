"""What `python -m aiocop attach PID` runs inside the target process.

The attaching side (`_attach`) has CPython 3.14+ run a small bootstrap script
in the target (`sys.remote_exec`, PEP 768) on its main thread, at its next
safe point. The bootstrap checks that it runs in the process it was written
for, starts a thread named `aiocop-attach` and returns: the target's main
thread (often its event loop's) is held for no longer than its few lines.
That thread loads this module (from the target's own aiocop if it has
imported one, else from the source the attaching side sent, never from a
path) and calls `run()`.

The session talks to the attaching side through files in the exchange folder
(private to the attaching user, or handed to the target's user when root
attaches to another user's process): `status.json` (started, done, or an
error), `report.json` (the summary), both carrying the nonce the bootstrap
was given; `stop` (Ctrl-C on the attaching side: end early) and `cancelled`
(the attaching side gave up: do nothing, remove the folder). It detaches on
its own at the end of the window whatever happens to the attaching side.

On every path, the window over or anything failing on the way (a status file
that cannot be written on a full disk, a start that raises halfway), it
stops what it started and only that, puts the target's settings back and,
if aiocop was not in the target before, removes every module of it from
`sys.modules`, the importer that served them, and the exit handlers they
registered (the audit hook cannot be removed: it is left as a one-dict-miss
no-op). What it could not stop, it leaves importable and says so.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import linecache
import os
import shutil
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import aiocop
from aiocop import _api
from aiocop._common.clock import monotonic
from aiocop._interception import hook as _hook
from aiocop._interception import loops as _loops
from aiocop._model import callbacks as _callbacks
from aiocop._model import state as _state
from aiocop._reporting import delivery as _delivery
from aiocop._reporting.report import Summary
from aiocop._stalls import settings as _stall_settings
from aiocop._stalls import watchdog as _watchdog

if TYPE_CHECKING:
    from collections.abc import Callable

# One session at a time per process: the bootstrap refuses a second while a
# thread named `aiocop-attach` lives; this lock closes the gap for a target's own aiocop.
_lock = threading.Lock()
_active: dict[str, Any] | None = None

_POLL_S = 0.05


def _write(settings: dict[str, Any], name: str, document: dict[str, Any]) -> None:
    # Whole or not at all: the attaching side polls for the file. With the
    # nonce, which tells the attaching side that this agent wrote it.
    path = os.path.join(settings["folder"], name)
    partial = path + ".partial"
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
    with open(os.open(partial, flags, 0o600), "w", encoding="utf-8") as out:
        json.dump({**document, "nonce": settings["nonce"]}, out)
    os.replace(partial, path)


def _told(settings: dict[str, Any], name: str) -> bool:
    """Whether the attaching side left `name` (`stop`, `cancelled`) in the folder."""
    return os.path.exists(os.path.join(settings["folder"], name))


def _attacher_gone(settings: dict[str, Any]) -> bool:
    try:
        os.kill(settings["by"], 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # another user's (root's): alive
    return False


def run(settings: dict[str, Any]) -> None:
    """One session, on the thread the bootstrap started: install, watch, undo, report."""
    global _active
    with _lock:
        busy = _active
        if busy is None:
            _active = settings
    if busy is not None:
        with contextlib.suppress(OSError):
            _write(
                settings, "status.json", {"state": "error", "error": f"another attach (by PID {busy['by']}) is running"}
            )
        return
    try:
        final = _session(settings)
    finally:
        with _lock:
            _active = None
    # Last: the attaching side takes this for the target being as it was.
    if _told(settings, "cancelled") or _attacher_gone(settings):
        shutil.rmtree(settings["folder"], ignore_errors=True)  # nobody will read it
    else:
        with contextlib.suppress(OSError):
            _write(settings, "status.json", final)


def _session(settings: dict[str, Any]) -> dict[str, Any]:
    undo: list[tuple[str, Callable[[], None]]] = []
    saved = _settings()
    summary = Summary()
    collector: Callable[[Any], None] = summary
    if settings.get("pictures"):  # --html and friends: each step kept with its time, as `run` keeps them
        from aiocop._reporting.timeline import Timeline  # noqa: PLC0415 - only for an attach that asked

        collector = timeline = Timeline(summary, STEPS_SENT)
    error: str | None = None
    report: dict[str, Any] | None = None
    try:
        own_watchdog = not _watchdog.watchdog.running
        threshold_ms, already = _install(settings, collector, undo)
        if own_watchdog:  # (a target's own watchdog keeps its own list of loops: left as it was)
            _adopt_running_loops()
        _write(settings, "status.json", {"state": "started", "already_running": already, "threshold_ms": threshold_ms})
        window = _watch(settings)
        report = {
            "pid": os.getpid(),
            "python": sys.version.split()[0],
            "aiocop": aiocop.__version__,
            "seconds": round(window, 3),
            "threshold_ms": threshold_ms,
            "already_running": already,
        }
    except BaseException as failure:  # never into the target: said to the attaching side instead
        error = f"{type(failure).__name__}: {failure}"
    # Everything started is undone, whatever failed above; each step on its own.
    failed = _undo(undo, saved)
    document = None
    if error is None and report is not None:
        # Before the modules go: what builds it may import (a lazy import after
        # `_forget` would load aiocop again, from the target's path).
        try:
            document = {**report, "loops": len(_seen_loops), **summary.to_dict()}
            document["hangs"] = hang_records(summary)
            if collector is not summary:
                document["timeline"] = _timeline_of(timeline, threshold_ms)
        except BaseException as failure:
            error = f"could not make the report: {type(failure).__name__}: {failure}"
    forgotten = _forget(settings, can_forget=not failed)
    if failed:
        left = "" if forgotten or not settings["injected"] else f": aiocop is left loaded in PID {os.getpid()}"
        error = (error + "; " if error else "") + f"could not stop what it started ({'; '.join(failed)}){left}"
    if error is None and document is not None:
        try:
            _write(settings, "report.json", document)
        except BaseException as failure:
            error = f"could not write the report: {type(failure).__name__}: {failure}"
    return {"state": "done"} if error is None else {"state": "error", "error": error}


_seen_loops: set[int] = set()


def _settings() -> tuple[dict[str, Any], dict[str, Any], bool]:
    """The target's own settings, put back when the session ends: a session changes none of them."""
    return dict(vars(_state.config)), dict(vars(_stall_settings.sampling)), _state.ever_started


def _install(
    settings: dict[str, Any], summary: Callable[[Any], None], undo: list[tuple[str, Callable[[], None]]]
) -> tuple[float, bool]:
    """Start what is not running yet, its undoing noted *before* each start (a start can fail halfway)."""
    started_interception = not _state.started
    started_watchdog = not _watchdog.watchdog.running
    # First in, last out: the report's callback hears every event, the pending ones delivered at the end too.
    undo.append(("the report's callback", lambda: _callbacks.unregister_slow_task_callback(summary)))
    _callbacks.register_slow_task_callback(summary)
    if started_interception:
        undo.append(("interception", _api.stop_interception))
        _api.start_blocking_io_detection()
    if started_watchdog:
        undo.append(("the watchdog", _api.stop_watchdog))
        # A target running interception alone keeps its own threshold.
        threshold = settings["threshold_ms"] if started_interception else None
        # A loop hung when the session starts is reported within the window: the attaching side chose when.
        _api.detect_slow_tasks(
            threshold_ms=threshold or _state.config.threshold_ms, hang_after_ms=settings.get("hang_after_ms")
        )
    return _state.config.threshold_ms, not (started_interception and started_watchdog)


# How far up a thread's stack `_running_loop_on` looks for the loop's own frame (`_run_once`, a Runner):
# outside the step, so further than a walk for the step's edge goes (frames.MAX_WALK).
_LOOP_SEARCH_DEPTH = 400


def _adopt_running_loops() -> None:
    """Register the loops already running in a step when the session starts: a loop hung in Python code.

    A loop aiocop was not told about is learnt at its next start, its first
    blocking call, or the watchdog's look at an idle one; a loop stuck in a
    step of pure Python code (an endless loop) gives none of these, and is
    the one an attach is most often for. Its thread's stack shows it: asyncio's
    own iteration (`BaseEventLoop._run_once`, whose `self` is the loop), or,
    for a loop written in C, the `asyncio.Runner` (or 3.10's `asyncio.run`) that
    called into it, which is also where that loop's steps begin.
    """
    runner = getattr(asyncio, "Runner", None)
    for thread_id, frame in sys._current_frames().items():
        if thread_id == threading.get_ident() or thread_id in _loops.watches:
            continue
        found = _running_loop_on(frame, runner)
        if found is not None:
            loop, base = found
            with contextlib.suppress(Exception):  # a loop that stopped meanwhile: nothing to adopt
                if loop.is_running():
                    _loops.register(loop, base, thread_id, discovered=True)


def _running_loop_on(frame: Any, runner: Any) -> tuple[asyncio.AbstractEventLoop, Any] | None:
    f, depth = frame, 0
    while f is not None and depth < _LOOP_SEARCH_DEPTH:
        depth += 1
        module, name = f.f_globals.get("__name__"), f.f_code.co_name
        with contextlib.suppress(Exception):  # another thread's frame, changing under us
            if module == "asyncio.base_events" and name == "_run_once":
                loop = f.f_locals.get("self")
                return (loop, None) if isinstance(loop, asyncio.AbstractEventLoop) else None
            if module == "asyncio.runners":
                held = f.f_locals.get("self")
                loop = getattr(held, "_loop", None) if runner is not None and isinstance(held, runner) else None
                loop = loop if loop is not None else f.f_locals.get("loop")  # 3.10's asyncio.run()
                if isinstance(loop, asyncio.AbstractEventLoop) and loop.is_running():
                    return loop, f  # a loop in C: its steps start above the frame that called into it
        f = f.f_back
    return None


def _undo(undo: list[tuple[str, Callable[[], None]]], saved: tuple[dict[str, Any], dict[str, Any], bool]) -> list[str]:
    """Undo the steps, last first, each whatever the others do; the steps that failed, said.

    What was started stops first (the watchdog, then interception), then the
    events still pending are delivered, then the report's callback goes.
    """
    failed: list[str] = []
    steps = [*undo[:1], ("pending events", _delivery.drain), *undo[1:]]
    for name, step in reversed(steps):
        try:
            step()
        except BaseException as error:
            failed.append(f"{name}: {type(error).__name__}: {error}")
    config, sampling, ever_started = saved
    vars(_state.config).update(config)
    vars(_stall_settings.sampling).update(sampling)
    _state.ever_started = ever_started
    try:
        _hook.rebuild()
    except BaseException as error:
        failed.append(f"the hook: {type(error).__name__}: {error}")
    return failed


def _watch(settings: dict[str, Any]) -> float:
    """Wait out the window, or until the attaching side says stop; how long it watched."""
    began = monotonic()
    deadline = began + settings["seconds"]
    # `cancelled` (the attaching side gave up) and the folder gone (it cleaned up) are stops too.
    while (
        monotonic() < deadline
        and not _told(settings, "stop")
        and not _told(settings, "cancelled")
        and os.path.isdir(settings["folder"])
    ):
        _seen_loops.update(_loops.watches)
        time.sleep(_POLL_S)
    return monotonic() - began


def _forget(settings: dict[str, Any], *, can_forget: bool) -> bool:
    """Leave the target as it was: the modules of aiocop this session imported, their importer and exit handlers gone.

    Not when something could not be stopped (`can_forget` false): the running
    parts stay reachable, and a later attach finds them. Whether all was removed.
    """
    if not can_forget:
        return False
    had = set(settings["modules_before"])
    idle = not _state.started and not _watchdog.watchdog.running
    if "aiocop._api" not in had and idle:
        _api.unregister_at_exit()
    if "aiocop._reporting.delivery" not in had and idle:
        atexit.unregister(_delivery.drain)
        _delivery.shut_down_worker()
    for name in [n for n in sys.modules if (n == "aiocop" or n.startswith("aiocop.")) and n not in had]:
        del sys.modules[name]
        package, _, attribute = name.rpartition(".")
        if package in sys.modules:  # `aiocop._commands.attach.agent`, an attribute of the target's own package too
            with contextlib.suppress(AttributeError):
                delattr(sys.modules[package], attribute)
    if "aiocop" in had:  # the target's own package: the names its lazy look-ups cached meanwhile go too
        namespace = vars(sys.modules["aiocop"])
        for key in set(namespace) - set(settings["package_before"]):
            del namespace[key]
    finder = settings.get("finder")
    if finder is not None:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(finder)
    return True


# --- what the report carries besides the table: the hung loops, the steps for --html ---------------------------

# Steps kept for --html (each with its frames), and the most the report may
# take (the attaching side refuses one above 16 MiB): steps beyond either are counted, not sent.
STEPS_SENT = 2000
_MAX_TIMELINE_BYTES = 12 << 20
_MAX_HANG_FRAMES = 100
# What the attaching side accepts of a context (keys, and characters of each value) and of a source line.
_CONTEXT_KEYS = 50
_TEXT = 1000


def _context(context: dict[Any, Any]) -> dict[str, str]:
    # A provider's value may be anything, and long: its text, cut.
    items = list(context.items())[:_CONTEXT_KEYS]
    return {str(k)[:200]: (v if isinstance(v, str) else repr(v))[:_TEXT] for k, v in items}


def hang_records(summary: Summary) -> list[dict[str, Any]]:
    """Each hung loop's latest hang report, with its stack and the source of each line, read here.

    The source is read in the target, as the target's user: the attaching
    side never opens a file the target names.
    """
    records = []
    for event, ended in summary.hangs():
        samples = event.cpu_stack_samples
        frames = samples[0].get("frames", ()) if samples else ()
        records.append(
            {
                "elapsed_ms": round(event.elapsed_ms, 3),
                "hang_reports": event.hang_reports,
                "task": event.task_name,
                "thread": event.thread_name,
                "loop": event.loop,
                "culprit": event.culprit,
                "call_site": event.call_site,
                "context": _context(event.context),
                "blocker": event.blocker,
                "blocker_trace": event.blocker_trace,
                "stack": [
                    [str(file), int(line), str(function), linecache.getline(file, line).strip()[:_TEXT]]
                    for file, line, function in list(frames)[:_MAX_HANG_FRAMES]
                ],
                "trace": samples[0]["trace"] if samples else "",
                "ended_after_ms": None if ended is None else round(ended.hung_ms, 3),
            }
        )
    return records


def _timeline_of(timeline: Any, threshold_ms: float) -> dict[str, Any]:
    """The steps of the HTML report's model (`_timeline.build`), within the report's size limit."""
    from aiocop._reporting import timeline as _timeline  # noqa: PLC0415 - loaded already, by the session that asked

    timeline.finish()
    model = _timeline.build(timeline, _timeline.Facts("attach", threshold_ms, "the target's"))
    steps, dropped = model["steps"], model["steps_dropped"]
    for step in steps:
        step["context"] = _context(step["context"])
        for call in step["calls"]:
            call["source"] = call["source"][:_TEXT]
    while steps and len(json.dumps(steps)) > _MAX_TIMELINE_BYTES:  # the first steps kept, as a long run keeps them
        keep = len(steps) // 2
        dropped += len(steps) - keep
        steps = steps[:keep]
    return {"steps": steps, "steps_dropped": dropped, "duration_ms": model["facts"]["duration_ms"]}
