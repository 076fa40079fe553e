"""Turning events into text and plain data: shared by logging, the CLI and the pytest plugin.

The text (`describe`, the table) goes to terminals and logs: every string in
it that the watched program chose (file, function and task names, a call's
arguments, source lines) is made `printable` there. The plain data
(`to_record`, `to_dict`) keeps them as they are: JSON escapes them itself.
"""

from __future__ import annotations

import linecache
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiocop._common import forksafe as _forksafe
from aiocop._common.escape import printable as _p
from aiocop._interception.frames import format_frame, is_app_file, short_path
from aiocop._model.severity import WEIGHT_MODERATE, level_rank

if TYPE_CHECKING:
    from aiocop._model.events import BlockingEventInfo, SlowTaskEvent

STALL = "stall"  # the event name given to a step only the watchdog saw
_CALLS = "calls"  # the kind of a summary row of blocking calls
_EVENTS_WIDTH = 56  # the widest the table's events column gets (--json has them all)
# aiocop's own lock is taken with the lock type's C methods: `with lock:` would
# pass through aiocop's Python wrapper of `__enter__` on a loop's thread (issue 26).
_acquire, _release = _forksafe.acquire, _forksafe.release


def call_site(event: SlowTaskEvent) -> str:
    """The `path:line:function` most to blame for a step."""
    if event.call_site:
        return event.call_site
    if event.blocking_events:
        return event.blocking_events[0]["entry_point"]
    return "unknown"


def site_key(site: str) -> str:
    """`path:line:function` without its line: `path:function` (any other text unchanged).

    A path under the working directory is made relative to it, so that a
    baseline written in one checkout holds in another.
    """
    rest, sep, function = site.rpartition(":")
    path, sep2, line = rest.rpartition(":")
    if not (sep and sep2 and line.isdigit()):
        return site
    if os.path.isabs(path):
        cwd = os.path.join(os.getcwd(), "")
        if path.startswith(cwd):
            path = path[len(cwd) :].replace(os.sep, "/")
    return f"{path}:{function}"


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
    if event.ongoing:
        record["ongoing"] = True
    if event.hang_reports:
        record["hang_reports"] = event.hang_reports
        record["hung_ms"] = round(event.hung_ms, 3)
    if event.blocker:
        record["blocker"] = event.blocker
        record["blocker_trace"] = event.blocker_trace
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
    where = f" in task {_p(repr(event.task_name))}" if event.task_name else " in a callback"
    if event.ongoing:
        return describe_hang(event)
    if event.reason == "cpu_blocking":
        lines = [
            f"loop stalled for {event.elapsed_ms:.1f} ms{where} (impact {event.impact}): "
            f"{_p(event.culprit or 'no call to intercept')}"
        ]
        lines.append(f"  at {_p(call_site(event))}")
        for sample in event.cpu_stack_samples[:3]:
            lines.append(f"  sampled {sample['count']}x: {_p(sample['trace'])}")
    else:
        count = len(event.blocking_events) + event.dropped_events
        lines = [
            f"{count} blocking call{'s' if count != 1 else ''}{where} "
            f"(impact {event.impact}, severity {event.severity_level}, {step_held(event)})"
        ]
        shown, rest = shown_calls(event, max_calls)
        for info in shown:
            lines.append(f"  {_p(info['event'])}")
            # The application's line first: the one to change. Where a library
            # made the call, where it blocked follows.
            app = app_site(info)
            lines.append(f"    at {_p(app)}")
            text = source_line(info, app)
            if text:
                lines.append(f"      {_p(text)}")
            if app != info["entry_point"]:
                lines.append(f"    blocked in {_p(info['entry_point'])}")
            lines.append(f"    trace: {_p(info['trace'])}")
        if rest:
            lines.append(f"  {_p(rest)}")
        if event.cpu_stack_samples:
            lines.append(f"  the loop was also stuck at: {_p(event.cpu_stack_samples[0]['trace'])}")
    if event.hang_reports:
        lines.append(
            f"  reported as a hang {event.hang_reports} time{'s' if event.hang_reports != 1 else ''} "
            f"while it ran; it held the loop {event.hung_ms / 1000.0:.1f} s in all"
        )
    if event.context:
        lines.append("  context: " + context_text(event.context))
    return "\n".join(lines)


