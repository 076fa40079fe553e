"""Renders the "Options" docs page from the code: signatures, docstrings, the pytest and CLI parsers.

Part of the docs build, not of aiocop: `docs/hooks/generated_pages.py` renders the page at
every build and `python docs/hooks/generated_pages.py` rewrites the committed copy, which a
test checks is up to date, so the page is never edited by hand.
Imports pytest and structlog (both in the `dev` extra).
"""

from __future__ import annotations

import argparse
import inspect
import logging
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiocop
import aiocop.asgi
import aiocop.structlog
from aiocop import pytest_plugin
from aiocop._commands import cli as _cli
from aiocop._commands import exits as _exits
from aiocop._configuration import config as _config
from aiocop._pytest_support import settings as _pytest_settings

if TYPE_CHECKING:
    from collections.abc import Callable

# The configuring callables of the Python API, in the order a user meets them:
# (what the page calls it, the object, its anchor on the API reference page).
API: tuple[tuple[str, Callable[..., Any], str], ...] = (
    ("aiocop.configure", aiocop.configure, "api.md"),
    ("aiocop.load_config", aiocop.load_config, "api.md"),
    ("aiocop.start_blocking_io_detection", aiocop.start_blocking_io_detection, "api.md"),
    ("aiocop.detect_slow_tasks", aiocop.detect_slow_tasks, "api.md"),
    ("aiocop.start_cpu_sampling", aiocop.start_cpu_sampling, "api.md"),
    ("aiocop.patch_audit_functions", aiocop.patch_audit_functions, "api.md"),
    ("aiocop.enable_raise_on_violations", aiocop.enable_raise_on_violations, "api.md"),
    ("aiocop.monitored", aiocop.monitored, "api.md"),
    ("aiocop.AllowRule", aiocop.AllowRule, "api.md"),
    ("aiocop.add_allow_rule", aiocop.add_allow_rule, "api.md"),
    ("aiocop.allow_blocking", aiocop.allow_blocking, "api.md"),
    ("aiocop.register_blocking_event", aiocop.register_blocking_event, "api.md"),
    ("aiocop.log_events", aiocop.log_events, "api.md"),
    ("aiocop.structlog.log_events", aiocop.structlog.log_events, "api-integrations.md"),
)
ASGI = ("aiocop.asgi.AiocopMiddleware", aiocop.asgi.AiocopMiddleware, "api-integrations.md")

# Public types whose parameters are data fields, not options, and the callback
# classes that the `log_events()` functions build with the same arguments (the
# test that every option is on the page skips them).
DATA_TYPES = frozenset(
    {
        "BlockingCall",
        "BlockingEventInfo",
        "ConfigError",
        "CpuStackSample",
        "HighSeverityBlockingIoException",
        "LoggingCallback",
        "ProjectConfig",
        "RawBlockingEvent",
        "RequestInfo",
        "SlowTaskEvent",
        "StructlogCallback",
    }
)

# Where a docstring has no `Args:` entry for a parameter: the allow-rule
# helpers take the fields of `AllowRule`, documented on the class.
_ALLOW_FIELDS = ("events", "module", "path", "call_site")
_ENTRY = re.compile(r"^(\*{0,2}\w+)(?: \([^)]*\))?:\s*(.*)$")


def docstring_entries(obj: object, section: str) -> dict[str, str]:
    """The `name: text` entries of a Google-style docstring section ("Args", "Attributes"), one line each."""
    doc = inspect.getdoc(obj) or ""
    entries: dict[str, str] = {}
    inside, current = False, None
    for line in doc.splitlines():
        if not line.startswith(" "):
            inside = line.strip() == f"{section}:"
            current = None
            continue
        if not inside:
            continue
        text = line[4:]
        match = _ENTRY.match(text) if not text.startswith(" ") else None
        if match:
            current = match.group(1).lstrip("*")
            entries[current] = match.group(2)
        elif current is not None and text.strip():
            entries[current] += " " + text.strip()
    return entries


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _describe(name: str, obj: object, parameter: str) -> str:
    for section in ("Args", "Attributes"):
        entries = docstring_entries(obj, section)
        if parameter in entries:
            return entries[parameter]
    if parameter in _ALLOW_FIELDS:
        return docstring_entries(aiocop.AllowRule, "Attributes")[parameter]
    raise LookupError(f"{name}: parameter {parameter!r} has no description in its docstring")


def _value(parameter: inspect.Parameter) -> str:
    value = parameter.default
    if parameter.name == "level" and isinstance(value, int) and not isinstance(value, bool):
        return f"logging.{logging.getLevelName(value)}"  # a logging level: by its name, as one writes it
    return repr(value)


def _signature(name: str, obj: Callable[..., Any]) -> str:
    parts: list[str] = []
    star = False
    for parameter in inspect.signature(obj).parameters.values():
        if parameter.kind is parameter.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        if parameter.kind is parameter.VAR_POSITIONAL:
            parts.append(f"*{parameter.name}")
            star = True
        elif parameter.default is parameter.empty:
            parts.append(parameter.name)
        else:
            parts.append(f"{parameter.name}={_value(parameter)}")
    return f"{name}({', '.join(parts)})"


