"""How a command ends: the exit statuses of `run` and `attach`, and `run`'s end by a signal.

The statuses, one table for both commands: `EXIT_ERROR`, `EXIT_USAGE`,
`EXIT_FAIL_ON`, and attach's `EXIT_NOT_RUN` and `EXIT_INTERRUPTED`.

`run`'s end by a signal: SIGTERM (a container stop) and SIGHUP (a closed terminal) still write the report.

The program runs in this very process, on the main thread, so a handler it
installs (`signal.signal`, or asyncio's `loop.add_signal_handler`, as
uvicorn does) would replace aiocop's, and a loop hung at that moment never
runs the program's callback: the process is killed later, and the report
and the files asked for are lost. So, while the program runs, aiocop's
handler stays the one the interpreter calls, and `signal.signal` and
`signal.getsignal` keep, for these two signals, the program's own choice:

- the program's choice is the default (it chose none): the report is
  printed and every file written, then the process ends by the signal, as
  the default action would (a parent sees "killed by SIGTERM", status 143);
- it installed a handler: that handler runs, as it would without aiocop;
  should the program still be running `GRACE_S` later (a hung loop never
  gets to its shutdown), the report so far is written, so that a SIGKILL
  after the orchestrator's grace period leaves it; the program's own end
  writes it again, whole;
- it ignores the signal (`SIG_IGN`): it is ignored, aiocop steps aside.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from collections.abc import Callable

EXIT_ERROR = 1  # what the command was asked to write could not be written (attach: the attach failed)
EXIT_USAGE = 2  # a usage error (argparse's own status)
EXIT_FAIL_ON = 3  # a call site reached the --fail-on impact
# attach: the target's main thread ran none of aiocop's code within the start timeout:
# blocked in a call (the message says which, as the OS sees it), or idle.
EXIT_NOT_RUN = 4
EXIT_INTERRUPTED = 130  # attach: interrupted (Ctrl-C)

# Signals whose default action ends the process and that a run is ended by from outside.
SIGNALS: tuple[signal.Signals, ...] = tuple(
    s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s is not None
)
# How long a program that handles the signal itself has to end before the report so far is written.
GRACE_S = 2.0
_REAL_SIGNAL = signal.signal  # (die_by must set the default, whatever the program's run replaced)


class ExitSignals:
    """aiocop's handlers of `SIGNALS` for one run (main thread only): `install()`, then `restore()`."""

    def __init__(self, on_exit: Callable[[int], None], on_late: Callable[[int], None]) -> None:
        self._on_exit = on_exit  # (signum) the process ends by it: print, write everything
        self._on_late = on_late  # (signum) the program handles it and has not ended within GRACE_S
        self._pid = os.getpid()
        self._chosen: dict[int, Any] = {}  # signal -> the program's choice (SIG_DFL or its handler)
        self._timers: list[threading.Timer] = []
        self._real_signal = signal.signal
        self._real_getsignal = signal.getsignal
        self._real_siginterrupt = getattr(signal, "siginterrupt", None)

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # (signal.signal works on the main thread only)
        for signum in SIGNALS:
            if self._real_getsignal(signum) is signal.SIG_DFL:  # one set before aiocop (SIG_IGN: nohup) stays
                self._real_signal(signum, self._dispatch)
                self._chosen[signum] = signal.SIG_DFL
        if self._chosen:
            signal.signal = self._signal  # the program's calls keep its own choice
            signal.getsignal = self._getsignal
            if self._real_siginterrupt is not None:
                signal.siginterrupt = self._siginterrupt

    def restore(self) -> None:
        """Put back the program's choices and the `signal` functions; cancel a pending late write."""
        for timer in self._timers:
            timer.cancel()
        if signal.signal == self._signal:
            signal.signal = self._real_signal
        if signal.getsignal == self._getsignal:
            signal.getsignal = self._real_getsignal
        if self._real_siginterrupt is not None and signal.siginterrupt == self._siginterrupt:
            signal.siginterrupt = self._real_siginterrupt
        for signum, chosen in self._chosen.items():
            if self._real_getsignal(signum) == self._dispatch:
                self._real_signal(signum, chosen)
        self._chosen.clear()

    def _signal(self, signalnum: int, handler: Any) -> Any:
        # `signal.signal` while the program runs: as the real one for what aiocop does not hold.
        held = signalnum in self._chosen and self._real_getsignal(signalnum) == self._dispatch
        valid = handler is signal.SIG_DFL or (callable(handler) and handler is not signal.SIG_IGN)
        if not held or not valid or threading.current_thread() is not threading.main_thread():
            # Not aiocop's to keep: as the real call does (it raises, as it would, for a bad handler or
            # another thread; SIG_IGN is set, and aiocop steps aside for good).
            result = self._real_signal(signalnum, handler)
            previous = self._chosen.pop(signalnum, None)
            return previous if previous is not None else result
        previous = self._chosen[signalnum]
        self._chosen[signalnum] = handler
        return previous

    def _siginterrupt(self, signalnum: int, flag: bool) -> None:
        # asyncio's add_signal_handler asks for system calls to restart after
        # the signal: a loop hung in a lock's wait would then never run a
        # Python handler, and the report would never be written. Python
        # retries an interrupted call itself (PEP 475): for the held signals
        # the request is skipped, and the program sees no difference.
        assert self._real_siginterrupt is not None
        if signalnum in self._chosen and self._real_getsignal(signalnum) == self._dispatch:
            return
        self._real_siginterrupt(signalnum, flag)

    def _getsignal(self, signalnum: int) -> Any:
        if signalnum in self._chosen and self._real_getsignal(signalnum) == self._dispatch:
            return self._chosen[signalnum]
        return self._real_getsignal(signalnum)

    def _dispatch(self, signum: int, frame: Any) -> Any:
        chosen = self._chosen.get(signum, signal.SIG_DFL)
        ours = os.getpid() == self._pid  # not a forked child (a pool's worker ended by its pool)
        if callable(chosen):
            if ours:
                timer = threading.Timer(GRACE_S, self._on_late, (signum,))
                timer.daemon = True
                timer.name = "aiocop-exit-report"
                self._timers.append(timer)
                timer.start()
            return chosen(signum, frame)
        if ours:
            self._on_exit(signum)
        die_by(signum)
        return None


def die_by(signum: int) -> NoReturn:
    """End the process as the signal's default action would: a parent sees "killed by" it."""
    sys.stderr.flush()
    _REAL_SIGNAL(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)  # (if the signal is blocked on this thread)
