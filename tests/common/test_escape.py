"""Text that leaves aiocop for a terminal or a log: control characters the watched program chose are escaped.

A file name chosen by a client (an upload), a call's arguments, a task's name:
written raw, ESC sequences retitle or clear the terminal, CR overwrites a log
line, U+202E reverses text, a newline forges a log line. Every surface that
prints them is checked here with one hostile event: the table, `run -v`'s
account, `log_events()`, structlog's fields, the pytest plugin's failure
section, hang reports. The plain data (`--json`, `record.aiocop`) keeps the
characters: JSON escapes them itself.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import unicodedata
from typing import TYPE_CHECKING

import pytest

import aiocop
from aiocop._common.escape import printable
from aiocop._pytest_support.events import message
from aiocop._reporting.logs import LoggingCallback, Occurrence, structured_fields
from aiocop._reporting.report import Summary, describe, describe_hang, to_record
from tests.conftest import ROOT

if TYPE_CHECKING:
    from pathlib import Path

# An OSC title sequence, a screen clear, a CR, a right-to-left override, a
# newline (a forged line) and a lone C1 CSI: what a hostile name carries.
EVIL = "\x1b]0;PWNED\x07\x1b[2J\rok\u202e\n\x9b"


def _event(evil: str, reason: str = "io_blocking", *, ongoing: bool = False) -> aiocop.SlowTaskEvent:
    site = f"/srv/app/{evil}up.py:7:handler{evil}"
    call: aiocop.BlockingEventInfo = {
        "event": f"os.stat(/srv/uploads/{evil}.png)",
        "trace": f"{site} <- /srv/app/main.py:3:main",
        "entry_point": site,
        "severity": 10,
        "name": "os.stat",
        "args": f"/srv/uploads/{evil}.png",
        "frames": [],
    }
    sample: aiocop.CpuStackSample = {
        "trace": site,
        "entry_point": site,
        "count": 2,
        "frames": [(f"/srv/app/{evil}up.py", 7, f"handler{evil}")],
    }
    return aiocop.SlowTaskEvent(
        12.0,
        10.0,
        True,
        10,
        "medium",
        reason,
        [] if reason == "cpu_blocking" else [call],
        context={"http_path": f"/{evil}"},
        cpu_stack_samples=[sample],
        task_name=f"task{evil}",
        thread_name=f"thread{evil}",
        call_site=site,
        culprit=f"time.sleep{evil}",
        loop=f"Loop{evil}",
        blocker=f"lock{evil}",
        ongoing=ongoing,
    )


def _assert_shown_safely(text: str, clean: str) -> None:
    # Nothing a terminal acts on, and not one line more than the same text
    # made of harmless names (a newline in a name forges no line).
    acting = [c for c in text if c != "\n" and unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp")]
    assert not acting, f"raw control characters reach the output: {acting!r} in {text!r}"
    assert text.count("\n") == clean.count("\n"), text
    assert "\\x1b]0;PWNED\\x07" in text, "the escaped text is still there to read"


@pytest.mark.parametrize("reason", ["io_blocking", "cpu_blocking"])
def test_describe_the_text_of_run_v_and_of_logs(reason: str) -> None:
    _assert_shown_safely(describe(_event(EVIL, reason)), describe(_event("x", reason)))


def test_hang_reports() -> None:
    _assert_shown_safely(
        describe_hang(_event(EVIL, "hang", ongoing=True)), describe_hang(_event("x", "hang", ongoing=True))
    )


def test_the_run_table() -> None:
    summaries = []
    for evil in (EVIL, "x"):
        summary = Summary()
        summary(_event(evil))
        summary(_event(evil, "cpu_blocking"))
        summaries.append(summary.render())
    _assert_shown_safely(*summaries)
    header, rule = summaries[0].splitlines()[2:4]
    assert len(header) == len(rule), "the columns are as wide as what they show"


def test_log_events_entries(caplog: pytest.LogCaptureFixture) -> None:
    texts = []
    for evil in (EVIL, "x"):
        callback = LoggingCallback("aiocop.test_escape", repeat_interval_s=0)
        with caplog.at_level(logging.WARNING, logger="aiocop.test_escape"):
            caplog.clear()
            callback(_event(evil))  # first: in full
            callback(_event(evil))  # again: the short line
            callback(_event(evil, "cpu_blocking"))
            callback(_event(evil, "hang", ongoing=True))
        texts.append("\n".join(r.getMessage() for r in caplog.records))
        if evil == EVIL:
            data = caplog.records[0].aiocop  # type: ignore[attr-defined]
            assert data["call_site"] == _event(EVIL).call_site, "record.aiocop, data for JSON, is not escaped"
    _assert_shown_safely(*texts)


def test_structlog_fields_are_printable_text() -> None:
    fields = structured_fields(_event(EVIL), Occurrence(first=True))
    clean = structured_fields(_event("x"), Occurrence(first=True))
    assert fields.keys() == clean.keys()
    for key, value in fields.items():
        _assert_fields(key, value)
    assert fields["call_site"] == printable(_event(EVIL).call_site)


def _assert_fields(key: str, value: object) -> None:
    if isinstance(value, str):
        assert value.isprintable() or all(c.isprintable() or c == " " for c in value), (key, value)
    elif isinstance(value, list | dict):
        for item in value.values() if isinstance(value, dict) else value:
            _assert_fields(key, item)


def test_the_pytest_failure_section() -> None:
    shown = message([_event(EVIL), _event(EVIL, "cpu_blocking")], "call", "medium", None)
    clean = message([_event("x"), _event("x", "cpu_blocking")], "call", "medium", None)
    _assert_shown_safely(shown, clean)


def test_json_keeps_the_characters() -> None:
    record = to_record(_event(EVIL))
    assert record["call_site"] == _event(EVIL).call_site
    assert json.loads(json.dumps(record))["blocking_calls"][0]["args"] == f"/srv/uploads/{EVIL}.png"


def test_run_prints_a_hostile_file_name_escaped(tmp_path: Path) -> None:
    # By hand, end to end: `python -m aiocop run -v` of a program whose file
    # name and whose blocking call's argument carry terminal escapes.
    name = "ev\x1b[31mil\u202e"
    program = tmp_path / f"{name}.py"
    target = tmp_path / "a\x1b]0;PWNED\x07b\x1b[2Jc\rd.txt"
    target.write_text("")
    program.write_text(
        f"import asyncio, os\n\nasync def main():\n    os.stat({str(target)!r})\n\nasyncio.run(main())\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "aiocop", "run", "-v", str(program)],
        capture_output=True,
        text=True,
        encoding="utf-8",
        errors="surrogateescape",
        timeout=120,
        check=False,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stderr and "\r" not in done.stderr and "\u202e" not in done.stderr, done.stderr
    assert "ev\\x1b[31mil\\u202e.py:4:main" in done.stderr, done.stderr
    assert "a\\x1b]0;PWNED\\x07b\\x1b[2Jc\\x0dd.txt" in done.stderr, done.stderr
