"""What a step's report shows and tells the user to do (issue 38): the calls that made its
severity, the step's time worded as the step's, and advice that fits where the call was made."""

from __future__ import annotations

import os

from aiocop import SlowTaskEvent
from aiocop._model.events import BlockingEventInfo
from aiocop._pytest_support.events import message
from aiocop._reporting.logs import Occurrence, headline, structured_fields
from aiocop._reporting.report import describe, library_site

LIBRARY_FILE = os.path.join(os.sep, "venv", "lib", "python3.12", "site-packages", "fastapi", "routing.py")
APP_FILE = os.path.join(os.getcwd(), "app", "views.py")


def _call(name: str, weight: int, filename: str, line: int, function: str) -> BlockingEventInfo:
    marker = "site-packages" + os.sep
    site = filename.rsplit(marker, maxsplit=1)[-1] if marker in filename else "app/views.py"
    entry = f"{site}:{line}:{function}"
    return BlockingEventInfo(
        event=f"{name}(x)",
        name=name,
        trace=entry,
        entry_point=entry,
        severity=weight,
        frames=[(filename, line, function)],
    )


def _event(calls: list[BlockingEventInfo], elapsed_ms: float = 6.0) -> SlowTaskEvent:
    score = sum(call["severity"] or 0 for call in calls)
    level = "high" if score >= 50 else "medium" if score >= 10 else "low"
    return SlowTaskEvent(elapsed_ms, 30.0, False, score, level, "io_blocking", calls, task_name="t")


def test_the_calls_that_made_the_severity_are_shown_when_the_list_is_cut() -> None:
    stats = [_call("os.stat", 1, LIBRARY_FILE, 300 + i, "_extract_endpoint_context") for i in range(10)]
    sleep = _call("time.sleep", 50, APP_FILE, 14, "handler")
    late = [_call("os.stat", 1, LIBRARY_FILE, 400 + i, "_extract_endpoint_context") for i in range(2)]
    text = describe(_event([*stats, sleep, *late]))

    assert "time.sleep(x)" in text
    assert "app/views.py:14:handler" in text
    assert text.count("os.stat(x)") == 9
    assert "... and 3 more, none heavier than those shown: os.stat x3" in text


def test_a_list_that_fits_is_shown_whole_in_call_order() -> None:
    calls = [_call("os.stat", 1, APP_FILE, 1, "f"), _call("time.sleep", 50, APP_FILE, 2, "f")]
    text = describe(_event(calls))
    assert text.index("os.stat(x)") < text.index("time.sleep(x)")
    assert "more" not in text


def test_the_time_given_is_the_steps_not_the_calls() -> None:
    event = _event([_call("os.stat", 1, APP_FILE, 1, "f")], elapsed_ms=6.0)
    assert "the step held the loop 6.0 ms, not the call alone" in describe(event).splitlines()[0]
    assert "the step held the loop 6.0 ms, not the call alone" in headline(event)
    assert "loop held 6.0 ms" not in headline(event)


def test_a_library_call_gets_the_narrow_call_site_rule_and_is_sent_to_the_library() -> None:
    call = _call("os.stat", 1, LIBRARY_FILE, 305, "_extract_endpoint_context")
    assert library_site(call) == ("fastapi/routing.py:_extract_endpoint_context", "fastapi")
    text = message([_event([call])], "call", "low", None)

    assert "to_thread" not in text
    assert 'aiocop_allow("os.stat", call_site="fastapi/routing.py:_extract_endpoint_context")' in text
    assert "'os.stat call_site=fastapi/routing.py:_extract_endpoint_context' in the ini key" in text
    assert "the fix belongs in fastapi" in text


def test_the_applications_own_call_is_told_to_go_non_blocking() -> None:
    own = _call("time.sleep", 50, APP_FILE, 14, "handler")
    library = _call("os.stat", 1, LIBRARY_FILE, 305, "_extract_endpoint_context")
    assert library_site(own) is None
    text = message([_event([own, library])], "call", "low", None)

    assert 'await asyncio.to_thread(...)), or allow it: @pytest.mark.aiocop_allow("time.sleep")' in text
    assert 'aiocop_allow("os.stat", call_site=' in text


def test_a_call_made_by_hand_without_frames_counts_as_the_applications() -> None:
    call = BlockingEventInfo(event="open(x)", trace="a.py:1:f", entry_point="a.py:1:f", severity=10)
    assert library_site(call) is None


def test_a_stall_or_hang_logs_its_impact_as_its_severity() -> None:
    # A stall and a hang have no calls to weigh: 1.x's score 0 made them
    # severity=low beside impact=high in every structured entry (issue 38).
    stall = SlowTaskEvent(120.0, 30.0, True, 0, "low", "cpu_blocking", [])
    hang = SlowTaskEvent(6000.0, 30.0, True, 0, "low", "hang", [], ongoing=True, hang_reports=1)
    for event in (stall, hang):
        fields = structured_fields(event, Occurrence(first=True))
        assert (fields["impact"], fields["severity"]) == ("high", "high")
    light = _event([_call("os.stat", 1, APP_FILE, 1, "f")], elapsed_ms=120.0)
    fields = structured_fields(light, Occurrence(first=True))
    assert (fields["impact"], fields["severity"]) == ("high", "low")  # calls made: their weight
