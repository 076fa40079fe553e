"""The pytest plugin's settings: command-line options, ini keys and markers, read and checked once.

Every option exists as a flag and as an ini key; the flag wins. Bad values,
unknown event names and malformed markers are usage errors that name the
option, ini key or test they come from.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import pytest

from aiocop._validate import did_you_mean

if TYPE_CHECKING:
    from pathlib import Path

    from aiocop._allow import AllowRule

LEVELS = ("low", "medium", "high")
DEFAULT_TRACE_DEPTH = 20
ALLOW_KEYS = ("module", "path", "call_site")

# pytest 8.4 added typed numeric ini keys (and, from 9.0, native TOML configs
# need them to accept `aiocop_threshold_ms = 50`); older versions read strings.
_NUMERIC_INI = tuple(int(part) for part in pytest.__version__.split(".")[:2] if part.isdigit()) >= (8, 4)
_FLOAT_INI: Literal["float", "string"] = "float" if _NUMERIC_INI else "string"
_INT_INI: Literal["int", "string"] = "int" if _NUMERIC_INI else "string"

MARKERS = (
    "aiocop_allow(*events, module=None, path=None, call_site=None): aiocop does not fail this test for "
    "blocking calls matching the rule (no argument: any blocking call or stall); fields as in aiocop.AllowRule.",
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

    def header(self) -> str:
        threshold = "off" if self.threshold_ms is None else f"{self.threshold_ms:g}"
        allow = "; ".join(self.allow_lines) if self.allow_lines else "none"
        return (
            f"aiocop: fail_on={self.fail_on}, threshold_ms={threshold}, trace_depth={self.trace_depth}, "
            f"check_fixtures={_yes_no(self.check_fixtures)}, check_sync={_yes_no(self.check_sync)}, "
            f"allow={allow}"
        )


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
    parser.addini("aiocop", type="bool", default=False, help="switch the aiocop plugin on (see --aiocop)")
    parser.addini("aiocop_fail_on", type="string", default="low", help="see --aiocop-fail-on")
    parser.addini("aiocop_threshold_ms", type=_FLOAT_INI, default=0, help="see --aiocop-threshold-ms")
    parser.addini(
        "aiocop_trace_depth",
        type=_INT_INI,
        default=DEFAULT_TRACE_DEPTH,
        help="see --aiocop-trace-depth",
    )
    parser.addini("aiocop_check_fixtures", type="bool", default=False, help="see --aiocop-check-fixtures")
    parser.addini("aiocop_check_sync", type="bool", default=True, help="see --aiocop-check-sync")
    parser.addini(
        "aiocop_allow",
        type="linelist",
        default=[],
        help="blocking calls allowed for the whole run, one rule per line: event names and/or "
        "module=NAME, path=PREFIX, call_site=FILE.py:FUNCTION",
    )


def read(config: pytest.Config) -> Settings:
    """The settings in effect; raises `pytest.UsageError` for bad values."""
    enabled = _pick(config, "aiocop", "aiocop")
    fail_on = str(_pick(config, "aiocop_fail_on", "aiocop_fail_on")).strip()
    if fail_on not in LEVELS:
        raise pytest.UsageError(
            f"{_source(config, 'aiocop_fail_on', '--aiocop-fail-on')}: expected one of low, medium, high, "
            f"got {fail_on!r}"
        )
    threshold = _number(config, "aiocop_threshold_ms", "--aiocop-threshold-ms", float, "a number of milliseconds")
    if not threshold >= 0:  # also rejects NaN
        raise pytest.UsageError(
            f"{_source(config, 'aiocop_threshold_ms', '--aiocop-threshold-ms')}: expected a number of "
            f"milliseconds >= 0 (0: off), got {threshold!r}"
        )
    depth = _number(config, "aiocop_trace_depth", "--aiocop-trace-depth", int, "a whole number of frames")
    if depth < 1:
        raise pytest.UsageError(
            f"{_source(config, 'aiocop_trace_depth', '--aiocop-trace-depth')}: expected a number of frames >= 1, "
            f"got {depth!r}"
        )
    rules: list[AllowRule] = []
    lines: list[str] = []
    sources = [("aiocop_allow (ini)", line) for line in config.getini("aiocop_allow")]
    sources += [("--aiocop-allow", line) for line in config.getoption("aiocop_allow")]
    for source, line in sources:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            rules.append(parse_allow_line(line, config.rootpath))
        except ValueError as exc:
            raise pytest.UsageError(f"{source}: in rule {line.strip()!r}: {exc}") from None
        lines.append(line.strip())
    return Settings(
        enabled=bool(enabled),
        fail_on=fail_on,
        threshold_ms=float(threshold) or None,
        trace_depth=int(depth),
        check_fixtures=bool(_pick(config, "aiocop_check_fixtures", "aiocop_check_fixtures")),
        check_sync=bool(_pick(config, "aiocop_check_sync", "aiocop_check_sync")),
        allow=tuple(rules),
        allow_lines=tuple(lines),
    )


def _pick(config: pytest.Config, dest: str, ini: str) -> Any:
    value = config.getoption(dest)
    if value is not None:
        return value
    try:
        return config.getini(ini)
    except (ValueError, pytest.UsageError) as exc:  # a typed key pytest could not convert: say which
        raise pytest.UsageError(f"{ini} (ini): {exc}") from None


def _source(config: pytest.Config, dest: str, flag: str) -> str:
    return flag if config.getoption(dest) is not None else f"{dest} (ini)"


def _number(config: pytest.Config, dest: str, flag: str, kind: type[float] | type[int], what: str) -> float:
    value = _pick(config, dest, dest)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return kind(value)
    try:
        return kind(str(value).strip())
    except ValueError:
        raise pytest.UsageError(f"{_source(config, dest, flag)}: expected {what}, got {value!r}") from None


def parse_allow_line(line: str, rootpath: Path) -> AllowRule:
    """An allow rule written as one line: event names and `key=value` fields.

    `open os.stat module=myapp.config` allows `open` and `os.stat` calls made
    under `myapp.config`; `path=vendor/` allows any call from files under
    `<rootdir>/vendor/`. Values may be quoted (`path="my dir/"`).
    """
    try:
        tokens = shlex.split(line, comments=True)
    except ValueError as exc:  # unbalanced quotes
        raise ValueError(str(exc)) from None
    events: list[str] = []
    fields: dict[str, str] = {}
    for token in tokens:
        key, sep, value = token.partition("=")
        if not sep:
            events.append(token)
        elif key not in ALLOW_KEYS:
            raise ValueError(
                f"unknown field {key!r}{did_you_mean(key, ALLOW_KEYS)}: expected event names and module=, path= "
                "or call_site="
            )
        elif key in fields:
            raise ValueError(f"{key}= given twice")
        else:
            fields[key] = value
    return make_rule(events, fields, rootpath)


def make_rule(events: list[Any] | tuple[Any, ...], fields: dict[str, Any], rootpath: Path) -> AllowRule:
    """An `AllowRule`, with a relative `path` taken from the rootdir (raises ValueError)."""
    unknown = sorted(set(fields) - set(ALLOW_KEYS))
    if unknown:
        raise ValueError(
            f"unknown keyword {unknown[0]!r}{did_you_mean(unknown[0], ALLOW_KEYS)}: expected module=, path= "
            "or call_site="
        )
    path = fields.get("path")
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if isinstance(path, str) and path and not os.path.isabs(path):
        # Allow rules match absolute file names; ini files and tests name paths
        # from the project root. Keep a trailing separator: it means "under".
        trailing = os.sep if path.endswith(("/", os.sep)) else ""
        path = os.path.normpath(os.path.join(str(rootpath), path)) + trailing
    # Imported here: with no rule to make (the plugin switched off), the plugin loads no part of the detector.
    from aiocop._allow import AllowRule  # noqa: PLC0415

    try:
        return AllowRule(tuple(events), fields.get("module"), path, fields.get("call_site"))  # type: ignore[arg-type]
    except TypeError as exc:
        raise ValueError(str(exc)) from None


def marker_rules(item: pytest.Item) -> tuple[AllowRule, ...]:
    """The allow rules of an item's `aiocop_allow` markers (its own, its class's, its module's)."""
    rules = []
    for mark in item.iter_markers("aiocop_allow"):
        try:
            rules.append(make_rule(mark.args, dict(mark.kwargs), item.config.rootpath))
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