def step_held(event: SlowTaskEvent) -> str:
    """How long the step held the loop, worded as the step's time: calls are not timed one by one."""
    count = len(event.blocking_events) + event.dropped_events
    return f"the step held the loop {event.elapsed_ms:.1f} ms, not the call{'s' if count != 1 else ''} alone"


def call_weight(info: BlockingEventInfo) -> int:
    """A call's weight, as the severity score counts it (none given: `WEIGHT_MODERATE`, as in 1.x)."""
    weight = info.get("severity")
    return weight if isinstance(weight, int) else WEIGHT_MODERATE


def shown_calls(event: SlowTaskEvent, max_calls: int) -> tuple[list[BlockingEventInfo], str]:
    """The calls of a step to itemise, and a line for those left out (`""`: none).

    When they do not all fit, the weightiest are kept (in call order among
    equals): the calls that made the step's severity are always shown, the
    cut falls on the light ones (a framework's many `os.stat`s).
    """
    calls = event.blocking_events
    if len(calls) <= max_calls:
        shown, cut = list(calls), []
    else:
        ranked = sorted(range(len(calls)), key=lambda i: -call_weight(calls[i]))
        keep = set(ranked[:max_calls])
        # Itemised in call order: the story of the step, with its heaviest calls in it.
        shown = [calls[i] for i in sorted(keep)]
        cut = [calls[i] for i in ranked[max_calls:]]
    if not cut and not event.dropped_events:
        return shown, ""
    names: dict[str, int] = {}
    for info in cut:
        name = info.get("name", info["event"])
        names[name] = names.get(name, 0) + 1
    parts = [name if n == 1 else f"{name} x{n}" for name, n in names.items()]
    if event.dropped_events:
        parts.append(f"{event.dropped_events} not kept: over the per-step buffer")
    lighter = ", none heavier than those shown" if cut else ""
    return shown, f"... and {len(cut) + event.dropped_events} more{lighter}: {', '.join(parts)}"


def library_site(info: BlockingEventInfo) -> tuple[str, str] | None:
    """Where a library, not the application, made a call: its `file.py:function` and the package.

    E.g. `("fastapi/routing.py:_extract_endpoint_context", "fastapi")`, the
    narrow `call_site=` an allow rule takes; `None` when the line that made
    the call is the application's own (or the event carries no frames).
    """
    entry = info["entry_point"]
    for frame in info.get("frames", ()):
        if format_frame(frame) != entry:
            continue
        filename, _line, function = frame
        if is_app_file(filename):
            return None
        path = short_path(filename).replace(os.sep, "/")
        return f"{path}:{function}", path.split("/", 1)[0].removesuffix(".py")
    return None


def context_text(context: dict[str, Any]) -> str:
    """A context's keys and values as one line: `http_path='/x', user=3`."""
    return ", ".join(f"{_p(str(k))}={_p(repr(v))}" for k, v in context.items())


def hang_headline(event: SlowTaskEvent) -> str:
    """One line for a hang report: the loop, how long, where, and what it is doing."""
    where = f"task {_p(repr(event.task_name))}" if event.task_name else "a callback"
    if event.ongoing and not event.hang_reports:
        # Seen at the end of a run (`_hangs.ongoing`), before hang_after_ms:
        # not a hang yet, but the step that holds the loop as the run ends.
        return (
            f"loop STILL HELD for {event.elapsed_ms / 1000.0:.1f} s at exit (a stall not over, not yet "
            f"hang_after_ms) in {where} on thread {_p(repr(event.thread_name))}: "
            f"{_p(event.culprit or 'no stack')} at {_p(call_site(event))}"
        )
    again = f", report {event.hang_reports}" if event.hang_reports > 1 else ""
    return (
        f"loop HUNG for {event.elapsed_ms / 1000.0:.1f} s (still running{again}) in {where} on thread "
        f"{_p(repr(event.thread_name))}: {_p(event.culprit or 'no stack')} at {_p(call_site(event))}"
    )


