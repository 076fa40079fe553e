"""The pytest plugin, run on test files of its own in pytest subprocesses (pytester).

Each inner run starts a fresh interpreter, so the plugin's session-wide
detection never touches this process's aiocop. Runs are grouped: one inner
run checks many tests, each with its own expected outcome. The plugin's
helpers are tested here: its options, ini keys and markers
(`aiocop._pytest_support.settings`), which events fail which test
(`aiocop._pytest_support.events`) and the test's line behind a `TestClient`
(`aiocop._pytest_support.portal`).
"""

from __future__ import annotations

import os
import re
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import aiocop
from aiocop._stalls.settings import sampling
from tests.support.pytester_args import QUIET, QUIET_BUT_TRIO, WITH_ANYIO

if TYPE_CHECKING:
    from collections.abc import Sequence

ROOT = Path(__file__).resolve().parents[2]

BASE_INI = """\
[pytest]
asyncio_default_fixture_loop_scope = function
"""


def run(pytester: pytest.Pytester, *args: str, ini: str = "", plugins: tuple[str, ...] = QUIET) -> pytest.RunResult:
    pytester.makeini(BASE_INI + textwrap.dedent(ini))
    return pytester.runpytest_subprocess(*plugins, "-rA", *args, timeout=120)


def outcomes(result: pytest.RunResult) -> dict[str, set[str]]:
    """Test name -> outcomes in the `-rA` summary (a test can pass and then error at teardown)."""
    found: dict[str, set[str]] = {}
    for line in result.stdout.lines:
        match = re.match(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) \S+::(\S+)", line)
        if match:
            found.setdefault(match.group(2), set()).add(match.group(1))
    return found


def section(result: pytest.RunResult, title: str) -> str:
    """The report of one failure or error (`test_x`, `ERROR at setup of test_x`)."""
    lines = result.stdout.lines
    heading = re.compile(rf"^_+ {re.escape(title)} _+$")
    start = next((i for i, line in enumerate(lines) if heading.match(line)), None)
    assert start is not None, f"no report for {title!r} in:\n{result.stdout.str()}"
    end = next(
        (j for j in range(start + 1, len(lines)) if re.match(r"^(_{3,} \S.* _{3,}|={3,})", lines[j])), len(lines)
    )
    return "\n".join(lines[start + 1 : end])


def line_of(source: str, marker: str) -> int:
    return next(number for number, text in enumerate(source.splitlines(), 1) if marker in text)


def expect(result: pytest.RunResult, expected: dict[str, Sequence[str]]) -> None:
    found = outcomes(result)
    assert found == {name: set(states) for name, states in expected.items()}, result.stdout.str()


STRICT = """\
import asyncio
import os
import time

import pytest
import pytest_asyncio


def stat_cwd():
    os.stat(".")


def spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@pytest.mark.asyncio
async def test_body_blocks():
    open(__file__).close()  # BODY


@pytest.mark.asyncio
async def test_task_blocks():
    async def child():
        time.sleep(0.001)  # TASK

    await asyncio.create_task(child())


@pytest.mark.asyncio
async def test_callback_blocks():
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    loop.call_soon(lambda: (stat_cwd(), done.set_result(None)))
    await done


@pytest.mark.asyncio
async def test_clean():
    await asyncio.sleep(0)
    await asyncio.to_thread(os.stat, ".")


@pytest.mark.asyncio
async def test_weightless_call():
    os.getcwd()


@pytest.mark.asyncio
async def test_stall_without_threshold():
    spin(0.06)


def test_sync_running_a_loop():
    async def main():
        os.stat(".")

    asyncio.run(main())


@pytest.mark.aiocop_check
def test_sync_checked_by_marker():
    async def main():
        os.stat(".")

    asyncio.run(main())


@pytest_asyncio.fixture
async def blocking_fixture():
    os.stat(".")
    yield
    os.listdir(".")


@pytest.mark.asyncio
async def test_fixture_not_checked(blocking_fixture):
    await asyncio.sleep(0)


@pytest.mark.aiocop_check(fixtures=True)
@pytest.mark.asyncio
async def test_fixture_checked_by_marker(blocking_fixture):
    await asyncio.sleep(0)


@pytest.mark.asyncio
async def test_events_fixture(aiocop_events):
    os.stat(".")
    assert aiocop_events.names() == ["os.stat"]  # the running step, delivered by the read
    open(__file__).close()
    await asyncio.sleep(0)
    assert aiocop_events.names() == ["os.stat", "open"]
    assert len(aiocop_events) == 2
    assert aiocop_events.calls[1]["entry_point"].endswith(":test_events_fixture")
    aiocop_events.clear()
    assert list(aiocop_events) == []
    os.stat(".")  # not a failure either: this test judges its events itself
    assert aiocop_events.names() == ["os.stat"]


def test_events_fixture_in_sync_test(aiocop_events):
    async def main():
        stat_cwd()

    asyncio.run(main())
    assert aiocop_events.names() == ["os.stat"]
    assert aiocop_events[0].severity_level == "low"


@pytest.mark.asyncio
async def test_fails_for_its_own_reason():
    os.stat(".")
    assert 1 == 2
"""


