"""The audit hook: the one place every detected blocking call passes through.

`audit_hook` is called by CPython for every audit event of every thread, so it
is written for speed: an event aiocop does not care about costs one dict miss,
and a thread that is not running an event loop costs one more C call
(`asyncio._get_running_loop`, a per-thread slot). Only then does the slow path
(`_record`) run, on the loop's thread, inside the offending step.

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
import sys
import threading
from asyncio import AbstractEventLoop, Task, current_task
from asyncio import _get_running_loop as get_running_loop
from contextvars import Context, copy_context
from time import perf_counter
from typing import TYPE_CHECKING, Any, NamedTuple

from aiocop import _allow, _frames, _internals, _rules, _state
from aiocop._frames import Kind

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import CodeType, FrameType

logger = logging.getLogger("aiocop")

# How far up a stack the walk goes when it finds no edge of the step.
_MAX_WALK = 256
_WRAPPERS_MODULE = "aiocop._wrappers"
_BUFFER_TYPES = (bytes, bytearray, memoryview)
_LOOP_BOUNDARY_EVENTS = ("sys.set_asyncgen_hook_firstiter",)


class _Rule:
    __slots__ = ("boundary", "condition", "weight")

    def __init__(self, weight: int, condition: Callable[[tuple[Any, ...]], bool] | None, boundary: bool) -> None:
        self.weight = weight
        self.condition = condition
        self.boundary = boundary


def _blocking_socket(args: tuple[Any, ...]) -> bool:
    sock: Any = args[0] if args else None
    try:
        return bool(sock.gettimeout() != 0.0)
    except Exception:  # not a socket, or closed: let the call itself decide
        return True


def _positive_delay(args: tuple[Any, ...]) -> bool:
    delay: Any = args[0] if args else None
    return isinstance(delay, (int, float)) and delay > 0


_CONDITIONS: dict[str, Callable[[tuple[Any, ...]], bool]] = {
    "blocking_socket": _blocking_socket,
    "positive_delay": _positive_delay,
}

# The hook's lookup: `dict.get` of a table compiled from the live rules, or of
# an empty dict while detection is off. Rebinding one global is atomic, so a
# hook running in another thread sees either the old table or the new one.
_NO_RULES: dict[str, _Rule] = {}
_lookup: Callable[[str], _Rule | None] = _NO_RULES.get


def rebuild() -> None:
    """Compile the hook's table from the live rules and the on/off switches."""
    global _lookup
    if not (_state.started and _state.active):
        _lookup = _NO_RULES.get
        return
    table: dict[str, _Rule] = {
        event: _Rule(weight, _CONDITIONS.get(_rules.CONDITIONS.get(event, "always")), False)
        for event, weight in _rules.live_weights().items()
    }
    for event in _LOOP_BOUNDARY_EVENTS:
        table[event] = _Rule(0, None, True)
    _lookup = table.get


def audit_hook(event: str, args: tuple[Any, ...]) -> None:
    # Hot path: keep the two early exits first and allocation-free.
    rule = _lookup(event)
    if rule is None:
        return
    loop = get_running_loop()
    if loop is None:
        if rule.boundary:
            _on_loop_boundary()
        return
    if rule.boundary:
        return
    _record(event, args, rule, loop)


class _ThreadState(threading.local):
    busy = False  # inside the hook's slow path or a delivery: ignore events
    group: StepGroup | None = None  # the step currently collecting events
    # Steps of this loop iteration waiting for the one delivery callback
    # scheduled by the first of them (replaced, never cleared, on flush).
    pending: list[StepGroup] | None = None
    # The frame that called into a running event loop written in C: the outer
    # edge of its steps. Held only while that loop runs (see _on_loop_boundary).
    base_frame: FrameType | None = None


thread_state = _ThreadState()


class Record(NamedTuple):
    """One intercepted call, kept raw: formatting waits until someone reads it."""

    event: str
    args: tuple[Any, ...]
    trace: list[tuple[CodeType, int]]  # (code, f_lasti), innermost first
    site: tuple[CodeType, int] | None  # the user's frame
    time: float  # perf_counter()
    weight: int


