"""`[tool.aiocop]`: one configuration for the API, the CLI, the pytest plugin and the middleware; baselines."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import aiocop
from aiocop import _api
from aiocop._configuration import baseline as _baseline
from aiocop._configuration import config as _config
from aiocop._configuration.config import ConfigError, ProjectConfig, load_config
from aiocop._interception import frames as _frames
from aiocop.asgi import AiocopMiddleware
from tests.commands.test_cli import CALLS_ONLY, aiocop_run
from tests.commands.test_cli import refused_in_process as cli_refused_in_process
from tests.conftest import ROOT, Collector, reset_aiocop, run_on
from tests.support import blocking_calls
from tests.support.pytester_args import QUIET

if TYPE_CHECKING:
    from collections.abc import Iterator


def pyproject(folder: Path, table: str) -> Path:
    path = folder / "pyproject.toml"
    path.write_text("[project]\nname = 'demo'\n\n[tool.aiocop]\n" + textwrap.dedent(table))
    return path


# --- reading the table ------------------------------------------------------------------


def test_a_full_table_is_read_with_paths_from_its_folder(tmp_path: Path) -> None:
    path = pyproject(
        tmp_path,
        """
        threshold_ms = 50
        trace_depth = 12
        fail_on = "medium"
        app_paths = ["src/"]
        library_paths = "src/app/vendor/"
        allow = ["open module=app.templates", { events = ["os.stat"], path = "scripts/" }]
        baseline = "aiocop-baseline.json"
        sample_rate = 0.25
        """,
    )
    config = load_config(path)
    assert (config.threshold_ms, config.trace_depth, config.fail_on, config.sample_rate) == (50.0, 12, "medium", 0.25)
    assert config.app_paths == (str(tmp_path / "src") + os.sep,)
    assert config.library_paths == (str(tmp_path / "src" / "app" / "vendor") + os.sep,)
    assert config.baseline == str(tmp_path / "aiocop-baseline.json")
    templates, scripts = config.allow
    assert (templates.events, templates.module) == (frozenset({"open"}), "app.templates")
    assert (scripts.events, scripts.path) == (frozenset({"os.stat"}), str(tmp_path / "scripts") + os.sep)
    assert config.allow_lines == ("open module=app.templates", "os.stat path=scripts/")
    assert config.source == str(path)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("treshold_ms = 5", "unknown key 'treshold_ms' (did you mean 'threshold_ms'?)"),
        ("threshold_ms = 'fast'", "threshold_ms: expected a number (milliseconds), got 'fast'"),
        ("threshold_ms = 0", "threshold_ms: expected a number > 0 and <= 3600000 (milliseconds), got 0"),
        ("trace_depth = 0", "trace_depth: expected a whole number of frames >= 1, got 0"),
        ("fail_on = 'hihg'", "fail_on: expected one of low, medium, high, got 'hihg' (did you mean 'high'?)"),
        ("sample_rate = 1.5", "sample_rate: expected a number > 0 and <= 1 (a fraction), got 1.5"),
        (
            "hang_after_ms = 86400001",
            "hang_after_ms: expected a number > 0 and <= 86400000 (milliseconds), got 86400001 (0: off; at most a day)",
        ),
        ("hang_after_ms = -5", "hang_after_ms: expected a number > 0 and <= 86400000 (milliseconds), got -5"),
        ("hang_after_ms = true", "hang_after_ms: expected a number (milliseconds), got True"),
        ("hang_after_ms = nan", "hang_after_ms: expected a number (milliseconds), got nan"),
        ("app_paths = [3]", "app_paths: expected a list of paths, got [3]"),
        ("allow = ['opn']", "allow: in rule 'opn': unknown event 'opn' in allow rule (did you mean 'open'?)"),
        (
            "allow = [{ modul = 'x' }]",
            "allow: in rule {'modul': 'x'}: unknown keyword 'modul' (did you mean 'module'?)",
        ),
        ("allow = 'open'", "allow: expected a list of rules (strings or tables), got 'open'"),
        ("baseline = ''", "baseline: expected a file name, got ''"),
    ],
)
def test_a_bad_table_names_the_file_the_key_and_the_fix(tmp_path: Path, table: str, message: str) -> None:
    path = pyproject(tmp_path, table)
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert str(raised.value).startswith(f"{path} [tool.aiocop]")
    assert message in str(raised.value)


def test_the_nearest_pyproject_is_read_and_aiocop_config_overrides_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pyproject(tmp_path, "threshold_ms = 40")
    inner = tmp_path / "src" / "pkg"
    inner.mkdir(parents=True)
    monkeypatch.chdir(inner)
    monkeypatch.delenv("AIOCOP_CONFIG", raising=False)
    assert load_config().threshold_ms == 40
    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.setenv("AIOCOP_CONFIG", str(pyproject(other, "threshold_ms = 70")))
    assert load_config().threshold_ms == 70
    monkeypatch.setenv("AIOCOP_CONFIG", str(tmp_path / "missing.toml"))
    with pytest.raises(ConfigError, match="AIOCOP_CONFIG: no such file"):
        load_config()


def test_a_project_without_the_table_gets_an_empty_configuration(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    config = load_config(tmp_path / "pyproject.toml")
    assert (config.threshold_ms, config.allow, config.baseline) == (None, (), None)
    (tmp_path / "pyproject.toml").write_text("[tool.aiocop\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(tmp_path / "pyproject.toml")


# --- the API: configure() ---------------------------------------------------------------


@pytest.fixture
def configured() -> Iterator[Collector]:
    collector = Collector()
    yield collector
    reset_aiocop()
    _frames.set_app_paths((), ())
    _api._configured = None


def test_configure_starts_detection_with_the_tables_rules_and_threshold(
    tmp_path: Path, configured: Collector, loop_name: str
) -> None:
    path = pyproject(
        tmp_path,
        """
        threshold_ms = 45
        allow = ["os.stat module=tests.support.blocking_calls"]
        sample_rate = 0.5
        """,
    )
    config = aiocop.configure(path)
    aiocop.register_slow_task_callback(configured)
    assert aiocop.is_monitoring_active() and aiocop.is_cpu_sampling_started()
    assert aiocop.get_slow_task_threshold_ms() == 45

    async def main() -> None:
        blocking_calls.do_stat()  # allowed by the table
        os.listdir(".")

    run_on(loop_name, main())
    assert configured.names() == ["os.listdir"]
    assert AiocopMiddleware(lambda scope, receive, send: None).sample_rate == 0.5  # type: ignore[arg-type,return-value]
    assert AiocopMiddleware(lambda scope, receive, send: None, sample_rate=1.0).sample_rate == 1.0  # type: ignore[arg-type,return-value]
    aiocop.configure(path)  # again: its rules replace the first call's, not add to them
    assert aiocop.get_allow_rules() == list(config.allow)


def test_app_paths_decide_which_line_is_the_applications(tmp_path: Path, configured: Collector) -> None:
    # Code the configuration calls the application's own is its line even when
    # a library's path says otherwise (an app installed into site-packages),
    # and vendored code is not, though it lives beside the app.
    library = os.path.dirname(blocking_calls.__file__) + os.sep
    assert _frames.is_app_file(blocking_calls.__file__)
    _frames.set_app_paths((), (library,))
    assert not _frames.is_app_file(blocking_calls.__file__)
    _frames.set_app_paths((blocking_calls.__file__,), (library,))  # the longer prefix wins
    assert _frames.is_app_file(blocking_calls.__file__)

    aiocop.configure(pyproject(tmp_path, f"library_paths = [{blocking_calls.__file__!r}]"))
    aiocop.register_slow_task_callback(configured)

    async def main() -> None:
        blocking_calls.do_stat()

    run_on("asyncio", main())
    (call,) = configured.calls
    assert call["entry_point"].startswith("tests/support/blocking_calls.py:")
    assert call["app_site"].endswith(":main"), "the vendored frame is where it blocked, not the app's line"


# --- the CLI ----------------------------------------------------------------------------

EXAMPLE = Path(ROOT) / "examples" / "configuration"


def test_the_cli_shows_one_row_per_cause_at_the_applications_lines(tmp_path: Path) -> None:
    # The small app: a package imported inside a task, datetime.strptime,
    # a Unix server, a third-party client that blocks. Two rows, at its lines.
    # The rows of blocking calls are the point: stalls only from 500 ms (the
    # first strptime's step, starved at load 10, was a 30 ms stall row on 3.14).
    report = tmp_path / "report.json"
    result = aiocop_run("run", "--threshold-ms", "500", "--json", report, "app.py", cwd=EXAMPLE)
    assert result.returncode == 0, result.stderr
    rows = json.loads(report.read_text())["call_sites"]
    source = (EXAMPLE / "app.py").read_text().splitlines()
    import_line = next(i for i, line in enumerate(source, 1) if "import structlog" in line)
    client_line = next(i for i, line in enumerate(source, 1) if "httpx.get(url)" in line)
    sites = {row["call_site"]: row["events"] for row in rows}
    assert set(sites) == {f"app.py:{import_line}:handle_upload", f"app.py:{client_line}:fetch_status"}, rows
    assert set(sites[f"app.py:{import_line}:handle_upload"]) == {"import"}
    client = set(sites[f"app.py:{client_line}:fetch_status"])
    # Its socket calls. Where trio is installed (the dev environment), httpx's
    # first request imports httpcore, which imports trio, on the loop: 60-odd
    # imports fill the step's buffer ahead of the socket calls.
    trio_installed = importlib.util.find_spec("trio") is not None
    assert {"socket.connect", "socket.socket.send"} <= client or (trio_installed and "import" in client), client
    assert "2 call site(s)" in result.stderr


PROGRAM = """
import asyncio, os

