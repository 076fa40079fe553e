"""One configuration for the API, the CLI, the pytest plugin and the ASGI middleware: `[tool.aiocop]`.

```toml
[tool.aiocop]
threshold_ms = 50                       # a step holding its loop this long is a stall
hang_after_ms = 10000                   # a step still running this long is reported as it hangs (0: off)
trace_depth = 20                        # frames kept per blocking call
fail_on = "medium"                      # the impact that fails a CLI run or a test
app_paths = ["src/"]                    # the application's own code, even if installed
library_paths = ["src/myapp/vendor/"]   # not the application's, though outside site-packages
allow = ["open module=myapp.templates", { events = ["os.stat"], path = "scripts/" }]
baseline = "aiocop-baseline.json"       # call sites known today: only new ones fail
sample_rate = 0.1                       # share of requests the ASGI middleware watches
```

Found in the project's `pyproject.toml` (the nearest from the working
directory up, never above the project's root: the first folder with a
`pyproject.toml`, `.git` or `.hg`), or in the file `AIOCOP_CONFIG` names. A
file that belongs to another user, or that anyone can write (or a link to it
that belongs to another user), is refused with an error naming it and the
override, `AIOCOP_TRUST` (see `aiocop._common.inputs`). Relative paths are taken from the file's
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

from aiocop._common.escape import printable
from aiocop._common.inputs import InputError, UntrustedError, read_file, shown
from aiocop._common.validate import did_you_mean
from aiocop._model.severity import LEVELS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

if TYPE_CHECKING:
    from collections.abc import Callable

    from aiocop._interception.allow import AllowRule

ENV_VAR = "AIOCOP_CONFIG"
# A stall threshold above an hour is a mistake (and would overflow the watchdog's timeouts).
MAX_THRESHOLD_MS = 3_600_000.0
# A step still running after a day is reported by then: a longer wait is a mistake (hang_after_ms).
MAX_HANG_AFTER_MS = 86_400_000.0
ALLOW_KEYS = ("module", "path", "call_site", "everything")


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
        hang_after_ms: A step still running this long is reported while it
            hangs, wherever the stall watchdog runs; `0.0`: hangs are
            reported only when they end.

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
    hang_after_ms: float | None = None


# A pyproject.toml this large is not a project's: refused rather than parsed.
MAX_CONFIG_BYTES = 4 * 1024 * 1024
# Where the search for a pyproject.toml stops: the root of the project's checkout.
ROOT_MARKERS = (".git", ".hg")


def find_pyproject(start: str | os.PathLike[str] | None = None) -> str | None:
    """The project's `pyproject.toml`: in `start` (default: the working directory) or the nearest folder above.

    The search stops at the project's root, as black's does: the first
    folder with a `pyproject.toml` (the one returned) or a `.git` or `.hg`
    (none is returned), so a file in a folder above the project is never
    read.
    """
    folder = os.path.abspath(start or os.getcwd())
    while True:
        candidate = os.path.join(folder, "pyproject.toml")
        if os.path.isfile(candidate):
            return candidate
        if any(os.path.exists(os.path.join(folder, marker)) for marker in ROOT_MARKERS):
            return None
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent


def load_config(path: str | os.PathLike[str] | None = None) -> ProjectConfig:
    """Read and check the `[tool.aiocop]` table of a `pyproject.toml`.

    With no `path`: the file `AIOCOP_CONFIG` names, else the project's
    `pyproject.toml`: the nearest from the working directory up, never
    above the project's root (a folder with `.git` or `.hg`). A project
    without one, or without the table, gets an empty configuration. Raises
    `ConfigError` naming the file and the key for anything wrong in the
    table; for a `path` (or `AIOCOP_CONFIG`) that does not exist or is not a
    regular file; and for a file, found or named, that belongs to another
    user than you or root, or that anyone can write, naming the override
    (`AIOCOP_TRUST`). Added in 2.0; refusing an untrusted file found by
    searching (it was ignored with a warning) changed in 2.0.
    """
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a file path (str or os.PathLike), not {type(path).__name__}: {path!r}")
    return read_config(path)


def read_config(
    path: str | os.PathLike[str] | None,
    *,
    start: str | os.PathLike[str] | None = None,
    named_by: str = "path",
) -> ProjectConfig:
    """`load_config`, searching from `start`.

    `named_by`: what gave `path`, as error messages name it (`--config`).
    """
    if path is not None:
        file, origin = os.fspath(path), named_by
    elif os.environ.get(ENV_VAR):
        file, origin = os.environ[ENV_VAR], ENV_VAR
    else:
        found = find_pyproject(start)
        if found is None:
            return ProjectConfig()
        file, origin = found, ""
    source = os.path.abspath(file)
    try:
        # Found or named, one rule (read_file's): a file another user could have written is refused.
        data = read_file(file, MAX_CONFIG_BYTES)
    except UntrustedError as exc:
        if origin:
            raise ConfigError(f"{printable(source)}: refused: {exc}") from None
        raise ConfigError(
            f"{printable(source)} (found as the project's configuration): refused: {exc}; if it is not your "
            "project's, give the project a pyproject.toml or .git of its own (the search stops there)"
        ) from None
    except FileNotFoundError:
        raise ConfigError(f"{printable(origin or file)}: no such file: {file!r}") from None
    except OSError as exc:
        raise ConfigError(f"{printable(file)}: cannot read it: {exc.strerror or exc}") from None
    except InputError as exc:
        raise ConfigError(f"{printable(file)}: {exc}") from None
    return _parse_document(data, source)


def _parse_document(data: bytes, source: str) -> ProjectConfig:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{printable(source)}: not UTF-8 text, as TOML must be ({exc.reason} at byte {exc.start})"
        ) from None
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{printable(source)}: not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{printable(source)}: not valid TOML: nested too deeply") from None
    tool = document.get("tool", {})
    if not isinstance(tool, dict):
        raise ConfigError(
            f"{printable(source)}: 'tool' must be a table ([tool.aiocop] is read from it), got {shown(tool)}"
        )
    table = tool.get("aiocop")
    if table is None:
        return ProjectConfig(source=source)
    return parse_table(table, source)


def parse_table(table: object, source: str) -> ProjectConfig:
    """Check a `[tool.aiocop]` table read from `source` (relative paths are from its folder)."""
    where = f"{printable(source)} [tool.aiocop]"
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table, got {shown(table)}")
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
    return _number(where, value, "milliseconds", 0, MAX_THRESHOLD_MS)


def _hang_after(where: str, value: object, _root: str) -> float:
    # 0 turns hang reports off (TOML has no null): said in the message.
    if value == 0 and not isinstance(value, bool):
        return 0.0
    try:
        return _number(where, value, "milliseconds", 0, MAX_HANG_AFTER_MS)
    except ConfigError as exc:
        raise ConfigError(f"{exc} (0: off; at most a day)") from None


def _sample_rate(where: str, value: object, _root: str) -> float:
    return _number(where, value, "a fraction", 0, 1)


def _trace_depth(where: str, value: object, _root: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}: expected a whole number of frames >= 1, got {shown(value)}")
    return value


def _level(where: str, value: object, _root: str) -> str:
    if value not in LEVELS:
        hint = did_you_mean(value, LEVELS) if isinstance(value, str) else ""
        raise ConfigError(f"{where}: expected one of {', '.join(LEVELS)}, got {shown(value)}{hint}")
    return str(value)


def _paths(where: str, value: object, root: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{where}: expected a list of paths, got {shown(value)}")
    return tuple(_path(root, p) for p in value)


def _file(where: str, value: object, root: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: expected a file name, got {shown(value)}")
    return _path(root, value)


def _number(where: str, value: object, unit: str, above: float, at_most: float | None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{where}: expected a number ({unit}), got {shown(value)}")
    if not value > above or (at_most is not None and value > at_most):
        bound = f"> {above:.15g}" + (f" and <= {at_most:.15g}" if at_most is not None else "")
        raise ConfigError(f"{where}: expected a number {bound} ({unit}), got {shown(value)}")
    return float(value)


def _path(root: str, path: str) -> str:
    # Prefixes match absolute file names; keep a trailing separator: it means "under".
    trailing = os.sep if path.endswith(("/", os.sep)) else ""
    return os.path.normpath(os.path.join(root, path)) + trailing


def _allow_rules(where: str, value: object, root: str) -> tuple[tuple[AllowRule, ...], tuple[str, ...]]:
    if not isinstance(value, list):
        raise ConfigError(f"{where}: expected a list of rules (strings or tables), got {shown(value)}")
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
            raise ConfigError(f"{where}: in rule {shown(entry)}: {exc}") from None
    return tuple(rules), tuple(lines)


def _as_line(events: list[str], fields: dict[str, Any]) -> str:
    def text(value: Any) -> str:
        return ("true" if value else "false") if isinstance(value, bool) else shlex.quote(str(value))

    return " ".join([*events, *(f"{key}={text(value)}" for key, value in fields.items())])


def parse_allow_line(line: str, root: str | os.PathLike[str]) -> AllowRule:
    """An allow rule written as one line: event names and `key=value` fields.

    `open os.stat module=myapp.config` allows `open` and `os.stat` calls made
    under `myapp.config`; `path=vendor/` allows any call from files under
    `<root>/vendor/`. Values may be quoted (`path="my dir/"`), and `#` starts
    a comment. A line that says nothing (empty, blank, only a comment) is
    refused: `everything=true` is how a rule allowing every call is written.
    """
    if not isinstance(line, str):
        raise TypeError(f"expected a rule as a string, got {type(line).__name__}: {line!r}")
    try:
        tokens = shlex.split(line, comments=True)
    except ValueError as exc:  # unbalanced quotes
        raise ValueError(str(exc)) from None
    if not tokens:
        what = "only a comment" if line.strip() else "empty"
        raise ValueError(
            f"the rule is {what}, and would allow every blocking call: write event names and/or module=, path=, "
            "call_site= (or everything=true to allow every call)"
        )
    events: list[str] = []
    fields: dict[str, str | bool] = {}
    for token in tokens:
        key, sep, value = token.partition("=")
        if not sep:
            events.append(token)
        elif key not in ALLOW_KEYS:
            raise ValueError(
                f"unknown field {key!r}{did_you_mean(key, ALLOW_KEYS)}: expected event names and module=, path=, "
                "call_site= or everything="
            )
        elif key in fields:
            raise ValueError(f"{key}= given twice")
        elif key == "everything":
            if value.lower() != "true":
                raise ValueError(f"everything= takes only true (leave it out otherwise), got {shown(value)}")
            fields[key] = True
        else:
            fields[key] = value
    return make_rule(events, fields, root)


def make_rule(events: list[Any] | tuple[Any, ...], fields: dict[str, Any], root: str | os.PathLike[str]) -> AllowRule:
    """An `AllowRule`, with a relative `path` taken from `root` (raises ValueError)."""
    unknown = sorted(set(fields) - set(ALLOW_KEYS))
    if unknown:
        raise ValueError(
            f"unknown keyword {unknown[0]!r}{did_you_mean(unknown[0], ALLOW_KEYS)}: expected module=, path=, "
            "call_site= or everything="
        )
    path = fields.get("path")
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if isinstance(path, str) and path and not os.path.isabs(path):
        path = _path(os.fspath(root), path)
    # Imported here: with no rule to make (the pytest plugin switched off), no part of the detector loads.
    from aiocop._interception.allow import AllowRule  # noqa: PLC0415

    try:
        return AllowRule(
            tuple(events),  # type: ignore[arg-type] # checked, and made a frozenset, by AllowRule
            fields.get("module"),
            path,
            fields.get("call_site"),
            fields.get("everything", False),
        )
    except TypeError as exc:
        raise ValueError(str(exc)) from None


# Each key of the table and what checks it, in the order the docs list them.
_PARSERS: dict[str, Callable[[str, object, str], object]] = {
    "threshold_ms": _threshold,
    "hang_after_ms": _hang_after,
    "trace_depth": _trace_depth,
    "fail_on": _level,
    "app_paths": _paths,
    "library_paths": _paths,
    "allow": _allow_rules,
    "baseline": _file,
    "sample_rate": _sample_rate,
}
