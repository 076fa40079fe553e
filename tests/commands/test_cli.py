"""`python -m aiocop run` (`aiocop.__main__`): the real CLI, in a subprocess (its usage errors in this process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import aiocop
from aiocop._commands import cli as _cli
from aiocop._commands.cli import Program, split_program
from tests.support.pytester_args import QUIET

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = """
import asyncio, os, sys, time

async def main():
    for _ in range(3):
        os.stat(".")  # light, three times
        await asyncio.sleep(0)
    time.sleep(0.04)  # heavy, once
    print("program ran with", sys.argv[1:], type(asyncio.get_running_loop()).__module__.split('.')[0])

asyncio.run(main())
"""


def aiocop_run(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aiocop", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=60,
        check=False,
    )


# For the runs whose point is their blocking calls: stalls (and a step's
# impact from its length) only from 1 s. At the default 30 ms, a busy machine
# that keeps a step of the loop's off the CPUs for 30 ms adds a stall row of
# its own (asyncio.run's, at a load of 10) and makes a light call's step
# "medium"; a step kept off for 1 s is not a busy machine but a broken one.
CALLS_ONLY = ("--threshold-ms", "1000")


@pytest.fixture
def program(tmp_path: Path) -> Path:
    path = tmp_path / "prog.py"
    path.write_text(textwrap.dedent(PROGRAM))
    return path


def test_runs_a_script_and_prints_call_sites_worst_first(program: Path) -> None:
    result = aiocop_run("run", *CALLS_ONLY, program.name, "a", "--flag", cwd=program.parent)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "program ran with ['a', '--flag'] asyncio\n", "the program's own output is untouched"
    lines = result.stderr.splitlines()
    header = lines.index(next(line for line in lines if line.startswith("call site")))
    assert lines[header].split() == ["call", "site", "events", "count", "steps", "ms", "worst", "step", "ms", "impact"]
    rows = [line.split() for line in lines[header + 2 :]]
    assert [(r[0], r[1], r[2], r[-1]) for r in rows] == [
        ("prog.py:8:main", "time.sleep", "1", "high"),
        ("prog.py:6:main", "os.stat", "3", "low"),
    ]
    assert "4 blocking call(s) and 0 stall(s) at 2 call site(s)" in result.stderr


def test_json_report(program: Path, tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    result = aiocop_run("run", *CALLS_ONLY, "--json", report, program.name, cwd=program.parent)
    assert result.returncode == 0, result.stderr
    data = json.loads(report.read_text())
    assert data["exit_status"] == 0
    assert data["worst_impact"] == "high"
    assert data["program"] == "prog.py"
    sleep, stat = data["call_sites"]
    assert (sleep["events"], sleep["count"], sleep["steps"], sleep["impact"]) == ({"time.sleep": 1}, 1, 1, "high")
    assert sleep["worst_ms"] >= 40 * 0.9
    assert sleep["total_ms"] == sleep["worst_ms"]
    assert (stat["events"], stat["count"], stat["call_site"]) == ({"os.stat": 3}, 3, "prog.py:6:main")
    assert stat["event"] == "os.stat"
    assert stat["example_trace"] == "prog.py:6:main"


def test_module_with_arguments(program: Path) -> None:
    result = aiocop_run("run", "--uvloop", "-m", "prog", "--x", "1", cwd=program.parent)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "program ran with ['--x', '1'] uvloop\n"
    assert "prog.py:8:main" in result.stderr


LOOP_KINDS = """
import asyncio, sys, warnings
warnings.simplefilter("error")  # 3.14+: any use of the deprecated policy system fails the run

async def kind():
    return type(asyncio.get_running_loop()).__module__.split(".")[0]

kinds = [asyncio.run(kind())]
if sys.version_info >= (3, 11):
    with asyncio.Runner() as runner:
        kinds.append(runner.run(kind()))
    with asyncio.Runner(loop_factory=asyncio.SelectorEventLoop) as runner:  # named: the program's choice
        kinds.append(runner.run(kind()))
