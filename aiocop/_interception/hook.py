"""The audit hook: the one place every detected blocking call passes through.

`audit_hook` is called by CPython for every audit event of every thread, so it
is written for speed: an event aiocop does not care about costs one dict miss,
and a thread that is not running an event loop costs one more C call
(`asyncio._get_running_loop`, a per-thread slot). Only then does the slow path
run (the rest of `audit_hook`, then `_capture`), on the loop's thread, inside
the offending step.

A trio task's step is found the same way, off every asyncio loop: trio's run
namespace for the thread names the task running a step (`trio_runs`), and the
walk stops at trio's dispatch frame; the step's calls are delivered when it
ends, by an instrument `trio_runs.TrioRun` adds to the run for that step.

No event loop method is wrapped. A step's edges are found from the stack: the
walk from the blocking call stops at the task's coroutine frame, at a Python
loop's dispatch frame (`Handle._run`, ...) or at the frame that entered a
loop written in C (learned from the `sys.set_asyncgen_hook_*` events every
loop raises when it starts). The first blocking call of a step schedules one
delivery callback with `loop.call_soon`; it runs after the step, so callbacks
never run inside the hook.
"""

from __future__ import annotations

import logging
import socket
import sys
import threading
from asyncio import AbstractEventLoop, Task, current_task
from asyncio import _get_running_loop as get_running_loop
from contextvars import Context, copy_context
from types import FunctionType
from typing import TYPE_CHECKING, Any

from aiocop._common.clock import perf_counter
from aiocop._interception import allow as _allow
from aiocop._interception import frames as _frames
from aiocop._interception import harmless as _harmless
from aiocop._interception import loops as _loops
from aiocop._interception import rules as _rules
from aiocop._interception import wrappers as _wrappers
from aiocop._interception.frames import MAX_WALK, Kind
from aiocop._interception.internals import IMPORT_EVENTS
from aiocop._interception.trio_runs import TRIO_PACKAGE_PREFIX, TrioRun, TrioTask, run_namespace, run_of
from aiocop._model import callbacks as _callbacks
from aiocop._model import state as _state

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import CodeType, FrameType

    from aiocop._interception.sink import Sink

logger = logging.getLogger("aiocop")

_WRAPPERS_MODULE = _wrappers.__name__
# Handle._run's module: a new frame for every callback and task step, the step's identity.
_ASYNCIO_DISPATCH = "asyncio.events"
_WRAPPERS_GLOBALS = vars(_wrappers)  # the f_globals of every wrapper's frame
_BUFFER_TYPES = (bytes, bytearray, memoryview)
# Arguments summarised at the call (see _summarize): buffers, which must not
# be kept alive until delivery, and sockets, whose state by then (closed,
# fd=-1) says nothing of the call.
_SUMMARIZED_TYPES = (*_BUFFER_TYPES, socket.socket)
# Argument types never summarised, told apart by their exact type.
_PLAIN_ARG_TYPES = frozenset({str, int, float, bool, type(None)})
_IMPORT_EVENTS = frozenset(IMPORT_EVENTS)
_UNSET: Any = _allow._UNSET  # the allow caches' "never compiled"
_SCOPED_RULES = _allow.ScopedRules
_LOOP_BOUNDARY_EVENTS = ("sys.set_asyncgen_hook_firstiter",)


class _Rule:
    __slots__ = ("boundary", "condition", "raises", "weight")

    def __init__(
        self,
        weight: int,
        condition: Callable[[tuple[Any, ...]], bool] | None,
        boundary: bool,
        raises: Callable[[tuple[Any, ...]], bool] | None = None,
    ) -> None:
        self.weight = weight
        self.condition = condition
        self.boundary = boundary
        # Whether raise_on_violations may stop this call (given its arguments);
        # None: always. Read only when raising is on.
        self.raises = raises


# The hook's lookup: `dict.get` of a table compiled from the live rules, or of
# an empty dict while detection is off. It is the hook's default argument, not
# a module global: a local is the fastest read there is, swapping the defaults
# tuple is atomic (a hook running in another thread sees the old table or the
# new one), and it survives the interpreter's shutdown, which sets module
# globals to None while the hook (which cannot be removed) still runs.
_NO_RULES: dict[str, _Rule] = {}
# trio's run namespace (`trio_runs.run_namespace`), None until the program
# imports trio. A module global, not a third default: it is read only for a
# call off every asyncio loop (a program without trio pays that one read),
# where a default would cost every audit event of the process; None at
# shutdown, it reads as "no trio".
_trio: Any = None


