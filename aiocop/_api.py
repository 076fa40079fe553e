"""Setting detection up, switching it on and off, and tearing it down."""

from __future__ import annotations

import asyncio
import atexit
import logging
from typing import TYPE_CHECKING, Any, get_args

from aiocop._common import forksafe as _forksafe
from aiocop._common.validate import (
    F,
    check_bool,
    check_callable,
    check_decorated,
    check_int,
    check_ms,
    check_name,
    check_number,
    did_you_mean,
)
from aiocop._configuration.config import ProjectConfig, load_config
from aiocop._interception import allow as _allow
from aiocop._interception import frames as _frames
from aiocop._interception import hook as _hook
from aiocop._interception import loops as _loops
from aiocop._interception import rules as _rules
from aiocop._interception import wrappers as _wrappers
from aiocop._interception.scope import ContextVarScope
from aiocop._model import callbacks as _callbacks
from aiocop._model import state as _state
from aiocop._model.severity import level_threshold
from aiocop._model.state import Delivery
from aiocop._reporting import delivery as _delivery
from aiocop._reporting import hangs as _hangs
from aiocop._reporting.sink import SINK
from aiocop._stalls import settings as _settings
from aiocop._stalls import watchdog as _watchdog

if TYPE_CHECKING:
    import os
    from collections.abc import Callable

    from aiocop._model.callbacks import SlowTaskCallback

logger = logging.getLogger("aiocop")

# The watchdog's intervals are waits of its thread: a watchdog that looks less
# than once an hour watches nothing, and past ~10^9 s the wait itself fails.
_HOUR_MS = 3_600_000.0
_DAY_MS = 86_400_000.0
# How long stop() waits for hang reports being delivered.
_HANG_REPORTS_AT_STOP_S = 1.0
# What threshold_ms=0 (a 1.x setting) is taken as.
_MIN_THRESHOLD_MS = 1.0


def start_blocking_io_detection(
    trace_depth: int = 20,
    *,
    delivery: Delivery = "loop",
    patch: bool = True,
    max_events_per_step: int = 64,
) -> None:
    """Detect blocking calls on every event loop of the process, from now on.

    Call it once at start-up, before or after any loop exists: every loop
    started later, in any thread (asyncio, uvloop, rloop, veloxloop, ...), is
    covered, and so is every trio run (its tasks' blocking calls; added in
    2.0). Calling it again reconfigures detection.

    Args:
        trace_depth: Frames kept per blocking call.
        delivery: `"loop"` runs callbacks on the loop's thread right after the
            offending step; `"thread"` runs them on a background thread. Added in 2.0.
        patch: Also wrap the stdlib calls that raise no audit event of their own
            (`patch_audit_functions()`). Added in 2.0.
        max_events_per_step: Blocking calls kept per step; more are counted in
            `SlowTaskEvent.dropped_events`. Added in 2.0.
    """
    # Every argument is checked before anything changes: a bad call leaves
    # the configuration as it was.
    depth = check_int("trace_depth", trace_depth, 1)
    if not isinstance(delivery, str) or delivery not in get_args(Delivery):
        raise ValueError(f"delivery must be 'loop' or 'thread', not {delivery!r}")
    check_bool("patch", patch)
    max_events = check_int("max_events_per_step", max_events_per_step, 1)
    config = _state.config
    config.trace_depth = depth
    config.delivery = delivery
    config.max_events_per_step = max_events
    if patch and not _wrappers.get_patched_functions():
        _wrappers.patch_audit_functions()
    _install_sink()
    _hook.install()
    _state.started = _state.ever_started = True
    _hook.rebuild()


