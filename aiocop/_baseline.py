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
from typing import TYPE_CHECKING

from aiocop._report import STALL, app_site, call_site, site_key

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from aiocop._events import SlowTaskEvent

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


def event_keys(event: SlowTaskEvent) -> list[Key]:
    """Every baseline key of an event: its calls', and its stall's for a stall event."""
    keys = call_keys(event)
    if event.reason == "cpu_blocking":
        keys.append(stall_key(event))
    return keys


def read(path: str) -> frozenset[Key]:
    """The call sites a baseline file records."""
    try:
        with open(path, encoding="utf-8") as stream:
            document = json.load(stream)
    except FileNotFoundError:
        raise BaselineError(
            f"baseline {path!r}: no such file (record one first with --write-baseline, "
            "or --aiocop-write-baseline under pytest)"
        ) from None
    except (OSError, ValueError) as exc:
        raise BaselineError(f"baseline {path!r}: cannot read it: {exc}") from None
    sites = document.get("call_sites") if isinstance(document, dict) else None
    if not isinstance(document, dict) or document.get("aiocop_baseline") != FORMAT or not isinstance(sites, list):
        raise BaselineError(f"baseline {path!r}: not an aiocop baseline (format {FORMAT}) file")
    keys: set[Key] = set()
    for entry in sites:
        if not (isinstance(entry, dict) and isinstance(entry.get("event"), str) and isinstance(entry.get("site"), str)):
            raise BaselineError(f"baseline {path!r}: each call site needs an 'event' and a 'site', got {entry!r}")
        keys.add((entry["event"], entry["site"]))
    return frozenset(keys)


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
    with open(path, "w", encoding="utf-8") as stream:
        json.dump(document, stream, indent=2)
        stream.write("\n")


def count(keys: Iterable[Key], into: dict[Key, int]) -> None:
    """Add one sighting of each key to `into`."""
    for key in keys:
        into[key] = into.get(key, 0) + 1