class StepGroup:
    """The blocking calls of one step of one loop, delivered together."""

    __slots__ = (
        "context",
        "dropped",
        "key",
        "loop",
        "raised",
        "records",
        "score",
        "stall",
        "t_end",
        "t_first",
        "task",
        "thread_id",
        "thread_name",
    )

    def __init__(self, loop: AbstractEventLoop, key: object, task: Task[Any] | None, now: float) -> None:
        self.loop = loop
        self.key = key
        self.task = task
        thread = threading.current_thread()
        self.thread_id = thread.ident or 0
        self.thread_name = thread.name
        self.context: Context = copy_context()
        self.records: list[Record] = []
        self.dropped = 0
        self.score = 0
        self.t_first = now
        self.t_end = 0.0
        self.raised: Record | None = None  # the call raise_on_violations failed first
        self.stall: Any = None  # the watchdog's view of this step, if it stalled


# Groups scheduled for delivery and not yet delivered. Whoever pops a
# group (the loop's delivery callback, or the off-loop fallback when a loop
# stopped first) delivers it; dict.pop is atomic, so it happens once.
unclaimed: dict[StepGroup, StepGroup] = {}
# Set by _delivery: (batch of groups) -> None, run on the loop thread after the steps.
flush_callback: Callable[[list[StepGroup]], None] | None = None
# Set by _delivery: hands groups whose loop stopped before their delivery
# callback ran to the off-loop worker.
orphan_handler: Callable[[list[StepGroup]], None] | None = None
# Set by _delivery: builds the exception raised by raise_on_violations.
make_violation: Callable[[StepGroup], BaseException] | None = None

# Set by _api while the watchdog runs: registers the running loop of this thread.
register_loop: Callable[[AbstractEventLoop], None] | None = None

_internal_errors = 0


def _record(event: str, args: tuple[Any, ...], rule: _Rule, loop: AbstractEventLoop) -> None:
    state = thread_state
    if state.busy or not _state.monitored.get():
        return
    condition = rule.condition
    if condition is not None and not condition(args):
        return
    state.busy = True
    try:
        captured = _capture(event, args, rule.weight, loop, state)
    except Exception:
        captured = None
        _internal_error()
    finally:
        state.busy = False
    if (
        captured is not None
        and rule.weight > 0
        and _state.raise_on_violations.get()
        and captured[0].score >= _state.config.raise_min_score
        and make_violation is not None
    ):
        group, record = captured
        if record is not None and group.raised is None:
            group.raised = record
        # Raised from the hook, the exception aborts the call before it runs
        # and surfaces at the offending line, inside the offending task.
        raise make_violation(group)


def _internal_error(what: str = "recording a blocking call") -> None:
    # aiocop must never break the application: log the first few failures
    # and carry on without the event.
    global _internal_errors
    _internal_errors += 1
    if _internal_errors <= 3:
        logger.exception("aiocop: internal error while %s (ignored)", what)


def _capture(
    event: str, args: tuple[Any, ...], weight: int, loop: AbstractEventLoop, state: _ThreadState
) -> tuple[StepGroup, Record | None] | None:
    task = current_task(loop)
    root: FrameType | None = None
    if task is not None and state.base_frame is None:
        # The task's coroutine frame bounds the step. Only needed when the
        # loop's entry frame is unknown (detection started inside a running
        # loop): reading cr_frame is an audit event of its own.
        root = getattr(task.get_coro(), "cr_frame", None)
    # 0: _capture, 1: _record, 2: audit_hook, 3: whoever raised the event.
    walked = _walk_step(sys._getframe(3), event, root, state)
    if walked is None:
        return None
    frames, kinds = walked
    if _is_allowed(event, args, frames, kinds, loop):
        return None

    trace, site = _trace(frames, kinds, _state.config.trace_depth)

    now = perf_counter()
    group = state.group
    # A task steps at most once per loop iteration, so the task identifies the
    # step; a plain callback by its outermost frame, not its function: two
    # runs of one function (two requests' callbacks, each in its own context)
    # are two steps. The group holds that frame until delivery, next iteration.
    key: object = task if task is not None else frames[-1]
    if group is None or group.key != key or group.loop is not loop or group.t_end:
        if group is not None and not group.t_end:
            group.t_end = now  # a new step began, so the previous one had ended
        group = StepGroup(loop, key, task, now)
        state.group = group
        _schedule(group, loop, state)
        if register_loop is not None:
            register_loop(loop)  # a loop the watchdog may not know (one that sets no asyncgen hooks)
    record: Record | None = None
    if len(group.records) < _state.config.max_events_per_step:
        record = Record(event, _summarize(args), trace, site, now, weight)
        group.records.append(record)
    else:
        group.dropped += 1
    group.score += weight
    return group, record