def test_synchronous_tests_can_be_left_unchecked(pytester: pytest.Pytester) -> None:
    # The explicit opt-out: only async tests, and synchronous ones marked.
    pytester.makepyfile(test_strict=STRICT)
    synchronous = "test_sync_running_a_loop or test_sync_checked_by_marker or test_events_fixture_in_sync_test"
    result = run(pytester, "--aiocop", "--no-aiocop-check-sync", "-k", synchronous)
    expect(
        result,
        {
            "test_sync_running_a_loop": ["PASSED"],
            "test_sync_checked_by_marker": ["FAILED"],
            "test_events_fixture_in_sync_test": ["PASSED"],
        },
    )


def test_strict_mode(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_strict=STRICT)
    result = run(pytester, "--aiocop")
    expect(
        result,
        {
            "test_body_blocks": ["FAILED"],
            "test_task_blocks": ["FAILED"],
            "test_callback_blocks": ["FAILED"],
            "test_clean": ["PASSED"],
            "test_weightless_call": ["PASSED"],
            "test_stall_without_threshold": ["PASSED"],
            "test_sync_running_a_loop": ["FAILED"],  # checked by default: the loop it runs blocked
            "test_sync_checked_by_marker": ["FAILED"],
            "test_fixture_not_checked": ["PASSED"],
            "test_fixture_checked_by_marker": ["ERROR"],
            "test_events_fixture": ["PASSED"],
            "test_events_fixture_in_sync_test": ["PASSED"],
            "test_fails_for_its_own_reason": ["FAILED"],
        },
    )
    body = [_without_loop_frames(line) for line in section(result, "test_body_blocks").splitlines()]
    line = line_of(STRICT, "# BODY")
    headline = (
        r"\[1\] 1 blocking call in task 'Task-\d+' "
        r"\(impact medium, severity medium, the step held the loop [\d.]+ ms, not the call alone\)"
    )
    assert re.fullmatch(headline, body[2])
    assert body[3].startswith(f"  open({pytester.path / 'test_strict.py'}, r, ")
    assert body[:2] + body[4:] == [
        "aiocop: 1 step blocked the event loop during the test (fail_on=low)",
        "",
        f"    at test_strict.py:{line}:test_body_blocks",
        "      open(__file__).close()  # BODY",
        f"    trace: test_strict.py:{line}:test_body_blocks",
        "",
        "Make it non-blocking (e.g. await asyncio.to_thread(...)), or allow it: "
        "@pytest.mark.aiocop_allow(\"open\") on the test, or a line 'open' in the ini key aiocop_allow.",
    ]
    task = section(result, "test_task_blocks")
    task_line = line_of(STRICT, "# TASK")
    assert "(impact high, severity high" in task
    assert f"    at test_strict.py:{task_line}:child\n      time.sleep(0.001)  # TASK" in task
    assert task.splitlines()[3] == "  time.sleep(0.001)"
    callback = section(result, "test_callback_blocks")
    assert "in a callback" in callback
    assert f"at test_strict.py:{line_of(STRICT, 'os.stat(')}:stat_cwd" in callback
    assert '@pytest.mark.aiocop_allow("os.stat")' in callback
    marked_sync = section(result, "test_sync_checked_by_marker")
    assert "os.stat(.)" in marked_sync
    assert "os.stat(.)" in section(result, "test_sync_running_a_loop")
    setup = section(result, "ERROR at setup of test_fixture_checked_by_marker")
    assert "blocked the event loop while setting up the test's fixtures" in setup
    assert "os.stat(.)" in setup
    teardown = section(result, "ERROR at teardown of test_fixture_checked_by_marker")
    assert "while tearing down the test's fixtures" in teardown
    assert "os.listdir(.)" in teardown
    own = section(result, "test_fails_for_its_own_reason")
    assert "assert 1 == 2" in own
    assert re.search(r"-+ Captured aiocop call -+\naiocop: 1 step blocked the event loop", own), own


AUTO = """\
import asyncio
import os
import time

import pytest


async def test_body_blocks():
    os.listdir(".")


async def test_task_blocks():
    async def child():
        time.sleep(0.001)

    await asyncio.gather(child())


async def test_clean():
    await asyncio.sleep(0)


@pytest.fixture
async def opens_in_setup():
    open(__file__).close()
    yield


@pytest.fixture
async def stats_in_teardown():
    yield
    os.stat(".")


async def test_setup_checked(opens_in_setup):
    pass


async def test_teardown_checked(stats_in_teardown):
    pass


@pytest.mark.aiocop_check(fixtures=False)
async def test_fixtures_unchecked_by_marker(opens_in_setup, stats_in_teardown):
    pass


def test_sync_checked():
    async def main():
        os.stat(".")

    asyncio.run(main())


def test_sync_clean():
    asyncio.run(asyncio.sleep(0))
"""


