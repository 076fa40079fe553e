"""The pytest plugin beside pytest-timeout: a hung test's loop is reported before its timeout ends it.

pytest-timeout hands each timed test's settings (its timeout, from
`--timeout`, the `timeout` ini key, `PYTEST_TIMEOUT` or a
`@pytest.mark.timeout` marker, and its method) to the
`pytest_timeout_set_timer` hook; the plugin reads them there, never by
parsing them again. A hang report made after the timeout is never seen, so
the test's hang threshold is set below it: half the timeout, at most the
default `hang_after_ms`. A `hang_after_ms` the user set is kept; one that
is not below the timeout gets a note saying how to set the pair.

The "thread" method ends the process with `os._exit` once it has dumped the
stacks: what the test wrote to a stream pytest-timeout does not dump (a
`capsys`'s, a `capfd`'s) is lost. Under it, a hang report goes straight to
the terminal, to a copy of the stderr that pytest had before capturing
began.
"""

from __future__ import annotations

import contextlib
import os
import threading

__all__ = ["ends_by_exit", "hang_after_ms", "header", "pair_note", "terminal_fd", "write"]


def hang_after_ms(timeout_s: float, hang_after_ms: float | None, explicit: bool) -> float | None:
    """The hang threshold for a test that pytest-timeout ends after `timeout_s` seconds.

    Half the timeout, which leaves the watchdog the other half to see the
    hang and write its report, and never above `hang_after_ms`. A value the user set (`explicit`) is
    theirs, off (None) included: `pair_note` says when it is too late.
    """
    if explicit or hang_after_ms is None:
        return hang_after_ms
    return min(hang_after_ms, timeout_s * 1000.0 / 2)


def header(hang_after: float | None, explicit: bool) -> str:
    """What the run header says the plugin does for the tests pytest-timeout times."""
    if not explicit:
        return f"hangs under pytest-timeout: reported after half a test's timeout, at most {hang_after or 0:g} ms"
    if hang_after is None:
        return "hangs under pytest-timeout: not reported (hang_after_ms=0)"
    return f"hangs under pytest-timeout: reported after hang_after_ms={hang_after:g} (set by you, kept)"


def pair_note(timeout_s: float, hang_after: float | None, threshold_ms: float | None, nodeid: str) -> str | None:
    """What to say when the user's settings report a hang of this test only after its timeout (None: in time)."""
    if hang_after is None:  # switched off on purpose
        return None
    # The watchdog calls a step hung only once it is past the stall threshold too.
    effective = max(hang_after, threshold_ms or 0.0)
    timeout_ms = timeout_s * 1000.0
    if effective < timeout_ms:
        return None
    which = "hang_after_ms" if effective == hang_after else "threshold_ms (a hang is reported from it at the earliest)"
    return (
        f"aiocop: {which}={effective:g} is not below pytest-timeout's timeout of {timeout_s:g} s "
        f"({nodeid}): a hung loop is not reported before the timeout ends the test. Set the pair, e.g. "
        f"--timeout={timeout_s:g} --aiocop-hang-after-ms={timeout_ms / 2:g} "
        f"(ini: timeout = {timeout_s:g} and aiocop_hang_after_ms = {timeout_ms / 2:g})"
    )


def ends_by_exit(method: object) -> bool:
    """Whether pytest-timeout ends the test with `os._exit` (its "thread" method) rather than an exception."""
    # Its "signal" method falls back to a timer thread off the main thread, as it does.
    return method == "thread" or threading.current_thread() is not threading.main_thread()


def terminal_fd() -> int | None:
    """A copy of the process's stderr, taken before a test captures it (at configure, capture is paused)."""
    with contextlib.suppress(OSError):  # no stderr at all (closed): hang reports stay in the test's output
        return os.dup(2)
    return None


def write(fd: int, text: str) -> None:
    """Write `text` on a line of its own to `fd` now, whole (from the watchdog's thread, while the test hangs)."""
    data = f"\n{text}\n".encode("utf-8", "backslashreplace")
    with contextlib.suppress(OSError):  # the terminal gone (closed, a broken pipe): nothing to tell it
        while data:
            data = data[os.write(fd, data) :]
