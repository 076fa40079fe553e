"""The process's one sink: where interception and the watchdog hand what they find (`_interception.sink`).

`_api` installs it into the hook, the loops' tracking and the watchdog as detection starts; the layers below
never import this package. The fields are the very functions of `delivery`, `building` and `hangs` (no
method bound, nothing wrapped): the hook calls them as it called them when they were set into it.
"""

from __future__ import annotations

from aiocop._reporting import building as _building
from aiocop._reporting import delivery as _delivery
from aiocop._reporting import hangs as _hangs
from aiocop._stalls import watchdog as _watchdog
from aiocop._stalls.sink import StallSink

SINK = StallSink(
    deliver=_delivery.flush,
    deliver_orphans=_delivery.deliver_orphans,
    violation=_building.make_violation,
    # (The watchdog's own: a loop registered wakes its thread. Through the sink because the loops' tracking,
    # in interception, may not import the watchdog.)
    loop_started=_watchdog.watchdog.loop_started,
    loop_stopped=_delivery.loop_stopping,
    attach_to_io=_delivery.attach_to_io,
    stall=_delivery.report_stall,
    hang=_hangs.report,
)
