"""What an attached process writes back is checked before use (aiocop/_commands/attach/report.py), on any Python.

The end-to-end cases, with a hostile target, are in tests/commands/test_attach.py (CPython 3.14+).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from aiocop._commands.attach.report import (
    MAX_REPORT_BYTES,
    BadReportError,
    parse,
    report,
    status,
)
from aiocop._common.escape import printable
from aiocop._reporting.report import Summary

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
        (("loops",), 10**400, "report.json.loops: expected a whole number from 0 to 2**53, got a number of 401 digits"),
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


# --- issue 25 and 28: the hung loops and the steps for --html -------------------------------------------------

HANG: dict[str, Any] = {
    "elapsed_ms": 2100.0,
    "hang_reports": 2,
    "task": "Task-1",
    "thread": "MainThread",
    "loop": "asyncio.unix_events._UnixSelectorEventLoop@0x7f",
    "culprit": "running Python code",
    "call_site": "app.py:50:spin",
    "context": {"request_id": "r-1"},
    "blocker": "",
    "blocker_trace": "",
    "stack": [["/srv/app.py", 50, "spin", "n += 1"], ["/srv/app.py", 60, "handle", ""]],
    "trace": "app.py:50:spin <- app.py:60:handle",
    "ended_after_ms": None,
}
FRAME = ["/srv/app.py", 12, "handle"]
STEP: dict[str, Any] = {
    "id": 0,
    "t0": 10.0,
    "t1": 12.5,
    "elapsed_ms": 2.5,
    "reason": "io_blocking",
    "impact": "low",
    "site": "app.py:1:f",
    "task": None,
    "thread": "MainThread",
    "loop": "asyncio.unix_events._UnixSelectorEventLoop@0x7f",
    "culprit": "",
    "context": {},
    "rows": [0],
    "calls": [
        {
            "event": "os.stat",
            "app_site": "app.py:1:f",
            "entry_point": "app.py:1:f",
            "source": "os.stat('/')",
            "trace": "app.py:1:f",
            "frames": [FRAME],
            "app_frame": 0,
            "weight": 1,
        }
    ],
    "samples": [
        {"count": 3, "trace": "app.py:1:f", "app_site": "app.py:1:f", "frames": [FRAME], "app_frame": -1, "ms": 2.5}
    ],
    "dropped_calls": 0,
}
TIMELINE: dict[str, Any] = {"steps": [STEP], "steps_dropped": 0, "duration_ms": 1000.0}


def test_hangs_and_steps_are_kept_and_a_hang_renders_as_run_prints_it() -> None:
    from aiocop._commands.attach.report import render_hangs

    result = checked({**REPORT, "hangs": [HANG], "timeline": TIMELINE})
    assert result["hangs"] == [HANG]
    assert result["timeline"] == TIMELINE
    text = render_hangs(result["hangs"])
    assert text.splitlines()[:8] == [
        "aiocop: 1 loop(s) hung during the window, 1 still hung now:",
        "[STILL HUNG] latest report:",
        "loop HUNG for 2.1 s (still running, report 2) in task 'Task-1' on thread 'MainThread': running Python code "
        "at app.py:50:spin",
        "  loop: asyncio.unix_events._UnixSelectorEventLoop@0x7f",
        "  context: request_id='r-1'",
        "  stack (innermost first):",
        "    /srv/app.py:50 in spin",
        "      n += 1",
    ]
    assert checked(REPORT)["hangs"] == [] and checked(REPORT)["timeline"] is None  # an older agent sends neither
    # ... nor the calls' weights (issue 37): the flame graphs then take a step's first call; nor the samples'
    # times: they weigh the samples by count.
    older = copy.deepcopy(TIMELINE)
    del older["steps"][0]["calls"][0]["weight"]
    del older["steps"][0]["samples"][0]["ms"]
    assert checked({**REPORT, "timeline": older})["timeline"] == older


@pytest.mark.parametrize(
    ("path", "value", "said"),
    [
        (("hangs",), {}, "report.json.hangs: expected an array, got an object"),
        (("hangs",), [HANG] * 1001, "report.json.hangs: more than 1000 items"),
        (("hangs", 0, "stack", 0, 1), "50", "report.json.hangs[0].stack[0].line: expected a whole number from 0"),
        (("hangs", 0, "stack", 0), ["a"], "report.json.hangs[0].stack[0]: expected [file, line, function]"),
        (("hangs", 0, "stack"), [FRAME] * 1001, "report.json.hangs[0].stack: more than 1000 items"),
        (("hangs", 0, "context"), {"k": 1}, "report.json.hangs[0].context['k']: expected a string"),
        (("hangs", 0, "context"), {str(n): "" for n in range(101)}, "report.json.hangs[0].context: more than 100"),
        (("hangs", 0, "task"), 7, "report.json.hangs[0].task: expected a string, got a number"),
        (("hangs", 0, "elapsed_ms"), -1, "report.json.hangs[0].elapsed_ms: expected a finite number"),
        (("hangs", 0, "ended_after_ms"), "soon", "report.json.hangs[0].ended_after_ms: expected a number"),
        (("timeline", "steps"), None, "report.json.timeline.steps: expected an array, got null"),
        (("timeline", "steps", 0, "rows", 0), 7, "report.json.timeline.steps[0].rows[0]: 7 is not a row of the"),
        (("timeline", "steps", 0, "t1"), 1e13, "report.json.timeline.steps[0].t1: expected a finite"),
        (("timeline", "steps", 0, "impact"), "<b>", "report.json.timeline.steps[0].impact: expected one of low"),
        (("timeline", "steps", 0, "calls", 0, "app_frame"), 1, "report.json.timeline.steps[0].calls[0].app_frame:"),
        (("timeline", "steps", 0, "samples", 0, "count"), -1, "report.json.timeline.steps[0].samples[0].count:"),
        (("timeline", "steps", 0, "calls", 0, "weight"), "50", "report.json.timeline.steps[0].calls[0].weight:"),
        (("timeline", "steps", 0, "samples", 0, "ms"), -1.0, "report.json.timeline.steps[0].samples[0].ms: expected a"),
        (("timeline", "steps", 0, "samples", 0, "ms"), "5", "report.json.timeline.steps[0].samples[0].ms: expected a"),
        (("timeline", "steps", 0, "samples", 0, "ms"), True, "report.json.timeline.steps[0].samples[0].ms: expected a"),
        # (A whole number too large for a float: compared, not converted, and named by its length.)
        (
            ("timeline", "steps", 0, "samples", 0, "ms"),
            10**400,
            "report.json.timeline.steps[0].samples[0].ms: expected a finite number from 0 to 1e+12, got a number of "
            "401 digits",
        ),
        (("timeline", "steps"), [STEP] * 5001, "report.json.timeline.steps: more than 5000 items"),
        (("timeline", "steps", 0, "t0"), 20.0, "report.json.timeline.steps[0]: it ends (t1) before it starts (t0)"),
    ],
)
def test_a_bad_hang_or_step_is_named(path: tuple[Any, ...], value: Any, said: str) -> None:
    document = copy.deepcopy({**REPORT, "hangs": [HANG], "timeline": TIMELINE})
    place: Any = document
    for key in path[:-1]:
        place = place[key]
    place[path[-1]] = value
    with pytest.raises(BadReportError) as caught:
        report(parse(json.dumps(document).encode(), "report.json", MAX_REPORT_BYTES), NONCE, PID)
    assert str(caught.value).startswith(said), str(caught.value)


def test_every_string_of_a_hang_and_a_step_is_made_printable() -> None:
    from aiocop._commands.attach.report import render_hangs

    hang = copy.deepcopy(HANG)
    hang["culprit"] = f"running{ESCAPES}\nforged line"
    hang["stack"][0] = [f"/srv/{ESCAPES}.py", 1, ESCAPES, f"x = 1{ESCAPES}"]
    hang["context"] = {ESCAPES: ESCAPES}
    step = copy.deepcopy(STEP)
    step["calls"][0]["source"] = f"</script><script>alert(1)</script>{ESCAPES}"
    result = checked({**REPORT, "hangs": [hang], "timeline": {**TIMELINE, "steps": [step]}})
    text = render_hangs(result["hangs"]) + json.dumps(result["timeline"], ensure_ascii=False)
    assert not any(ch in text for ch in "\x1b\x07\x9b\u202e\u200b\u2028\ud800\x7f")
    assert "forged line" in text and "\nforged line" not in text  # a newline cannot forge a line of the report


def test_a_target_sending_many_hangs_does_not_fill_the_terminal() -> None:
    from aiocop._commands.attach.report import render_hangs

    text = render_hangs(checked({**REPORT, "hangs": [HANG] * 1000})["hangs"])
    assert text.count("[STILL HUNG]") == 20
    assert "... 980 more hung loop(s); see --json for all" in text


def test_one_hang_with_a_huge_stack_prints_a_bounded_text() -> None:
    # A target may send hangs of hundreds of frames whose every string is a kilobyte (all within the report's
    # limits): printed whole, 20 such hangs were 12 MB on the terminal. The --json output keeps it all.
    from aiocop._commands.attach.report import MAX_HANG_FRAMES_SHOWN, MAX_SHOWN_CHARS, render_hangs

    long = "x" * 1_000
    hang = {
        **HANG,
        "culprit": long,
        "call_site": long,
        "blocker": long,
        "blocker_trace": "y" * 30_000,
        "stack": [[long, 7, long, long]] * 200,
    }
    result = checked({**REPORT, "hangs": [hang] * 20})
    assert len(result["hangs"][0]["stack"]) == 200  # kept whole for --json
    text = render_hangs(result["hangs"])
    assert "... 100 more frame(s); see --json for all" in text
    assert max(len(line) for line in text.splitlines()) <= 3 * MAX_SHOWN_CHARS + 200
    assert text.count(" in " + "x" * (MAX_SHOWN_CHARS - 3) + "...") == 20 * MAX_HANG_FRAMES_SHOWN
    assert len(text) < 20 * (MAX_HANG_FRAMES_SHOWN + 10) * 3 * (MAX_SHOWN_CHARS + 20)  # about 2 MB, was 12
