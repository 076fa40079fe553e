"""Baselines: the call sites that block today, recorded once, so that later runs fail only on new ones.

A team adopting aiocop on an old code base cannot fix every call at once.
`python -m aiocop run --write-baseline FILE` or `pytest --aiocop
--aiocop-write-baseline FILE` records what blocks now; with `--baseline
FILE` / `--aiocop-baseline FILE` (or `baseline = ...` in `[tool.aiocop]`)
those call sites are still reported but fail nothing.

A call site is the event and the application's line that led to it, as the
reports show it (`path:line:function`), without the line number: an edit
above a known call must not make it new. Stalls are keyed the same way,
with the event `stall`.
"""

from __future__ import annotations

import json
import os
import re
from typing import TYPE_CHECKING

from aiocop._common.inputs import InputError, UntrustedError, open_for_writing, read_file, shown
from aiocop._reporting.report import STALL, app_site, call_site, site_key

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from aiocop._model.events import SlowTaskEvent

FORMAT = 1
Key = tuple[str, str]  # (event, "path:function")


class BaselineError(ValueError):
    """A baseline file that cannot be read; the message names the file and what is wrong."""


def call_keys(event: SlowTaskEvent) -> list[Key]:
    """The baseline keys of an event's blocking calls, one per call, in order."""
    return [(info.get("name", info["event"]), site_key(app_site(info))) for info in event.blocking_events]


def stall_key(event: SlowTaskEvent) -> Key:
    """The baseline key of an event's stall (the watchdog's part of it)."""
    return (STALL, site_key(call_site(event)))


# A baseline holds a line per call site: this much is tens of thousands of them.
MAX_BYTES = 16 * 1024 * 1024
# A baseline is three levels deep (document, list, entry); a little room beyond.
MAX_DEPTH = 8
_BRACKETS_AND_STRINGS = re.compile(r'[\[\]{}]|"(?:[^"\\]|\\.)*"')


def read(path: str) -> frozenset[Key]:
    """The call sites a baseline file records; raises `BaselineError` naming the file, the key and what is wrong.

    The file must be yours or root's, writable by nobody else (or named in
    `AIOCOP_TRUST`), a regular file of at most 16 MiB of UTF-8 JSON, nested
    at most 8 levels deep, with `"aiocop_baseline": 1` (the integer: the
    format this version writes) and a list of call sites, each with a
    string `event` and `site`.
    """
    where = f"baseline {path!r}"
    try:
        data = read_file(path, MAX_BYTES)
    except FileNotFoundError:
        raise BaselineError(
            f"{where}: no such file (record one first with --write-baseline, or --aiocop-write-baseline under pytest)"
        ) from None
    except OSError as exc:
        raise BaselineError(f"{where}: cannot read it: {exc.strerror or exc}") from None
    except UntrustedError as exc:
        raise BaselineError(f"{where}: refused: {exc}") from None
    except InputError as exc:
        raise BaselineError(f"{where}: {exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BaselineError(f"{where}: not UTF-8 JSON ({exc.reason} at byte {exc.start})") from None
    depth = _depth(text)
    if depth > MAX_DEPTH:
        raise BaselineError(f"{where}: nested more than {MAX_DEPTH} levels deep: not an aiocop baseline")
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise BaselineError(f"{where}: not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise BaselineError(
            f"{where}: expected a JSON object with 'aiocop_baseline' and 'call_sites', got {shown(document)}"
        )
    version = document.get("aiocop_baseline")
    if type(version) is not int or version != FORMAT:  # not True, not 1.0: this exact format
        raise BaselineError(
            f"{where}: 'aiocop_baseline': expected {FORMAT} (the format this aiocop reads and writes), "
            f"got {shown(version)}"
        )
    sites = document.get("call_sites")
    if not isinstance(sites, list):
        raise BaselineError(f"{where}: 'call_sites': expected a list of call sites, got {shown(sites)}")
    keys: set[Key] = set()
    for index, entry in enumerate(sites):
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("event"), str)
            and isinstance(entry.get("site"), str)
            and entry["event"]
            and entry["site"]
        ):
            raise BaselineError(
                f"{where}: 'call_sites'[{index}]: expected an object with a non-empty string 'event' and 'site', "
                f"got {shown(entry)}"
            )
        keys.add((entry["event"], entry["site"]))
    return frozenset(keys)


def _depth(text: str) -> int:
    # Brackets outside strings, counted before json parses them: it recurses per level.
    depth = deepest = 0
    for match in _BRACKETS_AND_STRINGS.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return depth  # enough to refuse: no need to read on
            deepest = max(deepest, depth)
        elif token in "]}":
            depth -= 1
    return deepest


def write(path: str, counts: Mapping[Key, int]) -> None:
    """Write the call sites seen, with how many times each was seen (for the reader; not compared)."""
    document = {
        "aiocop_baseline": FORMAT,
        "note": "call sites known to block an event loop: aiocop reports them but fails nothing on them",
        "call_sites": [
            {"event": event, "site": site, "count": counts[(event, site)]} for event, site in sorted(counts)
        ],
    }
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    with open_for_writing(path) as stream:
        json.dump(document, stream, indent=2)
        stream.write("\n")


def count(keys: Iterable[Key], into: dict[Key, int]) -> None:
    """Add one sighting of each key to `into`."""
    for key in keys:
        into[key] = into.get(key, 0) + 1
