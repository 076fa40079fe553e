"""The pytest plugin's bookkeeping: which events belong to which test phase, and which fail it.

One slow-task callback (`Recorder`) files every event under the test phase
that is running when the event is delivered. Delivery trails the blocking
call a little (after the step, or from the watchdog thread once a stall
ends), so a phase is closed only after `settle()`: the watchdog has looked
at every loop since the phase ended, and everything pending has been
delivered.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from _thread import allocate_lock
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, cast, overload

from aiocop._common import forksafe as _forksafe
from aiocop._common.clock import perf_counter
from aiocop._common.escape import printable
from aiocop._configuration.baseline import Key, call_keys, stall_key
from aiocop._interception import hook as _hook
from aiocop._interception import loops as _loops
from aiocop._interception import trio_runs as _trio_runs
from aiocop._interception.trio_runs import TRIO_PACKAGE_PREFIX
from aiocop._model.events import is_hang_report
from aiocop._model.severity import level_rank, level_threshold
from aiocop._reporting import delivery as _delivery
from aiocop._reporting.report import STALL, call_site, describe, describe_hang, library_site, source_line
from aiocop._stalls import watchdog as _watchdog
from aiocop._stalls.state import state_of

if TYPE_CHECKING:
    from aiocop._interception.allow import AllowRule
    from aiocop._model.events import BlockingEventInfo, SlowTaskEvent

MAX_SHOWN = 10  # events itemised in one failure message
MAX_LIBRARY_SITES = 5  # libraries' call sites given their own allow rule in one failure message
_THROUGH_LOOPS_S = 1.0  # the longest settle() waits for loops in other threads


class Recorder:
    """The session's slow-task callback: appends each event to the phase open when it arrives."""

    def __init__(self) -> None:
        self._lock = _forksafe.lock()
        self._open: list[SlowTaskEvent] | None = None
        # Where hang reports go instead of the test's stderr: the terminal,
        # while a test runs that pytest-timeout ends with os._exit.
        self.hang_out: Callable[[str], None] | None = None

    def __call__(self, event: SlowTaskEvent) -> None:
        if is_hang_report(event):
            # A hang, while the test is stuck in it: into the test's output
            # now (captured, it is shown with the failure, and pytest-timeout
            # shows it when it kills the test). Its step's final event, if it
            # ends, is what can fail the test.
            text = f"aiocop: {describe_hang(event)}"
            out = self.hang_out
            if out is not None:
                out(text)
                return
            with contextlib.suppress(Exception):  # stderr closed or replaced by something odd
                sys.stderr.write(text + "\n")
                sys.stderr.flush()
            return
        with self._lock:
            if self._open is not None:
                self._open.append(event)
            # Events outside every test phase (collection, between tests)
            # belong to no test: nobody can be failed for them.

    @contextlib.contextmanager
    def phase(self, events: list[SlowTaskEvent]) -> Iterator[None]:
        """Collect into `events` while the block runs, and what it left pending when it ends."""
        with self._lock:
            self._open = events
        try:
            yield
        finally:
            try:
                settle()
            finally:
                with self._lock:
                    self._open = None


def settle() -> None:
    """Deliver every event of what has run so far.

    From outside a running loop: wait for the watchdog to look at every loop
    once (a stall that ended is then reported), for the loops still running
    in other threads to run what it handed them, then for the delivery worker.
    From inside a loop (a test reading `aiocop_events`), waiting is out of
    the question: deliver this thread's pending steps, including the one
    running now, whose later calls start a new event. A trio task is inside
    a loop as much as an asyncio one.
    """
    trio_task = _trio_runs.current_task()
    if trio_task is None and asyncio._get_running_loop() is None:
        _watchdog.watchdog.sync()
        _through_running_loops()
        _delivery.drain()
        return
    ident = threading.get_ident()
    task = asyncio.current_task() if trio_task is None else trio_task
    for group in list(_hook.unclaimed):
        if group.thread_id != ident:
            continue
        # Under merge_lock, as the loop's own delivery (_delivery._flush): the
        # watchdog's view of the running step joins its event, or sees it
        # taken, and the step is reported once, not also as a stall.
        with _watchdog.merge_lock:
            if not _hook.claim(group):
                continue
            if not group.t_end:
                group.t_end = perf_counter()
            if task is not None and group.key is task:
                _delivery.take_stall(group)
        group.context.copy().run(_delivery.deliver_now, group)


