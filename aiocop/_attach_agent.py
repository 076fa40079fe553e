"""What `python -m aiocop attach PID` runs inside the target process.

The attaching side (`_attach`) has CPython 3.14+ run a small bootstrap script
in the target (`sys.remote_exec`, PEP 768) on its main thread, at its next
safe point. The bootstrap imports this module (from the target's own aiocop
if it has one, else from the attaching interpreter's copy, without touching
`sys.path`) and calls `start()`, which returns at once: everything else runs
on a thread of its own, so the target's main thread (often its event loop's)
is held for no longer than the bootstrap's few lines.

The session talks to the attaching side through files in a private folder
(mode 0700, the attaching user's): `status.json` (started, done, or an
error), `report.json` (the summary), and `stop` (written by the attaching
side on Ctrl-C: the session ends early). It detaches on its own at the end
of the window whatever happens to the attaching side: it stops what it
started, and, if aiocop was not in the target before, removes every module
of it from `sys.modules` and the exit handlers it registered (the audit hook
cannot be removed: it is left as a one-dict-miss no-op).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import sys
import threading
import time
from typing import Any

import aiocop
from aiocop import _api, _callbacks, _delivery, _hook, _loops, _state, _watchdog
from aiocop._clock import monotonic
from aiocop._report import Summary

# One session at a time per process: a second attach is told so.
_lock = threading.Lock()
_active: dict[str, Any] | None = None

_POLL_S = 0.05


def start(settings: dict[str, Any]) -> None:
    """Start a session in a thread of its own and return (called on the target's main thread)."""
    threading.Thread(target=_session, args=(settings,), name="aiocop-attach", daemon=True).start()


def _write(folder: str, name: str, document: dict[str, Any]) -> None:
    # Whole or not at all: the attaching side polls for the file.
    path = os.path.join(folder, name)
    partial = path + ".partial"
    with open(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as out:
        json.dump(document, out)
    os.replace(partial, path)


def _told(settings: dict[str, Any], name: str) -> bool:
    """Whether the attaching side left `name` (`stop`, `cancelled`) in its folder."""
    return os.path.exists(os.path.join(settings["folder"], name))


def _session(settings: dict[str, Any]) -> None:
    global _active
    out = settings["out"]  # the folder this process writes in
    if _told(settings, "cancelled"):  # the attaching side gave up before this could start
        _cleanup(settings, (False, False))
        return
    with _lock:
        busy = _active
        if busy is None:
            _active = settings
    if busy is not None:
        _write(out, "status.json", {"state": "error", "error": f"another attach (by PID {busy['by']}) is running"})
        return
    started = (False, False)
    final: dict[str, Any] = {"state": "error", "error": "the session ended early"}
    saved = _settings()
    try:
        started, summary, threshold_ms = _install(settings)
        already = not (started[0] and started[1])
        _write(out, "status.json", {"state": "started", "already_running": already, "threshold_ms": threshold_ms})
        window = _watch(settings)
        _uninstall(summary, started, saved)
        report = {
            "pid": os.getpid(),
            "python": sys.version.split()[0],
            "aiocop": aiocop.__version__,
            "seconds": round(window, 3),
            "threshold_ms": threshold_ms,
            "already_running": already,
            "loops": len(_seen_loops),
            **summary.to_dict(),
        }
        _write(out, "report.json", report)
        final = {"state": "done"}
    except BaseException as error:  # never into the target: said to the attaching side instead
        final = {"state": "error", "error": f"{type(error).__name__}: {error}"}
    finally:
        _cleanup(settings, started)
        with _lock:
            _active = None
        # Last: the attaching side takes this for the target being as it was.
        if not _told(settings, "cancelled"):
            with contextlib.suppress(OSError):
                _write(out, "status.json", final)


_seen_loops: set[int] = set()


def _settings() -> tuple[dict[str, Any], dict[str, Any]]:
    """The target's own settings, put back when the session ends: a session changes none of them."""
    return dict(vars(_state.config)), dict(vars(_watchdog.sampling))


def _install(settings: dict[str, Any]) -> tuple[tuple[bool, bool], Summary, float]:
    """Start what is not running yet; the (interception, watchdog) started here, the summary, the threshold."""
    summary = Summary()
    started_interception = not _state.started
    started_watchdog = not _watchdog.watchdog.running
    if started_interception:
        aiocop.start_blocking_io_detection()
    if started_watchdog:
        # A target running interception alone keeps its own threshold.
        threshold = settings["threshold_ms"] if started_interception else None
        aiocop.detect_slow_tasks(threshold_ms=threshold or _state.config.threshold_ms)
    _callbacks.register_slow_task_callback(summary)
    return (started_interception, started_watchdog), summary, _state.config.threshold_ms


def _watch(settings: dict[str, Any]) -> float:
    """Wait out the window, or until the attaching side says stop; how long it watched."""
    began = monotonic()
    deadline = began + settings["seconds"]
    # `cancelled` (the attaching side gave up) and the folder gone (it cleaned up) are stops too.
    while (
        monotonic() < deadline
        and not _told(settings, "stop")
        and not _told(settings, "cancelled")
        and os.path.isdir(settings["out"])
    ):
        _seen_loops.update(_loops.watches)
        time.sleep(_POLL_S)
    return monotonic() - began


def _uninstall(summary: Summary, started: tuple[bool, bool], saved: tuple[dict[str, Any], dict[str, Any]]) -> None:
    """Stop what this session started, and only that; the target's settings as they were."""
    started_interception, started_watchdog = started
    if started_interception:
        _api.stop_interception()
    if started_watchdog:
        _api.stop_watchdog()
    _delivery.drain()
    _callbacks.unregister_slow_task_callback(summary)
    if not (started_interception and started_watchdog):
        config, sampling = saved
        vars(_state.config).update(config)
        vars(_watchdog.sampling).update(sampling)
        _hook.rebuild()


def _cleanup(settings: dict[str, Any], started: tuple[bool, bool]) -> None:
    """Leave the target as it was: the modules of aiocop this session imported, and their exit handlers, gone."""
    had = set(settings["modules_before"])
    if "aiocop._api" not in had and not _state.started and not _watchdog.watchdog.running:
        atexit.unregister(_api._at_exit)
    if "aiocop._delivery" not in had and not _state.started and not _watchdog.watchdog.running:
        atexit.unregister(_delivery.drain)
        _delivery._worker.shutdown()
    for name in [n for n in sys.modules if (n == "aiocop" or n.startswith("aiocop.")) and n not in had]:
        del sys.modules[name]
        package, _, attribute = name.rpartition(".")
        if package in sys.modules:  # `aiocop._attach_agent`, an attribute of the target's own package too
            with contextlib.suppress(AttributeError):
                delattr(sys.modules[package], attribute)
    if _told(settings, "cancelled"):
        shutil.rmtree(settings["out"], ignore_errors=True)  # nobody will read it