def _default(parameter: inspect.Parameter) -> str:
    if parameter.kind is parameter.VAR_POSITIONAL:
        return "none"
    if parameter.default is parameter.empty:
        return "required"
    return f"`{_value(parameter)}`"


def _callable_section(name: str, obj: Callable[..., Any], page: str) -> list[str]:
    lines = [
        f"### `{name}`",
        "",
        "```python",
        _signature(name, obj),
        "```",
        "",
        f"[API reference]({page}#{name})",
        "",
        "| argument | default | meaning |",
        "| --- | --- | --- |",
    ]
    for parameter in inspect.signature(obj).parameters.values():
        star = "*" if parameter.kind is parameter.VAR_POSITIONAL else ""
        description = _describe(name, obj, parameter.name)
        lines.append(f"| `{star}{parameter.name}` | {_default(parameter)} | {_cell(description)} |")
    return [*lines, ""]


# --- pytest: the plugin's own option registration, recorded ---------------------------


@dataclass
class _Option:
    flags: list[str]
    dest: str
    metavar: str | None
    help: str


@dataclass
class _Ini:
    name: str
    default: object
    help: str


@dataclass
class _Recorder:
    """Stands in for pytest's parser: records what `add_options` registers."""

    options: list[_Option] = field(default_factory=list)
    inis: list[_Ini] = field(default_factory=list)

    def getgroup(self, name: str, description: str = "") -> _Recorder:
        return self

    def addoption(self, *flags: str, **kwargs: Any) -> None:
        self.options.append(_Option(list(flags), kwargs["dest"], kwargs.get("metavar"), kwargs.get("help", "")))

    def addini(self, name: str, help: str, type: str | None = None, default: object = None) -> None:
        self.inis.append(_Ini(name, default, help))


_INI_NOTE = re.compile(r"\s*\((?:default [^;)]*; )?ini: [^)]*\)")


def _ini_value(value: object) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if value == []:
        return "none"
    return f"`{value}`"


def _pytest_section() -> list[str]:
    recorder = _Recorder()
    _pytest_settings.add_options(recorder)  # type: ignore[arg-type] # duck-typed: only the calls it makes
    inis = {ini.name: ini for ini in recorder.inis}
    flags: dict[str, list[_Option]] = {}
    for option in recorder.options:
        flags.setdefault(option.dest, []).append(option)
    lines = [
        "## pytest plugin",
        "",
        "Nearly every option is a command-line flag and an ini key (in `[tool.pytest.ini_options]`,",
        "`pytest.ini`, `tox.ini` or `setup.cfg`); the flag wins, then the ini key, then",
        "[`[tool.aiocop]`](#project-configuration-toolaiocop).",
        "See [pytest in CI](../how-to/pytest.md).",
        "",
        "| flag | ini key | default | meaning |",
        "| --- | --- | --- | --- |",
    ]
    for dest, options in flags.items():
        shown = " / ".join(
            f"`{flag}={option.metavar}`" if option.metavar else f"`{flag}`"
            for option in options
            for flag in option.flags
        )
        ini = inis.pop(dest, None)
        helps = [_INI_NOTE.sub("", option.help) for option in options]
        meaning = (
            helps[0]
            if len(helps) == 1
            else "; ".join(f"`{o.flags[0]}`: {h}" for o, h in zip(options, helps, strict=True))
        )
        if ini is None:  # a one-off action, not a setting
            lines.append(f"| {shown} | | none | {_cell(meaning)} |")
            continue
        default = _pytest_settings.DEFAULTS.get(ini.name, ini.default)
        lines.append(f"| {shown} | `{ini.name}` | {_ini_value(default)} | {_cell(meaning)} |")
    if inis:
        raise LookupError(f"ini keys without a flag: {sorted(inis)}")
    lines += ["", "### Markers", "", "| marker | meaning |", "| --- | --- |"]
    for marker in _pytest_settings.MARKERS:
        signature, _, meaning = marker.partition("): ")
        lines.append(f"| `@pytest.mark.{signature})` | {_cell(meaning)} |")
    lines += ["", "### Fixtures", "", "| fixture | gives |", "| --- | --- |"]
    for fixture in (pytest_plugin.aiocop_events,):
        doc = inspect.getdoc(fixture) or ""
        lines.append(f"| `{fixture.__name__}` | {_cell(doc.replace(chr(10) * 2, ' '))} |")
    return [*lines, ""]


# --- [tool.aiocop] ---