def rebuild() -> None:
    """Compile the hook's table from the live rules and the on/off switches."""
    if not (_state.started and _state.active):
        audit_hook.__defaults__ = (None, _NO_RULES.get, _NATIVE)
        wrapper_hook.__defaults__ = (None, _NO_RULES.get, _WRAPPED)
        return
    table: dict[str, _Rule] = {
        event: _Rule(
            weight,
            _rules.CONDITION_CHECKS.get(event),
            False,
            _rules.RAISE_CHECKS.get(event),
        )
        for event, weight in _rules.live_weights().items()
    }
    for event in _LOOP_BOUNDARY_EVENTS:
        table[event] = _Rule(0, None, True)
    audit_hook.__defaults__ = (None, table.get, _NATIVE)
    wrapper_hook.__defaults__ = (None, table.get, _WRAPPED)
    learn_trio()


def learn_trio() -> None:
    """Give the hook and the wrappers trio's run namespace, once the program has imported trio."""
    global _trio
    if _trio is None:
        _trio = run_namespace()
        _wrappers.use_trio(_trio)


# Where the caller of an event is, in frames out from _capture (0: _capture, 1:
# the hook): an event CPython raises comes from the caller itself (2), one a
# wrapper hands to `wrapper_hook` from the wrapper's frame (the caller is 3).
_NATIVE = 2
_WRAPPED = 3


def audit_hook(  # noqa: PLR0912 - one function on purpose: a call costs more than its branches
    event: str,
    args: tuple[Any, ...],
    _loop: object = None,
    _lookup: Callable[[str], _Rule | None] = _NO_RULES.get,
    _caller: int = _NATIVE,
) -> None:
    # Hot path: keep the two early exits first and allocation-free. The slow
    # path is inlined below (a Python call costs more than the rest of it).
    rule = _lookup(event)
    if rule is None:
        return
    # A wrapper hands over the running loop its gate has just found: the look
    # is not made twice per call (on 3.10 and 3.11 asyncio's C look-up is a
    # getpid() system call, its fork check; issue 39). Once trio is imported
    # the gate may find a trio task instead, so the hook looks for itself.
    loop: AbstractEventLoop | TrioRun | None = (
        _loop if _loop is not None and _trio is None else get_running_loop()  # type: ignore[assignment]
    )
    trio_task: TrioTask | None = None
    if loop is None:
        if rule.boundary:
            _on_loop_boundary()
            return
        if _trio is None:
            return
        # No asyncio loop on this thread: a trio task's step, if trio's run
        # namespace for this thread names a task (a dict read, no call into trio).
        namespace = _trio.__dict__
        trio_task = namespace.get("task")
        if trio_task is None:
            return
        loop = _trio_run(namespace.get("runner"))
    elif rule.boundary:
        return
    # The allow rules that can match the event: `_allow.matcher`, its caches
    # read inline (a call costs more), the global rules', or the one kept on a
    # scope's rules (see ScopedRules). A call allowed wherever it is made (a
    # rule naming only events, as `with allow_blocking("open"):` in a handler)
    # is settled here, before the call of _capture; one whose rules are not
    # compiled yet is left to _capture, which compiles them under `busy`.
    allow: _allow.Matcher | None = None
    scoped = _allow.scoped_rules.get()
    if _allow._global_rules or scoped:
        if not scoped:
            allow = _allow._global_matchers.get(event, _UNSET)
        elif type(scoped) is _SCOPED_RULES and scoped.generation == _allow._generation:
            allow = scoped.matchers.get(event, _UNSET)
        else:
            allow = _UNSET
        if allow is not None and allow is not _UNSET and allow.always:
            return
    try:
        state: ThreadState = _local.state  # no builtin getattr() call: the except runs once per thread
    except AttributeError:
        state = current_state()
    if state.busy or not _state.monitored.get():
        return
    condition = rule.condition
    if condition is not None and not condition(args):
        return
    state.busy = True
    try:
        captured = _capture(event, args, rule.weight, loop, state, trio_task, _caller, allow)
        if _callbacks.call_observers and captured is not None and captured is not _DROPPED:
            _callbacks.observe_call(captured)
    except Exception:
        captured = None
        internal_error()
    finally:
        state.busy = False
    if (
        captured is not None
        and rule.weight > 0
        and _state.raise_on_violations.get()
        and (rule.raises is None or rule.raises(args))
    ):
        group = state.group  # the one _capture recorded the call in
        if group is not None:
            _raise_violation(group, None if captured is _DROPPED else captured)