def _through_running_loops() -> None:
    # The watchdog hands a stall on a loop that still runs (a server in
    # another thread) to that loop: wait until each has run what was queued
    # on it so far. A loop stuck in a stall now would keep the phase waiting
    # for nothing: it is passed over.
    ident = threading.get_ident()
    passed = []
    for watch in list(_loops.watches.values()):
        loop = watch.loop
        step = state_of(watch).step
        if watch.thread_id == ident or loop is None or not loop.is_running() or (step is not None and step.stalled):
            continue
        done = allocate_lock()
        done.acquire()
        try:
            loop.call_soon_threadsafe(done.release)
        except RuntimeError:  # closed meanwhile
            continue
        passed.append((loop, done))
    deadline = perf_counter() + _THROUGH_LOOPS_S
    for loop, done in passed:
        # In short waits (the C method: no wrapper): a loop that stops first never runs it.
        while not _forksafe.acquire(done, True, 0.001) and loop.is_running() and perf_counter() < deadline:
            pass


class EventLog(Sequence["SlowTaskEvent"]):
    """The events of the running test's body: what the `aiocop_events` fixture gives.

    A read-only sequence of `aiocop.SlowTaskEvent`s, in delivery order. Every
    read first delivers what is pending, so a blocking call is in the log on
    the next line of the test, even before the test awaits anything.

    A test that requests the fixture is not failed by aiocop: it asserts on
    the events itself.

    Added in 2.0.
    """

    def __init__(self, events: list[SlowTaskEvent]) -> None:
        self._events = events

    def _current(self) -> list[SlowTaskEvent]:
        settle()
        return list(self._events)

    @overload
    def __getitem__(self, index: int) -> SlowTaskEvent: ...
    @overload
    def __getitem__(self, index: slice) -> list[SlowTaskEvent]: ...
    def __getitem__(self, index: int | slice) -> SlowTaskEvent | list[SlowTaskEvent]:
        return self._current()[index]

    def __len__(self) -> int:
        return len(self._current())

    def __iter__(self) -> Iterator[SlowTaskEvent]:
        return iter(self._current())

    def __repr__(self) -> str:
        return f"<aiocop EventLog {self.names()!r}>"

    @property
    def calls(self) -> list[BlockingEventInfo]:
        """Every blocking call of every event, in order."""
        return [call for event in self._current() for call in event.blocking_events]

    def names(self) -> list[str]:
        """The event name of each blocking call (e.g. `"open"`), and `"stall"` for each stall."""
        names: list[str] = []
        for event in self._current():
            if event.reason == "cpu_blocking":
                names.append(STALL)
            names.extend(call.get("name", call["event"]) for call in event.blocking_events)
        return names

    def clear(self) -> None:
        """Forget the events so far (e.g. those of the test's own preparation)."""
        settle()
        self._events.clear()


def is_stall(event: SlowTaskEvent) -> bool:
    """Whether the watchdog saw the step hold its loop past the threshold."""
    return event.exceeded_threshold and (event.reason == "cpu_blocking" or bool(event.cpu_stack_samples))


def failing(
    events: Sequence[SlowTaskEvent],
    fail_on: str,
    stalls: bool,
    rules: Sequence[AllowRule],
    known: frozenset[Key] | None = None,
) -> list[SlowTaskEvent]:
    """The events that fail a test.

    Blocking calls whose step reaches `fail_on` (calls that weigh nothing,
    such as `os.getcwd`, never do); and, if `stalls`, steps the watchdog saw
    stuck past the threshold whose impact reaches `fail_on` (a stall is
    "medium" from the threshold, "high" from twice it), unless an allow rule
    without event names covers their call site (rules naming events only
    ever match intercepted calls). With a baseline (`known`), an event whose
    call sites are all in it fails nothing.
    """
    minimum = max(1, level_threshold(fail_on))
    bad = []
    for event in events:
        blocked = (
            event.reason != "cpu_blocking"
            and event.severity_score >= minimum
            and (known is None or not known.issuperset(call_keys(event)))
        )
        stalled = (
            stalls
            and is_stall(event)
            and level_rank(event.impact) >= level_rank(fail_on)
            and not any(_allows_stall(rule, event) for rule in rules)
            and (known is None or stall_key(event) not in known)
        )
        if blocked or stalled:
            bad.append(event)
    return bad


def baseline_keys(event: SlowTaskEvent) -> list[Key]:
    """What a baseline records of an event that fails a test: its calls' sites, and its stall's."""
    keys = call_keys(event)
    if is_stall(event):
        keys.append(stall_key(event))
    return keys


def _allows_stall(rule: AllowRule, event: SlowTaskEvent) -> bool:
    if rule.events:
        return False
    if rule.module is not None:
        return False  # samples keep file names, not modules: cannot tell
    if rule.path is None and rule.call_site is None:
        return True
    site_file, _, site_func = (rule.call_site or "").rpartition(":")
    for sample in event.cpu_stack_samples[:1]:  # the stack the loop was stuck in most
        for filename, _line, function in sample.get("frames", ()):
            if rule.path is not None and not filename.startswith(rule.path):
                continue
            if rule.call_site is not None and not (function == site_func and filename.endswith(site_file)):
                continue
            return True
    return False


