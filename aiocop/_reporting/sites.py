"""Bounded attribute sets for metrics: one per application line, up to a cap, then `other`.

A metrics backend keeps one time series per distinct attribute set. Call
sites are the application's lines, a few dozen in a real service, but
unbounded in principle (generated code, a template engine's compiled
modules, a new line each deploy): a fleet could create series without end.
So each process names at most `max_sites` call sites and counts the rest
under one `other` value, and says once in the log that it did.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from aiocop._common.clock import monotonic

logger = logging.getLogger("aiocop")

Attributes = Mapping[str, "str | int | float"]

OTHER = "other"
"""The `code.file.path` and `code.function.name` of the call sites past the cap."""

# OpenTelemetry's semantic conventions for a line of code (`code.*`).
FILE = "code.file.path"
LINE = "code.line.number"
FUNCTION = "code.function.name"

_OTHER_SITE: Attributes = {FILE: OTHER, FUNCTION: OTHER}
_UNKNOWN: Attributes = {}


def parse_site(site: str) -> Attributes:
    """`code.*` attributes of a `path:line:function` site (aiocop's `app_site`, `call_site`).

    The path may hold colons of its own (a Windows drive): the last two
    fields are the line and the function. Something else gives no attributes.
    """
    path, _, rest = site.rpartition(":")
    path, _, line = path.rpartition(":")
    if not path or not line.isdigit():
        return _UNKNOWN
    return {FILE: path, LINE: int(line), FUNCTION: rest}


class SiteTable:
    """The attributes of each call site, for at most `max_sites` of them; `other` past that."""

    def __init__(self, max_sites: int) -> None:
        self.max_sites = max_sites
        self._sites: dict[str, Attributes] = {}
        # (site, extra attributes) -> the merged set: the same dict each time,
        # so building one costs a look-up after the first.
        self._merged: dict[tuple[str, tuple[tuple[str, str], ...]], Attributes] = {}
        self.overflowed = 0  # calls and stalls counted under `other`

    def attributes(self, site: str) -> Attributes:
        known = self._sites.get(site)
        if known is not None:
            return known
        if not site:
            return _UNKNOWN
        if len(self._sites) >= self.max_sites:
            if not self.overflowed:
                logger.warning(
                    "aiocop: more than %d call sites in this process: the others are counted under "
                    "code.file.path=%r in the metrics (raise max_call_sites to name more)",
                    self.max_sites,
                    OTHER,
                )
            self.overflowed += 1
            return _OTHER_SITE
        attributes = self._sites[site] = parse_site(site)
        return attributes

    def with_extra(self, site: str, extra: tuple[tuple[str, str], ...]) -> Attributes:
        """`attributes(site)` plus `extra` (an event name, a severity), cached per pair."""
        key = (site, extra)
        merged = self._merged.get(key)
        if merged is None:
            base = self.attributes(site)
            merged = {**base, **dict(extra)}
            # Kept for good, as every attribute set given out (whose identity
            # identifies it): past the cap, under `other`'s key, so that sites
            # past the cap share one set per extra (a bounded number).
            merged = self._merged.setdefault((site if base is not _OTHER_SITE else OTHER, extra), merged)
            if base is not _OTHER_SITE:
                self._merged[key] = merged
        return merged

    def key(self, site: str) -> str:
        """The site as the metrics name it: itself, or `other` past the cap."""
        return OTHER if self.attributes(site) is _OTHER_SITE else site


class RateLimit:
    """At most `per_second` events per key, spaced evenly (keys are bounded by the `SiteTable`)."""

    def __init__(self, per_second: float) -> None:
        self.spacing = 1.0 / per_second
        self._last: dict[str, float] = {}

    def allow(self, key: str) -> bool:
        now = monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self.spacing:
            return False
        self._last[key] = now
        return True