def test_auto_mode_switched_on_in_the_ini_file(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_auto=AUTO)
    result = run(
        pytester,
        ini="""
        asyncio_mode = auto
        aiocop = true
        aiocop_check_fixtures = true
        aiocop_check_sync = true
        """,
    )
    expect(
        result,
        {
            "test_body_blocks": ["FAILED"],
            "test_task_blocks": ["FAILED"],
            "test_clean": ["PASSED"],
            "test_setup_checked": ["ERROR"],
            "test_teardown_checked": ["PASSED", "ERROR"],
            "test_fixtures_unchecked_by_marker": ["PASSED"],
            "test_sync_checked": ["FAILED"],
            "test_sync_clean": ["PASSED"],
        },
    )
    assert "os.listdir(.)" in section(result, "test_body_blocks")
    assert "time.sleep(0.001)" in section(result, "test_task_blocks")
    assert "open(" in section(result, "ERROR at setup of test_setup_checked")
    assert "os.stat(.)" in section(result, "ERROR at teardown of test_teardown_checked")
    result.stdout.fnmatch_lines(["aiocop: fail_on=low, * check_fixtures=true, check_sync=true, allow=none"])


ALLOW = """\
import os

import pytest

import helpers
from vendor import lib


def stat_here():
    os.stat(".")


def access_here():
    os.access(".", os.R_OK)


@pytest.mark.aiocop_allow()
async def test_allow_everything():
    open(__file__).close()
    os.stat(".")


@pytest.mark.aiocop_allow("open")
async def test_allow_open():
    open(__file__).close()


@pytest.mark.aiocop_allow("open")
async def test_allow_open_not_stat():
    open(__file__).close()
    os.stat(".")


@pytest.mark.aiocop_allow(call_site="test_allow.py:stat_here")
async def test_allow_call_site():
    stat_here()


@pytest.mark.aiocop_allow(call_site="test_allow.py:stat_here")
async def test_call_site_elsewhere():
    os.stat(".")


@pytest.mark.aiocop_allow(module="helpers")
async def test_allow_module():
    helpers.list_cwd()


@pytest.mark.aiocop_allow(path="vendor/")
async def test_allow_path():
    lib.list_cwd()


async def test_marker_of_another_test_does_not_leak():
    stat_here()


async def test_ini_allows_event():
    os.readlink(__file__) if os.path.islink(__file__) else os.lstat(__file__)


async def test_ini_allows_call_site():
    access_here()
"""

MODULE_MARK = """\
import os

import pytest

pytestmark = pytest.mark.aiocop_allow("os.stat")


async def test_module_mark():
    os.stat(".")


async def test_module_mark_other_event():
    os.listdir(".")
"""


def test_allow_markers_and_ini(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_allow=ALLOW,
        test_module_mark=MODULE_MARK,
        helpers="import os\n\ndef list_cwd():\n    return os.listdir('.')\n",
    )
    pytester.mkpydir("vendor")
    (pytester.path / "vendor" / "lib.py").write_text("import os\n\ndef list_cwd():\n    return os.listdir('.')\n")
    result = run(
        pytester,
        "--aiocop-allow=os.lstat",
        ini="""
        asyncio_mode = auto
        aiocop = true
        aiocop_allow =
            os.readlink
            call_site=test_allow.py:access_here
        """,
    )
    expect(
        result,
        {
            "test_allow_everything": ["PASSED"],
            "test_allow_open": ["PASSED"],
            "test_allow_open_not_stat": ["FAILED"],
            "test_allow_call_site": ["PASSED"],
            "test_call_site_elsewhere": ["FAILED"],
            "test_allow_module": ["PASSED"],
            "test_allow_path": ["PASSED"],
            "test_marker_of_another_test_does_not_leak": ["FAILED"],
            "test_ini_allows_event": ["PASSED"],
            "test_ini_allows_call_site": ["PASSED"],
            "test_module_mark": ["PASSED"],
            "test_module_mark_other_event": ["FAILED"],
        },
    )
    only_stat = section(result, "test_allow_open_not_stat")
    assert "os.stat(.)" in only_stat
    assert "open(" not in only_stat  # the allowed call is not even recorded
    assert "os.listdir(.)" in section(result, "test_module_mark_other_event")
    result.stdout.fnmatch_lines(["aiocop: * allow=os.readlink; call_site=test_allow.py:access_here; os.lstat"])


FAIL_ON = """\
import os
import time


def inner():
    time.sleep(0.001)


def outer():
    inner()


async def test_one_stat():
    os.stat(".")


async def test_sleep():
    outer()


async def test_many_stats_in_one_step():
    for _ in range(10):
        os.stat(".")
"""


def test_fail_on_level_and_trace_depth(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_fail_on=FAIL_ON)
    result = run(pytester, "--aiocop", "--aiocop-fail-on=medium", "--aiocop-trace-depth=1", ini="asyncio_mode = auto\n")
    expect(
        result,
        {
            "test_one_stat": ["PASSED"],  # weight 1: "low"
            "test_sleep": ["FAILED"],  # weight 50: "high"
            "test_many_stats_in_one_step": ["FAILED"],  # 10 x 1 in one step: "medium"
        },
    )
    sleep = section(result, "test_sleep")
    assert "fail_on=medium" in sleep
    # One frame kept: the call's own, not outer() or the test.
    assert f"    trace: test_fail_on.py:{line_of(FAIL_ON, 'time.sleep(')}:inner" in sleep.splitlines()
    assert "(impact medium, severity medium" in section(result, "test_many_stats_in_one_step")
    # (pytest-timeout is loaded here: the header says what the plugin does for the tests it times.)
    result.stdout.fnmatch_lines(
        [
            "aiocop: fail_on=medium, threshold_ms=off, hangs under pytest-timeout: reported after half a test's "
            "timeout, at most 5000 ms, trace_depth=1, check_fixtures=false, check_sync=true, allow=none"
        ]
    )