# The hook the wrappers call: the same code, told by its default that the
# caller is one frame further out (a frame _capture then need not look at).
wrapper_hook = FunctionType(audit_hook.__code__, audit_hook.__globals__, "audit_hook", (None, _NO_RULES.get, _WRAPPED))


def _trio_run(runner: object) -> TrioRun:
    # The running trio run's stand-in, kept per thread (a thread runs one trio run at a time).
    # (The same stand-in as the watchdog's watch of the run: run_of.)
    state = current_state()
    run = state.trio_run
    if run is None or run.runner_ref() is not runner:
        run = state.trio_run = run_of(runner)
    return run


def task_name(task: Task[Any] | TrioTask) -> str:
    """The name of a step's task: an asyncio task's `get_name()`, a trio task's `name`."""
    get_name = getattr(task, "get_name", None)
    return str(get_name() if get_name is not None else getattr(task, "name", "?"))


def _raise_violation(group: StepGroup, record: Record | None) -> None:
    if group.score < _state.config.raise_min_score or _make_violation is None:
        return
    if record is not None and group.raised is None:
        group.raised = record
    # Raised from the hook, the exception aborts the call before it runs
    # and surfaces at the offending line, inside the offending task.
    raise _make_violation(group)


class ThreadState:
    """What the hook keeps per thread (one instance per thread, see `current_state`).

    The hook writes it, with two exceptions, each through this module: `busy` is also set, around their own
    work on a loop's thread, by the parts that run code there (delivery and its callbacks, building an
    event's fields, the watchdog starting its thread), so that the hook does not report aiocop's own calls
    as the app's; and a delivery lets go of its batch through `start_delivery`, of everything after a fork
    through `forget_steps_after_fork`.
    """

    __slots__ = ("base_frame", "busy", "group", "pending", "pending_loop", "thread_id", "thread_name", "trio_run")

    def __init__(self) -> None:
        self.busy = False  # inside the hook's slow path or a delivery: ignore events
        self.group: StepGroup | None = None  # the step currently collecting events
        # Steps of this loop iteration waiting for the one delivery callback
        # scheduled by the first of them (None once that callback has run).
        self.pending: list[StepGroup] | None = None
        # The loop that delivery callback was scheduled on (not read from the
        # batch's groups: a group delivered early, by drain() or the pytest
        # plugin, has let go of its loop).
        self.pending_loop: AbstractEventLoop | TrioRun | None = None
        self.trio_run: TrioRun | None = None  # the trio run this thread last made a blocking call in
        # The frame that called into a running event loop written in C: the
        # outer edge of its steps. Held only while that loop runs (see
        # _on_loop_boundary).
        self.base_frame: FrameType | None = None
        thread = threading.current_thread()
        self.thread_id = thread.ident or 0
        # Read again whenever a loop starts on the thread (Thread.name is a
        # property: too dear to read per step), as the watchdog does.
        self.thread_name = thread.name


# One attribute of a threading.local, holding a plain object: an attribute of a
# threading.local costs a per-thread dict look-up on every access, an
# attribute of a slotted object a pointer read, and the hook makes several.
_local = threading.local()


def current_state() -> ThreadState:
    """This thread's hook state (created on first use)."""
    state: ThreadState | None = getattr(_local, "state", None)
    if state is None:
        state = _local.state = ThreadState()
    return state


# One intercepted call, kept raw (formatting waits until someone reads it):
# (event, args, trace, site, time, weight). `trace` is the first frames as
# (code, f_lasti), innermost first; `site` the user's frame; `time` the
# perf_counter() of the call. A plain tuple: the hot path builds one per call.
# `app`: the innermost frame of the application's own code (not an installed
# library's), when there is one.
Record = tuple[
    str,
    tuple[Any, ...],
    list[tuple["CodeType", int]],
    "tuple[CodeType, int] | None",
    float,
    int,
    "tuple[CodeType, int] | None",
]