def detect_slow_tasks(
    threshold_ms: float = 30,
    on_slow_task: SlowTaskCallback | None = None,
    cpu_sampling: bool = True,
    hang_after_ms: float | None = 5000,
) -> None:
    """Report steps that hold their loop for `threshold_ms` or more.

    Starts the stall watchdog: a background thread that notices a loop
    stuck in one step, whatever the cause (CPU-bound code, C extensions,
    functions bound before patching), samples where it is stuck and reports
    a `SlowTaskEvent(reason="cpu_blocking")`, or adds the samples to the io
    event of the same step. Calling again changes the threshold at once.

    Args:
        threshold_ms: A step is slow (`exceeded_threshold`) from this many ms.
            `0` (accepted for 1.x code) is taken as 1 ms, the shortest stall
            the watchdog times, with a warning.
        on_slow_task: Registered with `register_slow_task_callback`.
        cpu_sampling: Whether events carry the stack samples of where the
            loop was stuck. `False` (as in 1.x): stalls are still reported,
            without samples.
        hang_after_ms: A step still running this long is reported while it
            runs: a `SlowTaskEvent(reason="hang", ongoing=True)` with the
            loop thread's stack at that moment, sent from aiocop's own
            thread to the same callbacks, and again after twice as long each
            time (at most 5 minutes apart) while it stays stuck. Its usual
            event follows if it ends, with `hang_reports` and `hung_ms`.
            Taken as at least `threshold_ms`. `None`: hangs are reported
            only when they end. Added in 2.0.
    """
    check_bool("cpu_sampling", cpu_sampling)
    hang_after = None if hang_after_ms is None else check_ms("hang_after_ms", hang_after_ms, _DAY_MS)
    if threshold_ms == 0 and not isinstance(threshold_ms, bool):
        logger.warning("aiocop: detect_slow_tasks(threshold_ms=0) is taken as 1 ms, the shortest stall it times")
        threshold_ms = _MIN_THRESHOLD_MS
    threshold = check_ms("threshold_ms", threshold_ms)
    if on_slow_task is not None:
        check_callable("on_slow_task", on_slow_task, 1)
    _state.config.threshold_ms = threshold
    _state.config.hang_after_ms = hang_after
    if on_slow_task is not None:
        _callbacks.register_slow_task_callback(on_slow_task)
    _settings.sampling.share_samples = cpu_sampling
    _start_watchdog()  # (idempotent: and never left half undone by a stop() from another thread)


def start_cpu_sampling(
    interval_ms: float = 10,
    arm_after_ms: float | None = None,
    idle_interval_ms: float | None = None,
    max_samples_per_slice: int = 32,
    trace_depth: int = 20,
    precise_idle: bool | None = None,
) -> None:
    """Start (or reconfigure) the stall watchdog.

    Args:
        interval_ms: Time between two stack samples of a stuck loop.
        arm_after_ms: Age of a step from which its stack is sampled (default:
            half the slow-task threshold, following it when it changes; `0`:
            from its start).
        idle_interval_ms: Time between two looks once every loop is idle
            (default: 250 ms while every loop is armed, 100 ms otherwise; while
            a loop runs a step the watchdog looks every 2 ms, and every 4 ms
            for 10 ms after it, 100 ms while steps come with short gaps).
            Each idle loop is armed to wake the watchdog
            as it wakes, so a stall after such a quiet spell is seen all the
            same. A loop that cannot be armed (one written in C, on Python
            3.12+; on 3.10 and 3.11 one whose thread already has a profile
            function) is looked at as `precise_idle` says.
        max_samples_per_slice: Samples kept per stall.
        trace_depth: Frames kept per sample.
        precise_idle: While a loop that cannot be armed runs, `True` looks at
            it every half threshold when it is idle (and every 4 ms for half
            a second after each step): a stall of 1.5x the threshold after a
            quiet spell is seen, for about 2 % of a core on a VM. `False`
            looks every `idle_interval_ms`, as for the other loops (about a
            tenth of that): a step that begins as the loop's next timer ends
            is still seen from its start (Linux), and a CPU-bound stall is
            timed from its start once a look sees it; a wait, or a CPU-bound
            stall shorter than the interval, begun as I/O woke the loop can go
            unseen. `None` (the default): `True` under the pytest plugin and
            `python -m aiocop run`, `False` otherwise. Added in 2.0.
    """
    interval = check_ms("interval_ms", interval_ms, _HOUR_MS)
    # 0 (1.x accepted it): sample a stuck step from its start.
    arm_after = (
        None if arm_after_ms is None else check_number("arm_after_ms", arm_after_ms, "milliseconds", allow_zero=True)
    )
    if arm_after is not None and arm_after > _HOUR_MS:
        raise ValueError(f"arm_after_ms must be at most {_HOUR_MS:g} milliseconds, not {arm_after_ms!r}")
    idle_interval = None if idle_interval_ms is None else check_ms("idle_interval_ms", idle_interval_ms, _HOUR_MS)
    max_samples = check_int("max_samples_per_slice", max_samples_per_slice, 1)
    depth = check_int("trace_depth", trace_depth, 1)
    precise = None if precise_idle is None else check_bool("precise_idle", precise_idle)
    sampling = _settings.sampling
    sampling.interval_ms = interval
    sampling.arm_after_ms = arm_after
    sampling.share_samples = True
    sampling.idle_interval_ms = idle_interval
    sampling.max_samples_per_slice = max_samples
    sampling.trace_depth = depth
    sampling.precise_idle = precise
    _start_watchdog()