THRESHOLD = """\
import asyncio
import time

import pytest


def spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:  # SPIN
        pass


async def test_stall_in_last_step():
    spin(0.15)


async def test_stall_then_await():
    spin(0.15)
    await asyncio.sleep(0.01)


@pytest.mark.aiocop_allow()
async def test_stall_allowed():
    spin(0.15)


@pytest.mark.aiocop_allow(call_site="test_threshold.py:spin")
async def test_stall_allowed_by_call_site():
    spin(0.15)


@pytest.mark.aiocop_allow("time.sleep")
async def test_stall_not_allowed_by_event_names():
    spin(0.15)


async def test_clean():
    spin(0.002)  # a short CPU-bound step is no stall
    await asyncio.sleep(0.01)


async def test_events_read_in_a_stalled_step(aiocop_events):
    time.sleep(0.15)
    assert aiocop_events.names() == ["time.sleep"]  # delivered by the read: the step so far is one event
    await asyncio.sleep(0.02)  # the watchdog sees the step end: still one event for it
    assert aiocop_events.names() == ["time.sleep"]
"""


def test_threshold_fails_stalls(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_threshold=THRESHOLD)
    result = run(pytester, "--aiocop", "--aiocop-threshold-ms=50", ini="asyncio_mode = auto\n")
    expect(
        result,
        {
            "test_stall_in_last_step": ["FAILED"],
            "test_stall_then_await": ["FAILED"],
            "test_stall_allowed": ["PASSED"],
            "test_stall_allowed_by_call_site": ["PASSED"],
            "test_stall_not_allowed_by_event_names": ["FAILED"],
            "test_clean": ["PASSED"],
            "test_events_read_in_a_stalled_step": ["PASSED"],
        },
    )
    last = section(result, "test_stall_in_last_step")
    assert "(fail_on=low, threshold_ms=50)" in last
    assert re.search(r"\[1\] loop stalled for \d+\.\d ms", last), last
    spin_line = line_of(THRESHOLD, "# SPIN")
    assert f"  at test_threshold.py:{spin_line}:spin\n      while time.perf_counter() < end:  # SPIN" in last
    caller = line_of(THRESHOLD, "spin(0.15)")
    assert f"test_threshold.py:{spin_line}:spin <- test_threshold.py:{caller}:test_stall_in_last_step" in last
    assert "loop stalled for" in section(result, "test_stall_then_await")
    result.stdout.fnmatch_lines(["aiocop: fail_on=low, threshold_ms=50, *"])


THREAD_LOOP = """\
import asyncio
import contextlib
import queue
import threading
import time

import pytest


def spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def busy(seconds):
    # A wait aiocop sees no call in (SimpleQueue is written in C), under the threshold.
    with contextlib.suppress(queue.Empty):
        queue.SimpleQueue().get(timeout=seconds)


@pytest.fixture(scope="module")
def server_loop():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="server")
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join()
    loop.close()


async def handle():
    # Once the reply has gone, the server's loop stays busy a while: the
    # watchdog's report of the stall waits behind that step.
    asyncio.current_task().add_done_callback(lambda _: busy(0.05))
    spin(0.3)


@pytest.mark.parametrize("request_number", range(3))
async def test_request_stalls_the_server(server_loop, request_number):
    await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(handle(), server_loop))
"""


def test_stall_of_a_loop_in_another_thread(pytester: pytest.Pytester) -> None:
    # The stall of a server's loop, running in a thread a fixture started, is
    # delivered on that loop: the test's phase waits for it.
    pytester.makepyfile(test_thread_loop=THREAD_LOOP)
    result = run(pytester, "--aiocop", "--aiocop-threshold-ms=100", ini="asyncio_mode = auto\n")
    expect(result, {f"test_request_stalls_the_server[{n}]": ["FAILED"] for n in range(3)})
    assert "loop stalled for" in section(result, "test_request_stalls_the_server[0]")


UVLOOP = """\
import asyncio
import os
import time


def spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


async def test_on_uvloop():
    assert type(asyncio.get_running_loop()).__module__.startswith("uvloop")


async def test_body_blocks():
    os.stat(".")


async def test_task_blocks():
    async def child():
        open(__file__).close()

    await asyncio.create_task(child())


async def test_stall():
    spin(0.15)
"""


def test_other_event_loop(pytester: pytest.Pytester) -> None:
    pytest.importorskip("uvloop")
    # The docs' conftest: pytest-asyncio's hook picks uvloop, with no event loop policy.
    pytester.makeconftest((ROOT / "examples" / "pytest" / "uvloop_conftest.py").read_text(encoding="utf-8"))
    pytester.makepyfile(test_uvloop=UVLOOP)
    # Deprecation warnings are errors: nothing may use the event loop policy system.
    result = run(
        pytester, "--aiocop", "--aiocop-threshold-ms=50", "-W", "error::DeprecationWarning", ini="asyncio_mode = auto\n"
    )
    expect(
        result,
        {
            "test_on_uvloop": ["PASSED"],
            "test_body_blocks": ["FAILED"],
            "test_task_blocks": ["FAILED"],
            "test_stall": ["FAILED"],
        },
    )
    assert "open(" in section(result, "test_task_blocks")
    assert "loop stalled for" in section(result, "test_stall")