async def main():
    os.stat(".")
    {extra}

asyncio.run(main())
"""


def test_hang_after_ms_from_the_table_reaches_the_api_the_cli_and_pytest(
    tmp_path: Path, configured: Collector, pytester: pytest.Pytester
) -> None:
    """Issue 25: `hang_after_ms` in [tool.aiocop]; 0 is off; the flags win."""
    from aiocop._model import state as _state

    aiocop.configure(pyproject(tmp_path, "threshold_ms = 40\nhang_after_ms = 300\n"))
    assert _state.config.hang_after_ms == 300
    aiocop.configure(pyproject(tmp_path, "threshold_ms = 40\nhang_after_ms = 0\n"))
    assert _state.config.hang_after_ms is None
    aiocop.configure(pyproject(tmp_path, "threshold_ms = 40\n"))
    assert _state.config.hang_after_ms == 5000  # unset: the default, not what the table said before
    # The CLI: a 1.2 s step is printed as a hang while it runs only if the table's 300 ms is used (not 5000).
    (tmp_path / "prog.py").write_text(PROGRAM.format(extra="__import__('time').sleep(1.2)"))
    pyproject(tmp_path, "hang_after_ms = 300\n")
    result = aiocop_run("run", "prog.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "loop HUNG for" in result.stderr
    off = aiocop_run("run", "--hang-after-ms", "0", "prog.py", cwd=tmp_path)  # the flag wins: off
    assert off.returncode == 0, off.stderr
    assert "HUNG" not in off.stderr
    # pytest: the table's value in the header, where the watchdog runs (the flags' checks: test_pytest_plugin.py).
    pytester.makepyprojecttoml("[tool.aiocop]\nhang_after_ms = 1500\n")
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = pytester.runpytest_subprocess(*QUIET, "--aiocop", "--aiocop-threshold-ms=50")
    result.stdout.fnmatch_lines(
        ["aiocop: fail_on=low, threshold_ms=50, hang_after_ms=1500, *trace_depth=*"]
    )  # (pytest-timeout's part between)


def test_the_cli_takes_the_table_and_its_flags_win(tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text(PROGRAM.format(extra="os.listdir('.')"))
    pyproject(tmp_path, 'fail_on = "low"\nallow = ["os.listdir"]\n')
    result = aiocop_run("run", "prog.py", cwd=tmp_path)
    assert result.returncode == 3, result.stderr
    assert "fail_on = 'low' in [tool.aiocop]" in result.stderr
    assert "os.listdir" not in result.stderr.partition("call site")[2]
    result = aiocop_run("run", *CALLS_ONLY, "--fail-on", "high", "--allow", "os.stat", "prog.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "no blocking calls" in result.stderr
    (tmp_path / "sub").mkdir()
    bad = pyproject(tmp_path / "sub", "fail_on = 'never'")
    result = aiocop_run("run", "--config", bad, "prog.py", cwd=tmp_path)
    assert result.returncode == 2
    assert "fail_on: expected one of low, medium, high, got 'never'" in result.stderr


def test_a_baseline_fails_only_new_call_sites(tmp_path: Path) -> None:
    baseline = tmp_path / "aiocop-baseline.json"
    (tmp_path / "prog.py").write_text(PROGRAM.format(extra="pass"))
    written = aiocop_run("run", *CALLS_ONLY, "--fail-on", "low", "--write-baseline", baseline, "prog.py", cwd=tmp_path)
    assert written.returncode == 0, written.stderr
    assert "wrote 1 call site(s) to the baseline" in written.stderr
    assert json.loads(baseline.read_text())["call_sites"] == [{"event": "os.stat", "site": "prog.py:main", "count": 1}]

    # Lines moved by an edit above the call: still known.
    (tmp_path / "prog.py").write_text("# a new comment\n" + PROGRAM.format(extra="pass"))
    known = aiocop_run("run", *CALLS_ONLY, "--fail-on", "low", "--baseline", baseline, "prog.py", cwd=tmp_path)
    assert known.returncode == 0, known.stderr
    assert "known" in known.stderr and "1 of 1 call site(s) are in the baseline" in known.stderr

    (tmp_path / "prog.py").write_text(PROGRAM.format(extra="open(__file__).close()"))
    new = aiocop_run("run", "--fail-on", "low", "--baseline", baseline, "prog.py", cwd=tmp_path)
    assert new.returncode == 3, new.stderr
    assert "NEW" in new.stderr and "a call site not in the baseline reached impact" in new.stderr

    missing = aiocop_run("run", "--baseline", tmp_path / "nope.json", "prog.py", cwd=tmp_path)
    assert missing.returncode == 2
    assert "no such file (record one first with --write-baseline" in missing.stderr


# --- the pytest plugin ------------------------------------------------------------------


def test_pytest_reads_the_table_and_a_baseline_passes_known_call_sites(pytester: pytest.Pytester) -> None:
    pytester.makepyprojecttoml(
        """
        [tool.pytest.ini_options]
        asyncio_mode = "auto"
        asyncio_default_fixture_loop_scope = "function"

        [tool.aiocop]
        allow = ["os.listdir"]
        baseline = "aiocop-baseline.json"
        """
    )
    pytester.makepyfile(
        test_app="""
        import os

        async def test_stat():
            os.stat(".")
            os.listdir(".")

        async def test_clean():
            pass
        """
    )
    missing = pytester.runpytest("--aiocop", "-p", "no:cacheprovider")
    assert "aiocop-baseline.json': no such file" in "\n".join(missing.errlines)

    written = pytester.runpytest(
        "--aiocop", "-p", "no:cacheprovider", "--aiocop-write-baseline", "aiocop-baseline.json"
    )
    written.assert_outcomes(passed=2)
    written.stdout.fnmatch_lines(["*wrote 1 call site(s) to the baseline*"])
    recorded = json.loads((pytester.path / "aiocop-baseline.json").read_text())["call_sites"]
    assert recorded == [{"event": "os.stat", "site": "test_app.py:test_stat", "count": 1}]

    pytester.runpytest("--aiocop", "-p", "no:cacheprovider").assert_outcomes(passed=2)

    pytester.makepyfile(
        test_app="""
        import os

        async def test_stat():
            os.stat(".")
            open(__file__).close()
        """
    )
    result = pytester.runpytest("--aiocop", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*baseline=*aiocop-baseline.json (1 call sites)*", "*open*"])


def test_the_table_the_docs_show_is_valid() -> None:
    config = load_config(EXAMPLE / "pyproject-example.toml")
    assert (config.threshold_ms, config.fail_on, config.sample_rate, len(config.allow)) == (50, "medium", 0.1, 2)
    assert config.hang_after_ms == 10000
    assert config.baseline == str(EXAMPLE / "aiocop-baseline.json")


# --- untrusted input (issue 23) ---------------------------------------------------------
#
# Every file aiocop reads may be hostile: planted by another local user in a
# shared parent folder, or a FIFO or a device behind an innocent name. Each
# case below is one message naming the file and what was expected, never a
# traceback, never a hang.

OTHER_UID = 12345  # a user that is neither the one running the tests nor root


def owned_by_someone_else(path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Make `path` another user's: chown as root; otherwise this process pretends to be another user."""
    if os.geteuid() == 0:
        os.chown(path, OTHER_UID, -1)
        return f"uid {OTHER_UID}"
    me = os.geteuid()
    # os.geteuid, as inputs.py reads it: the file is then neither "mine" nor root's.
    monkeypatch.setattr(os, "geteuid", lambda: me + 1)
    return f"uid {me}"


