"""What every benchmark child process shares: picking a loop, and switching aiocop on.

A child runs in one *mode*. `baseline` never imports aiocop (checked by
`aiocop_imported()` at the end of each run): the honest baseline is a process
aiocop never touched, not a "deactivated" one whose loop is still patched.
The other modes switch detection on the way an application would at start-up.

Children import nothing from `benchmarks/suite` (the orchestrator), only this
module, so that a baseline child loads the standard library, the loop and
nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

BASELINE = "baseline"
DETECT = "aiocop"
WATCHDOG = "aiocop+watchdog"
MIDDLEWARE = "aiocop+middleware"
# AiocopInstrumentor on top of the watchdog mode, with the SDK's in-memory
# reader (what any reader costs on the application's side: points recorded;
# exporting runs on its own thread or at a scrape).
OTEL = "aiocop+otel"
# blockbuster instead of aiocop (benchmarks/children/pertask_child.py only): the comparison of issue 39.
BLOCKBUSTER = "blockbuster"
MODES = (BASELINE, DETECT, WATCHDOG, MIDDLEWARE, OTEL)

# The trace depth of the 1.x benchmark and of the SPEC's per-task target.
TRACE_DEPTH = 5
# The watchdog's default threshold: no step of these workloads comes near it.
WATCHDOG_THRESHOLD_MS = 30


class Probe:
    """The registered callback: counts events, keeps a few to check afterwards.

    Counting is all a callback does inside the timed region; the kept events
    are formatted (and so checked) only after the clock has stopped. Stalls
    are counted apart: no step of these workloads comes near the threshold on
    a quiet machine, but on a busy one a step whose thread the OS set aside
    really does hold the loop that long, and the watchdog rightly says so.
    """

    def __init__(self, keep_every: int = 1000) -> None:
        self.count = 0
        self.stalls = 0
        self.keep_every = keep_every
        self.kept: list[Any] = []

    def __call__(self, event: Any) -> None:
        if event.reason == "cpu_blocking":
            self.stalls += 1
            return
        if self.count % self.keep_every == 0:
            self.kept.append(event)
        self.count += 1

    def reset(self) -> None:
        self.count = 0
        self.stalls = 0
        self.kept = []


def setup(mode: str, keep_every: int = 1000) -> Probe | None:
    """Switch aiocop on as `mode` says; `None` (and no import) for the baseline."""
    if mode not in MODES:
        raise SystemExit(f"unknown mode {mode!r}; one of {MODES}")
    if mode == BASELINE:
        return None
    import aiocop

    probe = Probe(keep_every)
    aiocop.start_blocking_io_detection(trace_depth=TRACE_DEPTH)
    aiocop.register_slow_task_callback(probe)
    if mode in (WATCHDOG, OTEL):
        aiocop.detect_slow_tasks(threshold_ms=WATCHDOG_THRESHOLD_MS)
    if mode == OTEL:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader

        from aiocop.opentelemetry import AiocopInstrumentor

        AiocopInstrumentor().instrument(meter_provider=MeterProvider(metric_readers=[InMemoryMetricReader()]))
    return probe


def unwatched() -> contextlib.AbstractContextManager[object]:
    """A scope for the benchmark's own instrumentation: aiocop (if loaded) ignores it."""
    if "aiocop" not in sys.modules:
        return contextlib.nullcontext()
    import aiocop

    return aiocop.monitored(enabled=False)


def aiocop_imported() -> bool:
    return "aiocop" in sys.modules


def instrumented() -> bool:
    """Whether `AiocopInstrumentor` is recording (the `aiocop+otel` mode)."""
    module = sys.modules.get("aiocop.opentelemetry")
    return module is not None and bool(module.AiocopInstrumentor().is_instrumented_by_opentelemetry)


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    if name == "asyncio":
        return asyncio.new_event_loop
    module = importlib.import_module(name)
    factory: Callable[[], asyncio.AbstractEventLoop] = module.new_event_loop
    return factory


def check_event(event: Any, names: tuple[str, ...], site: str) -> str | None:
    """Why a delivered event is not the expected one, or `None` if it is.

    Reading `blocking_events` formats the event (aiocop defers that until a
    callback reads it), so this runs after timing.
    """
    if event.reason != "io_blocking":
        return f"reason {event.reason!r}"
    calls = event.blocking_events
    got = tuple(call["name"] for call in calls)
    if got != names:
        return f"calls {got}, expected {names}"
    for call in calls:
        frames = call["frames"]
        if not 1 <= len(frames) <= TRACE_DEPTH:
            return f"{len(frames)} frames in the trace of {call['name']}"
        if site not in call["entry_point"]:
            return f"entry point {call['entry_point']!r} is not {site}"
    return None


def version_of(name: str) -> str:
    try:
        return str(importlib.import_module(name).__version__)
    except (ImportError, AttributeError):
        return "?"