OTHER_RUNNERS = """\
import os
import sys
import unittest

import pytest


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_anyio():
    os.stat(".")


class TestCase(unittest.IsolatedAsyncioTestCase):
    async def test_unittest(self):
        os.listdir(".")


def test_without_pytest_asyncio():
    assert "pytest_asyncio" not in sys.modules  # the plugin does not need it
"""


def test_other_test_runners(pytester: pytest.Pytester) -> None:
    pytest.importorskip("anyio")
    pytester.makepyfile(test_runners=OTHER_RUNNERS)
    result = run(pytester, "--aiocop", "-p", "no:asyncio", plugins=WITH_ANYIO)
    expect(
        result,
        {"test_anyio": ["FAILED"], "test_unittest": ["FAILED"], "test_without_pytest_asyncio": ["PASSED"]},
    )
    assert "os.stat(.)" in section(result, "test_anyio")
    assert "os.listdir(.)" in section(result, "TestCase.test_unittest")


OFF = """\
import asyncio
import os

import pytest

import aiocop
from aiocop._interception import hook as _hook


@pytest.mark.aiocop_allow("open")
async def test_nothing_is_watched():
    open(__file__).close()
    os.stat(".")
    assert not aiocop.is_monitoring_active()
    assert not aiocop.get_patched_functions()
    assert not _hook._installed  # no audit hook was added


def test_events_fixture_needs_the_plugin(aiocop_events):
    pass
"""


@pytest.mark.parametrize(
    ("args", "ini"),
    [
        pytest.param((), "", id="default"),
        pytest.param(("--no-aiocop",), "aiocop = true\n", id="no-aiocop-flag-over-ini"),
    ],
)
def test_plugin_off_changes_nothing(pytester: pytest.Pytester, args: tuple[str, ...], ini: str) -> None:
    pytester.makepyfile(test_off=OFF)
    result = run(pytester, "--strict-markers", *args, ini="asyncio_mode = auto\n" + ini)
    expect(result, {"test_nothing_is_watched": ["PASSED"], "test_events_fixture_needs_the_plugin": ["ERROR"]})
    assert "the aiocop_events fixture needs the aiocop plugin switched on: run pytest with --aiocop" in (
        section(result, "ERROR at setup of test_events_fixture_needs_the_plugin")
    )
    assert not any(line.startswith("aiocop:") for line in result.stdout.lines)  # no report header line


