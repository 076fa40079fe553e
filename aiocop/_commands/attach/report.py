"""What an attached process writes back, checked before anything of it is used or printed.

The target of `python -m aiocop attach` is another process, often another
user's, and the attaching side often runs as root: its `status.json` and
`report.json` are untrusted input. Each is parsed with limits (size, no
`NaN`/`Infinity`, no duplicate keys, nesting bounded by the interpreter's
recursion limit and then by the schema), checked field by field against the
schema the agent writes, authenticated by the nonce the attaching side gave
the target, and every string in it is made printable (control, format and
separator characters escaped) before it can reach a terminal or the `--json`
file. A document that fails is one `BadReportError` naming the file and the field.
"""

from __future__ import annotations

import hmac
import json
from typing import TYPE_CHECKING, Any

from aiocop._common.escape import printable
from aiocop._model.severity import LEVELS  # SlowTaskEvent.impact's values

if TYPE_CHECKING:
    from collections.abc import Callable

MAX_STATUS_BYTES = 64 << 10
MAX_REPORT_BYTES = 16 << 20
MAX_CALL_SITES = 100_000
MAX_EVENTS_PER_SITE = 1_000
MAX_COUNT = 2**53  # whole numbers beyond this lose precision in JSON readers
MAX_MS = 1e12  # about 31 years, in ms: no window or step lasts longer
MAX_HANGS = 1_000  # hung loops in one report
MAX_HANGS_SHOWN = 20  # printed (a process runs a few loops; more is a target filling the terminal)
# Printed of one hang: the agent sends 100 frames at most, a real stack fits in
# far fewer lines, and a path or source line in far fewer characters. The
# whole record stays in --json; this bounds what a target can print.
MAX_HANG_FRAMES_SHOWN = 100
MAX_SHOWN_CHARS = 300  # of one string of a hang (a path, a line of source, a trace)
MAX_TIMELINE_STEPS = 5_000  # steps accepted for --html (the agent sends agent.STEPS_SENT at most)
MAX_ITEMS = 10_000  # calls or samples in one step
MAX_FRAMES = 1_000  # frames in one stack
MAX_CONTEXT_KEYS = 100
_SHORT = 256  # versions, event names
_LINE = 4_096  # call sites, error messages
_TRACE = 65_536


class BadReportError(Exception):
    """A document from the target that cannot be used, said in one line."""


def parse(data: bytes, name: str, limit: int) -> dict[str, Any]:
    """A JSON object from `data` (already cut at `limit + 1` bytes by the reader)."""
    if len(data) > limit:
        raise BadReportError(f"{name}: larger than {limit} bytes")
    try:
        document = json.loads(data.decode("utf-8"), parse_constant=_no_constant, object_pairs_hook=_no_duplicates)
    except RecursionError:
        raise BadReportError(f"{name}: nested too deeply") from None
    except (UnicodeDecodeError, ValueError) as error:
        raise BadReportError(f"{name}: not JSON ({printable(str(error))[:200]})") from None
    if not isinstance(document, dict):
        raise BadReportError(f"{name}: expected a JSON object, got {_kind(document)}")
    return document


def _no_constant(word: str) -> Any:
    raise ValueError(f"{word} is not a number aiocop accepts")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    document = dict(pairs)
    if len(document) != len(pairs):
        raise ValueError("a key appears twice in one object")
    return document


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def _shown(number: float) -> str:
    # A number out of range, named in a message: a whole number of hundreds of digits only by its length.
    text = repr(number)
    if len(text) <= 24:
        return text
    return f"{'a negative' if number < 0 else 'a'} number of {len(text.lstrip('-'))} digits"