class StepGroup:
    """The blocking calls of one step of one loop, delivered together.

    One is made per step with a blocking call, in `_capture`, which sets
    the fields below directly (an __init__ would cost a second Python call;
    calling the class, which has none, costs less than `object.__new__`);
    reporting makes one the same way for a stall that no blocking call came
    with (`building`). The fields most steps never change are class-level
    defaults. Once the step is over, the group is whoever claimed it's
    (`take`): delivery, or the worker, sets when it ended and the stall that
    joins it. Once delivered, the group is what its event's fields are
    computed from, and drops what it held only to find and run its step
    (loop, key and task become None, context an empty one).
    """

    loop: AbstractEventLoop | TrioRun | None
    key: object  # what identifies the step: its task, or a callback's outermost frame
    # The step as the watchdog names it (`_stacks.step_of`): asyncio's
    # dispatch frame, else the step's outermost frame. A stall of this very
    # step joins its event; any other step's stall is its own event.
    ident: object = None
    task: Task[Any] | TrioTask | None
    thread_id: int
    thread_name: str
    context: Context  # a copy of the context at the step's first blocking call
    records: list[Record]
    t_first: float  # perf_counter() of the first blocking call

    dropped = 0  # blocking calls not kept: the step's buffer was full
    score = 0
    imports = False  # a record is an import: what failed to import is noted at delivery
    t_end = 0.0  # perf_counter() when the step was seen to be over
    raised: Record | None = None  # the call raise_on_violations failed first
    # The watchdog's view of this step, if it stalled (a `_stalls.attribution.Stall`): put here and read by
    # delivery, which casts it. Typed `object`: the hook neither reads it nor may know the watchdog's types.
    stall: object = None
    # What the context providers returned at the step's first blocking call,
    # inside the step (as 1.x did): a provider may read state that is gone
    # once the step is over. None: no provider was registered then.
    provided: dict[str, Any] | None = None


# Groups scheduled for delivery and not yet delivered. Whoever pops a
# group (the loop's delivery callback, or the off-loop fallback when a loop
# stopped first) delivers it; dict.pop is atomic, so it happens once.
unclaimed: dict[StepGroup, StepGroup] = {}
# The installed sink's callables (install_sink), bound to names of this module so that the hot path
# reads one global each, as it would a function of its own. None until detection starts: nothing is
# delivered. _flush: (batch of groups) -> None, run on the loop thread after the steps; _orphans: groups
# whose loop stopped before their delivery callback ran (`at_boundary`: called as a loop starts or stops
# on this thread); _make_violation: the exception raised by raise_on_violations.
_flush: Callable[[list[StepGroup]], None] | None = None
_orphans: Callable[[list[StepGroup], bool], None] | None = None
_make_violation: Callable[[StepGroup], BaseException] | None = None

# While the watchdog runs (watch_loops): registers the running loop of this thread.
_register_loop: Callable[[AbstractEventLoop | TrioRun, FrameType | None], None] | None = None


def install_sink(sink: Sink) -> None:
    """Hand the steps with blocking calls to `sink` from now on (`_api`, as detection starts)."""
    global _flush, _orphans, _make_violation
    _flush, _orphans, _make_violation = sink.deliver, sink.deliver_orphans, sink.violation


def watch_loops(on: bool) -> None:
    """Whether a step's first blocking call registers its loop if the watchdog does not know it yet.

    `_api` turns it on as the stall watchdog starts and off as it stops: without the watchdog, no loop
    needs registering.
    """
    global _register_loop
    _register_loop = _loops.ensure_registered if on else None


_internal_errors = 0


def internal_error(what: str = "recording a blocking call") -> None:
    """Log that aiocop itself failed while doing `what` (the first three failures of the process), and go on.

    aiocop must never break the application: the hook, and delivery (`_reporting.delivery`, the delivery
    thread of `_reporting.worker`), call this from the handler that contains their own failure, and carry
    on without the event; one count for the process, so that a failure repeated everywhere logs three times.
    """
    global _internal_errors
    _internal_errors += 1
    if _internal_errors <= 3:
        logger.exception("aiocop: internal error while %s (ignored)", what)


# The walk's lists before its first kept frame: empty, never appended to.
_NO_FRAMES: list[Any] = []
# What _capture returns for a call it counted in its step's group (`state.group`)
# but did not record, the step's buffer being full: no tuple is made per call.
_DROPPED: Any = ("dropped",)