@pytest.mark.parametrize(
    ("args", "ini", "test", "error"),
    [
        pytest.param(
            ("--aiocop", "--aiocop-fail-on=severe"),
            "",
            "",
            "--aiocop-fail-on: expected one of low, medium, high, got 'severe'",
            id="fail-on",
        ),
        pytest.param(
            ("--aiocop", "--aiocop-threshold-ms=abc"),
            "",
            "",
            "--aiocop-threshold-ms: expected a number of milliseconds, got 'abc'",
            id="threshold-not-a-number",
        ),
        pytest.param(
            ("--aiocop", "--aiocop-threshold-ms=-5"),
            "",
            "",
            "--aiocop-threshold-ms: expected a number of milliseconds >= 0 (0: off) and at most 3600000 (an hour), "
            "got -5.0",
            id="threshold-negative",
        ),
        pytest.param(
            ("--aiocop", "--aiocop-threshold-ms=nan"),
            "",
            "",
            "--aiocop-threshold-ms: expected a number of milliseconds >= 0 (0: off) and at most 3600000 (an hour), "
            "got nan",
            id="threshold-nan",
        ),
        pytest.param(
            ("--aiocop", "--aiocop-threshold-ms=inf"),
            "",
            "",
            "--aiocop-threshold-ms: expected a number of milliseconds >= 0 (0: off) and at most 3600000 (an hour), "
            "got inf",
            id="threshold-inf",
        ),
        pytest.param(
            ("--aiocop", "--aiocop-baseline="),
            "",
            "",
            "--aiocop-baseline: expected a file name, got ''",
            id="empty-baseline-flag",
        ),
        pytest.param(
            ("--aiocop", "--aiocop-allow="),
            "",
            "",
            "--aiocop-allow: in rule '': the rule is empty, and would allow every blocking call: write event names "
            "and/or module=, path=, call_site= (or everything=true to allow every call)",
            id="empty-allow-flag",
        ),
        pytest.param(
            ("--aiocop", "--aiocop-allow=   "),
            "",
            "",
            "--aiocop-allow: in rule '': the rule is empty*",
            id="blank-allow-flag",
        ),
        pytest.param(
            ("--aiocop", "--aiocop-allow=# TODO"),
            "",
            "",
            "--aiocop-allow: in rule '# TODO': the rule is only a comment, and would allow every blocking call*",
            id="comment-allow-flag",
        ),
        pytest.param(
            ("--aiocop",),
            "aiocop_threshold_ms = abc\n",
            "",
            "aiocop_threshold_ms (ini): *'abc'",
            id="ini-threshold-not-a-number",
        ),
        pytest.param(
            ("--aiocop",),
            "aiocop_hang_after_ms = soon\n",
            "",
            "aiocop_hang_after_ms (ini): *'soon'",
            id="ini-hang-after-not-a-number",
        ),
        pytest.param(
            ("--aiocop", "--aiocop-hang-after-ms=1e20"),
            "",
            "",
            "--aiocop-hang-after-ms: expected a number of milliseconds >= 0 (0: off) and at most 86400000 (a day), "
            "got 1e+20",
            id="hang-after-beyond-a-day",
        ),
        pytest.param(
            ("--aiocop",),
            "aiocop_hang_after_ms = -3\n",
            "",
            "aiocop_hang_after_ms (ini): expected a number of milliseconds >= 0 (0: off) and at most 86400000*",
            id="ini-hang-after-negative",
        ),
        pytest.param(
            ("--aiocop",),
            "aiocop_trace_depth = 2.5\n",
            "",
            "aiocop_trace_depth (ini): *'2.5'",
            id="ini-trace-depth-not-a-whole-number",
        ),
        pytest.param(
            ("--aiocop",),
            "aiocop_check_sync = maybe\n",
            "",
            "aiocop_check_sync (ini): *'maybe'",
            id="ini-not-a-bool",
        ),
        pytest.param(
            ("--aiocop", "--aiocop-trace-depth=0"),
            "",
            "",
            "--aiocop-trace-depth: expected a number of frames >= 1, got 0",
            id="trace-depth",
        ),
        pytest.param(
            ("--aiocop",),
            "aiocop_fail_on = hi\n",
            "",
            "aiocop_fail_on (ini): expected one of low, medium, high, got 'hi'",
            id="ini-fail-on",
        ),
        pytest.param(
            ("--aiocop",),
            "aiocop_allow = opn\n",
            "",
            "aiocop_allow (ini): in rule 'opn': unknown event 'opn' in allow rule (did you mean 'open'?); known "
            "events are listed by aiocop.get_blocking_events_dict()*",
            id="ini-unknown-event",
        ),
        pytest.param(
            ("--aiocop",),
            "aiocop_allow = open modul=x\n",
            "",
            "aiocop_allow (ini): in rule 'open modul=x': unknown field 'modul' (did you mean 'module'?): expected "
            "event names and module=, path=, call_site= or everything=",
            id="ini-unknown-field",
        ),
        pytest.param(
            ("--aiocop",),
            "",
            "@pytest.mark.aiocop_allow('open', 'os.stats')\ndef test_x():\n    pass\n",
            "test_bad.py::test_x: @pytest.mark.aiocop_allow: unknown event 'os.stats' in allow rule (did you mean "
            "'os.stat'?)*",
            id="marker-unknown-event",
        ),
        pytest.param(
            ("--aiocop",),
            "",
            "@pytest.mark.aiocop_allow(modul='x')\ndef test_x():\n    pass\n",
            "test_bad.py::test_x: @pytest.mark.aiocop_allow: unknown keyword 'modul' (did you mean 'module'?): "
            "expected module=, path=, call_site= or everything=",
            id="marker-unknown-keyword",
        ),
        pytest.param(
            ("--aiocop",),
            "",
            "@pytest.mark.aiocop_allow(call_site='nofunction')\ndef test_x():\n    pass\n",
            "test_bad.py::test_x: @pytest.mark.aiocop_allow: AllowRule.call_site must look like 'file.py:function'*",
            id="marker-bad-call-site",
        ),
        pytest.param(
            ("--aiocop",),
            "",
            "@pytest.mark.aiocop_check('yes')\ndef test_x():\n    pass\n",
            "test_bad.py::test_x: @pytest.mark.aiocop_check takes only the keyword fixtures=True/False, got 'yes'",
            id="check-marker-args",
        ),
    ],
)
def test_bad_settings_are_usage_errors(
    pytester: pytest.Pytester, args: tuple[str, ...], ini: str, test: str, error: str
) -> None:
    pytester.makepyfile(test_bad="import pytest\n\n\n" + (test or "def test_x():\n    pass\n"))
    if test:  # a marker is read once detection has started: a process of its own
        result = run(pytester, *args, ini=ini)
    else:
        # A bad flag or ini key is refused as pytest configures, before aiocop
        # starts anything: this process can run it (a process each cost 1 s of
        # CPU, 25 s of the suite's 220 on every Python), and is shown untouched.
        pytester.makeini(BASE_INI + ini)
        result = pytester.runpytest_inprocess(*QUIET, "-rA", *args)
        assert not aiocop.is_monitoring_active()
        assert not aiocop.get_patched_functions()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
    result.stderr.fnmatch_lines(["ERROR: " + error])


EXAMPLE = ROOT / "examples" / "pytest" / "test_example.py"
DOC = ROOT / "docs" / "how-to" / "pytest.md"


