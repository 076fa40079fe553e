"""The run's steps with their times: the one model the HTML report, speedscope and folded stacks are drawn from.

The table's rows come from `_report.Summary`, as the CLI prints them; the
timeline, the traces and the flame graphs need the steps themselves, with
when they ended. A `Timeline` wraps the summary's callback: it reads a
step's end from the unformatted event (`step_view`, before any field is
built) and keeps the event, up to a bound, for rendering at the end of the
run. Nothing is added to the detection path: it runs where the summary
already runs, in the delivery callback.
"""

from __future__ import annotations

import math
import os
import platform
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiocop
from aiocop._common import forksafe as _forksafe
from aiocop._common.clock import perf_counter
from aiocop._reporting.building import step_view
from aiocop._reporting.report import STALL, app_site, call_site, call_weight, source_line

if TYPE_CHECKING:
    from aiocop._model.events import SlowTaskEvent
    from aiocop._reporting.report import Summary

# Steps a run keeps for the timeline and traces (each holds its calls'
# frames): a long run past this keeps its first steps, and counts the rest
# (the table still has them all).
STEPS_KEPT = 5000
_CALLS = "calls"

# What a step's reason is drawn as; a reason not listed here (a newer aiocop's)
# is drawn under its own name, in the "other" colour.
CAUSES = {"io_blocking": "blocking call", "cpu_blocking": "stall", "hang": "hang"}


class Timeline:
    """A slow-task callback: feeds `summary`, and keeps each step with its end time (thread-safe)."""

    def __init__(self, summary: Summary, limit: int = STEPS_KEPT) -> None:
        self.summary = summary
        self.limit = limit
        self.origin = perf_counter()  # the run's start, on the clock steps are timed with
        self.wall_start = time.time()
        self.duration_s = 0.0
        self.dropped = 0
        self._steps: list[tuple[float, SlowTaskEvent]] = []
        self._lock = _forksafe.lock()

    def __call__(self, event: SlowTaskEvent) -> None:
        # First, while the event is unformatted: when its step ended. (An event
        # made by hand, or already formatted, ends now, when it is delivered.)
        view = step_view(event)
        end = view.end if view is not None else perf_counter()
        self.summary(event)
        with self._lock:
            if len(self._steps) < self.limit:
                self._steps.append((end - self.origin, event))
            else:
                self.dropped += 1

    def finish(self) -> None:
        """The run is over: its duration is now."""
        self.duration_s = perf_counter() - self.origin

    def steps(self) -> list[tuple[float, SlowTaskEvent]]:
        """(end in seconds from the run's start, event), in delivery order."""
        with self._lock:
            return list(self._steps)


@dataclass(frozen=True)
class Facts:
    """What the report says about the run itself."""

    command: str
    threshold_ms: float | None  # None: no stall watchdog (the pytest plugin's default)
    loop: str  # the loop implementation asked for (e.g. "uvloop (--uvloop)")
    exit_status: int | None = None


def build(timeline: Timeline, facts: Facts) -> dict[str, Any]:
    """The report's model: facts, the table's rows (worst first, as the CLI ranks them) and the steps.

    Plain JSON-safe data (finite numbers, strings), so that every renderer
    reads the same thing.
    """
    summary = timeline.summary
    rows = summary.rows()
    index = {(row.call_site, row.kind): i for i, row in enumerate(rows)}
    steps = [_step(n, end, event, index) for n, (end, event) in enumerate(timeline.steps())]
    loops = sorted({step["loop"].partition("@")[0] for step in steps if step["loop"]})
    duration = max([timeline.duration_s * 1000.0, *(step["t1"] for step in steps)])
    return {
        "facts": {
            "command": facts.command,
            "python": f"{platform.python_implementation()} {platform.python_version()}",
            "loop": facts.loop + (f"; seen: {', '.join(loops)}" if loops else ""),
            "threshold_ms": facts.threshold_ms,
            "duration_ms": round(duration, 3),
            "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(timeline.wall_start)),
            "aiocop": aiocop.__version__,
            "exit_status": facts.exit_status,
            "cwd": os.getcwd(),
        },
        "summary": summary.to_dict(),
        "steps": steps,
        "steps_dropped": timeline.dropped,
        "causes": CAUSES,
    }


def _step(n: int, end_s: float, event: SlowTaskEvent, index: dict[tuple[str, str], int]) -> dict[str, Any]:
    site = call_site(event)
    keys = [(app_site(info), _CALLS) for info in event.blocking_events]
    if event.reason != "io_blocking":  # a stall (or a hang): its row is the line the samples found
        keys += [(site, STALL), (site, event.reason)]
    end_ms = end_s * 1000.0
    return {
        "id": n,
        "t0": round(max(0.0, end_ms - _finite(event.elapsed_ms)), 3),
        "t1": round(end_ms, 3),
        "elapsed_ms": round(_finite(event.elapsed_ms), 3),
        "reason": str(event.reason),
        "impact": event.impact,
        "site": site,
        "task": event.task_name,
        "thread": event.thread_name,
        "loop": event.loop,
        "culprit": event.culprit,
        "context": {str(k): v if isinstance(v, str) else repr(v) for k, v in event.context.items()},
        "rows": sorted({index[key] for key in keys if key in index}),
        "calls": [
            {
                "event": info["event"],
                "app_site": app_site(info),
                "entry_point": info["entry_point"],
                "source": source_line(info, app_site(info)),
                "trace": info["trace"],
                "frames": _frames(info.get("frames", ())),
                "app_frame": _marked(info.get("frames", ()), app_site(info)),
                "weight": call_weight(info),  # which call a step no sample found is drawn at (`flame.py`)
            }
            for info in event.blocking_events
        ],
        "samples": [
            {
                "count": sample["count"],
                "trace": sample["trace"],
                "app_site": sample.get("app_site", sample["entry_point"]),
                "frames": _frames(sample.get("frames", ())),
                "app_frame": _marked(sample.get("frames", ()), sample.get("app_site", sample["entry_point"])),
                # (The loop time the samples stand for, by which `flame.py` weighs them; absent: by count.)
                **({"ms": _finite(float(sample["time_ms"]))} if "time_ms" in sample else {}),
            }
            for sample in event.cpu_stack_samples
        ],
        "dropped_calls": event.dropped_events,
    }


def _finite(value: float) -> float:
    return value if math.isfinite(value) else 0.0


def _frames(frames: Any) -> list[list[Any]]:
    # Innermost first, as aiocop records them: [file, line, function].
    return [[str(f[0]), int(f[1]), str(f[2])] for f in frames]


def _marked(frames: Any, site: str) -> int:
    """The index of the frame that is the application's line `site` (`path:line:function`), or -1."""
    rest, _, function = site.rpartition(":")
    path, _, line = rest.rpartition(":")
    if not line.isdigit():
        return -1
    for i, (filename, lineno, name) in enumerate(frames):
        if lineno == int(line) and name == function and str(filename).endswith(path):
            return i
    return -1