def message(events: Sequence[SlowTaskEvent], phase: str, fail_on: str, threshold_ms: float | None) -> str:
    """The failure message: each offending event with its line and trace, then how to allow it."""
    where = {"setup": "while setting up the test's fixtures", "teardown": "while tearing down the test's fixtures"}
    count = len(events)
    steps = f"{count} step{'s' if count != 1 else ''}"
    criteria = f"fail_on={fail_on}" + (f", threshold_ms={threshold_ms:g}" if threshold_ms is not None else "")
    lines = [f"aiocop: {steps} blocked the event loop {where.get(phase, 'during the test')} ({criteria})"]
    for number, event in enumerate(events[:MAX_SHOWN], 1):
        lines.append("")
        text = _describe_stall(event) if event.reason == "cpu_blocking" else describe(event)
        lines.append(f"[{number}] {text}")
    if count > MAX_SHOWN:
        lines.append(f"... and {count - MAX_SHOWN} more")
    lines.append("")
    lines.extend(_advice(events))
    if any(event.reason == "cpu_blocking" for event in events):
        lines.append(
            "A stall is allowed only by a rule without event names: @pytest.mark.aiocop_allow() "
            "(or with path=/call_site=), or a higher --aiocop-threshold-ms."
        )
    return "\n".join(lines)


def _advice(events: Sequence[SlowTaskEvent]) -> list[str]:
    # What to do about the calls: where the application made them, make them
    # non-blocking; where a library did, the fix is the library's, and the
    # rule to write meanwhile allows that one call site, not the call everywhere.
    own: set[str] = set()
    libraries: dict[tuple[str, str], set[str]] = {}
    for event in events:
        for call in event.blocking_events:
            name = printable(call.get("name", call["event"]))  # (the program's names: escaped for the terminal)
            site = library_site(call)
            if site is None:
                own.add(name)
            else:
                libraries.setdefault((printable(site[0]), printable(site[1])), set()).add(name)
    lines = []
    if own:
        names = sorted(own)
        quoted = ", ".join(f'"{name}"' for name in names)
        # A trio run is named after its Runner (trio._core._run.Runner@...): offload the trio way there.
        on_trio = any(event.loop.startswith(TRIO_PACKAGE_PREFIX) for event in events)
        offload = "trio.to_thread.run_sync(...), or anyio's" if on_trio else "asyncio.to_thread(...)"
        lines.append(
            f"Make it non-blocking (e.g. await {offload}), or allow it: "
            f"@pytest.mark.aiocop_allow({quoted}) on the test, or a line '{' '.join(names)}' in the ini "
            f"key aiocop_allow."
        )
    for (where, package), called in sorted(libraries.items())[:MAX_LIBRARY_SITES]:
        names = sorted(called)
        quoted = "".join(f'"{name}", ' for name in names)
        lines.append(
            f"{', '.join(names)} in {where} is the library {package}'s call: the fix belongs in {package} "
            f"(report it there). Meanwhile allow that call site alone: "
            f'@pytest.mark.aiocop_allow({quoted}call_site="{where}") on the test, or a line '
            f"'{' '.join(names)} call_site={where}' in the ini key aiocop_allow."
        )
    if len(libraries) > MAX_LIBRARY_SITES:
        lines.append(f"... and {len(libraries) - MAX_LIBRARY_SITES} more library call sites, allowed the same way.")
    return lines


def _describe_stall(event: SlowTaskEvent) -> str:
    # As _report.describe, plus the source text of the line the loop was
    # stuck on (a failing test should show it), and identical stacks counted
    # once. The task of a stall in a loop's last step has finished before the
    # watchdog reports it: then no task name is known.
    where = f" in task {printable(repr(event.task_name))}" if event.task_name else ""
    lines = [
        f"loop stalled for {event.elapsed_ms:.1f} ms{where} (impact {event.impact}): "
        f"{printable(event.culprit or 'no call to intercept')}"
    ]
    lines.append(f"  at {printable(call_site(event))}")
    samples = event.cpu_stack_samples
    if samples:
        # A sample carries the two keys source_line() reads (entry_point, frames).
        text = source_line(cast("BlockingEventInfo", samples[0]))
        if text:
            lines.append(f"      {printable(text)}")
    counts: dict[str, int] = {}
    for sample in samples:
        counts[sample["trace"]] = counts.get(sample["trace"], 0) + sample["count"]
    total = sum(counts.values())
    for trace, count in sorted(counts.items(), key=lambda item: -item[1])[:3]:
        lines.append(f"  stack ({count} of {total} samples): {printable(trace)}")
    return "\n".join(lines)