def describe_hang(event: SlowTaskEvent) -> str:
    """A hang report with its whole stack, innermost frame first, each with its source line."""
    lines = [hang_headline(event), f"  loop: {_p(event.loop)}"]
    if event.context:
        lines.append("  context: " + context_text(event.context))
    if event.blocker:
        lines.append(f"  blocked by: {_p(event.blocker)}")
        if event.blocker_trace:
            lines.append("    its stack: " + _p(event.blocker_trace))
    samples = event.cpu_stack_samples
    if samples:
        lines.append("  stack (innermost first):")
        for filename, lineno, function in samples[0].get("frames", ()):
            lines.append(f"    {_p(filename)}:{lineno} in {_p(function)}")
            text = linecache.getline(filename, lineno).strip()
            if text:
                lines.append(f"      {_p(text)}")
        if not samples[0].get("frames"):
            lines.append(f"    {_p(samples[0]['trace'])}")
    return "\n".join(lines)


@dataclass
class SiteStats:
    """What one application line did to the loop, over a run: its blocking calls, or its stalls."""

    call_site: str
    kind: str  # "calls" or STALL
    events: dict[str, int] = field(default_factory=dict)  # event name -> calls
    steps: int = 0
    total_ms: float = 0.0
    worst_ms: float = 0.0
    impact: str = "low"  # the highest impact of those steps (SlowTaskEvent.impact)
    example_trace: str = ""
    shared: bool = False  # a step of this row had other rows' calls too: its time is not this row's alone
    known: bool | None = None  # in the baseline (None: no baseline given)

    @property
    def count(self) -> int:
        """Calls (or stalls) at this line."""
        return sum(self.events.values())

    @property
    def event(self) -> str:
        """The events, most frequent first, with their counts if more than one: `import (56), socket.connect`."""
        if len(self.events) == 1:
            return next(iter(self.events))  # the count column says how many
        ranked = sorted(self.events.items(), key=lambda item: (-item[1], item[0]))
        return ", ".join(name if n == 1 else f"{name} ({n})" for name, n in ranked)

    def to_dict(self) -> dict[str, Any]:
        return {
            "call_site": self.call_site,
            "event": self.event,
            "events": dict(self.events),
            "count": self.count,
            "steps": self.steps,
            "total_ms": round(self.total_ms, 3),
            "worst_ms": round(self.worst_ms, 3),
            "step_shared": self.shared,
            "impact": self.impact,
            "example_trace": self.example_trace,
            **({} if self.known is None else {"known": self.known}),
        }