def _trace(
    frames: list[FrameType], kinds: list[Kind], depth: int
) -> tuple[list[tuple[CodeType, int]], tuple[CodeType, int] | None]:
    """The first `depth` frames, and the user's frame (even beyond `depth`).

    Kept as (code, f_lasti) pairs: the line number is worked out only when
    someone formats the event (f_lineno decodes the line table every time).
    Only these frames pay for reading f_code (an audit event of its own).
    """
    trace: list[tuple[CodeType, int]] = []
    site: tuple[CodeType, int] | None = None
    for frame, kind in zip(frames, kinds, strict=True):
        if len(trace) < depth:
            trace.append((frame.f_code, frame.f_lasti))
            if site is None and kind == Kind.USER:
                site = trace[-1]
        elif site is not None:
            break
        elif kind == Kind.USER:
            site = (frame.f_code, frame.f_lasti)
            break
    return trace, site


def _walk_step(
    frame: FrameType | None, event: str, root: FrameType | None, state: _ThreadState
) -> tuple[list[FrameType], list[Kind]] | None:
    """The frames of the current step, innermost first, without aiocop's.

    `None` when the call was not made inside a step (the loop's own
    machinery), was made inside the import system (reported as the `import`
    event), or was made by a wrapper called from another wrapper (reported
    once, by the outer one).
    """
    frames: list[FrameType] = []
    kinds: list[Kind] = []
    module_kinds = _frames._module_kinds
    base = state.base_frame
    while frame is not None:
        module_globals = frame.f_globals
        name = module_globals.get("__name__")
        kind = module_kinds.get(name)
        if kind is None:
            kind = _frames.frame_kind(frame)
        if kind == Kind.AIOCOP:
            if frames and name == _WRAPPERS_MODULE:
                return None  # nested inside an outer aiocop wrapper
        else:
            if kind == Kind.LOOP:
                roles = _frames.LOOP_ROLES.get(name)  # type: ignore[arg-type]
                if roles is not None:
                    role = roles.get(frame.f_code.co_name)
                    if role == "dispatch":
                        break
                    if role == "core":
                        return None
            elif kind == Kind.IMPORTLIB and event != "import":
                return None
            if frame is base and frame is not root:
                break
            frames.append(frame)
            kinds.append(kind)
            if frame is root or len(frames) >= _MAX_WALK:
                break
        frame = frame.f_back
    return (frames, kinds) if frames else None


def _is_allowed(
    event: str, args: tuple[Any, ...], frames: list[FrameType], kinds: list[Kind], loop: AbstractEventLoop
) -> bool:
    if _made_by_tooling(frames[0]):
        return True
    for rule in _harmless_for(event):
        if (
            _harmless_matches(rule, args, frames[0], kinds[0])
            and (not rule.inside_modules or _inside(rule.inside_modules, frames, kinds))
            and (not rule.debug_loop_only or loop.get_debug())
        ):
            return True
    rules = _allow.global_rules()
    scoped = _allow.scoped_rules.get()
    if not rules and not scoped:
        return False
    if scoped:
        rules = (*rules, *scoped)
    return any(rule.matches(event, frames) for rule in rules)


_harmless_by_event: dict[str, tuple[_internals.HarmlessRule, ...]] = {}
# Rules for any event whose only condition is the caller's module (test and
# coverage tooling): decided once per module name.
_harmless_any: tuple[_internals.HarmlessRule, ...] = tuple(r for r in _internals.HARMLESS if not r.event)
_tooling_by_module: dict[object, bool] = {}


def _harmless_for(event: str) -> tuple[_internals.HarmlessRule, ...]:
    rules = _harmless_by_event.get(event)
    if rules is None:
        rules = tuple(r for r in _internals.HARMLESS if event in r.event)
        _harmless_by_event[event] = rules
    return rules


def _made_by_tooling(caller: FrameType) -> bool:
    name = caller.f_globals.get("__name__")
    verdict = _tooling_by_module.get(name)
    if verdict is None:
        verdict = any(module_in(caller, r.caller_modules, r.caller_prefixes) for r in _harmless_any)
        _tooling_by_module[name] = verdict
    return verdict


def module_in(frame: FrameType, modules: tuple[str, ...], prefixes: tuple[str, ...]) -> bool:
    """Whether the frame's module is one of `modules` or below one of `prefixes` (`"pkg."`)."""
    name = frame.f_globals.get("__name__")
    return isinstance(name, str) and (name in modules or name.startswith(prefixes))


def _inside(modules: tuple[str, ...], frames: list[FrameType], kinds: list[Kind]) -> bool:
    prefixes = tuple(m + "." for m in modules)
    for frame, kind in zip(frames, kinds, strict=True):
        if kind == Kind.USER:
            return False
        if module_in(frame, modules, prefixes):
            return True
    return False


