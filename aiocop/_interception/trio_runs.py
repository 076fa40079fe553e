"""trio's run loop as the hook sees it: the trio task running a step on this thread, and that step's end.

trio is not an asyncio loop: `asyncio._get_running_loop()` is None in its tasks. trio names the task
running a step in a per-thread namespace, `trio._core._run.GLOBAL_RUN_CONTEXT` (a `threading.local`:
`task` is set just before a task's step and deleted just after it, `runner` lives as long as the run;
`trio.lowlevel.current_task()` and `in_trio_task()` read it). The hook reads that namespace's dict
itself, when a call it cares about is made off every asyncio loop: ~100 ns where `in_trio_task()`
costs ~1 µs off a task (its `hasattr` raises inside), and nothing per task step, where an instrument
flagging each step (`before_task_step`/`after_task_step`) cost +2.5 µs on every step of every task
(trio 0.35, CPython 3.12, a step ~6-10 µs).
`trio.to_thread.run_sync` runs its function in a worker thread, whose namespace names no task: its
calls are not reported, as `asyncio.to_thread`'s are not.

The stall watchdog watches a trio run as a loop, its `TrioRun` standing for it: registered as the run
installs its asyncgen hooks (`_interception.loops`), its steps bounded by trio's dispatch frame
(`_stalls.stacks`), its heartbeat and its tripwire's arming sent through trio's entry queue
(`TrioRun.call_soon_threadsafe`), its tripwire an instrument's `after_io_wait` (`_stalls.tripwire`):
nothing on the run's steps.

Nothing here imports trio: the namespace is taken from `sys.modules` once the program has imported it
(`run_namespace`), which the hook asks for when detection is set up and whenever a trio run starts.

A step's blocking calls are delivered once the step is over, on the run's own thread, by the run's
`TrioRun` acting as a `trio.abc.Instrument`: added at the step's first blocking call, its
`after_task_step` delivers and removes it. It costs only steps that blocked (+2.8 µs each); an
instrument left in place would cost every step, and `TrioToken.run_sync_soon` +20 µs (a wake-up
write, another task step) and, in a guest run (anyio's pytest plugin), a delivery after the test.
"""

from __future__ import annotations

import logging
import sys
import weakref
from typing import TYPE_CHECKING, Any, Protocol

from aiocop._interception.internals import TRIO_RUN_MODULE

if TYPE_CHECKING:
    from collections.abc import Callable
    from contextvars import Context

    from typing_extensions import TypeIs

logger = logging.getLogger("aiocop")

# Where trio keeps its per-thread run namespace (internals.TRIO_RUN_MODULE, its run loop's module), and the
# package prefix of the code that starts and ends a run (it sets the asyncgen hooks as it does, which the hook sees).
TRIO_RUN_CONTEXT = "GLOBAL_RUN_CONTEXT"
TRIO_PACKAGE_PREFIX = "trio."


class TrioTask(Protocol):
    """What aiocop reads of a `trio.lowlevel.Task`: its name."""

    name: str


_warned = False


def run_namespace() -> Any | None:
    """trio's per-thread run namespace (a `threading.local`) once the program has imported trio; else None."""
    global _warned
    module = sys.modules.get(TRIO_RUN_MODULE)
    if module is None:
        return None
    namespace = getattr(module, TRIO_RUN_CONTEXT, None)
    if namespace is None or not hasattr(namespace, "__dict__"):
        if not _warned:
            _warned = True
            logger.warning(
                "aiocop: trio %s has no %s.%s: blocking calls in trio tasks are not detected with it",
                getattr(sys.modules.get("trio"), "__version__", "?"),
                TRIO_RUN_MODULE,
                TRIO_RUN_CONTEXT,
            )
        return None
    return namespace


def current_runner() -> object | None:
    """The trio run (`Runner`) running on this thread, if any: detection set up inside a run."""
    namespace = run_namespace()
    return None if namespace is None else namespace.__dict__.get("runner")


# Each run's stand-in, for as long as its Runner lives: the hook's events and the watchdog's watch
# name the same object (`run_of`). A Runner is weakly referenceable (attrs' slots keep a weakref).
_runs: weakref.WeakKeyDictionary[object, TrioRun] = weakref.WeakKeyDictionary()


def run_of(runner: object) -> TrioRun:
    """The stand-in of the trio run `runner` (made at its first use: its start, or its first blocking call)."""
    run = _runs.get(runner)
    if run is None:
        run = _runs.setdefault(runner, TrioRun(runner))
    return run


def is_run(loop: object) -> TypeIs[TrioRun]:
    """Whether `loop`, a loop as the watchdog holds one, is a trio run's stand-in (by type: no `__class__` read)."""
    return type(loop) is TrioRun


