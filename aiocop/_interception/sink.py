"""The seam between detection and what reports it: one record of callables, installed from above.

Interception and the stall watchdog sit below delivery, so they cannot import it. They hand what they find
to the sink installed into them when detection starts (`_api` calls `hook.install_sink`, `loops.install_sink`
and the watchdog's `install_sink` with the process's one sink, `_reporting.sink.SINK`), as trio's runner
holds its instruments. A part binds the callables it needs into names of its own as the sink is installed:
the hot path reads one global, as it did before there was a seam.

One blocking call: the hook records it in its step's `StepGroup` and schedules `deliver` for the loop's
batch with `loop.call_soon`; a group whose loop stopped first goes to `deliver_orphans`; under
`raise_on_violations`, the hook raises what `violation` builds. One stall: the watchdog offers it to
`attach_to_io` (an io event of the same step still to be delivered takes it), else to `stall`; a step
still running past `hang_after_ms` goes to `hang` (the watchdog's part of the record, `_stalls.sink`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from aiocop._interception.hook import StepGroup
    from aiocop._interception.loops import LoopWatch


@dataclass(frozen=True)
class Sink:
    """What the hook and the loops' tracking hand on: each field a callable of the layer above."""

    # A loop's batch of steps with blocking calls, run on the loop's thread after those steps (the
    # callback the hook schedules with loop.call_soon at a batch's first call).
    deliver: Callable[[list[StepGroup]], None]
    # Steps whose loop stopped before `deliver` ran for them; true: called on that thread as a loop
    # starts or stops there (delivered before the loop's run returns), false: found later, off the loop.
    deliver_orphans: Callable[[list[StepGroup], bool], None]
    # The exception `raise_on_violations` raises at the offending call.
    violation: Callable[[StepGroup], BaseException]
    # A loop was registered (the watchdog wakes up).
    loop_started: Callable[[], None]
    # A loop's own thread, as the loop stops after its last step: its watch, the time, the thread's CPU time.
    loop_stopped: Callable[[LoopWatch, float, float | None], None]
