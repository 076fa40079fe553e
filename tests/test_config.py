"""`[tool.aiocop]`: one configuration for the API, the CLI, the pytest plugin and the middleware; baselines."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import aiocop
from aiocop import _api, _frames
from aiocop._config import ConfigError, load_config
from aiocop.asgi import AiocopMiddleware
from tests import blocking_calls
from tests.conftest import ROOT, Collector, reset_aiocop, run_on
from tests.test_cli import aiocop_run

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
        ("threshold_ms = 0", "threshold_ms: expected a number > 0 (milliseconds), got 0"),
        ("trace_depth = 0", "trace_depth: expected a whole number of frames >= 1, got 0"),
        ("fail_on = 'hihg'", "fail_on: expected one of low, medium, high, got 'hihg' (did you mean 'high'?)"),
        ("sample_rate = 1.5", "sample_rate: expected a number > 0 and <= 1 (a fraction), got 1.5"),
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
        allow = ["os.stat module=tests.blocking_calls"]
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
    assert call["entry_point"].startswith("tests/blocking_calls.py:")
    assert call["app_site"].endswith(":main"), "the vendored frame is where it blocked, not the app's line"


# --- the CLI ----------------------------------------------------------------------------

EXAMPLE = Path(ROOT) / "examples" / "configuration"


def test_the_cli_shows_one_row_per_cause_at_the_applications_lines(tmp_path: Path) -> None:
    # The small app: a package imported inside a task, datetime.strptime,
    # a Unix server, a third-party client that blocks. Two rows, at its lines.
    report = tmp_path / "report.json"
    result = aiocop_run("run", "--json", report, "app.py", cwd=EXAMPLE)
    assert result.returncode == 0, result.stderr
    rows = json.loads(report.read_text())["call_sites"]
    source = (EXAMPLE / "app.py").read_text().splitlines()
    import_line = next(i for i, line in enumerate(source, 1) if "import structlog" in line)
    client_line = next(i for i, line in enumerate(source, 1) if "httpx.get(url)" in line)
    sites = {row["call_site"]: row["events"] for row in rows}
    assert set(sites) == {f"app.py:{import_line}:handle_upload", f"app.py:{client_line}:fetch_status"}, rows
    assert set(sites[f"app.py:{import_line}:handle_upload"]) == {"import"}
    assert {"socket.connect", "socket.socket.send"} <= set(sites[f"app.py:{client_line}:fetch_status"])
    assert "2 call site(s)" in result.stderr


PROGRAM = """
import asyncio, os

async def main():
    os.stat(".")
    {extra}

asyncio.run(main())
"""


def test_the_cli_takes_the_table_and_its_flags_win(tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text(PROGRAM.format(extra="os.listdir('.')"))
    pyproject(tmp_path, 'fail_on = "low"\nallow = ["os.listdir"]\n')
    result = aiocop_run("run", "prog.py", cwd=tmp_path)
    assert result.returncode == 3, result.stderr
    assert "fail_on = 'low' in [tool.aiocop]" in result.stderr
    assert "os.listdir" not in result.stderr.partition("call site")[2]
    result = aiocop_run("run", "--fail-on", "high", "--allow", "os.stat", "prog.py", cwd=tmp_path)
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
    written = aiocop_run("run", "--fail-on", "low", "--write-baseline", baseline, "prog.py", cwd=tmp_path)
    assert written.returncode == 0, written.stderr
    assert "wrote 1 call site(s) to the baseline" in written.stderr
    assert json.loads(baseline.read_text())["call_sites"] == [{"event": "os.stat", "site": "prog.py:main", "count": 1}]

    # Lines moved by an edit above the call: still known.
    (tmp_path / "prog.py").write_text("# a new comment\n" + PROGRAM.format(extra="pass"))
    known = aiocop_run("run", "--fail-on", "low", "--baseline", baseline, "prog.py", cwd=tmp_path)
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
    assert config.baseline == str(EXAMPLE / "aiocop-baseline.json")