def is_trio_hook(firstiter: object) -> bool:
    """Whether `firstiter`, given to `sys.set_asyncgen_hooks`, is a trio run's (its start)."""
    module = getattr(firstiter, "__module__", None)
    return type(module) is str and module.startswith(TRIO_PACKAGE_PREFIX)


def current_task() -> TrioTask | None:
    """The trio task running a step on this thread, if any (`trio.lowlevel.current_task()`, without raising).

    For the pytest plugin's `settle()` (`_pytest_support.events`): read from inside a trio task, the
    `aiocop_events` fixture delivers that task's own step as it does an asyncio task's.
    """
    namespace = run_namespace()
    return None if namespace is None else namespace.__dict__.get("task")


class TrioRun:
    """One trio run where aiocop needs an event loop: what a step's calls are delivered on, and named after.

    Also the `trio.abc.Instrument` that delivers them (see the module's docstring), and the loop the
    stall watchdog watches for the run (`_interception.loops`: its `LoopWatch`), answering what the
    watchdog asks of a loop (`is_running`, `call_soon_threadsafe`, `task_of`). One per run (`run_of`),
    made as the run starts (its asyncgen hooks, seen by `_interception.loops`) or at its first blocking
    call; it holds its run's `Runner` weakly.
    """

    __slots__ = ("__weakref__", "_due", "name", "runner_ref", "running")

    def __init__(self, runner: object) -> None:
        self.runner_ref = weakref.ref(runner)
        # Between its start and its stop as `_interception.loops` saw them (the watchdog's watch).
        self.running = False
        # Named as asyncio's loops are ("module.Class@address"); object.__repr__ gives the address
        # without id(), an audited call.
        cls = type(runner)
        address = object.__repr__(runner).rpartition(" at ")[2].rstrip(">")
        self.name = f"{cls.__module__}.{cls.__qualname__}@{address}"
        self._due: list[tuple[Callable[..., object], tuple[Any, ...], Context | None]] = []

    def call_soon(self, callback: Callable[..., object], *args: Any, context: Context | None = None) -> None:
        """Run `callback(*args)` (in `context`) once the running task's step is over, on this thread.

        Called inside that step; raises outside a trio run (the hook then delivers off the run instead).
        """
        if not self._due:
            sys.modules["trio"].lowlevel.add_instrument(self)
        self._due.append((callback, args, context))

    def __dir__(self) -> list[str]:
        # trio's add_instrument looks for hooks in dir(instrument): the one this has, rather than
        # object's 27 names and these slots, makes adding it 3 times cheaper (8.6 µs -> 2.8 µs a step).
        return ["after_task_step"]

    def after_task_step(self, task: object) -> None:
        """trio's instrument hook, run right after the step that added it: deliver that step's calls."""
        due, self._due = self._due, []
        sys.modules["trio"].lowlevel.remove_instrument(self)
        for callback, args, context in due:
            try:
                if context is None:
                    callback(*args)
                else:
                    context.run(callback, *args)
            except Exception:  # trio would disable the instrument and log it: say it is aiocop's
                logger.exception("aiocop: delivering a trio task's blocking calls failed (ignored)")

    def is_running(self) -> bool:
        """Whether the run is going (started, not yet stopped: what the watchdog asks of a loop)."""
        return self.running and self.runner_ref() is not None

    def call_soon_threadsafe(self, callback: Callable[..., object], *args: Any, context: Context | None = None) -> None:
        """Run `callback(*args)` (in `context`) on the run's thread, soon: trio's entry queue (`run_sync_soon`).

        From any thread, as asyncio's `loop.call_soon_threadsafe`, for the watchdog's own short
        callbacks (its heartbeat, its tripwire's arming). Raises RuntimeError once the run is over
        (trio's `RunFinishedError` is one).
        """
        runner: Any = self.runner_ref()
        if runner is None or not self.running:
            raise RuntimeError("the trio run has finished")
        if context is None:
            runner.entry_queue.run_sync_soon(callback, *args)
        else:
            runner.entry_queue.run_sync_soon(context.run, callback, *args)

    def task_of(self, root: object) -> Any:
        """The trio task whose coroutine runs in the frame `root` (None: none), read from any thread."""
        runner: Any = self.runner_ref()
        if runner is None or root is None:
            return None
        try:
            tasks = list(runner.tasks)  # (a copy: the run's thread adds and removes tasks meanwhile)
        except RuntimeError:
            return None
        for task in tasks:
            if getattr(getattr(task, "coro", None), "cr_frame", None) is root:
                return task
        return None

    def get_debug(self) -> bool:
        """Never an asyncio loop in debug mode (the known-harmless rules of debug-mode loops ask)."""
        return False

    def __repr__(self) -> str:
        return f"<aiocop trio run {self.name}>"