class Summary:
    """Events aggregated per application line: a callback, thread-safe.

    One row per line of the application that led to blocking calls (every
    call it led to, whatever the event: one cause, one row), and one per line
    where the loop stalled. A step's duration (the time it held the loop) is
    counted once per row the step touches: `total_ms` is the loop time lost in
    steps where the line blocked, not the time of the calls alone (which
    aiocop does not time).
    """

    def __init__(self, baseline: frozenset[tuple[str, str]] | None = None) -> None:
        # (event, "path:function") keys of call sites known to block (see
        # _baseline): their rows are marked, and fail nothing.
        self.baseline = baseline
        self._rows: dict[tuple[str, str], SiteStats] = {}
        self._lock = _forksafe.lock()
        self.events = 0
        self.dropped_calls = 0
        # Hung steps: the latest report of each (by loop thread), and whether
        # it ended since (its final event is counted in the rows, as any step).
        self._hangs: dict[int, SlowTaskEvent] = {}
        self._hangs_ended: dict[int, SlowTaskEvent] = {}

    def __call__(self, event: SlowTaskEvent) -> None:
        if event.ongoing:
            _acquire(self._lock)
            try:
                self._hangs[event.thread_id] = event
                self._hangs_ended.pop(event.thread_id, None)
            finally:
                _release(self._lock)
            return
        _acquire(self._lock)
        try:
            if event.hang_reports and event.thread_id in self._hangs:
                self._hangs_ended[event.thread_id] = event
            self.events += 1
            self.dropped_calls += event.dropped_events
            touched: set[tuple[str, str]] = set()
            if event.reason == "cpu_blocking":
                samples = event.cpu_stack_samples
                self._row((call_site(event), STALL), STALL, event, touched, samples[0]["trace"] if samples else "")
            for info in event.blocking_events:
                name = info.get("name", info["event"])
                self._row((app_site(info), _CALLS), name, event, touched, info["trace"])
            if len(touched) > 1:  # one step, several rows: each shows the whole step's time
                for key in touched:
                    self._rows[key].shared = True
        finally:
            _release(self._lock)

    def _row(
        self, key: tuple[str, str], name: str, event: SlowTaskEvent, touched: set[tuple[str, str]], trace: str
    ) -> None:
        row = self._rows.get(key)
        if row is None:
            row = self._rows[key] = SiteStats(*key, example_trace=trace)
        if name not in row.events and self.baseline is not None:
            # Known only while every event of the line is in the baseline.
            row.known = (row.known is not False) and (name, site_key(key[0])) in self.baseline
        row.events[name] = row.events.get(name, 0) + 1
        if key not in touched:
            touched.add(key)
            row.steps += 1
            row.total_ms += event.elapsed_ms
            row.worst_ms = max(row.worst_ms, event.elapsed_ms)
            if level_rank(event.impact) > level_rank(row.impact):
                row.impact = event.impact

    def rows(self) -> list[SiteStats]:
        """The rows, most loop time lost first."""
        _acquire(self._lock)
        try:
            rows = list(self._rows.values())
        finally:
            _release(self._lock)
        return sorted(rows, key=lambda r: (-r.total_ms, -r.count, r.call_site, r.kind))

    def worst_level(self, *, new_only: bool = False) -> str | None:
        """The highest impact seen (of call sites not in the baseline: `new_only`), or `None`."""
        rows = [r for r in self.rows() if not (new_only and r.known)]
        return max((r.impact for r in rows), key=level_rank) if rows else None

    def counts(self) -> dict[tuple[str, str], int]:
        """How many times each call site was seen, by baseline key (event, `path:function`)."""
        counts: dict[tuple[str, str], int] = {}
        for row in self.rows():
            for name, n in row.events.items():
                key = (name, site_key(row.call_site))
                counts[key] = counts.get(key, 0) + n
        return counts

    def hangs(self) -> list[tuple[SlowTaskEvent, SlowTaskEvent | None]]:
        """Each hung step's latest hang report, with its final event if it ended since (else None)."""
        _acquire(self._lock)
        try:
            return [(report, self._hangs_ended.get(thread)) for thread, report in self._hangs.items()]
        finally:
            _release(self._lock)

    def render_hangs(self) -> str:
        """The hung loops first: each one's latest report, still hung ones first ("" if none hung)."""
        hangs = sorted(self.hangs(), key=lambda pair: pair[1] is not None)
        if not hangs:
            return ""
        still = sum(1 for _, ended in hangs if ended is None)
        held = sum(1 for report, ended in hangs if ended is None and not report.hang_reports)
        parts = (
            [f"{len(hangs) - held} loop(s) hung during the run, {still - held} still hung now"]
            if held < len(hangs)
            else []
        )
        if held:
            parts.append(f"{held} loop(s) still held by one step at exit (for less than hang_after_ms)")
        out = ["aiocop: " + "; ".join(parts) + ":"]
        for report, ended in hangs:
            state = "STILL HUNG" if ended is None else f"ended, after {ended.hung_ms / 1000.0:.1f} s"
            if ended is None and not report.hang_reports:
                state = "STILL HELD AT EXIT"  # (`_hangs.ongoing`: below hang_after_ms)
            out.append(f"[{state}] latest report:")
            out.append(describe_hang(report))
        return "\n".join(out)

    def render(self, limit: int | None = None) -> str:
        """The rows as a plain-text table, after the hung loops if any."""
        hangs = self.render_hangs()
        if not hangs:
            return self._render_rows(limit)
        table = (
            self._render_rows(limit)
            if self.rows()
            else "aiocop: no other blocking call or stall was seen (a hung step's calls are reported when it ends)."
        )
        return f"{hangs}\n\n{table}"

    def _render_rows(self, limit: int | None = None) -> str:
        rows = self.rows()
        if not rows:
            return "aiocop: no blocking calls or stalls were seen on the event loop."
        shown = rows if limit is None else rows[:limit]
        # The times are the steps', not the calls' (aiocop does not time a
        # call): the headers say so, and the note under the table.
        headers: tuple[str, ...] = ("call site", "events", "count", "steps ms", "worst step ms", "impact")
        table: list[tuple[str, ...]] = [
            (_p(r.call_site), _shorten(_p(r.event)), str(r.count), f"{r.total_ms:.1f}", f"{r.worst_ms:.1f}", r.impact)
            for r in shown
        ]
        if self.baseline is not None:
            headers += ("baseline",)
            table = [(*cells, "known" if r.known else "NEW") for cells, r in zip(table, shown, strict=True)]
        widths = [max(len(h), *(len(row[i]) for row in table)) for i, h in enumerate(headers)]
        numeric = {2, 3, 4}

        def fmt(cells: tuple[str, ...]) -> str:
            return "  ".join(
                c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            )

        calls = sum(r.count for r in rows if r.kind != STALL)
        stalls = sum(r.count for r in rows if r.kind == STALL)
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
        if self.baseline is not None:
            known = sum(1 for r in rows if r.known)
            out.append(f"({known} of {len(rows)} call site(s) are in the baseline; only new ones can fail the run)")
        return "\n".join(out)

    def to_dict(self) -> dict[str, Any]:
        return {
            "events": self.events,
            "dropped_calls": self.dropped_calls,
            "worst_impact": self.worst_level(),
            "call_sites": [r.to_dict() for r in self.rows()],
            **(
                {"hangs": [{**to_record(r), "ended": e is not None} for r, e in hangs]}
                if (hangs := self.hangs())
                else {}
            ),
        }

    @classmethod
    def from_dict(cls, document: dict[str, Any]) -> Summary:
        """A summary as `to_dict` wrote it (in another process: `python -m aiocop attach`)."""
        summary = cls()
        summary.events = document["events"]
        summary.dropped_calls = document["dropped_calls"]
        for row in document["call_sites"]:
            kind = STALL if row["events"] == {STALL: row["count"]} else _CALLS
            summary._rows[(row["call_site"], kind)] = SiteStats(
                row["call_site"],
                kind,
                events=dict(row["events"]),
                steps=row["steps"],
                total_ms=row["total_ms"],
                worst_ms=row["worst_ms"],
                impact=row["impact"],
                example_trace=row["example_trace"],
                shared=row["step_shared"],
            )
        return summary


def _shorten(events: str) -> str:
    """The events column: cut at a comma to fit, saying how many more there are."""
    if len(events) <= _EVENTS_WIDTH:
        return events
    names = events.split(", ")
    shown: list[str] = []
    for name in names:
        if len(", ".join([*shown, name])) > _EVENTS_WIDTH - 10 and shown:
            break
        shown.append(name)
    return ", ".join(shown) + f", +{len(names) - len(shown)} more"