needs_root = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0,
    reason="a file of another user is made with os.chown, which needs root (a subprocess cannot be mocked)",
)


@pytest.fixture
def no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIOCOP_CONFIG", raising=False)
    monkeypatch.delenv("AIOCOP_TRUST", raising=False)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("allow = ['']", "allow: in rule '': the rule is empty, and would allow every blocking call"),
        ("allow = ['   ']", "allow: in rule '   ': the rule is empty, and would allow every blocking call"),
        ("allow = ['# TODO']", "allow: in rule '# TODO': the rule is only a comment, and would allow every"),
        ("allow = [{}]", "allow: in rule {}: an allow rule needs an event name or module=, path= or call_site="),
        ("allow = [{ events = [] }]", "an allow rule needs an event name or module=, path= or call_site="),
        ("allow = ['everything=yes']", "everything= takes only true (leave it out otherwise), got 'yes'"),
        ("allow = [{ everything = 'yes' }]", "AllowRule.everything must be True or False, not 'yes'"),
        ("allow = [{ everything = true, module = 'x' }]", "takes no other field"),
        ("threshold_ms = inf", "threshold_ms: expected a number (milliseconds), got inf"),
        ("threshold_ms = nan", "threshold_ms: expected a number (milliseconds), got nan"),
        ("threshold_ms = 1e300", "threshold_ms: expected a number > 0 and <= 3600000 (milliseconds), got 1e+300"),
        ("sample_rate = nan", "sample_rate: expected a number (a fraction), got nan"),
        ("threshold_ms = '" + "x" * 5000 + "'", "threshold_ms: expected a number (milliseconds), got 'xxxxxxx"),
    ],
)
def test_a_blank_or_unbounded_value_is_refused(tmp_path: Path, table: str, message: str) -> None:
    path = pyproject(tmp_path, table)
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert str(raised.value).startswith(f"{path} [tool.aiocop]")
    assert message in str(raised.value)
    assert len(str(raised.value)) < 600, "a huge value is shortened in the message"