def _capture(  # noqa: PLR0912, PLR0915 - one function on purpose: calls cost more than its steps
    event: str,
    args: tuple[Any, ...],
    weight: int,
    loop: AbstractEventLoop | TrioRun,
    state: ThreadState,
    trio_task: TrioTask | None,
    caller: int,
    allow: _allow.Matcher | None,
) -> Record | None:
    """Record the call in its step's group (`state.group`); its record, `_DROPPED`, or `None` if not to be reported.

    A walk up the stack from the caller of the event to the step's edge
    finds the step's frames; it stops at the task's coroutine frame, at a
    Python loop's dispatch frame (`Handle._run`, ...), or at the frame that
    entered a loop written in C (`state.base_frame`). Known-harmless calls
    are dropped at the walk's first frame and allowed ones after it, before
    any of the costly work: only a call to report pays for its trace (the
    first `trace_depth` frames as (code, f_lasti): the line number is worked
    out only when someone formats the event), its user's and application's
    frames, even beyond that depth, the clock and its step's group.

    `allow`: the allow rules that can match the event, as the hook found them
    in the caches (`_UNSET`: not compiled yet for the rules in force).
    """
    if allow is _UNSET:
        allow = _allow.matcher(event, _allow.scoped_rules.get())
        if allow is not None and allow.always:
            return None  # allowed wherever it is made
    base = state.base_frame
    root: FrameType | None = None
    task: Task[Any] | TrioTask | None = trio_task
    if trio_task is not None:
        # A trio step is bounded by trio's own dispatch frame (LOOP_FRAMES):
        # a C loop's entry frame left from before is not on this stack.
        base = None
    elif base is None:
        task = current_task(loop)  # type: ignore[arg-type]  # an asyncio loop: trio's took the branch above
        if task is not None:
            # The task's coroutine frame bounds the step. Only needed when the
            # loop's entry frame is unknown (detection started inside a running
            # loop): reading cr_frame is an audit event of its own.
            root = getattr(task.get_coro(), "cr_frame", None)
    # The step's frames and each one's kind: made at the first frame kept,
    # after the known-harmless and allow rules had their say at it (most
    # allowed or harmless calls are settled there, and make neither list).
    frames: list[FrameType] = _NO_FRAMES
    kinds: list[int] = _NO_FRAMES  # both empty until the first frame
    # For an import: the index in `frames` of the outermost frame that
    # started an import (the line that imported the package whose modules
    # import the rest): the import chain's one application line.
    importer = 0
    outer: FrameType | None = None  # the outermost frame of the step, aiocop's own included
    ident: FrameType | None = None  # asyncio's dispatch frame, where there is one
    module_kinds = _frames._module_kinds
    # 0: _capture, 1: audit_hook, 2: whoever raised the event; for an event
    # CPython raised, that may be one of aiocop's wrappers (calling the
    # original), whose caller is the first frame of interest. An event a
    # wrapper handed over directly starts at its caller: the wrapper's frame
    # is never made an object of (a frame object made costs ~1 k instructions).
    frame: FrameType | None
    if caller == _NATIVE:
        try:
            frame = sys._getframe(2)
        except ValueError:  # raised by C with no Python frame at all (a loop run as a raw thread's first call)
            frame = None
        if frame is not None and frame.f_globals is _WRAPPERS_GLOBALS:
            frame = frame.f_back
    else:
        try:
            frame = sys._getframe(caller)
        except ValueError:  # a wrapper called from C with no Python frame outside (its f_back is None)
            frame = None
    while frame is not None:
        if frame is base:  # (never `root`: there is a root only when there is no base)
            break
        name = frame.f_globals.get("__name__")
        kind = module_kinds.get(name)
        if kind is None:
            kind = _frames.frame_kind(frame)
        if kind:  # not the user's code (USER is 0): the step's edges are among these
            if kind == _AIOCOP:
                if frames and name == _WRAPPERS_MODULE:
                    return None  # nested inside an outer aiocop wrapper: reported once, by it
                outer = frame
                frame = frame.f_back
                continue
            if kind == _LOOP:
                roles = _frames.LOOP_ROLES.get(name)  # type: ignore[arg-type]
                if roles is not None:
                    role = roles.get(frame.f_code.co_name)
                    if role == "dispatch":
                        if name == _ASYNCIO_DISPATCH:
                            ident = frame
                        break
                    if role == "core":
                        return None  # the loop's own machinery, outside any step
            elif kind == _IMPORTLIB:
                if event != "import":
                    return None  # part of an import, reported as the `import` event
                # The import event itself, raised inside the import system
                # (3.15 raises it from importlib's own frames): its caller is
                # the code that imported, past them. And a module being
                # imported that imports: the next frame out started it.
                importer = len(frames)
                outer = frame
                frame = frame.f_back
                continue
        # A module the matcher knows it allows settles it without a call; at
        # the caller, before the harmless rules, which say the same (not
        # reported) for the calls they match.
        if allow is not None and (allow.by_name.get(name) or allow.frame_allowed(frame, name)):
            return None  # the rest of the walk is not needed
        if not frames:
            # The caller. Whether the call is a known-harmless internal is
            # decided here, before the rest of the walk: a debug-mode loop
            # makes hundreds of them per connection. The rules the event and
            # the caller's module leave in play are nearly always none (two
            # dict look-ups, see _harmless).
            in_play = _harmless.in_play.get(event)
            harmless = in_play.get(name) if in_play is not None else None
            if harmless is None:
                harmless = _harmless.rules_in_play(event, name, kind)
            if harmless and _harmless.any_matches(harmless, args, frame, base, loop, event, name):
                return None
        if frames:
            frames.append(frame)
            kinds.append(kind)
        else:
            frames = [frame]
            kinds = [kind]
        outer = frame
        if frame is root or len(frames) >= MAX_WALK:
            break
        frame = frame.f_back
    if not frames:
        return None
    if base is not None:
        task = current_task(loop)  # type: ignore[arg-type]  # an asyncio loop: a trio step has no base
    if ident is None and outer is root and root is not None:
        # The walk stopped at the task's coroutine frame (the loop started
        # before aiocop saw it): name the step as the watchdog does, by
        # asyncio's dispatch frame just outside, so that a stall of this very
        # step joins its event rather than cutting it short.
        ident = _dispatch_outside(root)

    # Only a call to report pays for the trace: the first `trace_depth`
    # frames as (code, f_lasti), the user's frame and the application's,
    # even beyond that depth (reading f_code is an audit event of its own).
    trace: list[tuple[CodeType, int]] = []
    site: tuple[CodeType, int] | None = None
    app: tuple[CodeType, int] | None = None
    trigger: tuple[CodeType, int] | None = None  # an import's first user frame from `importer` out
    depth = _state.config.trace_depth
    app_modules = _frames._app_modules
    # One pass by index (no enumerate(zip(...)) to build and tear down): while
    # under `depth`, every frame joins the trace, so len(trace) == index.
    for index in range(len(frames)):
        frame = frames[index]
        pair: tuple[CodeType, int] | None = None
        if index < depth:
            pair = (frame.f_code, frame.f_lasti)
            trace.append(pair)
        elif site is not None and app is not None:
            break
        if not kinds[index]:
            if site is None:
                site = pair = pair or (frame.f_code, frame.f_lasti)
            if index >= importer:
                if trigger is None:
                    trigger = pair = pair or (frame.f_code, frame.f_lasti)
                if app is None:
                    # _frames.is_app, its cache read inline (a call costs more).
                    in_app = app_modules.get(frame.f_globals.get("__name__"))
                    if in_app is None:
                        in_app = _frames.is_app(frame)
                    if in_app:
                        app = pair or (frame.f_code, frame.f_lasti)
    if app is None and importer:
        # A library's import chain with no application frame (a server
        # importing its protocol modules at start-up): the line that started
        # it, one row for the whole chain, rather than each nested module.
        app = trigger

    now = perf_counter()
    group = state.group
    # A task steps at most once per loop iteration, so the task identifies the
    # step; a plain callback by its outermost frame, not its function: two
    # runs of one function (two requests' callbacks, each in its own context)
    # are two steps. The group holds that frame until delivery, next iteration.
    key: object = task if task is not None else frames[-1]
    if group is None or group.key is not key or group.loop is not loop or group.t_end:
        if group is not None and not group.t_end:
            group.t_end = now  # a new step began, so the previous one had ended
        group = state.group = StepGroup()
        group.loop = loop
        group.key = key
        group.ident = ident if ident is not None else outer
        group.task = task
        group.thread_id = state.thread_id
        group.thread_name = state.thread_name
        group.context = copy_context()
        if _callbacks.providers:
            group.provided = _callbacks.capture_context()  # under `busy`: their own calls are not the app's
        group.records = []
        group.t_first = now
        unclaimed[group] = group
        pending = state.pending
        if pending is not None and state.pending_loop is loop:
            pending.append(group)  # the delivery callback of this iteration is scheduled already
        else:
            _schedule(group, loop, state)
        if _register_loop is not None:
            # A loop the watchdog may not know (one that sets no asyncgen hooks,
            # or bound them before aiocop wrapped them; a trio run already going
            # when detection started), with its edge. Known nearly always: that
            # check is made here (a call costs more).
            watch = _loops.watches.get(state.thread_id)
            if watch is None or watch.loop_ref() is not loop:
                _register_loop(loop, None if trio_task is not None else state.base_frame)
    record: Record = _DROPPED
    if len(group.records) < _state.config.max_events_per_step:
        for arg in args:
            # A path or a number (nearly every call) settles by its exact type.
            if type(arg) not in _PLAIN_ARG_TYPES and isinstance(arg, _SUMMARIZED_TYPES):
                args = _summarize(args)
                break
        record = (event, args, trace, site, now, weight, app)
        group.records.append(record)
        if event in _IMPORT_EVENTS:
            group.imports = True  # what it failed to import is noted at delivery
    else:
        group.dropped += 1
    group.score += weight
    return record


