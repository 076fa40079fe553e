"""rloop 0.5 closes its self-pipe twice; with loops in two threads, that breaks the other loop.

Run it: `python examples/rloop_self_pipe.py [ROUNDS]` (no aiocop involved; Python 3.11+).
Each round, two threads each run `asyncio.Runner(loop_factory=...)` with one
task that meets the other thread at a barrier and then blocks for 20 ms. It
prints how many of the runs failed, with `rloop.new_event_loop` and with the
workaround below; on a busy machine rloop's own loop fails a few runs in a
hundred (`RuntimeError: Cannot close a running event loop`), the workaround
none.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from typing import TYPE_CHECKING

import rloop

if TYPE_CHECKING:
    from collections.abc import Callable


# --8<-- [start:repro]
async def meet(barrier: threading.Barrier) -> None:
    barrier.wait()  # both loops run at once...
    time.sleep(0.02)  # ...and stop at once


def run(factory: Callable[[], asyncio.AbstractEventLoop], barrier: threading.Barrier, errors: list[str]) -> None:
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(meet(barrier))
    except Exception as exc:  # rloop 0.5: "Cannot close a running event loop"
        errors.append(f"{type(exc).__name__}: {exc}")


def failures(factory: Callable[[], asyncio.AbstractEventLoop], rounds: int) -> list[str]:
    errors: list[str] = []
    for _ in range(rounds):
        barrier = threading.Barrier(2, timeout=10)
        threads = [threading.Thread(target=run, args=(factory, barrier, errors)) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return errors


# --8<-- [end:repro]


# --8<-- [start:workaround]
class SelfPipeFixedRLoop(rloop.RLoop):
    """rloop's loop, with its self-pipe closed once.

    rloop 0.5 hands the self-pipe's two descriptors to its Rust core, which
    closes them as the loop stops (`_ssock_del`), and then drops the Python
    sockets that still own the same numbers, which close them again. A
    descriptor another thread opened in between (the next self-pipe of a
    loop running there) is closed under it. Detaching the Python sockets
    first leaves the closing to the Rust core alone.
    """

    def _ssock_stop(self) -> None:
        reader, writer = self._ssock_r, self._ssock_w
        if reader is None or writer is None:  # not set up: rloop's own error
            super()._ssock_stop()
            return
        fd = reader.fileno()
        reader.detach()
        writer.detach()
        self._ssock_del(fd)  # closes both descriptors, once
        self._ssock_w = None
        self._ssock_r = None


# asyncio.Runner(loop_factory=SelfPipeFixedRLoop), asyncio.run(main(), loop_factory=SelfPipeFixedRLoop)
# --8<-- [end:workaround]


def main() -> None:
    if sys.version_info < (3, 11):
        sys.exit("examples/rloop_self_pipe.py needs Python 3.11 or newer (asyncio.Runner, the issue's case)")
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    for name, factory in (("rloop.new_event_loop", rloop.new_event_loop), ("SelfPipeFixedRLoop", SelfPipeFixedRLoop)):
        errors = failures(factory, rounds)
        kinds = "; ".join(sorted(set(errors)))
        print(f"{name}: {len(errors)} of {2 * rounds} runs failed" + (f" ({kinds})" if kinds else ""))


if __name__ == "__main__":
    main()
