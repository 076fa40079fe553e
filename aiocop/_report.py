"""Turning events into text and plain data: shared by logging, the CLI and the pytest plugin."""

from __future__ import annotations

import linecache
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiocop import _forksafe
from aiocop._severity import level_rank

if TYPE_CHECKING:
    from aiocop._events import BlockingEventInfo, SlowTaskEvent

STALL = "stall"  # the event name given to a step only the watchdog saw


def call_site(event: SlowTaskEvent) -> str:
    """The `path:line:function` most to blame for a step."""
    if event.call_site:
        return event.call_site
    if event.blocking_events:
        return event.blocking_events[0]["entry_point"]
    return "unknown"


def app_site(info: BlockingEventInfo) -> str:
    """The application's line that led to a call (its `entry_point` on events made by hand)."""
    return info.get("app_site") or info["entry_point"]


def _full_path(info: BlockingEventInfo, site: str | None = None) -> tuple[str, int] | None:
    """The file and line of a call's entry point (or of `site`), for reading its source."""
    path = (site or info["entry_point"]).rpartition(":")[0]
    path, _, line = path.rpartition(":")
    if not line.isdigit():
        return None
    for filename, lineno, _function in info.get("frames", ()):
        if lineno == int(line) and filename.endswith(path):
            return filename, lineno
    return (path, int(line)) if os.path.exists(path) else None


def source_line(info: BlockingEventInfo, site: str | None = None) -> str:
    """The source text of a call's entry point (or of `site`), or `""` when unavailable."""
    where = _full_path(info, site)
    return linecache.getline(*where).strip() if where is not None else ""


def to_record(event: SlowTaskEvent) -> dict[str, Any]:
    """One event as JSON-safe plain data (for logs and `--json`)."""
    record: dict[str, Any] = {
        "reason": event.reason,
        "call_site": call_site(event),
        "elapsed_ms": round(event.elapsed_ms, 3),
        "threshold_ms": event.threshold_ms,
        "exceeded_threshold": event.exceeded_threshold,
        "impact": event.impact,
        "severity_level": event.severity_level,
        "severity_score": event.severity_score,
        "blocking_calls": [
            {
                "event": info.get("name", info["event"]),
                "args": info.get("args", ""),
                "entry_point": info["entry_point"],
                "app_site": app_site(info),
                "severity": info["severity"],
                "trace": info["trace"],
            }
            for info in event.blocking_events
        ],
        "task": event.task_name,
        "thread": event.thread_name,
        "loop": event.loop,
    }
    if event.culprit:
        record["culprit"] = event.culprit
    if event.cpu_stack_samples:
        record["stack_samples"] = [{"trace": s["trace"], "count": s["count"]} for s in event.cpu_stack_samples]
    if event.dropped_events:
        record["dropped_events"] = event.dropped_events
    if event.context:
        record["context"] = {str(k): _plain(v) for k, v in event.context.items()}
    return record


def _plain(value: object) -> object:
    return value if isinstance(value, (str, int, float, bool)) or value is None else repr(value)


def describe(event: SlowTaskEvent, *, max_calls: int = 10) -> str:
    """A readable, multi-line account of one event, with the offending lines."""
    where = f" in task {event.task_name!r}" if event.task_name else " in a callback"
    if event.reason == "cpu_blocking":
        lines = [
            f"loop stalled for {event.elapsed_ms:.1f} ms{where} (impact {event.impact}): "
            f"{event.culprit or 'no call to intercept'}"
        ]
        lines.append(f"  at {call_site(event)}")
        for sample in event.cpu_stack_samples[:3]:
            lines.append(f"  sampled {sample['count']}x: {sample['trace']}")
    else:
        count = len(event.blocking_events) + event.dropped_events
        lines = [
            f"{count} blocking call{'s' if count != 1 else ''}{where} "
            f"(impact {event.impact}, severity {event.severity_level}, loop held {event.elapsed_ms:.1f} ms)"
        ]
        for info in event.blocking_events[:max_calls]:
            lines.append(f"  {info['event']}")
            # The application's line first: the one to change. Where a library
            # made the call, where it blocked follows.
            app = app_site(info)
            lines.append(f"    at {app}")
            text = source_line(info, app)
            if text:
                lines.append(f"      {text}")
            if app != info["entry_point"]:
                lines.append(f"    blocked in {info['entry_point']}")
            lines.append(f"    trace: {info['trace']}")
        hidden = count - min(len(event.blocking_events), max_calls)
        if hidden:
            lines.append(f"  ... and {hidden} more")
        if event.cpu_stack_samples:
            lines.append(f"  the loop was also stuck at: {event.cpu_stack_samples[0]['trace']}")
    if event.context:
        lines.append("  context: " + ", ".join(f"{k}={v!r}" for k, v in event.context.items()))
    return "\n".join(lines)


