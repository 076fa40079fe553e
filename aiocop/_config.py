"""One configuration for the API, the CLI, the pytest plugin and the ASGI middleware: `[tool.aiocop]`.

```toml
[tool.aiocop]
threshold_ms = 50                       # a step holding its loop this long is a stall
trace_depth = 20                        # frames kept per blocking call
fail_on = "medium"                      # the impact that fails a CLI run or a test
app_paths = ["src/"]                    # the application's own code, even if installed
library_paths = ["src/myapp/vendor/"]   # not the application's, though outside site-packages
allow = ["open module=myapp.templates", { events = ["os.stat"], path = "scripts/" }]
baseline = "aiocop-baseline.json"       # call sites known today: only new ones fail
sample_rate = 0.1                       # share of requests the ASGI middleware watches
```

Found in the nearest `pyproject.toml` from the working directory up, or in
the file `AIOCOP_CONFIG` names. Relative paths are taken from the file's
folder. Each integration's own flags and options win over the file. This
module imports neither pytest nor the detector: reading a configuration
starts nothing.
"""

from __future__ import annotations

import math
import os
import shlex
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiocop._validate import did_you_mean

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

if TYPE_CHECKING:
    from collections.abc import Callable

    from aiocop._allow import AllowRule

ENV_VAR = "AIOCOP_CONFIG"
LEVELS = ("low", "medium", "high")
ALLOW_KEYS = ("module", "path", "call_site")


class ConfigError(ValueError):
    """A `[tool.aiocop]` table that cannot be used; the message names the file, the key and the fix."""


@dataclass(frozen=True)
class ProjectConfig:
    """The `[tool.aiocop]` table of a project, checked; `None` or empty where the table says nothing.

    Attributes:
        source: The file it was read from (`None`: no file, every value unset).
        threshold_ms: A step holding its loop this long is a stall.
        trace_depth: Frames kept per blocking call.
        fail_on: The impact (`"low"`, `"medium"`, `"high"`) that fails a CLI run or a test.
        app_paths: Absolute path prefixes of the application's own code (even under site-packages).
        library_paths: Absolute path prefixes that are not the application's (vendored code).
        allow: Allow rules for the whole process.
        allow_lines: The rules as written, for reports.
        baseline: The baseline file (absolute): call sites known to block, which fail nothing.
        sample_rate: The share of requests the ASGI middleware watches.

    Added in 2.0.
    """

    source: str | None = None
    threshold_ms: float | None = None
    trace_depth: int | None = None
    fail_on: str | None = None
    app_paths: tuple[str, ...] = ()
    library_paths: tuple[str, ...] = ()
    allow: tuple[AllowRule, ...] = field(default=())
    allow_lines: tuple[str, ...] = ()
    baseline: str | None = None
    sample_rate: float | None = None


def find_pyproject(start: str | None = None) -> str | None:
    """The `pyproject.toml` in `start` (default: the working directory) or the nearest folder above it."""
    folder = os.path.abspath(start or os.getcwd())
    while True:
        candidate = os.path.join(folder, "pyproject.toml")
        if os.path.isfile(candidate):
            return candidate
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent


def load_config(path: str | os.PathLike[str] | None = None) -> ProjectConfig:
    """Read and check the `[tool.aiocop]` table of a `pyproject.toml`.

    With no `path`: the file `AIOCOP_CONFIG` names, else the nearest
    `pyproject.toml` from the working directory up. A project without one,
    or without the table, gets an empty configuration. Raises `ConfigError`
    naming the file and the key for anything wrong in the table, and for a
    `path` (or `AIOCOP_CONFIG`) that does not exist. Added in 2.0.
    """
    if path is not None:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a file path (str or os.PathLike), not {type(path).__name__}: {path!r}")
        file = os.fspath(path)
        origin = "path"
    elif os.environ.get(ENV_VAR):
        file = os.environ[ENV_VAR]
        origin = ENV_VAR
    else:
        found = find_pyproject()
        if found is None:
            return ProjectConfig()
        file, origin = found, ""
    if origin and not os.path.isfile(file):
        raise ConfigError(f"{origin}: no such file: {file!r}")
    try:
        with open(file, "rb") as stream:
            document = tomllib.load(stream)
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read it: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: not valid TOML: {exc}") from None
    table = document.get("tool", {}).get("aiocop")
    if table is None:
        return ProjectConfig(source=os.path.abspath(file))
    return parse_table(table, os.path.abspath(file))