def _dispatch_outside(root: FrameType) -> FrameType | None:
    """asyncio's `Handle._run` frame a few frames outside a task's coroutine frame, if there is one."""
    frame = root.f_back
    for _ in range(4):  # Task.__step_run_and_handle_result, Task.__step, Context.run, Handle._run
        if frame is None:
            return None
        if frame.f_globals.get("__name__") == _ASYNCIO_DISPATCH and _frames.is_step_edge(frame, _ASYNCIO_DISPATCH):
            return frame
        frame = frame.f_back
    return None


# The kinds as plain ints for the walk: reading an enum member is a class
# attribute look-up, comparing with a local int is not.
_USER, _LOOP, _AIOCOP, _IMPORTLIB = int(Kind.USER), int(Kind.LOOP), int(Kind.AIOCOP), int(Kind.IMPORTLIB)


def _summarize(args: tuple[Any, ...]) -> tuple[Any, ...]:
    # Never keep a large buffer alive until delivery: keep its size instead.
    # A socket: what identifies it now, read without a system call.
    return tuple(
        BufferSummary(len(a))
        if isinstance(a, _BUFFER_TYPES)
        else SocketSummary(a)
        if isinstance(a, socket.socket)
        else a
        for a in args
    )


class SocketSummary:
    """A socket as it was at the call: its descriptor, family and type (its repr, read later, says "closed")."""

    __slots__ = ("text",)

    def __init__(self, sock: socket.socket) -> None:
        try:
            family = getattr(sock.family, "name", sock.family)
            kind = getattr(sock.type, "name", sock.type)
            self.text = f"<socket fd={sock.fileno()} {family} {kind}>"
        except Exception:  # an odd subclass: its type name is enough
            self.text = f"<{type(sock).__name__}>"

    def __repr__(self) -> str:
        return self.text


