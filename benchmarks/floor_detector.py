"""The least a pure-Python detector can do for one detected call: a yardstick, not a detector.

`benchmarks/instructions.py --floor` counts what this costs per task next to
aiocop. It keeps only what the "task with one detected blocking call, event
delivered to a callback with a 5-frame trace" target asks for, each in its
cheapest form:

- a wrapper that raises an audit event for `os.stat` on a loop's thread
  (CPython raises none for it);
- an audit hook that skips other events with one set look-up, finds the
  caller's frame (`sys._getframe`, an audit event of its own) and keeps it
  as a (code, f_lasti) pair (`frame.f_code`, another audit event): the
  benchmark task's own frame, the whole of its step's stack, so the one
  frame of its trace (up to five are asked for);
- one record per call, grouped per task, each group with a copy of the
  context it ran in;
- one `loop.call_soon` per loop iteration that delivers every group after its
  step, running each callback in the step's context with a one-slot event.

It leaves out what a detector needs to be right and safe, and aiocop does:
the edges of the step (it traces one frame, the benchmark task's own), other
events and their conditions, allow and known-harmless rules, per-context
monitoring, the guard against its own calls, steps that are plain callbacks,
several loops and threads, bounded buffers, the watchdog's hand-over, error
handling, and events whose fields are computed when read.
"""

from __future__ import annotations

import contextvars
import os
import sys
from asyncio import _get_running_loop as get_running_loop
from asyncio import current_task
from time import perf_counter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

callbacks: list[Callable[[Event], None]] = []
_pending: dict[object, list[Any]] = {}  # task -> [context, records]
_EVENTS = frozenset({"os.stat"})
_stat = os.stat
_audit = sys.audit
_getframe = sys._getframe
_copy_context = contextvars.copy_context


class Event:
    __slots__ = ("group",)
    group: list[Any]


def _wrapper(*args: Any, **kwargs: Any) -> Any:
    if get_running_loop() is not None:
        _audit("os.stat", args[0] if args else kwargs.get("path"))
    return _stat(*args, **kwargs)


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if event not in _EVENTS:
        return
    loop = get_running_loop()
    if loop is None:
        return
    frame = _getframe(2)  # 0: this hook, 1: sys.audit's caller (the wrapper), 2: its caller, the task
    trace = [(frame.f_code, frame.f_lasti)]
    task = current_task(loop)
    group = _pending.get(task)
    if group is None:
        if not _pending:
            loop.call_soon(_flush)
        group = _pending[task] = [_copy_context(), []]
    group[1].append((event, args, trace, perf_counter()))


def _deliver(group: list[Any]) -> None:
    event = Event()
    event.group = group
    for callback in callbacks:
        callback(event)


def _flush() -> None:
    batch = list(_pending.values())
    _pending.clear()
    for group in batch:
        group[0].run(_deliver, group)


def install() -> None:
    """Wrap `os.stat` and add the hook (for the rest of the process)."""
    os.stat = _wrapper
    sys.addaudithook(_hook)