_STDLIB_MODULES: frozenset[str] = frozenset(getattr(sys, "stdlib_module_names", ()))


def _harmless_matches(rule: _internals.HarmlessRule, args: tuple[Any, ...], caller: FrameType, kind: Kind) -> bool:
    if rule.caller_internal and kind == Kind.USER:
        return False
    if rule.caller_modules and not module_in(caller, rule.caller_modules, rule.caller_prefixes):
        return False
    if rule.caller_functions and caller.f_code.co_name not in rule.caller_functions:
        return False
    if rule.arg0_prefixes or rule.arg0_stdlib:
        arg0 = args[0] if args else None
        if not isinstance(arg0, str):
            return False
        if rule.arg0_prefixes and not arg0.startswith(rule.arg0_prefixes):
            return False
        if rule.arg0_stdlib and arg0.partition(".")[0] not in _STDLIB_MODULES:
            return False
    return True


def _summarize(args: tuple[Any, ...]) -> tuple[Any, ...]:
    # Never keep a large buffer alive until delivery: keep its size instead.
    for arg in args:
        if isinstance(arg, _BUFFER_TYPES):
            return tuple(BufferSummary(len(a)) if isinstance(a, _BUFFER_TYPES) else a for a in args)
    return args


class BufferSummary:
    __slots__ = ("size",)

    def __init__(self, size: int) -> None:
        self.size = size

    def __repr__(self) -> str:
        return f"<{self.size} bytes>"


def _schedule(group: StepGroup, loop: AbstractEventLoop, state: _ThreadState) -> None:
    # One delivery callback per loop iteration, not per step: the first step
    # with a blocking call schedules it, later ones in the same iteration join
    # its batch (call_soon'd callbacks run in the next iteration, after them).
    unclaimed[group] = group
    pending = state.pending
    # A batch of another loop is stale: that loop stopped before its delivery
    # callback ran (loops that raise no start/stop event never reset it).
    if pending is not None:
        if pending[0].loop is loop:
            pending.append(group)
            return
        stale = [g for g in pending if g in unclaimed]
        if stale and orphan_handler is not None:
            orphan_handler(stale)  # delivered off the loop, now rather than at exit
    state.pending = pending = [group]
    if flush_callback is None:
        return
    try:
        loop.call_soon(flush_callback, pending, context=_EMPTY_CONTEXT.copy())
    except Exception:
        # The loop refused (closing?): the off-loop fallback delivers these
        # when the loop stops or the process exits.
        state.pending = None
        logger.debug("aiocop: could not schedule delivery on %r", loop, exc_info=True)


_EMPTY_CONTEXT = Context()


def _on_loop_boundary() -> None:
    # A loop is starting or stopping on this thread; either way it is not the
    # running loop (yet, or any more). The event fires before the hooks change:
    # if they are still a loop's, that loop is stopping.
    state = thread_state
    firstiter = sys.get_asyncgen_hooks().firstiter
    stopping = isinstance(getattr(firstiter, "__self__", None), AbstractEventLoop)
    # For loops written in C, the frame that called into the loop is the
    # outer edge of every step; keep it only while the loop runs.
    if stopping:
        state.base_frame = None
    else:
        # The caller of sys.set_asyncgen_hooks, past aiocop's own wrapper of
        # it (installed with the watchdog).
        frame: FrameType | None = sys._getframe(2)
        while frame is not None and frame.f_globals.get("__name__", "").startswith("aiocop."):
            frame = frame.f_back
        state.base_frame = frame
    state.group = None
    state.pending = None
    # Hand any group whose delivery callback may never run (its loop stopped
    # first) to the off-loop worker.
    ident = threading.get_ident()
    orphans = [g for g in list(unclaimed) if g.thread_id == ident]
    if orphans and orphan_handler is not None and not state.busy:
        state.busy = True
        try:
            orphan_handler(orphans)
        except Exception:
            _internal_error()
        finally:
            state.busy = False


def claim(group: StepGroup) -> bool:
    """Take the right to deliver `group`; true for exactly one caller."""
    return unclaimed.pop(group, None) is not None


def reset_current_step() -> None:
    """Forget the blocking calls recorded so far in the current step of this thread."""
    group = thread_state.group
    if group is not None and not group.t_end:
        group.records.clear()
        group.dropped = 0
        group.score = 0


_installed = False


def install() -> None:
    """Add the audit hook once per process (audit hooks cannot be removed)."""
    global _installed
    if not _installed:
        sys.addaudithook(audit_hook)
        _installed = True