# Starting and stopping the watchdog from several threads at once: each one
# whole, so that the watchdog is never left on with loop starts untracked.
_watchdog_switch = _forksafe.lock()


def _install_sink() -> None:
    # The one seam between detection and reporting (`_interception.sink`): what the hook, the loops'
    # tracking and the watchdog find goes to delivery and hang reports from now on. Installed again by
    # every start (the same record); left installed by stop(), as steps recorded before it are still
    # delivered when their loop runs on or stops.
    _hook.install_sink(SINK)
    _loops.install_sink(SINK)
    _watchdog.install_sink(SINK)


def _start_watchdog() -> None:
    with _watchdog_switch:
        _install_sink()
        _loops.install()
        _hook.watch_loops(True)
        _watchdog.watchdog.start()


# What configure() applied last: its allow rules are taken back when it runs again.
_configured: ProjectConfig | None = None


def configure(path: str | os.PathLike[str] | None = None) -> ProjectConfig:
    """Start detection as the project's `[tool.aiocop]` table says, and return that configuration.

    Reads the table (`load_config(path)`: the file `AIOCOP_CONFIG` names, else
    the nearest `pyproject.toml` from the working directory up), starts
    interception with its `trace_depth`, adds its allow rules, takes its
    `app_paths`/`library_paths` for the reports' application lines, and
    starts the stall watchdog if it sets `threshold_ms` (with its
    `hang_after_ms`, which a watchdog already running takes too). The ASGI middleware
    takes its `sample_rate`. Called again, it replaces what it applied
    before. Raises `ConfigError` for a table it cannot use. Added in 2.0.

    Args:
        path: The `pyproject.toml` to read, instead of looking for one.
    """
    global _configured
    config = load_config(path)
    start_blocking_io_detection(trace_depth=config.trace_depth or _state.Config.trace_depth)
    if _configured is not None:
        for rule in _configured.allow:
            _allow.remove_allow_rule(rule)
    for rule in config.allow:
        _allow.add_allow_rule(rule)
    _frames.set_app_paths(config.app_paths, config.library_paths)
    if config.threshold_ms is not None:
        hang_after = _state.Config.hang_after_ms if config.hang_after_ms is None else config.hang_after_ms or None
        detect_slow_tasks(threshold_ms=config.threshold_ms, hang_after_ms=hang_after)
    elif config.hang_after_ms is not None and _watchdog.watchdog.running:
        _state.config.hang_after_ms = config.hang_after_ms or None  # the watchdog already running takes it
    _configured = config
    return config


def configured() -> ProjectConfig | None:
    """The configuration `configure()` applied last (None: it was not called)."""
    return _configured


def is_cpu_sampling_started() -> bool:
    """Whether the stall watchdog is running and samples where stalled loops are stuck.

    False after `detect_slow_tasks(cpu_sampling=False)` alone, as in 1.x:
    stalls are then still reported, without samples.
    """
    return _watchdog.watchdog.running and _settings.sampling.share_samples


def get_slow_task_threshold_ms() -> float:
    """The slow-step threshold in milliseconds."""
    return _state.config.threshold_ms