loop = asyncio.new_event_loop()
kinds.append(type(loop).__module__.split(".")[0])
loop.close()
print(*kinds, "policy:", type(asyncio.events._event_loop_policy).__module__.split(".")[0])
"""


def test_uvloop_without_an_event_loop_policy(tmp_path: Path) -> None:
    # Policies are deprecated from 3.14: --uvloop must not install one, yet
    # every loop the program creates without naming a factory is uvloop's.
    script = tmp_path / "kinds.py"
    script.write_text(LOOP_KINDS)
    result = aiocop_run("run", "--uvloop", script)
    assert result.returncode == 0, result.stderr
    runners = ["uvloop", "asyncio"] if sys.version_info >= (3, 11) else []
    assert result.stdout.split() == ["uvloop", *runners, "uvloop", "policy:", "asyncio"]
    plain = aiocop_run("run", script)
    assert "uvloop" not in plain.stdout, plain.stdout


TRIO_PROGRAM = """
import os, time, trio

async def worker():
    os.stat(".")  # light, in each of three child tasks

async def main():
    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(worker)
    time.sleep(0.04)  # heavy, once
    await trio.to_thread.run_sync(time.sleep, 0.01)  # in trio's worker thread: off the run loop
    print("trio program ran")

trio.run(main)
"""


def test_a_trio_program(tmp_path: Path) -> None:
    # trio's run loop is not asyncio's: its tasks' blocking calls are reported all the same (issue 41).
    pytest.importorskip("trio")
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(TRIO_PROGRAM))
    result = aiocop_run("run", *CALLS_ONLY, script.name, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "trio program ran\n"
    lines = result.stderr.splitlines()
    header = lines.index(next(line for line in lines if line.startswith("call site")))
    rows = [line.split() for line in lines[header + 2 :]]
    assert [(r[0], r[1], r[2], r[-1]) for r in rows] == [
        ("prog.py:11:main", "time.sleep", "1", "high"),
        ("prog.py:5:worker", "os.stat", "3", "low"),
    ]
    assert "4 blocking call(s) and 0 stall(s) at 2 call site(s)" in result.stderr


def test_a_trio_program_with_a_stall(tmp_path: Path) -> None:
    # The watchdog watches trio's run loop as it does an asyncio loop's (issue 41).
    pytest.importorskip("trio")
    script = tmp_path / "spin.py"
    script.write_text(
        "import time, trio\n"
        "async def main():\n"
        "    await trio.sleep(0.02)\n"
        "    end = time.perf_counter() + 0.3\n"
        "    while time.perf_counter() < end:\n"
        "        pass\n"
        "    await trio.sleep(0.02)\n"
        "trio.run(main)\n"
    )
    result = aiocop_run("run", "--threshold-ms", "30", script.name, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "0 blocking call(s) and 1 stall(s)" in result.stderr
    [row] = [line.split() for line in result.stderr.splitlines() if "  stall  " in line]
    assert row[0] == "spin.py:5:main", row


@pytest.mark.parametrize(
    ("level", "status"),
    [("high", 3), ("low", 3)],
)
def test_fail_on_reached(program: Path, level: str, status: int) -> None:
    result = aiocop_run("run", "--fail-on", level, program)
    assert result.returncode == status
    assert f"reached impact 'high' (--fail-on {level})" in result.stderr


def test_fail_on_not_reached(tmp_path: Path) -> None:
    script = tmp_path / "light.py"
    script.write_text("import asyncio, os\nasync def main():\n    os.stat('.')\nasyncio.run(main())\n")
    assert aiocop_run("run", *CALLS_ONLY, "--fail-on", "medium", script).returncode == 0
    assert aiocop_run("run", *CALLS_ONLY, "--fail-on", "low", script).returncode == 3


def test_the_programs_own_exit_status_wins(tmp_path: Path) -> None:
    script = tmp_path / "exits.py"
    script.write_text(
        "import asyncio, sys, time\nasync def main():\n    time.sleep(0.01)\nasyncio.run(main())\nsys.exit(4)\n"
    )
    result = aiocop_run("run", "--fail-on", "high", script)
    assert result.returncode == 4
    assert "exits.py:3:main" in result.stderr, "the summary is printed all the same"


def test_a_crashing_program_shows_its_own_traceback_then_the_summary(tmp_path: Path) -> None:
    script = tmp_path / "crash.py"
    script.write_text("import asyncio, os\nasync def main():\n    os.stat('.')\n    1 / 0\nasyncio.run(main())\n")
    result = aiocop_run("run", script)
    assert result.returncode == 1
    traceback = result.stderr[result.stderr.index("Traceback") :]
    first_frame = traceback.splitlines()[1]
    assert first_frame.strip().startswith(f'File "{script}"'), traceback
    assert "runpy" not in traceback
    assert "_commands/cli.py" not in traceback
    assert "ZeroDivisionError" in traceback
    assert traceback.index("ZeroDivisionError") < traceback.index("crash.py:3:main")


def test_a_programs_own_excepthook_reports_its_crash(tmp_path: Path) -> None:
    script = tmp_path / "hooked.py"
    script.write_text(
        "import sys\n"
        "sys.excepthook = lambda kind, error, tb: print('hooked', kind.__name__, tb.tb_frame.f_code.co_filename)\n"
        "raise ValueError('boom')\n"
    )
    result = aiocop_run("run", script)
    assert result.returncode == 1
    assert result.stdout == f"hooked ValueError {script}\n", "as Python would, with the program's own frames"
    assert "Traceback" not in result.stderr


def test_the_summary_waits_for_the_programs_threads(tmp_path: Path) -> None:
    script = tmp_path / "threads.py"
    script.write_text(
        "import asyncio, concurrent.futures, os, threading, time\n"
        "async def late():\n"
        "    await asyncio.sleep(0.2)\n"
        "    os.stat('.')  # after the main thread is done\n"
        "threading.Thread(target=asyncio.run, args=(late(),)).start()\n"
        "IDLE = concurrent.futures.ThreadPoolExecutor(1)  # never shut down, as Python allows\n"
        "IDLE.submit(time.sleep, 0)\n"
    )
    result = aiocop_run("run", script)
    assert result.returncode == 0, result.stderr
    assert "threads.py:4:late" in result.stderr, "the thread's loop is watched to its end"


def test_a_symlinked_script_imports_its_neighbours(tmp_path: Path) -> None:
    # As `python link.py`: sys.path[0] is the directory of the script the link points to.
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "helper.py").write_text("NAME = 'helper'\n")
    (tmp_path / "real" / "tool.py").write_text("import helper\nprint(helper.NAME)\n")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "tool.py").symlink_to(tmp_path / "real" / "tool.py")
    result = aiocop_run("run", tmp_path / "bin" / "tool.py")
    assert (result.returncode, result.stdout) == (0, "helper\n"), result.stderr


def test_sys_exit_with_a_message(tmp_path: Path) -> None:
    script = tmp_path / "message.py"
    script.write_text("import sys\nsys.exit('bad input')\n")
    result = aiocop_run("run", script)
    assert result.returncode == 1
    assert result.stderr.startswith("bad input\n")
    assert "no blocking calls or stalls were seen" in result.stderr


# A step that spins for 80 ms, and on until the watchdog has seen it stalled
# and reported it (a busy machine can keep the watchdog's thread off the CPUs
# for all of 80 ms, or its report past the program's end): without a watchdog,
# 80 ms. The spin is one line, the row's call site.
SPIN = """
import asyncio, threading, time
import aiocop
from aiocop._interception import loops

