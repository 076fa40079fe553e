"""Turning a step's raw records into a `SlowTaskEvent` and handing it to callbacks.

Delivery normally happens on the loop's thread, in the callback the hook
scheduled with `loop.call_soon` at the step's first blocking call. With
`delivery="thread"`, or when a loop stopped before that callback could run,
a worker thread delivers instead (`worker`). The event itself is built by
`building`; this module decides who delivers which step, and when: claiming
a loop's batch once its iteration is over, handing the watchdog's stalls to
the io event of the same step (or reporting them alone), and delivering
what a stopping loop leaves behind before its run returns.

May import: aiocop._common, aiocop._model, aiocop._interception, aiocop._stalls, and building and worker.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from typing import TYPE_CHECKING, cast

from aiocop._common import forksafe as _forksafe
from aiocop._common.clock import perf_counter
from aiocop._interception import harmless as _harmless
from aiocop._interception import hook as _hook
from aiocop._interception import loops as _loops
from aiocop._interception.trio_runs import is_run
from aiocop._model import callbacks as _callbacks
from aiocop._model import state as _state
from aiocop._model.events import SlowTaskEvent
from aiocop._reporting import building as _building
from aiocop._reporting import worker as _worker_module
from aiocop._stalls import attribution as _attribution
from aiocop._stalls import timing as _timing
from aiocop._stalls import watchdog as _watchdog
from aiocop._stalls.state import state_of

if TYPE_CHECKING:
    import contextvars
    from asyncio import AbstractEventLoop
    from collections.abc import Callable

    from aiocop._interception.hook import StepGroup
    from aiocop._interception.loops import LoopWatch
    from aiocop._stalls.attribution import Stall
    from aiocop._stalls.state import LoopState


# Bound once: _deliver runs once per step, on the loop's thread (a module attribute is a look-up more).
_new_object, _set_attribute = _building.new_object, _building.set_attribute
_step_fields, _NO_CONTEXT = _building.step_fields, _building.NO_CONTEXT


def deliver_now(group: StepGroup, origin: _building.Origin | None = None) -> None:
    """Build the event and run providers and callbacks (in the step's context)."""
    state = _hook.current_state()
    was_busy, state.busy = state.busy, True  # a callback's own blocking calls are not reported
    try:
        _deliver(group, origin if origin is not None else _building.Origin(group.loop))
    finally:
        state.busy = was_busy


def _deliver(group: StepGroup, origin: _building.Origin) -> None:
    # deliver_now without the busy flag, which the caller holds. Called once
    # per group, after the step (group.t_end is set).
    if not group.records and not group.dropped:
        return  # reset_blocking_events() emptied it
    task = group.task
    try:
        if group.imports:
            _harmless.note_failed_imports(group.records)
        provided = group.provided
        if provided is None and _callbacks.providers:
            provided = _callbacks.capture_context()  # providers registered after the step's first call
        # _building.lazy_event, inline (once per step, on the loop's thread). The task
        # itself stands for its name while the callbacks run: get_name()
        # formats a default name ("Task-N") at its first call, 1 800
        # instructions per step on 3.12, for a field few callbacks read.
        event = _new_object(SlowTaskEvent)
        _set_attribute(event, "_resolve", (_step_fields, origin, group, provided, task, "io_blocking"))
    except Exception:
        _hook.internal_error("delivering an event")
        return
    finally:
        # The event keeps the group for its fields: not what the group holds
        # only to find and run its step (task, context, loop, the key frame).
        group.task = group.key = group.ident = group.loop = None
        group.context = _NO_CONTEXT
    try:
        _callbacks.invoke_callbacks(event)
    finally:
        # An event kept by a callback (or a KeyboardInterrupt's traceback)
        # outlives its delivery: it takes its task's name now, and keeps no
        # task alive. One nobody kept goes with this frame, task and all.
        if task is not None and _refcount(event) > _LOCAL_REFS:
            resolve = _building.resolve_of(event)
            if resolve is not None:
                _set_attribute(event, "_resolve", (*resolve[:4], _hook.task_name(task), *resolve[5:]))


_refcount = sys.getrefcount


def _refs_of_a_local() -> int:
    # What sys.getrefcount() says of an object only a local variable holds,
    # measured as _deliver reads it (3.14 counts the argument's reference no
    # longer). Counted high, the name is read for nothing; never counted low:
    # a kept event with a task, not a name, still has its name to give.
    local = object()
    return _refcount(local)


_LOCAL_REFS = _refs_of_a_local()


def flush(batch: list[StepGroup]) -> None:
    """Run by the loop after the steps of an iteration: they are over, deliver them."""
    # Nothing aiocop does from here is the app's blocking: the thread's state is marked busy, and let go of
    # the batch, in one call into the hook.
    state, was_busy = _hook.start_delivery(batch, perf_counter())
    try:
        _flush(batch)
    finally:
        state.busy = was_busy


def _flush(batch: list[StepGroup]) -> None:
    claimed = _claim(batch)
    if not claimed:
        return
    if _state.config.delivery == "thread":
        _worker.submit(claimed)
        return
    if not _callbacks.listening():
        return  # nobody to tell: no event is built
    origin = _building.Origin(claimed[0].loop)  # a batch is one loop's
    for group in claimed:
        # Each step's providers and callbacks run in (a copy of) its own context.
        group.context.run(_deliver, group, origin)


def _claim(batch: list[StepGroup]) -> list[StepGroup]:
    """The groups of `batch` this delivery takes (`_hook.claim`), with the watchdog's stalls."""
    take = _hook.take
    watches = _loops.watches
    if not watches:
        # No watchdog: nobody hands stalls over, claiming alone decides.
        return [group for group in batch if take(group, None) is not None]
    claimed = []
    # A batch is one loop's, run on its thread: one watch for all its groups.
    watch = watches.get(batch[0].thread_id)
    # Claiming and taking the watchdog's stall under one lock: the watchdog
    # either finds a group unclaimed (and hands it the stall) or sees it
    # taken, never the moment in between. One lock round per batch, taken
    # with the lock's C method (`with` would go through aiocop's wrapper).
    lock = _watchdog.merge_lock
    _acquire(lock)
    try:
        state = state_of(watch) if watch is not None else None
        step = state.step if state is not None else None
        # Only a step the watchdog is looking at has anything to hand over
        # or to tell (_take_stall_of's first test, read once for the batch).
        watched = step is not None and not step.merged
        for group in batch:
            if take(group, None) is not None:
                if watched:
                    _take_stall_of(group, watch, state)  # type: ignore[arg-type]  # watched: watch, state not None
                claimed.append(group)
        if state is not None and claimed:
            # The watchdog reads the last io event delivered (under this
            # lock): the batch's last step, whose end is the latest.
            last = claimed[-1]
            stall = cast("Stall | None", last.stall)
            state.delivered(last.ident, last.t_first if stall is None else min(last.t_first, stall.start), last.t_end)
    finally:
        _release(lock)
    return claimed


_acquire, _release = _forksafe.acquire, _forksafe.release


def take_stall(group: StepGroup) -> None:
    """`group`'s share of the watchdog's view of its step, as a delivery takes it (under merge_lock).

    For a delivery made outside this module: the pytest plugin's `settle()` (`_pytest_support.events`),
    which delivers the running task's own step from inside it, claims the group as `_claim` does and must
    take the stall with it, or the step would be reported twice (its event, and the watchdog's stall).
    """
    watch = _loops.watches.get(group.thread_id)
    if watch is None:
        return
    state = state_of(watch)
    _take_stall_of(group, watch, state)
    stall = cast("Stall | None", group.stall)
    state.delivered(group.ident, group.t_first if stall is None else min(group.t_first, stall.start), group.t_end)


def _take_stall_of(group: StepGroup, watch: LoopWatch, state: LoopState) -> None:
    # Under merge_lock. If the watchdog is watching this very step stall, its
    # samples join this event and it will not report the stall again. If it
    # is watching another step, seen running after this step's first
    # blocking call, this step had ended when that one began (steps of one
    # thread never overlap): its event does not last into that step (a
    # task's call followed, in the same loop iteration, by another task's
    # CPU-bound step, a stall or one the looks have not yet seen run for the
    # threshold: a step after another is decided on its looks alone, and
    # an event delivered meanwhile ran on into the stall, 40 to 120 ms).
    step = state.step
    stall = cast("Stall | None", group.stall)
    if step is not None and not step.merged and stall is None:
        if step.ident is group.ident:
            if step.stalled:
                step.merged = True
                stall = group.stall = _timing.stall_of(step, step.start(), group.t_end, watch)
        elif step.t_last > group.t_first:
            group.t_end = max(group.t_first, min(group.t_end, step.known_since()))
    if stall is not None:
        stall.release()  # the io event knows its task: keep no frame, task or context alive


def attach_to_io(watch: LoopWatch, stall: Stall) -> bool:
    """Give `stall` to an io event of its step still waiting for delivery; true if one took it (the sink's).

    The watchdog calls it through the sink (`_reporting.sink`), under merge_lock, as a stall ends.
    """
    # Called by the watchdog (under merge_lock) when a stall ends: an io event
    # of the same step still waiting for delivery takes the stall over. An
    # undelivered io event of another step of that thread whose first call
    # falls inside the stall's estimated span contradicts it (steps of one
    # thread never overlap): if the call came while the watchdog still saw
    # the stalled step, that step began after the event's step had ended (the
    # stall's start is an estimate, which may fall a little before the call);
    # if it came after the last look that saw the stalled step, that step had
    # ended by then, and it is the stall's estimated end that ran on (a look
    # long after, with the thread's CPU time of the steps between counted in).
    taken = False
    for group in list(_hook.unclaimed):
        if group.thread_id != watch.thread_id:
            continue
        if group.ident is stall.ident:
            if not taken and group.stall is None and group.t_first <= stall.end:
                group.stall = stall
                taken = True
        elif group.t_first < stall.end and (not group.t_end or group.t_end > stall.start):
            if stall.seen_until and group.t_first > stall.seen_until:
                stall.end = max(stall.seen_until, group.t_first)
            else:
                group.t_end = max(group.t_first, stall.start)
    if taken:
        stall.release()  # the io event knows its task: keep no frame, task or context alive
    return taken


def report_stall(stall: Stall) -> None:
    """Report a stall no io event took, as its own event (the sink's: the watchdog calls it)."""
    if not _state.active:
        stall.release()
        return  # deactivate() pauses stall reports too, as it pauses everything else
    seen = stall.task or _attribution.StalledTask.of(stall.watch.loop, stall.root)
    stall.release()  # the task is known: the event keeps no frame (and its locals), task or context alive
    if not seen.monitored:
        return  # the stalled task runs under monitored(False)
    task, context = seen.task, seen.context

    def deliver() -> None:
        state = _hook.current_state()
        was_busy, state.busy = state.busy, True
        try:
            _callbacks.invoke_callbacks(_building.build_stall_event(stall, task, _callbacks.capture_context()))
        except Exception:
            _hook.internal_error("delivering a stall")
        finally:
            state.busy = was_busy

    loop = stall.watch.loop
    # A trio run's stalls go to the worker: a guest run (anyio's pytest plugin) runs its entry
    # queue only while its host ticks it, and a test's last stall handed there waited for the next test.
    if _state.config.delivery == "loop" and loop is not None and loop.is_running() and not is_run(loop):
        _hand_to_loop(loop, deliver, context)
    elif _state.config.delivery == "loop" and threading.get_ident() == stall.watch.thread_id:
        context.run(deliver)  # the loop's own thread, as the loop stops (loop_stopping)
    else:
        _worker.submit_call(lambda: context.run(deliver))


# Stall reports handed to a loop and not run there yet. The watchdog reports a
# stall just after it ends, which can be after the loop's last iteration: a
# report queued then would wait for the loop's next run, or for ever. Whoever
# pops a report's entry delivers it: the loop, or the worker once that loop
# has stopped (at its stop, or in drain()).
_on_loops: dict[object, tuple[AbstractEventLoop, Callable[[], None]]] = {}


def _hand_to_loop(loop: AbstractEventLoop, deliver: Callable[[], None], context: contextvars.Context) -> None:
    token = object()

    def run_on_loop() -> None:
        if _on_loops.pop(token, None) is not None:
            deliver()

    _on_loops[token] = (loop, lambda: context.run(deliver))
    with contextlib.suppress(RuntimeError):  # closed meanwhile: delivered just below
        loop.call_soon_threadsafe(run_on_loop, context=context)
    if not loop.is_running():  # it stopped while we queued: its stop may have looked before we did
        deliver_stranded()


def deliver_stranded(stopping: AbstractEventLoop | None = None) -> None:
    """Deliver the stall reports queued on loops that are not running (or on `stopping`).

    On the stopping loop's own thread, with `delivery="loop"`, they run here
    and now; the rest go to the worker.
    """
    here = stopping is not None and _state.config.delivery == "loop"
    for token, (loop, run) in list(_on_loops.items()):
        if (loop is stopping or not loop.is_running()) and _on_loops.pop(token, None) is not None:
            if here and loop is stopping:
                run()
            else:
                _worker.submit_call(run)


def loop_stopping(watch: LoopWatch, stopped: float, cpu: float | None) -> None:
    """Called by a loop's own thread as the loop stops, after its last step.

    That step is over: the watchdog's view of it is finished here (a stall
    in it is reported now, not at the watchdog's next look, which can come
    after `asyncio.run()` has returned), and every report of this loop is
    delivered before the loop's run returns: on this thread with
    `delivery="loop"`, by the delivery thread, waited for, with `"thread"`.
    """
    state = _hook.current_state()
    was_busy, state.busy = state.busy, True  # some loops (veloxloop) are still "running" here
    try:
        queued = _worker.pending()
        _watchdog.watchdog.finish(watch, stopped, cpu)
        loop = watch.loop
        if loop is not None:
            deliver_stranded(loop)
        if _worker.pending() > queued or (_state.config.delivery == "thread" and queued):
            _worker.wait(_worker_module.STOP_WAIT_S)
    finally:
        state.busy = was_busy


def _claim_all(groups: list[StepGroup]) -> list[StepGroup]:
    # Under merge_lock, as every claim: the watchdog hands a stall to an
    # unclaimed group (attach_to_io) only while no delivery is taking it.
    lock = _watchdog.merge_lock
    _acquire(lock)
    try:
        return [g for g in groups if _hook.claim(g)]
    finally:
        _release(lock)


def deliver_orphans(groups: list[StepGroup], at_boundary: bool) -> None:
    """Deliver steps whose loop stopped before their delivery callback ran (the sink's: the hook calls it)."""
    # Steps whose loop stopped before their delivery callback ran. At a loop
    # boundary (on that thread, as its loop stops or the next one starts, no
    # loop running) they are delivered before the loop's run returns, like
    # every other event; found later, by another loop's step, off the loop.
    claimed = _claim(groups)
    if not claimed:
        return
    here = at_boundary and all(g.thread_id == threading.get_ident() for g in claimed)
    if here and _state.config.delivery == "loop":
        for group in claimed:
            if not group.t_end:
                group.t_end = perf_counter()
            group.context.copy().run(deliver_now, group)
        return
    _worker.submit(claimed)
    if here:
        _worker.wait(_worker_module.STOP_WAIT_S)


_worker = _worker_module.Worker(deliver_now, _claim_all)


def drain() -> None:
    deliver_stranded()
    _worker.drain()


def shut_down_worker() -> None:
    """End the delivery thread once what is queued has been handled.

    For the attach agent (`_commands.attach.agent`), leaving a target whose aiocop it loaded itself: the
    modules go, and must leave no thread of theirs behind.
    """
    _worker.shutdown()


atexit.register(drain)


def _after_fork_in_child() -> None:
    # The parent's pending steps are the parent's to deliver: a child that
    # delivered them too would report every one of them twice.
    _hook.forget_steps_after_fork()
    _on_loops.clear()
    _worker.reinit_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