class _Fields:
    """Reads the fields of one JSON object, each checked, naming `where` in errors."""

    def __init__(self, document: object, where: str) -> None:
        if not isinstance(document, dict):
            raise BadReportError(f"{where}: expected an object, got {_kind(document)}")
        self.document = document
        self.where = where

    def _get(self, key: str) -> object:
        if key not in self.document:
            raise BadReportError(f"{self.where}: the key {key!r} is missing")
        return self.document[key]

    def _bad(self, key: str, expected: str, value: object) -> BadReportError:
        return BadReportError(f"{self.where}.{key}: expected {expected}, got {_kind(value)}")

    def string(self, key: str, limit: int) -> str:
        value = self._get(key)
        if not isinstance(value, str):
            raise self._bad(key, "a string", value)
        if len(value) > limit:
            raise BadReportError(f"{self.where}.{key}: longer than {limit} characters")
        return printable(value)

    def count(self, key: str) -> int:
        return _count(self._get(key), f"{self.where}.{key}")

    def ms(self, key: str) -> float:
        value = self._get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._bad(key, "a number", value)
        # (Compared, not converted: a whole number too large for a float makes math.isfinite raise
        # OverflowError; NaN and the infinities fail the comparison too.)
        if not 0 <= value <= MAX_MS:
            raise BadReportError(
                f"{self.where}.{key}: expected a finite number from 0 to {MAX_MS:g}, got {_shown(value)}"
            )
        return float(value) + 0.0  # (+ 0.0: -0.0 is 0)

    def boolean(self, key: str) -> bool:
        value = self._get(key)
        if not isinstance(value, bool):
            raise self._bad(key, "true or false", value)
        return value

    def optional_string(self, key: str, limit: int) -> str | None:
        return None if self._get(key) is None else self.string(key, limit)

    def integer(self, key: str, low: int, high: int) -> int:
        value = self._get(key)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            shown = value if isinstance(value, int) else _kind(value)
            raise BadReportError(f"{self.where}.{key}: expected a whole number from {low} to {high}, got {shown}")
        return value

    def list(self, key: str, limit: int, item: Callable[[object, str], Any]) -> list[Any]:
        return _list(self._get(key), f"{self.where}.{key}", limit, item)

    def context(self, key: str) -> dict[str, str]:
        value = self._get(key)
        where = f"{self.where}.{key}"
        if not isinstance(value, dict):
            raise BadReportError(f"{where}: expected an object, got {_kind(value)}")
        if len(value) > MAX_CONTEXT_KEYS:
            raise BadReportError(f"{where}: more than {MAX_CONTEXT_KEYS} keys")
        checked = {}
        for name, text in value.items():
            if len(name) > _SHORT:
                raise BadReportError(f"{where}: a key longer than {_SHORT} characters")
            if not isinstance(text, str) or len(text) > _LINE:
                raise BadReportError(
                    f"{where}[{printable(name)[:40]!r}]: expected a string of at most {_LINE} characters"
                )
            checked[printable(name)] = printable(text)
        return checked

    def level(self, key: str, *, optional: bool = False) -> str | None:
        value = self._get(key)
        if value is None and optional:
            return None
        if not (isinstance(value, str) and value in LEVELS):
            shown = printable(value[:20]) if isinstance(value, str) else _kind(value)
            raise BadReportError(f"{self.where}.{key}: expected one of {', '.join(LEVELS)}, got {shown!r}")
        return value


