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
import math
import unicodedata
from typing import Any

LEVELS = ("low", "medium", "high")  # SlowTaskEvent.impact's values
MAX_STATUS_BYTES = 64 << 10
MAX_REPORT_BYTES = 16 << 20
MAX_CALL_SITES = 100_000
MAX_EVENTS_PER_SITE = 1_000
MAX_COUNT = 2**53  # whole numbers beyond this lose precision in JSON readers
MAX_MS = 1e12  # about 31 years, in ms: no window or step lasts longer
_SHORT = 256  # versions, event names
_LINE = 4_096  # call sites, error messages
_TRACE = 65_536

# Unicode categories never shown raw: C0/C1 controls and DEL (terminal escapes),
# format characters (bidirectional overrides, zero-width), lone surrogates
# (which stderr could not even encode), line and paragraph separators.
_UNPRINTABLE = frozenset(("Cc", "Cf", "Cs", "Zl", "Zp"))


class BadReportError(Exception):
    """A document from the target that cannot be used, said in one line."""


def printable(text: str) -> str:
    """`text` with every character a terminal could act on escaped (`\\x1b`, `\\u202e`)."""
    if text.isprintable():  # the usual case: nothing to do
        return text
    out = []
    for char in text:
        if unicodedata.category(char) in _UNPRINTABLE:
            code = ord(char)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(char)
    return "".join(out)


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
        if not (math.isfinite(value) and 0 <= value <= MAX_MS):
            raise BadReportError(f"{self.where}.{key}: expected a finite number from 0 to {MAX_MS:g}, got {value!r}")
        return float(value)

    def boolean(self, key: str) -> bool:
        value = self._get(key)
        if not isinstance(value, bool):
            raise self._bad(key, "true or false", value)
        return value

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
        raise BadReportError(f"{where}: expected a whole number from 0 to 2**53, got {value}")
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