def test_allowing_everything_in_the_table_is_spelled_out(tmp_path: Path) -> None:
    config = load_config(pyproject(tmp_path, "allow = ['everything=true', { everything = true }]"))
    assert config.allow == (aiocop.AllowRule(everything=True),) * 2
    assert config.allow_lines == ("everything=true", "everything=true")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"[tool.aiocop]\nthreshold_ms = 5\n# caf\xe9\n", "not UTF-8 text, as TOML must be (invalid continuation byte"),
        (b"tool = 3\n", "'tool' must be a table ([tool.aiocop] is read from it), got 3"),
        (b"[tool]\naiocop = 'fast'\n", "[tool.aiocop]: expected a table, got 'fast'"),
        (b"x = " + b"[" * 100_000 + b"]" * 100_000 + b"\n", "not valid TOML"),
        (b"[tool.aiocop\n", "not valid TOML"),
    ],
)
def test_a_broken_pyproject_is_one_message_naming_it(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "pyproject.toml"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert str(raised.value).startswith(str(path))
    assert message in str(raised.value)


@pytest.mark.parametrize("kind", ["fifo", "device", "directory", "huge"])
def test_a_configuration_that_is_not_a_small_regular_file_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    # A FIFO would block open() for ever, /dev/zero never ends: neither may hang a run.
    path = special_file(tmp_path / "pyproject.toml", kind, monkeypatch)
    expected = {
        "fifo": "it is a FIFO (named pipe), not a regular file",
        "device": "it is a character device, not a regular file",
        "directory": "it is a directory, not a regular file",
        "huge": "bytes, more than the 1024 aiocop reads",
    }[kind]
    monkeypatch.setattr(_config, "MAX_CONFIG_BYTES", 1024)
    with pytest.raises(ConfigError, match=re.escape(expected)):
        load_config(path)
    monkeypatch.setenv("AIOCOP_CONFIG", str(path))
    with pytest.raises(ConfigError, match=re.escape(expected)):
        load_config()


def special_file(path: Path, kind: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    if kind == "fifo":
        os.mkfifo(path)
        return path
    if kind == "device":
        return Path(os.devnull if not os.path.exists("/dev/zero") else "/dev/zero")
    if kind == "directory":
        path.mkdir()
        return path
    path.write_text("[tool.aiocop]\n" + "# padding\n" * 200_000)
    return path


def test_the_search_stops_at_the_projects_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_env: None) -> None:
    # A pyproject.toml above the project's root (a .git or .hg folder) is never read.
    pyproject(tmp_path, "threshold_ms = 'planted'")
    for marker in (".git", ".hg"):
        project = tmp_path / f"project{marker}"
        (project / marker).mkdir(parents=True)
        (project / "src" / "pkg").mkdir(parents=True)
        monkeypatch.chdir(project / "src" / "pkg")
        assert _config.find_pyproject() is None
        assert load_config() == ProjectConfig()
    # A git worktree's .git is a file: the root all the same.
    worktree = tmp_path / "worktree"
    worktree.mkdir()
    (worktree / ".git").write_text("gitdir: /elsewhere\n")
    monkeypatch.chdir(worktree)
    assert load_config() == ProjectConfig()
    # The nearest pyproject.toml is the project's, with or without the table: none above it is read.
    nested = tmp_path / "plain" / "sub"
    nested.mkdir(parents=True)
    (tmp_path / "plain" / "pyproject.toml").write_text("[project]\nname = 'plain'\n")
    monkeypatch.chdir(nested)
    assert load_config() == ProjectConfig(source=str(tmp_path / "plain" / "pyproject.toml"))


# One rule for every file aiocop reads, found or named, as git's `safe.directory`:
# yours or root's, writable by nobody else, no link of another user's on the
# way; else refused with an error naming the file and the override.


def _refusal(path: Path, reason: str) -> str:
    return (
        f"{path}: refused: {reason}: a file aiocop reads must be yours or root's and writable by nobody else "
        f"(set AIOCOP_TRUST={path} if you trust it)"
    )


# Files aiocop did not write are read as untrusted input (aiocop._common.inputs).
def test_a_file_of_another_user_is_refused_found_or_named_unless_trusted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_env: None
) -> None:
    path = pyproject(tmp_path, 'fail_on = "low"')
    owner = owned_by_someone_else(path, monkeypatch)
    reason = f"it belongs to another user ({owner}; you are uid {os.geteuid()})"
    monkeypatch.chdir(tmp_path)
    # Found as the project's own: refused, not ignored (its fail_on would be dropped unseen).
    with pytest.raises(ConfigError) as raised:
        load_config()
    assert str(raised.value).startswith(
        f"{path} (found as the project's configuration): refused: {reason}: a file aiocop reads"
    )
    assert f"(set AIOCOP_TRUST={path} if you trust it); if it is not your project's" in str(raised.value)
    # Named by the user (a path, AIOCOP_CONFIG): the same rule.
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert str(raised.value) == _refusal(path, reason)
    monkeypatch.setenv("AIOCOP_CONFIG", str(path))
    with pytest.raises(ConfigError, match=re.escape(_refusal(path, reason))):
        load_config()
    # Checked before anything else: another user's file is refused whatever it is (here: too large).
    monkeypatch.setattr(_config, "MAX_CONFIG_BYTES", 10)
    with pytest.raises(ConfigError, match="it belongs to another user"):
        load_config()
    monkeypatch.setattr(_config, "MAX_CONFIG_BYTES", 4 << 20)
    # The override: the file, a folder above it, or every file.
    for trusted in (str(path), str(tmp_path), f"/nowhere{os.pathsep}{tmp_path}", "*"):
        monkeypatch.setenv("AIOCOP_TRUST", trusted)
        assert load_config().fail_on == "low"
    monkeypatch.setenv("AIOCOP_TRUST", str(tmp_path / "other"))
    with pytest.raises(ConfigError, match="refused"):
        load_config()