class BufferSummary:
    __slots__ = ("size",)

    def __init__(self, size: int) -> None:
        self.size = size

    def __repr__(self) -> str:
        return f"<{self.size} bytes>"


def _schedule(group: StepGroup, loop: AbstractEventLoop | TrioRun, state: ThreadState) -> None:
    # One delivery callback per loop iteration, not per step: the first step
    # with a blocking call schedules it, later ones in the same iteration join
    # its batch (call_soon'd callbacks run in the next iteration, after them;
    # _capture appends them to `state.pending` itself).
    pending = state.pending
    # A batch of another loop is stale: that loop stopped before its delivery
    # callback ran (loops that raise no start/stop event never reset it).
    if pending is not None:
        stale = [g for g in pending if g in unclaimed]
        if stale and _orphans is not None:
            _orphans(stale, False)  # delivered off the loop, now rather than at exit
    state.pending = pending = [group]
    state.pending_loop = loop
    if _flush is None:
        return
    try:
        loop.call_soon(_flush, pending, context=_EMPTY_CONTEXT.copy())
    except Exception:
        # The loop refused (closing?): the off-loop fallback delivers these
        # when the loop stops or the process exits.
        state.pending = state.pending_loop = None
        logger.debug("aiocop: could not schedule delivery on %r", loop, exc_info=True)