def stop() -> None:
    """Uninstall detection and deliver the events still pending.

    Restores the wrapped functions, makes the audit hook inert (audit hooks
    cannot be removed) and ends the watchdog thread. Start again with
    `start_blocking_io_detection()` / `detect_slow_tasks()`. Added in 2.0.
    """
    stop_interception()
    stop_watchdog()
    _delivery.drain()


def stop_interception() -> None:
    """Make the audit hook inert and restore the wrapped functions (`start_blocking_io_detection` undone)."""
    _state.started = False
    _hook.rebuild()
    _wrappers.unpatch_audit_functions()


def stop_watchdog() -> None:
    """End the stall watchdog and the tracking of loop starts (`_start_watchdog` undone)."""
    with _watchdog_switch:
        _watchdog.watchdog.stop()
        _hook.watch_loops(False)
        _loops.uninstall()
    _hangs.reporter.stop(_HANG_REPORTS_AT_STOP_S)


def _at_exit() -> None:
    # The interpreter is ending: deliver what is pending, put back everything
    # aiocop patched, and let go of the application's callbacks and providers.
    # They hold their module's globals (a callback defined in __main__ holds
    # __main__'s): kept past this point, the application's own objects (a
    # module-level NamedTemporaryFile) were finalized only after the modules
    # their finalizers need had been torn down, and left files behind.
    try:
        stop()
    finally:
        _callbacks.clear_slow_task_callbacks()
        _callbacks.clear_context_providers()


atexit.register(_at_exit)


def unregister_at_exit() -> None:
    """Take back the exit handler this module registered at import.

    For the attach agent (`_commands.attach.agent`), leaving a target whose aiocop it loaded itself: the
    modules go, and no handler of theirs may run at the target's exit. (`_at_exit` keeps its name: the
    attach bootstrap, `_commands/attach/command.py`, unregisters it by that name from an aiocop that failed to load,
    which may be the target's own, older one.)
    """
    atexit.unregister(_at_exit)


def activate() -> None:
    """Resume detection paused by `deactivate()` (detection starts active).

    Called before detection was ever set up in the process, it sets it up
    with the defaults (`start_blocking_io_detection()`): in 1.x, `activate()`
    was what switched monitoring on, and `is_monitoring_active()` said so.
    After `stop()` (which 1.x did not have) it only sets the switch.
    """
    _state.active = True
    if not _state.ever_started:
        start_blocking_io_detection()
    _hook.rebuild()


def deactivate() -> None:
    """Pause detection everywhere, without uninstalling anything."""
    _state.active = False
    _hook.rebuild()


def is_monitoring_active() -> bool:
    """Whether blocking calls are being detected right now."""
    return _state.started and _state.active


def enable_raise_on_violations(level: str = "high") -> None:
    """Raise `HighSeverityBlockingIoException` at blocking calls in the current context.

    The exception is raised at the call that brings the step's severity to
    `level`, before the call runs, inside the task that made it. Tasks created
    afterwards from this context inherit the setting (the on/off switch is a
    context variable).

    Args:
        level: `"high"` (default, as in 1.x), `"medium"` or `"low"` (any
            blocking call with a weight). The level is process-wide: it
            applies to every context that raises, `raise_on_violations()`
            scopes included. Added in 2.0.
    """
    if not isinstance(level, str):
        raise TypeError(f"level must be 'high', 'medium' or 'low', not {type(level).__name__}: {level!r}")
    _state.config.raise_min_score = level_threshold(level)
    _state.raise_on_violations.set(True)


def disable_raise_on_violations() -> None:
    """Stop raising on violations in the current context."""
    _state.raise_on_violations.set(False)


def is_raise_on_violations_enabled() -> bool:
    """Whether violations raise in the current context."""
    return _state.raise_on_violations.get()