def parse_table(table: object, source: str) -> ProjectConfig:
    """Check a `[tool.aiocop]` table read from `source` (relative paths are from its folder)."""
    where = f"{source} [tool.aiocop]"
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table, got {table!r}")
    root = os.path.dirname(source)
    values: dict[str, Any] = {"source": source}
    for key, value in table.items():
        parse = _PARSERS.get(key)
        if parse is None:
            raise ConfigError(
                f"{where}: unknown key {key!r}{did_you_mean(key, _PARSERS)}; the keys are {', '.join(_PARSERS)}"
            )
        values[key] = parse(f"{where} {key}", value, root)
    rules = values.pop("allow", None)
    if rules is not None:
        values["allow"], values["allow_lines"] = rules
    return ProjectConfig(**values)


def _threshold(where: str, value: object, _root: str) -> float:
    return _number(where, value, "milliseconds", 0, None)


def _sample_rate(where: str, value: object, _root: str) -> float:
    return _number(where, value, "a fraction", 0, 1)


def _trace_depth(where: str, value: object, _root: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}: expected a whole number of frames >= 1, got {value!r}")
    return value


def _level(where: str, value: object, _root: str) -> str:
    if value not in LEVELS:
        hint = did_you_mean(value, LEVELS) if isinstance(value, str) else ""
        raise ConfigError(f"{where}: expected one of low, medium, high, got {value!r}{hint}")
    return str(value)


def _paths(where: str, value: object, root: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{where}: expected a list of paths, got {value!r}")
    return tuple(_path(root, p) for p in value)


def _file(where: str, value: object, root: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: expected a file name, got {value!r}")
    return _path(root, value)


def _number(where: str, value: object, unit: str, above: float, at_most: float | None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{where}: expected a number ({unit}), got {value!r}")
    if not value > above or (at_most is not None and value > at_most):
        bound = f"> {above:g}" + (f" and <= {at_most:g}" if at_most is not None else "")
        raise ConfigError(f"{where}: expected a number {bound} ({unit}), got {value!r}")
    return float(value)


def _path(root: str, path: str) -> str:
    # Prefixes match absolute file names; keep a trailing separator: it means "under".
    trailing = os.sep if path.endswith(("/", os.sep)) else ""
    return os.path.normpath(os.path.join(root, path)) + trailing


def _allow_rules(where: str, value: object, root: str) -> tuple[tuple[AllowRule, ...], tuple[str, ...]]:
    if not isinstance(value, list):
        raise ConfigError(f"{where}: expected a list of rules (strings or tables), got {value!r}")
    rules: list[AllowRule] = []
    lines: list[str] = []
    for entry in value:
        try:
            if isinstance(entry, str):
                rules.append(parse_allow_line(entry, root))
                lines.append(entry.strip())
            elif isinstance(entry, dict):
                fields = dict(entry)
                events = fields.pop("events", [])
                if isinstance(events, str):
                    events = [events]
                rules.append(make_rule(events, fields, root))
                lines.append(_as_line(events, fields))
            else:
                raise ValueError("expected a string such as 'open module=myapp.config', or a table")
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{where}: in rule {entry!r}: {exc}") from None
    return tuple(rules), tuple(lines)


def _as_line(events: list[str], fields: dict[str, Any]) -> str:
    return " ".join([*events, *(f"{key}={shlex.quote(str(value))}" for key, value in fields.items())])


def parse_allow_line(line: str, root: str | os.PathLike[str]) -> AllowRule:
    """An allow rule written as one line: event names and `key=value` fields.

    `open os.stat module=myapp.config` allows `open` and `os.stat` calls made
    under `myapp.config`; `path=vendor/` allows any call from files under
    `<root>/vendor/`. Values may be quoted (`path="my dir/"`).
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
    return make_rule(events, fields, root)


def make_rule(events: list[Any] | tuple[Any, ...], fields: dict[str, Any], root: str | os.PathLike[str]) -> AllowRule:
    """An `AllowRule`, with a relative `path` taken from `root` (raises ValueError)."""
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
        path = _path(os.fspath(root), path)
    # Imported here: with no rule to make (the pytest plugin switched off), no part of the detector loads.
    from aiocop._allow import AllowRule  # noqa: PLC0415

    try:
        return AllowRule(tuple(events), fields.get("module"), path, fields.get("call_site"))  # type: ignore[arg-type]
    except TypeError as exc:
        raise ValueError(str(exc)) from None


# Each key of the table and what checks it, in the order the docs list them.
_PARSERS: dict[str, Callable[[str, object, str], object]] = {
    "threshold_ms": _threshold,
    "trace_depth": _trace_depth,
    "fail_on": _level,
    "app_paths": _paths,
    "library_paths": _paths,
    "allow": _allow_rules,
    "baseline": _file,
    "sample_rate": _sample_rate,
}
