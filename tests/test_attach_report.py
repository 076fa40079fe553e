"""What an attached process writes back is checked before use (aiocop/_attach_report.py), on any Python.

The end-to-end cases, with a hostile target, are in tests/test_attach.py (CPython 3.14+).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from aiocop._attach_report import (
    MAX_REPORT_BYTES,
    BadReportError,
    parse,
    printable,
    report,
    status,
)
from aiocop._report import Summary

NONCE = "0123456789abcdef0123456789abcdef"
PID = 4321

ROW = {
    "call_site": "app.py:1:f",
    "event": "os.stat",
    "events": {"os.stat": 2},
    "count": 2,
    "steps": 2,
    "total_ms": 1.5,
    "worst_ms": 1.0,
    "step_shared": False,
    "impact": "low",
    "example_trace": "app.py:1:f",
}
REPORT: dict[str, Any] = {
    "pid": PID,
    "python": "3.14.0",
    "aiocop": "2.0.0",
    "seconds": 1.0,
    "threshold_ms": 30,
    "already_running": False,
    "loops": 1,
    "events": 2,
    "dropped_calls": 0,
    "worst_impact": "low",
    "call_sites": [ROW],
    "nonce": NONCE,
}


def checked(document: dict[str, Any]) -> dict[str, Any]:
    return report(parse(json.dumps(document).encode(), "report.json", MAX_REPORT_BYTES), NONCE, PID)


def test_a_good_report_is_kept_and_renders() -> None:
    result = checked(REPORT)
    assert result["call_sites"] == [ROW]
    assert "nonce" not in result
    assert "app.py:1:f" in Summary.from_dict(result).render()


def test_unknown_keys_are_dropped() -> None:
    assert "extra" not in checked({**REPORT, "extra": {"anything": [1, 2]}})


def broken(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    document = copy.deepcopy(REPORT)
    place = document
    for key in path[:-1]:
        place = place[key]
    if value is KeyError:
        del place[path[-1]]
    else:
        place[path[-1]] = value
    return document


@pytest.mark.parametrize(
    ("path", "value", "said"),
    [
        (("pid",), "4321", "report.json.pid: expected a whole number, got a string"),
        (("pid",), 1, "report.json.pid: 1 is not the PID attached to (4321)"),
        (("python",), 3.14, "report.json.python: expected a string, got a number"),
        (("python",), "3" * 300, "report.json.python: longer than 256 characters"),
        (("seconds",), -1, "report.json.seconds: expected a finite number from 0 to 1e+12, got -1"),
        (("seconds",), True, "report.json.seconds: expected a number, got a boolean"),
        (("already_running",), 0, "report.json.already_running: expected true or false, got a number"),
        (("loops",), 2**60, "report.json.loops: expected a whole number from 0 to 2**53, got 1152921504606846976"),
        (("events",), KeyError, "report.json: the key 'events' is missing"),
        (("worst_impact",), "extreme", "report.json.worst_impact: expected one of low, medium, high, got 'extreme'"),
        (("call_sites",), {}, "report.json.call_sites: expected an array, got an object"),
        (("call_sites", 0), "row", "report.json.call_sites[0]: expected an object, got a string"),
        (("call_sites", 0, "count"), "7", "report.json.call_sites[0].count: expected a whole number, got a string"),
        (("call_sites", 0, "events"), {}, "report.json.call_sites[0].events: expected a non-empty object"),
        (("call_sites", 0, "events"), [], "report.json.call_sites[0].events: expected a non-empty object"),
        (("call_sites", 0, "events", "os.stat"), -2, "report.json.call_sites[0].events['os.stat']: expected a whole"),
        (("call_sites", 0, "impact"), None, "report.json.call_sites[0].impact: expected one of low, medium, high"),
        (("call_sites", 0, "step_shared"), "no", "report.json.call_sites[0].step_shared: expected true or false"),
        (("call_sites", 0, "example_trace"), KeyError, "report.json.call_sites[0]: the key 'example_trace' is missing"),
        (("nonce",), "f" * 32, "report.json: not written for this attach (its nonce is missing or wrong)"),
        (("nonce",), KeyError, "report.json: not written for this attach (its nonce is missing or wrong)"),
        (("nonce",), 5, "report.json: not written for this attach (its nonce is missing or wrong)"),
    ],
)
def test_a_bad_field_is_named(path: tuple[Any, ...], value: Any, said: str) -> None:
    with pytest.raises(BadReportError) as caught:
        checked(broken(path, value))
    assert str(caught.value).startswith(said), str(caught.value)


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (b"[" * 200_000 + b"]" * 200_000, "report.json: nested too deeply"),
        (b'{"a": NaN}', "report.json: not JSON (NaN is not a number aiocop accepts)"),
        (b'{"a": -Infinity}', "report.json: not JSON (-Infinity is not a number aiocop accepts)"),
        (b'{"a": 1, "a": 2}', "report.json: not JSON (a key appears twice in one object)"),
        (b"\xff\xfe", "report.json: not JSON ('utf-8' codec can't decode byte 0xff"),
        (b"", "report.json: not JSON (Expecting value: line 1 column 1 (char 0))"),
        (b"[]", "report.json: expected a JSON object, got an array"),
        (b'"\\u001b[2J"', "report.json: expected a JSON object, got a string"),
        (b'{"n": ' + b"9" * 5000 + b"}", "report.json: not JSON (Exceeds the limit"),
    ],
)
def test_what_is_not_json_aiocop_reads_is_refused(data: bytes, said: str) -> None:
    with pytest.raises(BadReportError) as caught:
        parse(data, "report.json", MAX_REPORT_BYTES)
    assert str(caught.value).startswith(said), str(caught.value)


def test_a_document_over_the_limit_is_refused_unread() -> None:
    with pytest.raises(BadReportError, match=r"report\.json: larger than 100 bytes"):
        parse(b"{" + b" " * 100 + b"}", "report.json", 100)


def test_infinity_as_a_large_number_is_refused() -> None:
    with pytest.raises(BadReportError, match=r"report.json.seconds: expected a finite number .* got inf"):
        report(parse(json.dumps(REPORT).replace('"seconds": 1.0', '"seconds": 1e999').encode(), "r", 10**6), NONCE, PID)


ESCAPES = "\x1b]0;owned\x07\x1b[2J\x9b\u202e\u200b\u2028\ud800\x7f"


def test_printable_escapes_what_a_terminal_acts_on() -> None:
    assert printable(ESCAPES) == "\\x1b]0;owned\\x07\\x1b[2J\\x9b\\u202e\\u200b\\u2028\\ud800\\x7f"
    assert printable("é ü 中文 tab") == "é ü 中文 tab"
    assert printable("a\tb\nc") == "a\\x09b\\x0ac"
    assert printable("\U000e0001") == "\\U000e0001"


def test_every_string_of_a_report_is_made_printable() -> None:
    document = copy.deepcopy(REPORT)
    document["python"] = f"3.14{ESCAPES}"
    document["aiocop"] = ESCAPES
    row = document["call_sites"][0]
    row["call_site"] = f"app.py:1:{ESCAPES}"
    row["event"] = ESCAPES
    row["events"] = {ESCAPES: 2}
    row["example_trace"] = ESCAPES
    result = checked(document)
    text = json.dumps(result, ensure_ascii=False)
    assert not any(ch in text for ch in "\x1b\x07\x9b\u202e\u200b\u2028\ud800\x7f")
    rendered = Summary.from_dict(result).render()
    assert "\x1b" not in rendered and "\\x1b]0;owned" in rendered


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        (
            {"state": "started", "already_running": True, "threshold_ms": 40},
            {"state": "started", "already_running": True, "threshold_ms": 40.0},
        ),
        ({"state": "done"}, {"state": "done"}),
        ({"state": "error", "error": f"boom{ESCAPES}"}, {"state": "error", "error": "boom" + printable(ESCAPES)}),
    ],
)
def test_a_good_status(document: dict[str, Any], expected: dict[str, Any]) -> None:
    assert status({**document, "nonce": NONCE}, NONCE) == expected


@pytest.mark.parametrize(
    ("document", "said"),
    [
        ({"state": "started", "threshold_ms": 40}, "status.json: the key 'already_running' is missing"),
        ({"state": "error"}, "status.json: the key 'error' is missing"),
        ({"state": "error", "error": 1}, "status.json.error: expected a string, got a number"),
        ({"state": "error", "error": "x" * 5000}, "status.json.error: longer than 4096 characters"),
        ({"state": "dancing"}, "status.json.state: expected started, done or error, got 'dancing'"),
        ({"state": None}, "status.json.state: expected a string, got null"),
    ],
)
def test_a_bad_status(document: dict[str, Any], said: str) -> None:
    with pytest.raises(BadReportError, match="^" + said.replace("(", r"\(").replace(")", r"\)")):
        status({**document, "nonce": NONCE}, NONCE)
    with pytest.raises(BadReportError, match="nonce is missing or wrong"):
        status(document, NONCE)
