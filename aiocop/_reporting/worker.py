"""The delivery thread: events delivered off the loops' threads, from a bounded queue.

With `delivery="thread"`, and for what a stopped loop can no longer run
(stall reports after its last step, steps whose delivery callback never
ran), groups and calls are queued here and delivered by one daemon thread.
The queue is bounded (`MAX_PENDING`): a callback slower than events arrive
makes aiocop drop, count and log events, never grow without bound.
`drain` (at `stop()` and at exit) delivers what is queued within `DRAIN_S`.

May import: aiocop._common, aiocop._interception.
"""

from __future__ import annotations

import logging
import threading
from queue import SimpleQueue
from typing import TYPE_CHECKING

from aiocop._common import forksafe as _forksafe
from aiocop._common.clock import monotonic, perf_counter
from aiocop._interception import hook as _hook

if TYPE_CHECKING:
    from collections.abc import Callable

    from aiocop._interception.hook import StepGroup

logger = logging.getLogger("aiocop")


# How long a stopping loop waits for the delivery thread to report its last
# steps (delivery="thread"): every event reaches its callback before
# `asyncio.run()` returns, unless a callback is this slow.
STOP_WAIT_S = 2.0


# Steps queued for the delivery thread at most (its documented capacity). A
# callback slower than the events arrive (a network exporter) must not make
# memory grow without bound: past this, new steps are dropped, counted and
# logged, never silently.
MAX_PENDING = 10_000


_DROP_LOG_INTERVAL_S = 10.0


# stop() (and the exit) waits this long for the queue to be delivered; what
# is left then is dropped, counted and logged. A callback running at that
# moment is waited for, up to _CALLBACK_WAIT_S more: none starts afterwards.
DRAIN_S = 1.0


_CALLBACK_WAIT_S = 5.0


class Worker:
    """A daemon thread that delivers groups off the loop threads, from a bounded queue."""

    def __init__(
        self, deliver: Callable[[StepGroup], None], claim_all: Callable[[list[StepGroup]], list[StepGroup]]
    ) -> None:
        # What delivering a group and claiming stranded groups are (delivery's own functions: it sits above).
        self._deliver = deliver
        self._claim_all = claim_all
        # Items: groups to deliver, stall reports (calls), or an Event to set
        # once everything queued before it has been handled (see drain).
        self._queue: SimpleQueue[list[StepGroup] | threading.Event | Callable[[], None]] = SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = _forksafe.lock()
        self._queued = 0  # steps put, under _lock
        self._handled = 0  # steps taken and handled (or dropped): written by the worker thread only
        # Set by drain() when out of time: every item queued before this
        # marker is dropped, not delivered. Cleared by the worker alone, as it
        # reaches the marker: nothing queued before stop() runs after it.
        self._discard_until: threading.Event | None = None
        self.dropped = 0  # steps dropped, since the process started
        self._dropped_logged = 0
        self._last_drop_log = 0.0

    def pending(self) -> int:
        return self._queued - self._handled

    def submit(self, groups: list[StepGroup]) -> None:
        if self._thread is None:
            self._start()
        with self._lock:
            room = MAX_PENDING - (self._queued - self._handled)
            kept = groups if len(groups) <= room else groups[: max(room, 0)]
            self.dropped += len(groups) - len(kept)
            self._queued += len(kept)
        if kept:
            self._queue.put(kept)
        if len(kept) < len(groups):
            self._log_dropped(at_most_every=_DROP_LOG_INTERVAL_S)

    def submit_call(self, call: Callable[[], None]) -> None:
        if self._thread is None:
            self._start()
        with self._lock:
            full = self._queued - self._handled >= MAX_PENDING
            if full:
                self.dropped += 1
            else:
                self._queued += 1
        if full:
            self._log_dropped(at_most_every=_DROP_LOG_INTERVAL_S)
        else:
            self._queue.put(call)

    def _log_dropped(self, at_most_every: float = 0.0) -> None:
        now = monotonic()
        new = self.dropped - self._dropped_logged
        if new <= 0 or now - self._last_drop_log < at_most_every:
            return
        self._dropped_logged, self._last_drop_log = self.dropped, now
        logger.warning(
            "aiocop: %d event(s) dropped (%d in all): the slow-task callbacks run slower than events arrive "
            "(delivery='thread' keeps at most %d waiting, and stop() delivers for %.0f s); make them faster, "
            "or sample fewer requests",
            new,
            self.dropped,
            MAX_PENDING,
            DRAIN_S,
        )

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="aiocop-delivery", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _SHUTDOWN:
                return
            if isinstance(item, threading.Event):
                if item is self._discard_until:
                    self._discard_until = None
                item.set()
                continue
            steps = 1 if callable(item) else len(item)
            try:
                if self._discard_until is not None:
                    with self._lock:  # loop threads count their drops too (in submit)
                        self.dropped += steps
                else:
                    self._handle(item)
            except BaseException:  # this thread must outlive anything a delivery raises
                _hook._internal_error("delivering off the loop")
            finally:
                self._handled += steps

    def _handle(self, item: list[StepGroup] | Callable[[], None]) -> None:
        if callable(item):
            item()
            return
        for group in item:
            if not group.t_end:
                group.t_end = perf_counter()
            # A copy: the loop thread may still be inside the original.
            group.context.copy().run(self._deliver, group)

    def wait(self, timeout: float) -> bool:
        """Wait until what is queued now has been handled; False if `timeout` passed first."""
        thread = self._thread
        if thread is None or not thread.is_alive() or thread is threading.current_thread():
            return False
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout)

    def drain(self, timeout: float | None = None) -> None:
        """Deliver what is queued, within `timeout`; drop (count, log) what is left; no callback starts after.

        The callback running when time is up is waited for (up to
        `_CALLBACK_WAIT_S`): returns within `timeout` plus that callback.
        Then deliver what was never scheduled, on this thread.
        """
        if timeout is None:
            timeout = DRAIN_S  # read now: a test may shorten it
        thread = self._thread
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            done = threading.Event()
            self._queue.put(done)
            if not done.wait(timeout):
                # Out of time: the rest, up to the marker, is dropped by the
                # worker (quickly); only the callback running now is waited for.
                self._discard_until = done
                if done.is_set():  # the worker reached the marker meanwhile: nothing left to drop
                    self._discard_until = None
                elif not done.wait(_CALLBACK_WAIT_S):
                    logger.warning(
                        "aiocop: a slow-task callback has been running for over %.0f s; stop() returns without "
                        "waiting for it (no other callback will start)",
                        timeout + _CALLBACK_WAIT_S,
                    )
        self._log_dropped()
        for group in self._claim_all(list(_hook.unclaimed)):
            if not group.t_end:
                group.t_end = perf_counter()
            group.context.copy().run(self._deliver, group)

    def shutdown(self) -> None:
        """End the thread once what is queued has been handled (an attach session leaving its target)."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            self._queue.put(_SHUTDOWN)  # type: ignore[arg-type]
            thread.join(STOP_WAIT_S)

    def reinit_after_fork(self) -> None:
        self.__init__(self._deliver, self._claim_all)  # type: ignore[misc]


_SHUTDOWN = object()