reported = []
aiocop.register_slow_task_callback(lambda event: event.reason == "cpu_blocking" and reported.append(event))

async def main():
    await asyncio.sleep(0.02)
    watchdog = any(thread.name == "aiocop-watchdog" for thread in threading.enumerate())
    s = loops.watches[threading.get_ident()].watchdog if watchdog else None  # its state of this loop
    pc, before = time.perf_counter, len(reported)
    end, cap = pc() + 0.08, pc() + 30
    while pc() < end or (s is not None and not (s.step and s.step.stalled) and pc() < cap):  # SPIN
        pass
    while s is not None and len(reported) == before and pc() < cap:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.02)

asyncio.run(main())
"""


def test_stall_is_a_row_unless_the_watchdog_is_off(tmp_path: Path) -> None:
    script = tmp_path / "spin.py"
    script.write_text(SPIN)
    spin_line = next(i for i, text in enumerate(SPIN.splitlines(), 1) if "# SPIN" in text)
    with_watchdog = aiocop_run("run", "--threshold-ms", "20", script)
    assert with_watchdog.returncode == 0, with_watchdog.stderr
    assert "0 blocking call(s) and " in with_watchdog.stderr
    # The spin, one stall at one of its two lines: the `while` or its `pass`,
    # whichever the samples found more often (the watchdog gets the GIL at
    # the loop's checks, which lie on both; on CPython 3.15 in CI, with every
    # core busy, most samples were at the `pass`). A busy machine can add a
    # stall of another step, kept off the CPUs for the threshold: a row of its own.
    rows = [line.split() for line in with_watchdog.stderr.splitlines()]
    spin_sites = (f"spin.py:{spin_line}:main", f"spin.py:{spin_line + 1}:main")
    assert [row[1:3] for row in rows if row and row[0].endswith(spin_sites)] == [["stall", "1"]], with_watchdog.stderr
    assert "  stall  " in with_watchdog.stderr
    without = aiocop_run("run", "--no-watchdog", script)
    assert without.returncode == 0, without.stderr
    assert "no blocking calls or stalls were seen" in without.stderr


def test_verbose_prints_each_event_with_its_source_line(program: Path) -> None:
    result = aiocop_run("run", "-v", program)
    assert result.stderr.count("aiocop: 1 blocking call in task") == 4
    assert 'os.stat(".")  # light, three times' in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("run", "missing.py"), "can't open file 'missing.py': no such file"),
        (("run", "-m", "no_such_module_here"), "no module named 'no_such_module_here'"),
        (("run",), "the program to run is missing"),
        (("run", "--fail-on", "severe", "x.py"), "argument --fail-on: invalid choice: 'severe'"),
        (("run", "--threshold-ms", "-3", "x.py"), "argument --threshold-ms: expected a positive float, got '-3'"),
        (("run", "--trace-depth", "many", "x.py"), "argument --trace-depth: expected a positive int, got 'many'"),
        (("run", "--thr", "5", "x.py"), "unrecognized arguments: --thr"),  # not --threshold-ms, nor 5 the script
        (("bench",), "invalid choice: 'bench'"),
        ((), "usage: python -m aiocop"),
    ],
)
def test_usage_errors(args: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, stderr = refused_in_process(capsys, *args)
    assert status == 2
    assert message in stderr
    assert "Traceback" not in stderr


def test_version() -> None:
    # The version aiocop._version holds, the one the package says.
    import aiocop

    result = aiocop_run("--version")
    assert (result.returncode, result.stdout.strip()) == (0, f"aiocop {aiocop.__version__}")


@pytest.mark.parametrize(
    ("argv", "options", "program"),
    [
        (
            ["--json", "out.json", "app.py", "--json", "x"],
            ["--json", "out.json"],
            Program("app.py", None, ["--json", "x"]),
        ),
        (["-v", "-m", "pkg.mod", "-v"], ["-v"], Program(None, "pkg.mod", ["-v"])),
        (["-mpkg", "a"], [], Program(None, "pkg", ["a"])),
        (["--", "-odd-name.py", "a"], [], Program("-odd-name.py", None, ["a"])),
        (["--uvloop"], ["--uvloop"], None),
        (["-m"], [], None),
    ],
)
def test_split_program(argv: list[str], options: list[str], program: Program | None) -> None:
    assert split_program(argv) == (options, program)


def test_the_demo_catches_every_planted_call() -> None:
    report = ROOT / ".pytest-demo-report.json"
    try:
        result = aiocop_run("run", "--uvloop", "--json", report, "examples/demo_app.py", cwd=ROOT)
        assert result.returncode == 0, result.stderr
        rows = json.loads(report.read_text())["call_sites"]
    finally:
        report.unlink(missing_ok=True)
    found = {(r["call_site"].rsplit(":", 1)[1], event) for r in rows for event in r["events"]}
    assert found == {
        ("render", "open"),
        ("health", "os.stat"),
        ("health", "socket.gethostbyname"),
        ("report", "time.sleep"),
        ("report", "subprocess.Popen"),
        ("stats", "stall"),
    }, "every handler but /fine (which uses asyncio.to_thread) is caught, at its own line"
    assert all(r["call_site"].startswith("examples/demo_app.py:") for r in rows)


def test_an_unwritable_json_path_is_a_usage_error_before_the_program_runs(program: Path, tmp_path: Path) -> None:
    result = aiocop_run("run", "--json", tmp_path / "missing-dir" / "r.json", program)
    assert result.returncode == 2
    assert "--json: cannot write a file in" in result.stderr
    assert "program ran" not in result.stdout


def test_a_forked_child_that_returns_prints_no_second_summary(tmp_path: Path) -> None:
    script = tmp_path / "forks.py"
    script.write_text(
        "import asyncio, os, time\n"
        "async def main():\n"
        "    time.sleep(0.01)\n"
        "asyncio.run(main())\n"
        "pid = os.fork()\n"
        "if pid:\n"
        "    os.waitpid(pid, 0)\n"
    )
    result = aiocop_run("run", script)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("call site(s), most loop time lost first") == 1, result.stderr


def test_a_test_suite_that_turns_warnings_into_errors_runs_under_the_cli(tmp_path: Path) -> None:
    # aiocop is a pytest plugin, imported by the CLI before pytest starts:
    # pytest warned it could not rewrite its asserts, and a suite with
    # filterwarnings = error stopped before its first test.
    (tmp_path / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\nfilterwarnings = ["error"]\nasyncio_default_fixture_loop_scope = "function"\n'
    )
    (tmp_path / "test_app.py").write_text(
        textwrap.dedent("""\
            import asyncio, os


            def test_app():
                async def main():
                    os.stat(".")

                asyncio.run(main())
            """)
    )
    result = aiocop_run("run", "-m", "pytest", "-q", *QUIET, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout
    assert "test_app.py:6:main" in result.stderr


# --- errors, outputs and the environment (issue 23) -------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--allow", ""), "--allow: in rule '': the rule is empty, and would allow every blocking call"),
        (("--allow", "  "), "--allow: in rule '  ': the rule is empty"),
        (("--allow", "# TODO"), "--allow: in rule '# TODO': the rule is only a comment"),
        (("--threshold-ms", "inf"), "argument --threshold-ms: expected a positive float, got 'inf'"),
        (("--threshold-ms", "nan"), "argument --threshold-ms: expected a positive float, got 'nan'"),
        (("--threshold-ms", "1e300"), "argument --threshold-ms: expected at most 3600000, got '1e300'"),
        # Issue 25: beyond a day, as the API refuses it (it was a traceback from detect_slow_tasks).
        (
            ("--hang-after-ms", "1e20"),
            "argument --hang-after-ms: expected a number of milliseconds from 0 (off) to 86400000 (a day), got '1e20'",
        ),
        (("--hang-after-ms", "86400001"), "to 86400000 (a day), got '86400001'"),
        (("--hang-after-ms", "nan"), "to 86400000 (a day), got 'nan'"),
        (("--hang-after-ms", "-1"), "to 86400000 (a day), got '-1'"),
        (("--json", ""), "--json: expected a file name, got ''"),
        (("--write-baseline", "."), "--write-baseline: '.' is a directory, not a file"),
        (("--config", "/dev/zero"), "/dev/zero: it is a character device, not a regular file"),
        (("--config", "."), ".: it is a directory, not a regular file"),
        (("--baseline", "/dev/zero"), "baseline '/dev/zero': it is a character device, not a regular file"),
        (("--baseline", ""), "--baseline: expected a file name, got ''"),
    ],
)
def test_bad_run_settings_are_usage_errors(
    program: Path, args: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, stderr = refused_in_process(capsys, "run", "--fail-on", "low", *args, program)
    assert status == 2, stderr
    assert message in stderr
    assert "Traceback" not in stderr


def refused_in_process(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str]:
    """`python -m aiocop ARGS` refused before its program runs: the exit status and stderr.

    A refusal comes before the program runs and before aiocop starts
    anything, so the CLI's steps run in this process (a process each cost
    0.3 s of CPU on every Python), and are shown to have started nothing.
    """
    steps = _cli.session([str(arg) for arg in args])
    with pytest.raises((StopIteration, SystemExit)) as refused:
        next(steps)
    error = refused.value
    assert isinstance(error, (StopIteration, SystemExit))
    status = error.value if isinstance(error, StopIteration) else error.code
    assert isinstance(status, int), status
    assert not aiocop.is_monitoring_active()
    assert not aiocop.get_patched_functions()
    return status, capsys.readouterr().err


def test_a_json_directory_is_refused_before_the_program_runs(program: Path, tmp_path: Path) -> None:
    result = aiocop_run("run", "--json", tmp_path, program)
    assert result.returncode == 2
    assert f"--json: {str(tmp_path)!r} is a directory, not a file" in result.stderr
    assert "program ran" not in result.stdout


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux) to fail a write after the run")
@pytest.mark.parametrize("flag", ["--json", "--write-baseline"])
def test_an_output_that_cannot_be_written_fails_the_run(program: Path, flag: str) -> None:
    # /dev/full opens but refuses every write (ENOSPC): found out only once the run is over.
    result = aiocop_run("run", flag, "/dev/full", program)
    assert "program ran" in result.stdout
    assert result.returncode == 1, result.stderr
    assert f"aiocop: could not write {flag} file: [Errno 28] No space left on device" in result.stderr


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_failed_output_keeps_a_worse_status(tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text(
        "import asyncio, os\n\nasync def main():\n    os.stat('.')\n\nasyncio.run(main())\n"
    )
    failing = aiocop_run("run", "--fail-on", "low", "--json", "/dev/full", "prog.py", cwd=tmp_path)
    assert failing.returncode == 3, failing.stderr  # the gate's own status, still not 0
    (tmp_path / "exits.py").write_text("raise SystemExit(7)\n")
    exits = aiocop_run("run", "--json", "/dev/full", "exits.py", cwd=tmp_path)
    assert exits.returncode == 7, exits.stderr


@pytest.mark.timeout(150)  # two programs in turn, each given 60 s
def test_run_never_reads_the_attach_environment(program: Path) -> None:
    # The attach command's variable, set wrong, once broke `run` at import.
    env = {**os.environ, "AIOCOP_ATTACH_START_TIMEOUT_S": "abc"}
    result = subprocess.run(
        [sys.executable, "-m", "aiocop", "run", str(program)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "program ran" in result.stdout
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, aiocop._commands.cli; print('aiocop._commands.attach' in sys.modules)"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    assert loaded.stdout.strip() == "False"


@pytest.mark.parametrize("value", ["abc", "nan", "inf", "-1", "0", "1e9"])
def test_attach_checks_its_environment_with_a_clear_error(
    value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AIOCOP_ATTACH_START_TIMEOUT_S", value)
    status, stderr = refused_in_process(capsys, "attach", str(os.getpid()))
    assert status == 2, stderr
    assert "AIOCOP_ATTACH_START_TIMEOUT_S=" in stderr
    assert "expected a number of seconds above 0" in stderr
    assert "Traceback" not in stderr


@pytest.mark.parametrize(
    ("value", "message"), [("", "--config: no such file: ''"), ("nope.toml", "--config: no such file")]
)
def test_a_missing_config_is_named_by_its_flag(program: Path, value: str, message: str) -> None:
    result = aiocop_run("run", "--config", value, program)
    assert result.returncode == 2
    assert message in result.stderr


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs (POSIX)")
def test_a_fifo_nobody_reads_fails_the_run_instead_of_hanging_it(program: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "report.json"
    os.mkfifo(fifo)
    for flag in ("--json", "--write-baseline"):
        result = aiocop_run("run", flag, fifo, program)  # opening a FIFO to write would wait for a reader
        assert result.returncode == 1, result.stderr
        assert f"aiocop: could not write {flag} file: [Errno 6] No such device or address" in result.stderr
    to_stdout = aiocop_run("run", "--json", "/dev/stdout", program)
    assert to_stdout.returncode == 0, to_stdout.stderr
    assert '"exit_status": 0' in to_stdout.stdout


def test_run_looks_at_idle_loops_written_in_c_every_half_threshold(tmp_path: Path) -> None:
    # The precise idle looks (start_cpu_sampling's precise_idle) are a run's default, not a production process's.
    prog = tmp_path / "looks.py"
    prog.write_text(
        "import asyncio, aiocop\n"
        "from aiocop._stalls.settings import sampling\n"
        "aiocop.detect_slow_tasks(threshold_ms=30)\n"
        "print('precise', sampling.precise())\n"
        "aiocop.start_cpu_sampling(precise_idle=False)\n"
        "print('asked', sampling.precise())\n"
    )
    run = aiocop_run("run", prog, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "precise True\nasked False\n" in run.stdout
    plain = subprocess.run([sys.executable, str(prog)], capture_output=True, text=True, timeout=60, check=False)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout == "precise False\nasked False\n"