def _count(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadReportError(f"{where}: expected a whole number, got {_kind(value)}")
    if not 0 <= value <= MAX_COUNT:
        raise BadReportError(f"{where}: expected a whole number from 0 to 2**53, got {_shown(value)}")
    return value


def check_nonce(document: dict[str, Any], nonce: str, name: str) -> None:
    """The document was written by this attach's agent: it carries the nonce only that agent was given."""
    sent = document.get("nonce")
    if not (isinstance(sent, str) and hmac.compare_digest(sent.encode(), nonce.encode())):
        raise BadReportError(f"{name}: not written for this attach (its nonce is missing or wrong)")


def status(document: dict[str, Any], nonce: str) -> dict[str, Any]:
    """A checked `status.json`: `{"state": "started"|"done"|"error", ...}`, its strings printable."""
    check_nonce(document, nonce, "status.json")
    fields = _Fields(document, "status.json")
    state = fields.string("state", _SHORT)
    if state == "error":
        return {"state": state, "error": fields.string("error", _LINE)}
    if state == "started":
        return {
            "state": state,
            "already_running": fields.boolean("already_running"),
            "threshold_ms": fields.ms("threshold_ms"),
        }
    if state == "done":
        return {"state": state}
    raise BadReportError(f"status.json.state: expected started, done or error, got {state[:20]!r}")


def report(document: dict[str, Any], nonce: str, pid: int) -> dict[str, Any]:
    """A checked `report.json`, with only the keys aiocop knows, every string printable."""
    check_nonce(document, nonce, "report.json")
    fields = _Fields(document, "report.json")
    if fields.count("pid") != pid:
        raise BadReportError(f"report.json.pid: {document['pid']} is not the PID attached to ({pid})")
    sites = document.get("call_sites")
    if not isinstance(sites, list):
        raise BadReportError(f"report.json.call_sites: expected an array, got {_kind(sites)}")
    if len(sites) > MAX_CALL_SITES:
        raise BadReportError(f"report.json.call_sites: more than {MAX_CALL_SITES} rows")
    return {
        "pid": pid,
        "python": fields.string("python", _SHORT),
        "aiocop": fields.string("aiocop", _SHORT),
        "seconds": fields.ms("seconds"),
        "threshold_ms": fields.ms("threshold_ms"),
        "already_running": fields.boolean("already_running"),
        "loops": fields.count("loops"),
        "events": fields.count("events"),
        "dropped_calls": fields.count("dropped_calls"),
        "worst_impact": fields.level("worst_impact", optional=True),
        "call_sites": [_row(row, f"report.json.call_sites[{i}]") for i, row in enumerate(sites)],
        # An agent of an older aiocop sends neither: none hung, no steps.
        "hangs": _list(document.get("hangs", []), "report.json.hangs", MAX_HANGS, _hang),
        "timeline": None if document.get("timeline") is None else _timeline(document["timeline"], len(sites)),
    }


def _row(document: object, where: str) -> dict[str, Any]:
    fields = _Fields(document, where)
    events = fields.document.get("events")
    if not isinstance(events, dict) or not events:
        expected = "a non-empty object of event names to counts"
        raise BadReportError(f"{where}.events: expected {expected}, got {_kind(events)}")
    if len(events) > MAX_EVENTS_PER_SITE:
        raise BadReportError(f"{where}.events: more than {MAX_EVENTS_PER_SITE} event names")
    checked: dict[str, int] = {}
    for name, n in events.items():
        if len(name) > _SHORT:
            raise BadReportError(f"{where}.events: an event name longer than {_SHORT} characters")
        checked[printable(name)] = _count(n, f"{where}.events[{printable(name)[:40]!r}]")
    row: dict[str, Any] = {
        "call_site": fields.string("call_site", _LINE),
        "event": fields.string("event", _LINE),
        "events": checked,
        "count": fields.count("count"),
        "steps": fields.count("steps"),
        "total_ms": fields.ms("total_ms"),
        "worst_ms": fields.ms("worst_ms"),
        "step_shared": fields.boolean("step_shared"),
        "impact": fields.level("impact"),
        "example_trace": fields.string("example_trace", _TRACE),
    }
    if "known" in fields.document:
        row["known"] = fields.boolean("known")
    return row


def _list(value: object, where: str, limit: int, item: Callable[[object, str], Any]) -> list[Any]:
    if not isinstance(value, list):
        raise BadReportError(f"{where}: expected an array, got {_kind(value)}")
    if len(value) > limit:
        raise BadReportError(f"{where}: more than {limit} items")
    return [item(entry, f"{where}[{i}]") for i, entry in enumerate(value)]


def _frame(value: object, where: str) -> list[Any]:
    """`[file, line, function]` (and, in a hang's stack, the line's source text)."""
    if not (isinstance(value, list) and len(value) in (3, 4)):
        raise BadReportError(f"{where}: expected [file, line, function], got {_kind(value)}")
    fields = _Fields(dict(zip(("file", "line", "function", "source"), value, strict=False)), where)
    frame: list[Any] = [
        fields.string("file", _LINE),
        fields.integer("line", 0, 2**31),
        fields.string("function", _LINE),
    ]
    if len(value) == 4:
        frame.append(fields.string("source", _LINE))
    return frame


def _hang(document: object, where: str) -> dict[str, Any]:
    """A hung loop's latest report, as the agent's `hang_records` writes it."""
    fields = _Fields(document, where)
    ended = fields.document.get("ended_after_ms")
    return {
        "elapsed_ms": fields.ms("elapsed_ms"),
        "hang_reports": fields.count("hang_reports"),
        "task": fields.optional_string("task", _LINE),
        "thread": fields.string("thread", _LINE),
        "loop": fields.string("loop", _LINE),
        "culprit": fields.string("culprit", _LINE),
        "call_site": fields.string("call_site", _LINE),
        "context": fields.context("context"),
        "blocker": fields.string("blocker", _LINE),
        "blocker_trace": fields.string("blocker_trace", _TRACE),
        "stack": fields.list("stack", MAX_FRAMES, _frame),
        "trace": fields.string("trace", _TRACE),
        "ended_after_ms": None if ended is None else fields.ms("ended_after_ms"),
    }


def _timeline(document: object, rows: int) -> dict[str, Any]:
    """The steps of the HTML report's model (`_timeline.build`), each field checked: the renderers trust them."""
    fields = _Fields(document, "report.json.timeline")
    return {
        "steps": fields.list("steps", MAX_TIMELINE_STEPS, lambda step, where: _step(step, where, rows)),
        "steps_dropped": fields.count("steps_dropped"),
        "duration_ms": fields.ms("duration_ms"),
    }


def _step(document: object, where: str, rows: int) -> dict[str, Any]:
    fields = _Fields(document, where)
    if fields.ms("t0") > fields.ms("t1"):
        raise BadReportError(f"{where}: it ends (t1) before it starts (t0)")
    return {
        "id": fields.count("id"),
        "t0": fields.ms("t0"),
        "t1": fields.ms("t1"),
        "elapsed_ms": fields.ms("elapsed_ms"),
        "reason": fields.string("reason", _SHORT),
        "impact": fields.level("impact"),
        "site": fields.string("site", _LINE),
        "task": fields.optional_string("task", _LINE),
        "thread": fields.string("thread", _LINE),
        "loop": fields.string("loop", _LINE),
        "culprit": fields.string("culprit", _LINE),
        "context": fields.context("context"),
        "rows": fields.list("rows", MAX_CALL_SITES, lambda n, at: _index(n, at, rows)),
        "calls": fields.list("calls", MAX_ITEMS, _call),
        "samples": fields.list("samples", MAX_ITEMS, _sample),
        "dropped_calls": fields.count("dropped_calls"),
    }


def _index(value: object, where: str, rows: int) -> int:
    n = _count(value, where)
    if n >= rows:
        raise BadReportError(f"{where}: {n} is not a row of the report's {rows} call sites")
    return n


def _call(document: object, where: str) -> dict[str, Any]:
    fields = _Fields(document, where)
    frames = fields.list("frames", MAX_FRAMES, _frame)
    call = {
        "event": fields.string("event", _LINE),
        "app_site": fields.string("app_site", _LINE),
        "entry_point": fields.string("entry_point", _LINE),
        "source": fields.string("source", _LINE),
        "trace": fields.string("trace", _TRACE),
        "frames": frames,
        "app_frame": fields.integer("app_frame", -1, len(frames) - 1),
    }
    # Absent from the report of a target whose own aiocop is older: the
    # flame graphs then draw a step no sample found at its first call.
    if "weight" in fields.document:
        call["weight"] = fields.count("weight")
    return call


def _sample(document: object, where: str) -> dict[str, Any]:
    fields = _Fields(document, where)
    frames = fields.list("frames", MAX_FRAMES, _frame)
    sample = {
        "count": fields.count("count"),
        "trace": fields.string("trace", _TRACE),
        "app_site": fields.string("app_site", _LINE),
        "frames": frames,
        "app_frame": fields.integer("app_frame", -1, len(frames) - 1),
    }
    # Absent from the report of a target whose own aiocop is older: the
    # flame graphs then weigh its samples by their count.
    if "ms" in fields.document:
        sample["ms"] = fields.ms("ms")
    return sample


def render_hangs(hangs: list[dict[str, Any]]) -> str:
    """The hung loops of a checked report, still hung ones first, as `run` prints them (`Summary.render_hangs`).

    Every string in them was made printable when checked; the source lines
    are the target's, read there: nothing here opens a file the target names.
    """
    if not hangs:
        return ""
    ordered = sorted(hangs, key=lambda hang: hang["ended_after_ms"] is not None)
    still = sum(1 for hang in hangs if hang["ended_after_ms"] is None)
    out = [f"aiocop: {len(hangs)} loop(s) hung during the window, {still} still hung now:"]
    for hang in ordered[:MAX_HANGS_SHOWN]:
        ended = hang["ended_after_ms"]
        out.append(
            "[STILL HUNG] latest report:" if ended is None else f"[ended, after {ended / 1000.0:.1f} s] latest report:"
        )
        out.append(_describe_hang(hang))
    if len(ordered) > MAX_HANGS_SHOWN:
        out.append(f"... {len(ordered) - MAX_HANGS_SHOWN} more hung loop(s); see --json for all")
    out.append("(a step already running when aiocop attached is timed from the attach: it has hung at least that long)")
    return "\n".join(out)


def _cut(text: str) -> str:
    return text if len(text) <= MAX_SHOWN_CHARS else text[: MAX_SHOWN_CHARS - 3] + "..."


def _describe_hang(hang: dict[str, Any]) -> str:
    # The words of _report.describe_hang, from the checked record; each
    # string cut at MAX_SHOWN_CHARS, the stack at MAX_HANG_FRAMES_SHOWN.
    where = f"task {_cut(hang['task'])!r}" if hang["task"] is not None else "a callback"
    again = f", report {hang['hang_reports']}" if hang["hang_reports"] > 1 else ""
    lines = [
        f"loop HUNG for {hang['elapsed_ms'] / 1000.0:.1f} s (still running{again}) in {where} on thread "
        f"{_cut(hang['thread'])!r}: {_cut(hang['culprit']) or 'no stack'} at {_cut(hang['call_site']) or 'unknown'}",
        f"  loop: {_cut(hang['loop'])}",
    ]
    if hang["context"]:
        lines.append("  context: " + _cut(", ".join(f"{k}={v!r}" for k, v in hang["context"].items())))
    if hang["blocker"]:
        lines.append(f"  blocked by: {_cut(hang['blocker'])}")
        if hang["blocker_trace"]:
            lines.append("    its stack: " + _cut(hang["blocker_trace"]))
    stack = hang["stack"]
    if stack:
        lines.append("  stack (innermost first):")
        for file, line, function, *source in stack[:MAX_HANG_FRAMES_SHOWN]:
            lines.append(f"    {_cut(file)}:{line} in {_cut(function)}")
            if source and source[0]:
                lines.append(f"      {_cut(source[0])}")
        if len(stack) > MAX_HANG_FRAMES_SHOWN:
            lines.append(f"    ... {len(stack) - MAX_HANG_FRAMES_SHOWN} more frame(s); see --json for all")
    elif hang["trace"]:
        lines.append(f"  stack: {_cut(hang['trace'])}")
    return "\n".join(lines)