# Which integrations read each key (the API through aiocop.configure()).
_READ_BY = {
    "threshold_ms": "API, CLI, pytest",
    "hang_after_ms": "API (with `threshold_ms`), CLI `run`, pytest (with a threshold, or under pytest-timeout)",
    "trace_depth": "API, CLI, pytest",
    "fail_on": "CLI, pytest",
    "app_paths": "API, CLI, pytest",
    "library_paths": "API, CLI, pytest",
    "allow": "API, CLI, pytest",
    "baseline": "CLI, pytest",
    "sample_rate": "ASGI middleware (after `aiocop.configure()`)",
}


def _project_section() -> list[str]:
    fields = docstring_entries(_config.ProjectConfig, "Attributes")
    if set(_READ_BY) != set(_config._PARSERS):
        raise LookupError(f"[tool.aiocop] keys without a reader: {sorted(set(_config._PARSERS) ^ set(_READ_BY))}")
    lines = [
        "## Project configuration: `[tool.aiocop]`",
        "",
        "One table in `pyproject.toml` for the API (`aiocop.configure()`), the command line, the pytest",
        "plugin and the ASGI middleware; each one's own flags and arguments win. Relative paths are",
        "from the file's folder. See [configuration and baselines](../how-to/configuration.md).",
        "",
        "| key | read by | meaning |",
        "| --- | --- | --- |",
    ]
    for key in _config._PARSERS:
        lines.append(f"| `{key}` | {_READ_BY[key]} | {_cell(fields[key])} |")
    return [*lines, ""]


# --- the command line ----------------------------------------------------------------------

_DEFAULT_NOTE = re.compile(r"\s*\(default: [^)]*\)")


def _cli_default(action: argparse.Action) -> str:
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return "off"
    if action.default is None:
        return "none"
    return f"`{action.default:g}`" if isinstance(action.default, float) else f"`{action.default}`"


def _parser_table(name: str, parser: argparse.ArgumentParser, how_to: str) -> list[str]:
    lines = [
        f"## Command line: `python -m aiocop {name}`",
        "",
        f"See [the how-to](../how-to/{how_to}).",
        "",
        "```text",
        parser.format_usage().strip().removeprefix("usage: "),
        "```",
        "",
        "| option | default | meaning |",
        "| --- | --- | --- |",
    ]
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or not action.option_strings:
            continue
        names = ", ".join(
            f"`{flag} {action.metavar}`" if action.metavar and action.nargs != 0 else f"`{flag}`"
            for flag in action.option_strings
        )
        lines.append(f"| {names} | {_cli_default(action)} | {_cell(_DEFAULT_NOTE.sub('', action.help or ''))} |")
    return lines


def _cli_section() -> list[str]:
    _, run = _cli.build_parsers()
    lines = _parser_table("run", run, "cli.md")
    lines += [
        "",
        "Everything after the script path (or after `-m module`) is the program's own arguments.",
        "`python -m aiocop --version` prints aiocop's version.",
        "",
        "Exit status: the program's own when it fails; "
        f"`{_exits.EXIT_FAIL_ON}` when it succeeded but a call site reached the `--fail-on` severity; "
        f"`{_exits.EXIT_USAGE}` for a usage error; `0` otherwise.",
        "",
    ]
    lines += _parser_table("attach", _cli.attach_parser(), "attach.md")
    lines += [
        "",
        f"Exit status: `{_exits.EXIT_FAIL_ON}` when a call site reached the `--fail-on` severity; "
        f"`{_exits.EXIT_USAGE}` for a usage error or a Python older than 3.14; `{_exits.EXIT_ERROR}` when the attach "
        f"failed (the message says why); `{_exits.EXIT_INTERRUPTED}` when interrupted; `0` otherwise.",
        "",
    ]
    return lines


def render() -> str:
    lines = [
        "# Options",
        "",
        "<!-- Generated by `python docs/hooks/generated_pages.py` from the signatures and docstrings of the",
        "     public API, and from the pytest plugin's and the CLI's own option definitions.",
        "     Do not edit: the test suite checks it is up to date. -->",
        "",
        "Every option aiocop has, in one place: the keyword arguments of the Python API, the ASGI",
        "middleware, the `[tool.aiocop]` table they share, the pytest plugin's flags, ini keys, markers and",
        f"fixture, and the command line. Two environment variables: `{_config.ENV_VAR}`, the file to read",
        "`[tool.aiocop]` from instead of the nearest `pyproject.toml`, and `AIOCOP_TRUST`, the files aiocop",
        "reads though another user owns them or anyone can write them (see",
        "[which file is read](../how-to/configuration.md#which-file-is-read)).",
        "",
        "## Python API",
        "",
        "Setup functions can be called again to reconfigure. Arguments are checked when the call is",
        "made: a bad value raises `TypeError` or `ValueError` there, not later inside an event loop.",
        "",
    ]
    for name, obj, page in API:
        lines += _callable_section(name, obj, page)
    lines += ["## ASGI middleware", "", "See [web apps](../how-to/asgi.md).", ""]
    lines += _callable_section(*ASGI)
    lines += _project_section()
    lines += _pytest_section()
    lines += _cli_section()
    return "\n".join(lines).rstrip("\n") + "\n"