def test_a_file_anyone_can_write_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_env: None) -> None:
    path = pyproject(tmp_path, 'fail_on = "low"')
    path.chmod(0o666)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=re.escape(f"{path} (found as the project's configuration): refused: anyone")):
        load_config()
    with pytest.raises(ConfigError, match=re.escape(_refusal(path, "anyone can write it"))):
        load_config(path)
    path.chmod(0o644)
    assert load_config().fail_on == "low"


@needs_root
def test_a_link_of_another_user_to_a_file_of_yours_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_env: None
) -> None:
    # A link planted in a shared parent, to a file of yours that says something else (allow everything).
    mine = tmp_path / "mine.toml"
    mine.write_text('[tool.aiocop]\nallow = ["everything=true"]\n')
    project = tmp_path / "shared" / "work"
    project.mkdir(parents=True)
    link = tmp_path / "shared" / "pyproject.toml"
    link.symlink_to(mine)
    os.lchown(link, OTHER_UID, -1)
    monkeypatch.chdir(project)
    with pytest.raises(ConfigError, match=re.escape("refused: it is a symbolic link that belongs to another user")):
        load_config()
    os.lchown(link, 0, -1)  # your own link to your own file: read
    assert load_config().allow


# --- baselines -----------------------------------------------------------------------------