_EMPTY_CONTEXT = Context()


def _on_loop_boundary() -> None:
    # A loop is starting or stopping on this thread; either way it is not the
    # running loop (yet, or any more). The event fires before the hooks change:
    # if they are still a loop's, that loop is stopping.
    state = current_state()
    firstiter = sys.get_asyncgen_hooks().firstiter
    stopping = isinstance(getattr(firstiter, "__self__", None), AbstractEventLoop)
    # For loops written in C, the frame that called into the loop is the
    # outer edge of every step; keep it only while the loop runs.
    if stopping:
        state.base_frame = None
    else:
        # The caller of sys.set_asyncgen_hooks, past aiocop's own wrapper of
        # it (installed with the watchdog).
        frame: FrameType | None
        try:
            frame = sys._getframe(2)
        except ValueError:  # a loop run straight from C (`_thread.start_new_thread(loop.run_forever, ())`)
            frame = None
        while frame is not None and frame.f_globals.get("__name__", "").startswith("aiocop."):
            frame = frame.f_back
        if frame is not None and frame.f_globals.get("__name__", "").startswith(TRIO_PACKAGE_PREFIX):
            # A trio run starting or ending: its steps are bounded by trio's
            # own dispatch frame, and a frame of it kept here would keep the
            # run alive. The hook learns trio's run namespace here, if the
            # program imported trio after detection was set up.
            frame = None
            state.trio_run = None
            learn_trio()
        state.base_frame = frame
        state.thread_name = threading.current_thread().name
    state.group = None
    state.pending = state.pending_loop = None
    # Hand any group whose delivery callback may never run (its loop stopped
    # first) to the off-loop worker.
    ident = threading.get_ident()
    orphans = [g for g in list(unclaimed) if g.thread_id == ident]
    if orphans and _orphans is not None and not state.busy:
        state.busy = True
        try:
            _orphans(orphans, True)
        except Exception:
            internal_error()
        finally:
            state.busy = False


def claim(group: StepGroup) -> bool:
    """Take the right to deliver `group`; true for exactly one caller."""
    return unclaimed.pop(group, None) is not None


# The same, as the bound C method of the groups waiting: `take(group, None)` is the group to whoever takes it
# first, None to the others. For delivery's loop over a batch, where a call of `claim` per group would be a
# Python call, and a trip into this part and back, each.
take = unclaimed.pop


def start_delivery(batch: list[StepGroup], now: float) -> tuple[ThreadState, bool]:
    """The delivery of `batch` begins on this thread: the thread's state, marked busy (aiocop's own work from
    here: nothing is reported), with whether it was busy before (the caller puts that back when done); the
    state lets go of the batch, and a step of it not yet seen to end ends `now`. One call for the delivery
    callback the batch scheduled."""
    state = current_state()
    was_busy, state.busy = state.busy, True
    if state.pending is batch:
        state.pending = state.pending_loop = None
    if state.group is not None and state.group in batch:
        state.group = None
    for group in batch:
        if not group.t_end:
            group.t_end = now
    return state, was_busy


def forget_steps_after_fork() -> None:
    """In a forked child: the parent's steps are the parent's to deliver (a child that delivered them too
    would report each twice), and the forking thread's batch and step are gone with them."""
    unclaimed.clear()
    state = current_state()
    state.pending = state.pending_loop = None
    state.group = None


def reset_current_step() -> None:
    """Forget the blocking calls recorded so far in the current step of this thread."""
    group = current_state().group
    if group is not None and not group.t_end:
        group.records.clear()
        group.dropped = 0
        group.score = 0


_installed = False


def install() -> None:
    """Add the audit hook once per process (audit hooks cannot be removed), and hand it to the wrappers."""
    global _installed
    _wrappers.use_audit_hook(wrapper_hook)
    if not _installed:
        sys.addaudithook(audit_hook)
        _installed = True
