"""The pytest plugin's settings: command-line options, ini keys and markers, read and checked once.

Every option exists as a flag and as an ini key; the flag wins. Bad values,
unknown event names and malformed markers are usage errors that name the
option, ini key or test they come from.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import pytest

from aiocop._configuration.baseline import BaselineError
from aiocop._configuration.baseline import read as read_baseline
from aiocop._configuration.config import (
    ALLOW_KEYS,
    MAX_HANG_AFTER_MS,
    MAX_THRESHOLD_MS,
    ConfigError,
    ProjectConfig,
    make_rule,
    parse_allow_line,
    read_config,
)
from aiocop._model.severity import LEVELS
from aiocop._pytest_support import timeouts as _timeouts

if TYPE_CHECKING:
    from aiocop._interception.allow import AllowRule

DEFAULT_TRACE_DEPTH = 20
# What an ini key left unset means when [tool.aiocop] does not say either.
DEFAULTS: dict[str, Any] = {
    "aiocop_fail_on": "low",
    "aiocop_threshold_ms": 0,
    "aiocop_trace_depth": DEFAULT_TRACE_DEPTH,
    "aiocop_hang_after_ms": 5000,
}
__all__ = [
    "ALLOW_KEYS",
    "DEFAULTS",
    "Settings",
    "add_options",
    "enabled",
    "make_rule",
    "parse_allow_line",
    "read",
]

# pytest 8.4 added typed numeric ini keys (and, from 9.0, native TOML configs
# need them to accept `aiocop_threshold_ms = 50`); older versions read strings.
_NUMERIC_INI = tuple(int(part) for part in pytest.__version__.split(".")[:2] if part.isdigit()) >= (8, 4)
_FLOAT_INI: Literal["float", "string"] = "float" if _NUMERIC_INI else "string"
_INT_INI: Literal["int", "string"] = "int" if _NUMERIC_INI else "string"

MARKERS = (
    "aiocop_allow(*events, module=None, path=None, call_site=None, everything=False): aiocop does not fail this "
    "test for blocking calls matching the rule (no argument, or everything=True: any blocking call or stall); "
    "fields as in aiocop.AllowRule.",
    "aiocop_check(fixtures=None): aiocop checks this test's body even if it is synchronous; "
    "fixtures=True also checks the set-up and teardown of its fixtures.",
)


@dataclass(frozen=True)
class Settings:
    """What the plugin does in this session."""

    enabled: bool
    fail_on: str
    threshold_ms: float | None  # None: no stall watchdog
    trace_depth: int
    check_fixtures: bool
    check_sync: bool
    allow: tuple[AllowRule, ...]
    allow_lines: tuple[str, ...]  # as written, for the report header
    app_paths: tuple[str, ...] = ()
    library_paths: tuple[str, ...] = ()
    baseline_file: str | None = None  # compared with (None: no baseline)
    baseline: frozenset[tuple[str, str]] | None = None  # the call sites it records
    write_baseline: str | None = None  # record the session's call sites here instead of failing tests
    html: str | None = None  # write the session's HTML report here
    config_source: str | None = None  # the pyproject.toml whose [tool.aiocop] was read
    hang_after_ms: float | None = 5000.0  # with the watchdog (threshold_ms): hangs reported as they hang; None: off
    hang_after_explicit: bool = False  # the user set hang_after_ms (flag, ini key or [tool.aiocop]): never lowered
    timeout_plugin: bool = False  # pytest-timeout is loaded: the hangs of the tests it times are reported before it

    def header(self) -> str:
        threshold = "off" if self.threshold_ms is None else f"{self.threshold_ms:g}"
        if self.threshold_ms is not None:  # hangs are the watchdog's: said only where it runs
            threshold += f", hang_after_ms={'off' if self.hang_after_ms is None else f'{self.hang_after_ms:g}'}"
        if self.timeout_plugin:
            threshold += f", {_timeouts.header(self.hang_after_ms, self.hang_after_explicit)}"
        allow = "; ".join(self.allow_lines) if self.allow_lines else "none"
        line = (
            f"aiocop: fail_on={self.fail_on}, threshold_ms={threshold}, trace_depth={self.trace_depth}, "
            f"check_fixtures={_yes_no(self.check_fixtures)}, check_sync={_yes_no(self.check_sync)}, "
            f"allow={allow}"
        )
        if self.baseline_file is not None:
            line += f", baseline={self.baseline_file} ({len(self.baseline or ())} call sites)"
        if self.write_baseline is not None:
            line += f", writing the baseline {self.write_baseline} (no test fails for blocking)"
        if self.config_source is not None:
            line += f", [tool.aiocop] from {self.config_source}"
        return line


def _yes_no(value: bool) -> str:
    return "true" if value else "false"


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("aiocop", "aiocop: fail async tests that block the event loop")
    group.addoption(
        "--aiocop",
        action="store_true",
        dest="aiocop",
        default=None,
        help="fail async tests that make blocking calls on the event loop (ini: aiocop)",
    )
    group.addoption(
        "--no-aiocop", action="store_false", dest="aiocop", help="switch the aiocop plugin off, whatever the ini says"
    )
    group.addoption(
        "--aiocop-fail-on",
        dest="aiocop_fail_on",
        metavar="SEVERITY",
        help="lowest step severity that fails a test: low (any blocking call, default), medium or high "
        "(ini: aiocop_fail_on)",
    )
    group.addoption(
        "--aiocop-threshold-ms",
        dest="aiocop_threshold_ms",
        metavar="MS",
        help="also fail a test whose loop was stuck in one step this long, whatever the cause "
        "(CPU-bound code, C extensions); default 0: off (ini: aiocop_threshold_ms)",
    )
    group.addoption(
        "--aiocop-hang-after-ms",
        dest="aiocop_hang_after_ms",
        metavar="MS",
        help="with --aiocop-threshold-ms: a test's loop still stuck in one step this long is reported into the "
        "test's output while it hangs (default 5000; 0: off; ini: aiocop_hang_after_ms); for a test "
        "pytest-timeout times, unless set: half its timeout if less",
    )
    group.addoption(
        "--aiocop-trace-depth",
        dest="aiocop_trace_depth",
        metavar="N",
        help=f"frames kept per blocking call (default {DEFAULT_TRACE_DEPTH}; ini: aiocop_trace_depth)",
    )
    group.addoption(
        "--aiocop-check-fixtures",
        action="store_true",
        dest="aiocop_check_fixtures",
        default=None,
        help="also fail a test when the set-up or teardown of its fixtures blocks (ini: aiocop_check_fixtures)",
    )
    group.addoption(
        "--aiocop-check-sync",
        action="store_true",
        dest="aiocop_check_sync",
        default=None,
        help="check synchronous tests too: the loops they run, in any thread (asyncio.run(), a TestClient's "
        "portal), as an async test's (the default; ini: aiocop_check_sync)",
    )
    group.addoption(
        "--no-aiocop-check-sync",
        action="store_false",
        dest="aiocop_check_sync",
        help="check async tests only: synchronous tests are checked only with @pytest.mark.aiocop_check",
    )
    group.addoption(
        "--aiocop-allow",
        action="append",
        dest="aiocop_allow",
        default=[],
        metavar="RULE",
        help="allow blocking calls for the whole run, e.g. 'open module=myapp.config' "
        "(repeatable, added to the ini key aiocop_allow)",
    )
    group.addoption(
        "--aiocop-baseline",
        dest="aiocop_baseline",
        metavar="FILE",
        help="call sites recorded in this baseline file are reported but fail no test (ini: aiocop_baseline; "
        "[tool.aiocop] baseline)",
    )
    group.addoption(
        "--aiocop-write-baseline",
        dest="aiocop_write_baseline",
        metavar="FILE",
        help="record the call sites that would fail tests in FILE, as the baseline later runs compare with; "
        "no test fails for blocking in this run",
    )
    group.addoption(
        "--aiocop-html",
        dest="aiocop_html",
        metavar="FILE",
        help="write one self-contained HTML report of the session: the call sites with their traces, a timeline "
        "of the steps that held a loop, flame graphs of their stacks weighed in loop time",
    )
    # Unset ini keys read as None: then [tool.aiocop] in pyproject.toml, then the default.
    parser.addini("aiocop", type="bool", default=False, help="switch the aiocop plugin on (see --aiocop)")
    parser.addini("aiocop_fail_on", type="string", default=None, help="see --aiocop-fail-on")
    parser.addini("aiocop_threshold_ms", type=_FLOAT_INI, default=None, help="see --aiocop-threshold-ms")
    parser.addini("aiocop_hang_after_ms", type=_FLOAT_INI, default=None, help="see --aiocop-hang-after-ms")
    parser.addini("aiocop_trace_depth", type=_INT_INI, default=None, help="see --aiocop-trace-depth")
    parser.addini("aiocop_baseline", type="string", default=None, help="see --aiocop-baseline")
    parser.addini("aiocop_check_fixtures", type="bool", default=False, help="see --aiocop-check-fixtures")
    parser.addini("aiocop_check_sync", type="bool", default=True, help="see --aiocop-check-sync")
    parser.addini(
        "aiocop_allow",
        type="linelist",
        default=[],
        help="blocking calls allowed for the whole run, one rule per line: event names and/or "
        "module=NAME, path=PREFIX, call_site=FILE.py:FUNCTION",
    )


def enabled(config: pytest.Config) -> bool:
    """Whether the plugin is on: `--aiocop` / `--no-aiocop`, else the ini key `aiocop`.

    Nothing else of aiocop's is read before this says yes: a pytest run
    that did not ask for aiocop cannot be changed, or broken, by it.
    """
    return bool(_pick(config, "aiocop", "aiocop"))


def read(config: pytest.Config) -> Settings:
    """The settings in effect; raises `pytest.UsageError` for bad values.

    Each comes from its flag, else its ini key, else `[tool.aiocop]` in the
    project's pyproject.toml, else its default.
    """
    project = _project(config)
    on = enabled(config)
    fail_on = str(
        _pick(config, "aiocop_fail_on", "aiocop_fail_on", project.fail_on or DEFAULTS["aiocop_fail_on"])
    ).strip()
    if fail_on not in LEVELS:
        raise pytest.UsageError(
            f"{_source(config, 'aiocop_fail_on', '--aiocop-fail-on')}: expected one of {', '.join(LEVELS)}, "
            f"got {fail_on!r}"
        )
    threshold = _number(
        config,
        "aiocop_threshold_ms",
        "--aiocop-threshold-ms",
        float,
        "a number of milliseconds",
        project.threshold_ms or DEFAULTS["aiocop_threshold_ms"],
    )
    if not 0 <= threshold <= MAX_THRESHOLD_MS:  # also rejects NaN and infinity
        raise pytest.UsageError(
            f"{_source(config, 'aiocop_threshold_ms', '--aiocop-threshold-ms')}: expected a number of "
            f"milliseconds >= 0 (0: off) and at most {MAX_THRESHOLD_MS:.15g} (an hour), got {threshold!r}"
        )
    default_hang = project.hang_after_ms if project.hang_after_ms is not None else DEFAULTS["aiocop_hang_after_ms"]
    hang_after = _number(
        config, "aiocop_hang_after_ms", "--aiocop-hang-after-ms", float, "a number of milliseconds", default_hang
    )
    if not 0 <= hang_after <= MAX_HANG_AFTER_MS:  # also rejects NaN and infinity
        raise pytest.UsageError(
            f"{_source(config, 'aiocop_hang_after_ms', '--aiocop-hang-after-ms')}: expected a number of "
            f"milliseconds >= 0 (0: off) and at most {MAX_HANG_AFTER_MS:.15g} (a day), got {hang_after!r}"
        )
    depth = _number(
        config,
        "aiocop_trace_depth",
        "--aiocop-trace-depth",
        int,
        "a whole number of frames",
        project.trace_depth or DEFAULTS["aiocop_trace_depth"],
    )
    if depth < 1:
        raise pytest.UsageError(
            f"{_source(config, 'aiocop_trace_depth', '--aiocop-trace-depth')}: expected a number of frames >= 1, "
            f"got {depth!r}"
        )
    rules: list[AllowRule] = list(project.allow)
    lines: list[str] = list(project.allow_lines)
    sources = [("aiocop_allow (ini)", line) for line in config.getini("aiocop_allow")]
    sources += [("--aiocop-allow", line) for line in config.getoption("aiocop_allow")]
    for source, line in sources:
        try:
            rules.append(parse_allow_line(line, config.rootpath))
        except ValueError as exc:
            raise pytest.UsageError(f"{source}: in rule {line.strip()!r}: {exc}") from None
        lines.append(line.strip())
    return Settings(
        enabled=on,
        fail_on=fail_on,
        threshold_ms=float(threshold) or None,
        hang_after_ms=float(hang_after) or None,
        hang_after_explicit=project.hang_after_ms is not None or _given(config, "aiocop_hang_after_ms"),
        timeout_plugin=config.pluginmanager.hasplugin("timeout"),
        trace_depth=int(depth),
        check_fixtures=bool(_pick(config, "aiocop_check_fixtures", "aiocop_check_fixtures")),
        check_sync=bool(_pick(config, "aiocop_check_sync", "aiocop_check_sync")),
        allow=tuple(rules),
        allow_lines=tuple(lines),
        app_paths=project.app_paths,
        library_paths=project.library_paths,
        config_source=project.source if project != ProjectConfig(source=project.source) else None,
        html=_html_path(config),
        **_baselines(config, project),
    )


def _html_path(config: pytest.Config) -> str | None:
    from aiocop._reporting.report_files import output_problem  # noqa: PLC0415 - loaded only by a session that is on

    path: str | None = config.getoption("aiocop_html")
    if path is None:
        return None
    problem = output_problem("--aiocop-html", path)
    if problem is not None:
        raise pytest.UsageError(problem)
    return os.path.abspath(path)  # the tests may change the working directory


def _project(config: pytest.Config) -> ProjectConfig:
    # The file AIOCOP_CONFIG names, else the project's pyproject.toml, from the rootdir up.
    try:
        return read_config(None, start=config.rootpath)
    except ConfigError as exc:
        raise pytest.UsageError(str(exc)) from None


def _baselines(config: pytest.Config, project: ProjectConfig) -> dict[str, Any]:
    write = config.getoption("aiocop_write_baseline")
    if write is not None:
        if not write.strip() or os.path.isdir(write):
            what = "a directory" if write.strip() else "empty"
            raise pytest.UsageError(f"--aiocop-write-baseline: expected a file name, got {write!r} ({what})")
        return {"write_baseline": os.path.abspath(write)}
    flag = config.getoption("aiocop_baseline")
    if flag is not None and not flag.strip():
        raise pytest.UsageError(f"--aiocop-baseline: expected a file name, got {flag!r}")
    named = flag or config.getini("aiocop_baseline")
    # A relative file is the rootdir's (os.path.join keeps an absolute one as it is).
    file = os.path.join(str(config.rootpath), named) if named else project.baseline
    if not file:
        return {}
    try:
        return {"baseline_file": file, "baseline": read_baseline(file)}
    except BaselineError as exc:
        origin = "" if named else f"{project.source} [tool.aiocop] baseline: "
        raise pytest.UsageError(f"{origin}{exc}") from None


def _pick(config: pytest.Config, dest: str, ini: str, default: Any = None) -> Any:
    value = config.getoption(dest)
    if value is not None:
        return value
    try:
        value = config.getini(ini)
    except (ValueError, pytest.UsageError) as exc:  # a typed key pytest could not convert: say which
        raise pytest.UsageError(f"{ini} (ini): {exc}") from None
    # Unset: None (older pytest versions give an empty value instead).
    return default if value is None or value in ([], "") else value


def _given(config: pytest.Config, dest: str) -> bool:
    """Whether the flag or the ini key `dest` was set (not left to [tool.aiocop] or the default)."""
    return _pick(config, dest, dest) is not None


def _source(config: pytest.Config, dest: str, flag: str) -> str:
    return flag if config.getoption(dest) is not None else f"{dest} (ini)"


def _number(
    config: pytest.Config, dest: str, flag: str, kind: type[float] | type[int], what: str, default: float
) -> float:
    value = _pick(config, dest, dest, default)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return kind(value)
    try:
        return kind(str(value).strip())
    except ValueError:
        raise pytest.UsageError(f"{_source(config, dest, flag)}: expected {what}, got {value!r}") from None


def marker_rules(item: pytest.Item) -> tuple[AllowRule, ...]:
    """The allow rules of an item's `aiocop_allow` markers (its own, its class's, its module's)."""
    rules = []
    for mark in item.iter_markers("aiocop_allow"):
        # A bare marker is written on one test on purpose: it allows everything there.
        fields = dict(mark.kwargs) if mark.args or mark.kwargs else {"everything": True}
        try:
            rules.append(make_rule(mark.args, fields, item.config.rootpath))
        except ValueError as exc:
            raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.aiocop_allow: {exc}") from None
    return tuple(rules)


def marker_check(item: pytest.Item) -> tuple[bool, bool | None]:
    """Whether an `aiocop_check` marker asks for the body to be checked, and its `fixtures=` (None: unset)."""
    mark = item.get_closest_marker("aiocop_check")
    if mark is None:
        return False, None
    unknown = sorted(set(mark.kwargs) - {"fixtures"})
    if mark.args or unknown:
        raise pytest.UsageError(
            f"{item.nodeid}: @pytest.mark.aiocop_check takes only the keyword fixtures=True/False, "
            f"got {', '.join([*map(repr, mark.args), *(f'{k}=' for k in unknown)])}"
        )
    fixtures = mark.kwargs.get("fixtures")
    if fixtures is not None and not isinstance(fixtures, bool):
        raise pytest.UsageError(
            f"{item.nodeid}: @pytest.mark.aiocop_check(fixtures=...) must be True or False, not {fixtures!r}"
        )
    return True, fixtures