def test_documented_example(pytester: pytest.Pytester) -> None:
    source = EXAMPLE.read_text(encoding="utf-8")
    pytester.makepyfile(test_example=source)
    result = run(pytester, "--aiocop", "--strict-markers")
    expect(
        result,
        {
            "test_load_settings_blocking": ["FAILED"],
            "test_load_settings": ["PASSED"],
            "test_legacy_loader_is_allowed": ["PASSED"],
            "test_blocking_loader_reports_open": ["PASSED"],
        },
    )
    failure = section(result, "test_load_settings_blocking").splitlines()
    # The excerpt in the how-to page is this failure, run from the project root.
    doc = DOC.read_text(encoding="utf-8")
    excerpt = doc.split("<!-- failure excerpt -->", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    stable = [line.replace("examples/pytest/", "") for line in excerpt.splitlines() if _stable(line)]
    assert stable, "the how-to page lost its failure excerpt"
    assert stable == [_without_loop_frames(line) for line in failure if _stable(line)]


def _without_loop_frames(line: str) -> str:
    # On 3.10 pytest-asyncio runs tests in pure-Python tasks, whose step
    # function shows at the end of a trace: `... <- asyncio/tasks.py:232:__step`.
    return re.sub(r" <- asyncio/\S+", "", line)


def _stable(line: str) -> bool:
    # Lines without run-to-run details (temporary paths, task numbers,
    # timings) and other than the test's heading.
    unstable = ("open(/", "Task-", "the step held the loop")
    return not any(part in line for part in unstable) and not line.startswith("____")


OFF_BUT_BROKEN = """
import pytest

@pytest.mark.aiocop_allow("no.such.event")
@pytest.mark.aiocop_check("yes")
def test_x():
    pass
"""


def test_plugin_off_reads_nothing_of_aiocops(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    # Switched off, aiocop reads none of its settings: bad ini keys and flags,
    # bad markers, a broken [tool.aiocop], AIOCOP_CONFIG naming a FIFO (whose
    # open() would wait for ever). The run is the one pytest makes without it.
    pytester.makepyprojecttoml('[tool.aiocop]\nthreshold_ms = "x"\nbaseline = "/dev/zero"\n')
    fifo = pytester.path / "fifo"
    os.mkfifo(fifo)
    monkeypatch.setenv("AIOCOP_CONFIG", str(fifo))
    pytester.makepyfile(test_off=OFF_BUT_BROKEN)
    ini = "aiocop_threshold_ms = abc\naiocop_check_sync = maybe\naiocop_allow = opn\naiocop_baseline = fifo\n"
    result = run(pytester, "--aiocop-fail-on=severe", "--aiocop-allow=", "--aiocop-trace-depth=0", ini=ini)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
    expect(result, {"test_x": ["PASSED"]})
    without = run(pytester, "-p", "no:aiocop", ini=ini)
    assert without.ret == pytest.ExitCode.OK
    expect(without, {"test_x": ["PASSED"]})
    # Switched on, the same settings are a usage error naming the first of them.
    on = run(pytester, "--aiocop", ini=ini)
    assert on.ret == pytest.ExitCode.USAGE_ERROR
    on.stderr.fnmatch_lines([f"ERROR: {fifo}: it is a FIFO (named pipe), not a regular file"])


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux) to fail the write at the end")
def test_a_baseline_that_cannot_be_written_fails_the_run(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_ok="def test_ok():\n    pass\n")
    result = run(pytester, "--aiocop", "--aiocop-write-baseline=/dev/full")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines(["aiocop: could not write the baseline /dev/full: [[]Errno 28[]] No space left*"])
    for bad in ("", "."):
        refused = run(pytester, "--aiocop", f"--aiocop-write-baseline={bad}")
        assert refused.ret == pytest.ExitCode.USAGE_ERROR
        refused.stderr.fnmatch_lines([f"ERROR: --aiocop-write-baseline: expected a file name, got {bad!r}*"])


SPINNING_ON_TRIO = """
import time

import anyio
import pytest
import trio


def spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:  # SPIN
        pass


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request):
    return request.param


@pytest.mark.anyio
async def test_spins(anyio_backend):
    await anyio.sleep(0)
    spin(0.3)


@pytest.mark.anyio
async def test_clean(anyio_backend):
    await anyio.sleep(0.05)  # waiting in the loop: no stall
    await anyio.to_thread.run_sync(spin, 0.3)  # off the loop: fine


@pytest.mark.trio
async def test_spins_under_pytest_trio():
    await trio.sleep(0)
    spin(0.3)


@pytest.mark.trio
async def test_clean_under_pytest_trio():
    await trio.sleep(0.05)
    await trio.to_thread.run_sync(spin, 0.3)
"""


def test_a_spinning_test_on_trio_fails_as_a_stall(pytester: pytest.Pytester) -> None:
    # The watchdog watches trio's run loop (issue 41): a test that anyio runs on trio, and a
    # pytest-trio test, fail as a stall like their asyncio twin; clean ones pass, and no test is
    # said to be left unchecked.
    pytest.importorskip("pytest_trio")
    pytester.makepyfile(test_spin=SPINNING_ON_TRIO)
    pytester.makeini(BASE_INI)
    result = pytester.runpytest_subprocess(*QUIET_BUT_TRIO, "-rA", "--aiocop", "--aiocop-threshold-ms=30", timeout=120)
    assert outcomes(result) == {
        "test_spins[asyncio]": {"FAILED"},
        "test_spins[trio]": {"FAILED"},
        "test_clean[asyncio]": {"PASSED"},
        "test_clean[trio]": {"PASSED"},
        "test_spins_under_pytest_trio": {"FAILED"},
        "test_clean_under_pytest_trio": {"PASSED"},
    }
    spin_line = line_of(SPINNING_ON_TRIO.strip(), "# SPIN")
    for name in ("test_spins[trio]", "test_spins_under_pytest_trio", "test_spins[asyncio]"):
        report = section(result, name)
        assert re.search(r"\[1\] loop stalled for \d+\.\d ms", report), report
        assert f"at test_spin.py:{spin_line}:spin" in report, report
    assert "ran on trio" not in result.stdout.str()


ANYIO_TESTS = """
import os
import time

import anyio
import pytest

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request):
    return request.param


async def test_sleeps(anyio_backend):
    await anyio.sleep(0)
    time.sleep(0.05)  # the blocking line


async def test_clean(anyio_backend):
    await anyio.sleep(0)
    await anyio.to_thread.run_sync(time.sleep, 0.01)  # off the loop: fine


async def test_reads_its_events(anyio_backend, aiocop_events):
    os.stat(".")
    assert aiocop_events.names() == ["os.stat"]  # its own step, delivered from inside it
"""


def test_an_anyio_test_on_trio_fails_at_its_blocking_line(pytester: pytest.Pytester) -> None:
    pytest.importorskip("trio")
    pytester.makepyfile(test_anyio=ANYIO_TESTS)
    result = run(pytester, "--aiocop", plugins=WITH_ANYIO)
    assert outcomes(result) == {
        "test_sleeps[asyncio]": {"FAILED"},
        "test_sleeps[trio]": {"FAILED"},
        "test_clean[asyncio]": {"PASSED"},
        "test_clean[trio]": {"PASSED"},
        "test_reads_its_events[asyncio]": {"PASSED"},
        "test_reads_its_events[trio]": {"PASSED"},
    }
    line = line_of(ANYIO_TESTS.strip(), "# the blocking line")
    report = section(result, "test_sleeps[trio]")
    assert "time.sleep(0.05)" in report
    assert f"at test_anyio.py:{line}:test_sleeps" in report
    assert "in task 'anyio._backends._trio.TestRunner._run_tests_and_fixtures'" in report
    assert "await trio.to_thread.run_sync(...)" in report
    assert f"at test_anyio.py:{line}:test_sleeps" in section(result, "test_sleeps[asyncio]")
    assert "ran on trio" not in result.stdout.str()


def test_a_pytest_trio_test_fails_at_its_blocking_line(pytester: pytest.Pytester) -> None:
    pytest.importorskip("pytest_trio")
    source = """
    import time

    import pytest
    import trio


    @pytest.mark.trio
    async def test_sleeps():
        await trio.sleep(0)
        time.sleep(0.05)  # the blocking line


    @pytest.mark.trio
    async def test_clean():
        await trio.to_thread.run_sync(time.sleep, 0.01)
    """
    pytester.makepyfile(test_pytest_trio=source)
    pytester.makeini(BASE_INI)
    result = pytester.runpytest_subprocess(*QUIET_BUT_TRIO, "-rA", "--aiocop", timeout=120)
    assert outcomes(result) == {"test_sleeps": {"FAILED"}, "test_clean": {"PASSED"}}
    line = line_of(textwrap.dedent(source).strip(), "# the blocking line")
    assert f"at test_pytest_trio.py:{line}:test_sleeps" in section(result, "test_sleeps")
    assert "ran on trio" not in result.stdout.str()


def test_a_testclient_request_names_the_tests_line(pytester: pytest.Pytester) -> None:
    # The TestClient runs the app on a loop in another thread (anyio's
    # portal): the app's stack ends in the framework; the test's line is
    # carried over from the calling thread (issue 38).
    pytest.importorskip("starlette.testclient")
    pytester.makepyfile(
        test_client="""
        import time
        from starlette.applications import Starlette
        from starlette.responses import PlainTextResponse
        from starlette.routing import Route
        from starlette.testclient import TestClient

        async def slow(request):
            time.sleep(0.001)
            return PlainTextResponse("ok")

        app = Starlette(routes=[Route("/", slow)])

        def test_request():
            client = TestClient(app)
            assert client.get("/").status_code == 200  # the test's line
        """
    )
    result = run(pytester, "--aiocop", "-W", "ignore::DeprecationWarning")
    assert "called_from='test_client.py:15:test_request'" in result.stdout.str()


def test_the_plugin_looks_at_idle_loops_written_in_c_every_half_threshold(pytester: pytest.Pytester) -> None:
    # The precise idle looks (start_cpu_sampling's precise_idle) are a test run's default; a test's own choice wins.
    pytester.makepyfile(
        test_looks="""
        import aiocop
        from aiocop._stalls.settings import sampling

        def test_default():
            assert sampling.precise()

        def test_asked():
            aiocop.start_cpu_sampling(precise_idle=False)
            assert not sampling.precise()
        """
    )
    result = run(pytester, "--aiocop")
    assert outcomes(result) == {"test_default": {"PASSED"}, "test_asked": {"PASSED"}}, result.stdout.str()
    # The test run's default ends with it: what the process does after it gets production's.
    in_process = pytester.runpytest_inprocess(*QUIET, "--aiocop", "-k", "test_default")
    in_process.assert_outcomes(passed=1)
    assert not aiocop.is_monitoring_active()
    assert not sampling.precise()