def baseline_document(**changes: object) -> dict[str, object]:
    document: dict[str, object] = {
        "aiocop_baseline": 1,
        "call_sites": [{"event": "os.stat", "site": "prog.py:main", "count": 1}],
    }
    document.update(changes)
    return document


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            json.dumps(baseline_document(aiocop_baseline=True)),
            "'aiocop_baseline': expected 1 (the format this aiocop reads and writes), got True",
        ),
        (
            json.dumps(baseline_document(aiocop_baseline=1.0)),
            "'aiocop_baseline': expected 1 (the format this aiocop reads and writes), got 1.0",
        ),
        (
            json.dumps(baseline_document(aiocop_baseline=2)),
            "'aiocop_baseline': expected 1 (the format this aiocop reads and writes), got 2",
        ),
        (json.dumps(baseline_document(aiocop_baseline="1")), "'aiocop_baseline': expected 1"),
        (
            json.dumps({"call_sites": []}),
            "'aiocop_baseline': expected 1 (the format this aiocop reads and writes), got None",
        ),
        (
            json.dumps(baseline_document(call_sites={"a": 1})),
            "'call_sites': expected a list of call sites, got {'a': 1}",
        ),
        (
            json.dumps(baseline_document(call_sites=[{"event": "open"}])),
            "'call_sites'[0]: expected an object with a non-empty string 'event' and 'site', got {'event': 'open'}",
        ),
        (
            json.dumps(baseline_document(call_sites=[{"event": "", "site": "a.py:f"}])),
            "'call_sites'[0]: expected an object",
        ),
        (json.dumps([1, 2]), "expected a JSON object with 'aiocop_baseline' and 'call_sites', got [1, 2]"),
        ("[" * 100_000 + "]" * 100_000, "nested more than 8 levels deep: not an aiocop baseline"),
        ('{"a": ' * 50_000 + "1" + "}" * 50_000, "nested more than 8 levels deep"),
        ("{nope", "not valid JSON: Expecting property name enclosed in double quotes"),
        ('{"note": "[[[[[[[[[[[[", "aiocop_baseline": 1, "call_sites": []}', ""),  # brackets in strings are text
    ],
)
def test_a_bad_baseline_is_one_message_naming_it(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "baseline.json"
    path.write_text(content)
    if not message:
        assert _baseline.read(str(path)) == frozenset()
        return
    with pytest.raises(_baseline.BaselineError) as raised:
        _baseline.read(str(path))
    assert str(raised.value).startswith(f"baseline {str(path)!r}: ")
    assert message in str(raised.value)
    assert len(str(raised.value)) < 600


@pytest.mark.parametrize("kind", ["fifo", "device", "directory", "huge", "not-utf8"])
def test_a_baseline_that_is_not_a_small_regular_file_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    path = tmp_path / "baseline.json"
    if kind == "not-utf8":
        path.write_bytes(b'{"aiocop_baseline": 1, "call_sites": [], "note": "\xff"}')
    else:
        path = special_file(path, kind, monkeypatch)
    monkeypatch.setattr(_baseline, "MAX_BYTES", 1024)
    expected = {
        "fifo": "it is a FIFO (named pipe), not a regular file",
        "device": "it is a character device, not a regular file",
        "directory": "it is a directory, not a regular file",
        "huge": "bytes, more than the 1024 aiocop reads",
        "not-utf8": "not UTF-8 JSON (invalid start byte at byte 50)",
    }[kind]
    with pytest.raises(_baseline.BaselineError, match=re.escape(expected)):
        _baseline.read(str(path))


def test_the_baseline_limits_hold_the_files_aiocop_writes(tmp_path: Path) -> None:
    # 20 000 call sites with long paths: far more than any project records, still readable.
    counts = {("os.stat", f"src/{'deep/' * 20}module_{n}.py:handler_{n}"): n for n in range(20_000)}
    path = tmp_path / "baseline.json"
    _baseline.write(str(path), counts)
    assert path.stat().st_size < _baseline.MAX_BYTES
    assert _baseline.read(str(path)) == frozenset(counts)


# --- hostile files end to end: the CLI and pytest -----------------------------------------

# What another user can plant in a shared parent folder (/tmp/pyproject.toml).
HOSTILE = {
    "threshold-not-a-number": '[tool.aiocop]\nthreshold_ms = "x"\n',
    "tool-not-a-table": "tool = 3\n",
    "baseline-dev-zero": '[tool.aiocop]\nbaseline = "/dev/zero"\n',
    "baseline-fifo": '[tool.aiocop]\nbaseline = "fifo"\n',
    "empty-allow-rule": '[tool.aiocop]\nallow = [""]\n',
    "allow-everything": '[tool.aiocop]\nallow = ["everything=true"]\n',
}
HOSTILE_ERRORS = {
    "threshold-not-a-number": "[tool.aiocop] threshold_ms: expected a number (milliseconds), got 'x'",
    "tool-not-a-table": "'tool' must be a table",
    "baseline-dev-zero": "[tool.aiocop] baseline: baseline '/dev/zero': it is a character device, not a regular",
    "baseline-fifo": "[tool.aiocop] baseline: baseline '",
    "empty-allow-rule": "[tool.aiocop] allow: in rule '': the rule is empty",
}

BLOCKING_TEST = """
import asyncio, os

def test_blocks():
    async def main():
        os.stat(".")
    asyncio.run(main())
"""


def hostile_parent(tmp_path: Path, kind: str) -> tuple[Path, Path]:
    """A shared parent folder with a planted pyproject.toml, and a project under it with no marker of its own."""
    parent = tmp_path / "shared"
    project = parent / "work" / "project"
    project.mkdir(parents=True)
    (parent / "pyproject.toml").write_text(HOSTILE[kind])
    os.mkfifo(parent / "fifo")
    (project / "test_blocks.py").write_text(BLOCKING_TEST)
    (project / "prog.py").write_text(PROGRAM.format(extra="pass"))
    return parent / "pyproject.toml", project


def run_pytest(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIOCOP_", "PYTEST_"))}
    return subprocess.run(
        [sys.executable, "-m", "pytest", *QUIET, "-q", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


# pytest run in the test's own process: pytest-asyncio, which these runs do
# not use, would add its warning of an unset loop scope to the suite's.
IN_PROCESS = (*QUIET, "-p", "no:asyncio", "-q")


def in_project(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as `run_pytest` starts one: in `project`, with no AIOCOP_ or pytest variables of the suite's."""
    for name in list(os.environ):
        if name.startswith("AIOCOP_") or name in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(project)


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_plain_pytest_under_a_hostile_parent_runs_as_without_aiocop(
    tmp_path: Path, kind: str, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, project = hostile_parent(tmp_path, kind)
    if kind == "tool-not-a-table":
        # `tool = 3` breaks pytest itself (its own search reads the file, and
        # raises out of pytest.main): the same with or without aiocop.
        without_run, plain_run = run_pytest(project, "-p", "no:aiocop"), run_pytest(project)
        assert plain_run.returncode == without_run.returncode == 1, plain_run.stderr
        assert "aiocop" not in plain_run.stdout + plain_run.stderr
        assert plain_run.stderr == without_run.stderr
        return
    # pytest in this process (a process each cost 1 s of CPU on every Python):
    # switched off, the plugin reads nothing and starts nothing.
    in_project(project, monkeypatch)
    without = pytester.runpytest_inprocess(*IN_PROCESS, "-p", "no:aiocop")
    plain = pytester.runpytest_inprocess(*IN_PROCESS)
    assert not aiocop.is_monitoring_active()
    assert plain.ret == without.ret == pytest.ExitCode.OK, plain.stdout.str() + plain.stderr.str()
    outcome = re.compile(r" in [\d.]+s")
    assert outcome.sub("", plain.stdout.lines[-1]) == outcome.sub("", without.stdout.lines[-1]) == "1 passed"
    assert "aiocop" not in plain.stdout.str() + plain.stderr.str()
    assert plain.stderr.str() == without.stderr.str()


Refusals = Callable[[Path], tuple[tuple[int, str], pytest.RunResult]]


@pytest.fixture
def refused(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Refusals:
    """`python -m aiocop run prog.py`, then `pytest --aiocop`, from a project, both refused, in this process.

    Refused as they read their settings, before aiocop starts anything (each
    shows it started nothing): no process of their own, which cost 1 s of
    CPU each on every Python.
    """

    def refuse(project: Path) -> tuple[tuple[int, str], pytest.RunResult]:
        in_project(project, monkeypatch)
        cli = cli_refused_in_process(capsys, "run", "--fail-on", "low", "prog.py")
        result = pytester.runpytest_inprocess(*IN_PROCESS, "--aiocop")
        assert not aiocop.is_monitoring_active()
        assert not aiocop.get_patched_functions()
        return cli, result

    return refuse


@pytest.mark.parametrize("kind", sorted(HOSTILE_ERRORS))
def test_aiocop_under_a_broken_parent_of_ones_own_is_a_usage_error_naming_it(
    tmp_path: Path, kind: str, refused: Refusals
) -> None:
    planted, project = hostile_parent(tmp_path, kind)
    (status, stderr), result = refused(project)
    if kind != "tool-not-a-table":  # which pytest itself cannot start with (see above)
        assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
        result.stderr.fnmatch_lines([f"ERROR: {planted}*"])
        assert HOSTILE_ERRORS[kind] in result.stderr.str()
        assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
        assert "Traceback" not in result.stderr.str()
    assert status == 2, stderr
    assert str(planted) in stderr and HOSTILE_ERRORS[kind] in stderr
    assert "Traceback" not in stderr


@needs_root
@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_aiocop_under_a_parent_planted_by_another_user_refuses_it_naming_the_override(
    tmp_path: Path, kind: str, refused: Refusals
) -> None:
    # As git in a repository of another user's: an error naming the file and
    # the override, never a run with the file silently left out (or followed).
    planted, project = hostile_parent(tmp_path, kind)
    os.chown(planted, OTHER_UID, -1)
    refusal = (
        f"{planted} (found as the project's configuration): refused: it belongs to another user (uid {OTHER_UID}; "
        f"you are uid 0): a file aiocop reads must be yours or root's and writable by nobody else "
        f"(set AIOCOP_TRUST={planted} if you trust it)"
    )
    (status, stderr), result = refused(project)
    if kind != "tool-not-a-table":  # which pytest itself cannot start with (see above)
        assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
        assert f"ERROR: {refusal}" in result.stderr.str()
        assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
        assert "Traceback" not in result.stderr.str()
    assert status == 2, stderr
    assert stderr.count(refusal) == 1 and "Traceback" not in stderr


@needs_root
def test_the_projects_own_file_of_another_user_fails_the_run_instead_of_dropping_its_fail_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 38: a checkout owned by another uid (a CI volume) whose fail_on was
    # ignored with a warning: `run` exited 0 instead of 3. Now refused; trusted, it fails the run.
    project = tmp_path / "project"
    (project / ".git").mkdir(parents=True)
    (project / "prog.py").write_text(PROGRAM.format(extra="pass"))
    config = pyproject(project, 'fail_on = "low"')
    os.chown(config, OTHER_UID, -1)
    refused = aiocop_run("run", "prog.py", cwd=project)
    assert refused.returncode == 2, refused.stderr
    assert f"{config} (found as the project's configuration): refused: it belongs to another user" in refused.stderr
    monkeypatch.setenv("AIOCOP_TRUST", str(project))  # the subprocess inherits it
    trusted = aiocop_run("run", "prog.py", cwd=project)
    assert trusted.returncode == 3, trusted.stderr


@needs_root
def test_a_baseline_of_another_user_or_anyone_can_write_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(baseline_document()))
    os.chown(path, OTHER_UID, -1)
    with pytest.raises(
        _baseline.BaselineError, match=re.escape(f"refused: it belongs to another user (uid {OTHER_UID}")
    ):
        _baseline.read(str(path))
    os.chown(path, 0, -1)
    path.chmod(0o666)
    with pytest.raises(_baseline.BaselineError) as raised:
        _baseline.read(str(path))
    assert str(raised.value) == (
        f"baseline {str(path)!r}: refused: anyone can write it: a file aiocop reads must be yours or root's and "
        f"writable by nobody else (set AIOCOP_TRUST={path} if you trust it)"
    )
    path.chmod(0o644)
    assert _baseline.read(str(path))


def test_pytest_refuses_blank_allow_rules_in_its_ini(pytester: pytest.Pytester) -> None:
    pytester.makepyprojecttoml(
        """
        [tool.pytest.ini_options]
        aiocop_allow = ["open", "# TODO: decide"]
        """
    )
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = pytester.runpytest_subprocess("--aiocop", *QUIET)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: aiocop_allow (ini): in rule '# TODO: decide': the rule is only a comment*"])


def test_a_path_is_printed_with_its_control_characters_escaped(tmp_path: Path) -> None:
    # A folder name can carry a terminal's escape sequences: a message never prints them raw.
    folder = tmp_path / "evil\x1b[2J\x07"
    folder.mkdir()
    path = pyproject(folder, 'fail_on = "x\\u001b[31m"')  # a TOML escape: the value holds ESC
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    message = str(raised.value)
    assert "\x1b" not in message and "\x07" not in message
    assert "evil\\x1b[2J\\x07" in message and "'x\\x1b[31m'" in message


def test_every_test_the_security_page_names_exists() -> None:
    # The page says which test holds each line: a renamed or deleted test must not leave it lying.
    page = (Path(ROOT) / "docs" / "concepts" / "security.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", page))
    assert len(named) > 20
    missing = [
        f"{file}::{name}" for file, name in sorted(named) if f"def {name}(" not in (Path(ROOT) / file).read_text()
    ]
    assert missing == []


def test_a_file_name_with_a_nul_is_refused_not_a_traceback(tmp_path: Path) -> None:
    path = pyproject(tmp_path, 'baseline = "base\\u0000line.json"')  # TOML lets a string hold NUL
    baseline = load_config(path).baseline
    assert baseline is not None
    with pytest.raises(_baseline.BaselineError, match="a file name cannot hold a NUL character"):
        _baseline.read(baseline)
    with pytest.raises(ConfigError, match="a file name cannot hold a NUL character"):
        load_config(str(tmp_path / "py\0project.toml"))