class raise_on_violations(ContextVarScope[bool]):  # noqa: N801 - 1.x name
    """Raise on violations inside a `with` block, or a decorated function or coroutine function.

    ```python
    with aiocop.raise_on_violations():
        await handler()
    ```

    It raises at the level last given to `enable_raise_on_violations()`
    (`"high"` by default). As a decorator it works with or without
    parentheses: `@aiocop.raise_on_violations()` or `@aiocop.raise_on_violations`.
    """

    def __new__(cls, func: Callable[..., Any] | None = None, /) -> Any:
        scope = super().__new__(cls)
        if func is None:
            return scope
        # `@aiocop.raise_on_violations` without parentheses: decorate at once
        # (Python calls __init__ only on what __new__ returns of this class).
        raise_on_violations.__init__(scope)
        return scope(func)

    def __init__(self, func: Callable[..., Any] | None = None, /) -> None:
        super().__init__(_state.raise_on_violations)

    def _value(self) -> bool:
        return True

    def __call__(self, func: F) -> F:
        return super().__call__(check_decorated("raise_on_violations()", func))


class monitored(ContextVarScope[bool]):  # noqa: N801 - reads as an adjective, like a flag
    """Watch, or with `enabled=False` ignore, the code run inside a block or function.

    Unlike `deactivate()`, which pauses detection everywhere, this follows the
    context: tasks and callbacks started inside the scope inherit it, and code
    running concurrently elsewhere is unaffected. The ASGI middleware uses it
    to watch a sample of requests.

    ```python
    with aiocop.monitored(enabled=random.random() < 0.1):
        await handle(request)
    ```

    Args:
        enabled: `True` (default) to watch, `False` to ignore blocking calls
            and stalls of this context.

    Added in 2.0.
    """

    def __init__(self, enabled: bool = True) -> None:
        if callable(enabled):
            raise TypeError(
                "enabled must be a bool, not a function: decorate with @aiocop.monitored(), not @aiocop.monitored"
            )
        check_bool("enabled", enabled)
        super().__init__(_state.monitored)
        self.enabled = enabled

    def _value(self) -> bool:
        return self.enabled

    def __call__(self, func: F) -> F:
        return super().__call__(check_decorated("monitored()", func))

    def _on_enter(self) -> tuple[asyncio.Task[object], bool | None] | None:
        # Remember the setting per task as well where the watchdog cannot read
        # a task's context from its own thread (3.10, 3.11, task types of
        # their own).
        task = _current_task()
        if task is None or not _state.needs_task_record(task, self.enabled):
            return None
        previous = _state.task_monitored.get(task)
        _state.task_monitored[task] = self.enabled
        _state.task_records_made = True
        return task, previous

    def _on_exit(self, entered: tuple[asyncio.Task[object], bool | None] | None) -> None:
        if entered is None:
            return
        task, previous = entered
        if previous is None:
            _state.task_monitored.pop(task, None)
        else:
            _state.task_monitored[task] = previous


def _current_task() -> asyncio.Task[object] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no running loop in this thread
        return None


def is_monitored() -> bool:
    """Whether blocking calls made here, now, would be reported.

    True when detection is started and active and the current context is not
    inside `monitored(enabled=False)`. Added in 2.0.
    """
    return _state.started and _state.active and _state.monitored.get()


def reset_blocking_events() -> None:
    """Forget the blocking calls recorded so far in the current step."""
    _hook.reset_current_step()


def register_blocking_event(event: str, weight: int = 10) -> None:
    """Detect an audit event (or change its weight); takes effect at once.

    Args:
        event: An audit event name, native or raised with `sys.audit` by your code.
        weight: Its severity weight (`WEIGHT_HEAVY`, `WEIGHT_MODERATE`, ...).

    Added in 2.0.
    """
    check_name("event", event)
    _rules.set_weight(event, check_int("weight", weight, 0))
    _hook.rebuild()


def unregister_blocking_event(event: str) -> None:
    """Stop detecting an event; raises `KeyError` if it is not detected. Added in 2.0."""
    check_name("event", event)
    weights = _rules.live_weights()
    if event not in weights:
        raise KeyError(
            f"{event!r} is not a detected event{did_you_mean(event, weights)}; see aiocop.get_blocking_events_dict()"
        )
    _rules.remove_weight(event)
    _allow.forget_kept_scopes()
    _hook.rebuild()


def reset_blocking_event_table() -> None:
    """Restore the default table of detected events and weights. Added in 2.0."""
    _rules.reset_weights()
    _allow.forget_kept_scopes()  # it may have lost events registered since
    _hook.rebuild()
