"""Switches shared by the hook, the wrappers and the public API.

Global switches are module attributes (read on the hot path as one global
look-up); per-scope switches are context variables, so a task created inside
a scope inherits it and one created outside does not.
"""

from __future__ import annotations

import weakref
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from asyncio import Task

from aiocop._model.severity import THRESHOLD_HIGH

Delivery = Literal["loop", "thread"]


@dataclass
class Config:
    trace_depth: int = 20
    threshold_ms: float = 30.0
    delivery: Delivery = "loop"
    max_events_per_step: int = 64
    raise_min_score: int = THRESHOLD_HIGH
    # detect_slow_tasks(hang_after_ms=...): a step still running this long is
    # reported while it runs (reason="hang"); None: never.
    hang_after_ms: float | None = 5000.0


config = Config()

# Whether start_blocking_io_detection() has installed detection (until stop()).
started = False
# Whether it ever has, in this process: activate() sets detection up if not (as 1.x's activate() switched it on).
ever_started = False
# activate()/deactivate(): pause detection without uninstalling anything.
active = True

# raise_on_violations: kept under its 1.x name for code that imported it.
raise_on_violations: ContextVar[bool] = ContextVar("aiocop_raise_on_violations", default=False)

# monitored(False): the code of this context is not watched at all (the ASGI
# middleware's unsampled requests). Read only once a detected call is made on
# a loop, never on the fast path.
monitored: ContextVar[bool] = ContextVar("aiocop_monitored", default=True)
# The same, per task that entered a monitored() scope: the watchdog reads it to
# tell a stalled task's setting on 3.10 and 3.11, whose tasks do not expose
# their context to other threads.
task_monitored: weakref.WeakKeyDictionary[Task[object], bool] = weakref.WeakKeyDictionary()
# Whether a record was ever made: until then no task can have one, and
# needs_task_record skips the look-up (a weak reference made per call, a
# third of an unsampled request's cost in the ASGI middleware). Never reset:
# a record left by a task that died is harmless, the look-up is then made.
task_records_made = False


def needs_task_record(task: object, enabled: bool) -> bool:
    """Whether a `monitored(enabled)` scope entered by `task` must note its setting in `task_monitored`.

    Called once the scope has set the variable. The watchdog reads a stalled
    task's setting from its record if it has one, else from the task's own
    context (`Task.get_context()`, 3.12+; see `_stalls.attribution.StalledTask.of`).
    Where that context shows the setting and no enclosing scope left a
    record, none is needed: the scope costs a fraction. A task without
    `get_context()` (3.10, 3.11), or one that does not run in the context it
    reports (veloxloop 0.2), needs the record.
    """
    get_context = getattr(task, "get_context", None)
    return (
        get_context is None
        or get_context().get(monitored, True) is not enabled
        or (task_records_made and task in task_monitored)
    )