@dataclass
class SiteStats:
    """What one call site did to the loop, over a run."""

    call_site: str
    event: str
    count: int = 0
    steps: int = 0
    total_ms: float = 0.0
    worst_ms: float = 0.0
    impact: str = "low"  # the highest impact of those steps (SlowTaskEvent.impact)
    example_trace: str = ""
    shared: bool = False  # a step of this row had other rows' calls too: its time is not this row's alone

    def to_dict(self) -> dict[str, Any]:
        return {
            "call_site": self.call_site,
            "event": self.event,
            "count": self.count,
            "steps": self.steps,
            "total_ms": round(self.total_ms, 3),
            "worst_ms": round(self.worst_ms, 3),
            "step_shared": self.shared,
            "impact": self.impact,
            "example_trace": self.example_trace,
        }


class Summary:
    """Events aggregated per (call site, event name): a callback, thread-safe.

    A step's duration (the time it held the loop) is counted once per row the
    step touches: `total_ms` is the loop time lost in steps where the call
    site blocked, not the time of the calls alone (which aiocop does not time).
    """

    def __init__(self) -> None:
        self._rows: dict[tuple[str, str], SiteStats] = {}
        self._lock = _forksafe.lock()
        self.events = 0
        self.dropped_calls = 0

    def __call__(self, event: SlowTaskEvent) -> None:
        with self._lock:
            self.events += 1
            self.dropped_calls += event.dropped_events
            touched: set[tuple[str, str]] = set()
            if event.reason == "cpu_blocking":
                samples = event.cpu_stack_samples
                self._row((call_site(event), STALL), event, touched, samples[0]["trace"] if samples else "")
            for info in event.blocking_events:
                self._row((app_site(info), info.get("name", info["event"])), event, touched, info["trace"])
            if len(touched) > 1:  # one step, several rows: each shows the whole step's time
                for key in touched:
                    self._rows[key].shared = True

    def _row(self, key: tuple[str, str], event: SlowTaskEvent, touched: set[tuple[str, str]], trace: str) -> None:
        row = self._rows.get(key)
        if row is None:
            row = self._rows[key] = SiteStats(*key, example_trace=trace)
        row.count += 1
        if key not in touched:
            touched.add(key)
            row.steps += 1
            row.total_ms += event.elapsed_ms
            row.worst_ms = max(row.worst_ms, event.elapsed_ms)
            if level_rank(event.impact) > level_rank(row.impact):
                row.impact = event.impact

    def rows(self) -> list[SiteStats]:
        """The rows, most loop time lost first."""
        with self._lock:
            rows = list(self._rows.values())
        return sorted(rows, key=lambda r: (-r.total_ms, -r.count, r.call_site, r.event))

    def worst_level(self) -> str | None:
        """The highest impact seen, or `None` when nothing was reported."""
        rows = self.rows()
        return max((r.impact for r in rows), key=level_rank) if rows else None

    def render(self, limit: int | None = None) -> str:
        """The rows as a plain-text table."""
        rows = self.rows()
        if not rows:
            return "aiocop: no blocking calls or stalls were seen on the event loop."
        shown = rows if limit is None else rows[:limit]
        # The times are the steps', not the calls' (aiocop does not time a
        # call): the headers say so, and the note under the table.
        headers = ("call site", "event", "count", "steps ms", "worst step ms", "impact")
        table = [
            (r.call_site, r.event, str(r.count), f"{r.total_ms:.1f}", f"{r.worst_ms:.1f}", r.impact) for r in shown
        ]
        widths = [max(len(h), *(len(row[i]) for row in table)) for i, h in enumerate(headers)]
        numeric = {2, 3, 4}

        def fmt(cells: tuple[str, ...]) -> str:
            return "  ".join(
                c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            )

        calls = sum(r.count for r in rows if r.event != STALL)
        stalls = sum(r.count for r in rows if r.event == STALL)
        out = [
            f"aiocop: {calls} blocking call(s) and {stalls} stall(s) at {len(rows)} call site(s), "
            f"most loop time lost first:",
            "",
            fmt(headers),
            fmt(tuple("-" * w for w in widths)),
        ]
        out += [fmt(row).rstrip() for row in table]
        if len(shown) < len(rows):
            out.append(f"... {len(rows) - len(shown)} more call site(s); see --json for all")
        shared = sum(1 for r in rows if r.shared)
        if shared:
            out.append(
                f"(ms: how long the steps where the line blocked held the loop; {shared} row(s) share a step with "
                "another row, whose time each shows in full)"
            )
        if self.dropped_calls:
            out.append(f"({self.dropped_calls} calls beyond the per-step buffer were counted but not itemised)")
        return "\n".join(out)

    def to_dict(self) -> dict[str, Any]:
        return {
            "events": self.events,
            "dropped_calls": self.dropped_calls,
            "worst_impact": self.worst_level(),
            "call_sites": [r.to_dict() for r in self.rows()],
        }
