"""The pytest plugin beside pytest-timeout: each timed test's hang threshold sits below its timeout.

The choice is a function of the settings, checked directly; the plugin's
use of it is checked in pytest subprocesses whose tests read the threshold
in force while they run (no real time: nothing hangs here; the hang
reports themselves are in test_hangs.py).
"""

from __future__ import annotations

import os
import re
import textwrap

import pytest

from aiocop._pytest_support import timeouts
from tests.support.pytester_args import QUIET


@pytest.mark.parametrize(
    ("timeout_s", "hang_after", "explicit", "expected"),
    [
        (5, 5000.0, False, 2500.0),  # the default, not below a 5 s timeout: half of it
        (4, 5000.0, False, 2000.0),
        (60, 5000.0, False, 5000.0),  # far below the timeout already: never raised
        (0.5, 5000.0, False, 250.0),
        (5, 8000.0, True, 8000.0),  # the user's: kept, with a note (below)
        (5, 4000.0, True, 4000.0),
        (60, 1000.0, True, 1000.0),
        (5, None, True, None),  # switched off by the user: stays off
    ],
)
def test_the_hang_threshold_sits_below_the_timeout_unless_the_user_set_it(
    timeout_s: float, hang_after: float | None, explicit: bool, expected: float | None
) -> None:
    assert timeouts.hang_after_ms(timeout_s, hang_after, explicit) == expected


def test_a_hang_threshold_not_below_the_timeout_gets_a_note_with_the_pair() -> None:
    note = timeouts.pair_note(5, 8000.0, None, "test_x.py::test_x")
    assert note == (
        "aiocop: hang_after_ms=8000 is not below pytest-timeout's timeout of 5 s (test_x.py::test_x): a hung loop "
        "is not reported before the timeout ends the test. Set the pair, e.g. --timeout=5 "
        "--aiocop-hang-after-ms=2500 (ini: timeout = 5 and aiocop_hang_after_ms = 2500)"
    )
    assert timeouts.pair_note(5, 5000.0, None, "t") is not None  # equal: the timeout fires first
    assert timeouts.pair_note(5, 2500.0, None, "t") is None
    assert timeouts.pair_note(5, None, None, "t") is None  # off on purpose: nothing to say
    # A stall threshold past the timeout holds the hang back as much.
    threshold = timeouts.pair_note(5, 2500.0, 6000.0, "t")
    assert threshold is not None
    assert threshold.startswith("aiocop: threshold_ms (a hang is reported from it at the earliest)=6000 ")


def test_the_header_says_what_the_plugin_does_under_pytest_timeout() -> None:
    assert timeouts.header(5000.0, explicit=False) == (
        "hangs under pytest-timeout: reported after half a test's timeout, at most 5000 ms"
    )
    assert timeouts.header(8000.0, explicit=True) == (
        "hangs under pytest-timeout: reported after hang_after_ms=8000 (set by you, kept)"
    )
    assert timeouts.header(None, explicit=True) == "hangs under pytest-timeout: not reported (hang_after_ms=0)"


def test_write_puts_the_whole_text_on_a_line_of_its_own() -> None:
    read, write = os.pipe()
    try:
        timeouts.write(write, "aiocop: loop HUNG \u202e")
        os.close(write)
        write = -1
        assert os.read(read, 1000) == "\naiocop: loop HUNG \u202e\n".encode()
    finally:
        os.close(read)
        if write != -1:
            os.close(write)
    timeouts.write(write, "to a closed descriptor: nothing, and no error")


# Each test reads the hang threshold and stall threshold in force while it runs.
READER = """
import aiocop._model.state as state
import pytest

def seen():
    return (state.config.hang_after_ms, state.config.threshold_ms)

@pytest.mark.timeout(3)
async def test_marker_3s():
    print("IN FORCE test_marker_3s", seen())

@pytest.mark.timeout(60)
async def test_marker_60s():
    print("IN FORCE test_marker_60s", seen())

async def test_session_timeout():
    print("IN FORCE test_session_timeout", seen())
"""


def _in_force(result: pytest.RunResult) -> dict[str, str]:
    """Test name -> the (hang_after_ms, threshold_ms) it printed."""
    return {
        match.group(1): match.group(2) for match in re.finditer(r"IN FORCE (test_\w+) (\(.*?\))", result.stdout.str())
    }


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        # No --timeout: only the marked tests are timed; the watchdog runs for their hangs alone.
        ((), {"test_marker_3s": "(1500.0, 1500.0)", "test_marker_60s": "(5000.0, 5000.0)"}),
        # A session timeout from the flag; with a stall threshold, it stays.
        (
            ("--timeout=4", "--aiocop-threshold-ms=100"),
            {
                "test_marker_3s": "(1500.0, 100.0)",
                "test_marker_60s": "(5000.0, 100.0)",
                "test_session_timeout": "(2000.0, 100.0)",
            },
        ),
    ],
)
def test_each_timed_test_gets_a_hang_threshold_below_its_timeout(
    pytester: pytest.Pytester, args: tuple[str, ...], expected: dict[str, str]
) -> None:
    pytester.makeini("[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(test_reader=READER)
    result = pytester.runpytest_subprocess(*QUIET, "-v", "-s", "--aiocop", *args, timeout=120)
    assert result.ret == 0, result.stdout.str()
    assert "hangs under pytest-timeout: reported after half a test's timeout, at most 5000 ms" in result.stdout.str()
    seen = _in_force(result)
    for name, value in expected.items():
        assert seen.get(name) == value, result.stdout.str()
    if "test_session_timeout" not in expected:  # untimed: the hang and stall thresholds off again
        assert seen["test_session_timeout"] == "(None, 3600000.0)", result.stdout.str()


def test_the_ini_key_and_the_environment_variable_are_read_through_pytest_timeout(pytester: pytest.Pytester) -> None:
    pytester.makeini(
        "[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\ntimeout = 6\n"
        "aiocop_hang_after_ms = 9000\n"
    )
    pytester.makepyfile(test_reader=READER)
    result = pytester.runpytest_subprocess(*QUIET, "-v", "-s", "--aiocop", timeout=120)
    assert result.ret == 0, result.stdout.str()
    output = result.stdout.str()
    # The user's own hang_after_ms is kept, and the pair's note says how to set it (once).
    assert "hangs under pytest-timeout: reported after hang_after_ms=9000 (set by you, kept)" in output
    seen = _in_force(result)
    assert seen["test_session_timeout"] == "(9000.0, 9000.0)", output
    assert seen["test_marker_60s"] == "(9000.0, 9000.0)", output
    notes = [line for line in result.stdout.lines if "is not below pytest-timeout's timeout" in line]
    assert notes == [
        "aiocop: hang_after_ms=9000 is not below pytest-timeout's timeout of 3 s (test_reader.py::test_marker_3s): "
        "a hung loop is not reported before the timeout ends the test. Set the pair, e.g. --timeout=3 "
        "--aiocop-hang-after-ms=1500 (ini: timeout = 3 and aiocop_hang_after_ms = 1500)"
    ], output

    pytester.makeini("[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(test_reader=textwrap.dedent(READER).replace("@pytest.mark.timeout(3)", ""))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTEST_TIMEOUT", "2")
        result = pytester.runpytest_subprocess(*QUIET, "-v", "-s", "--aiocop", timeout=120)
    assert result.ret == 0, result.stdout.str()
    seen = _in_force(result)
    assert seen["test_marker_3s"] == "(1000.0, 1000.0)", result.stdout.str()
    assert seen["test_session_timeout"] == "(1000.0, 1000.0)", result.stdout.str()
