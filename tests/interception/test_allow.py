"""Allow rules, global and scoped, and the built-in harmless internals."""

from __future__ import annotations

import asyncio
import contextvars
import os
import sys
import threading
import time
import traceback
import warnings
from typing import TYPE_CHECKING, Any

import pytest

import aiocop
from aiocop._interception import allow as _allow
from aiocop._interception import scope as _scope
from aiocop._interception import wrappers as _wrappers
from tests.conftest import Collector, run_on
from tests.support import blocking_calls

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Callable, Iterator


def test_allow_by_event_globally(detector: Collector, loop_name: str) -> None:
    rule = aiocop.add_allow_rule("os.stat")

    async def main() -> None:
        os.stat(".")
        os.listdir(".")

    run_on(loop_name, main())
    assert detector.names() == ["os.listdir"]
    aiocop.remove_allow_rule(rule)
    assert aiocop.get_allow_rules() == []


def test_allow_by_module(detector: Collector, loop_name: str) -> None:
    aiocop.add_allow_rule(module="tests.support.blocking_calls")

    async def main() -> None:
        blocking_calls.do_stat()
        os.stat(".")

    run_on(loop_name, main())
    assert [c["entry_point"].rsplit(":", 1)[1] for c in detector.calls] == ["main"]


def test_allow_by_path_prefix(detector: Collector, loop_name: str) -> None:
    aiocop.add_allow_rule(path=os.path.dirname(__file__))  # the folder of this file, whose main() calls

    async def main() -> None:
        os.stat(".")

    run_on(loop_name, main())
    assert detector.names() == []


def test_allow_by_call_site(detector: Collector, loop_name: str) -> None:
    aiocop.add_allow_rule(call_site="tests/support/blocking_calls.py:do_listdir")

    async def main() -> None:
        blocking_calls.do_listdir()
        blocking_calls.do_stat()

    run_on(loop_name, main())
    assert detector.names() == ["os.stat"]


def test_scoped_allow_as_context_manager_and_decorator(detector: Collector, loop_name: str) -> None:
    @aiocop.allow_blocking("os.listdir")
    async def allowed_listing() -> None:
        await asyncio.sleep(0)
        os.listdir(".")

    async def main() -> None:
        with aiocop.allow_blocking("os.stat"):
            os.stat(".")
        await allowed_listing()
        os.stat(".")  # outside the scope again

    run_on(loop_name, main())
    assert detector.names() == ["os.stat"]


def test_scopes_decorate_generators_around_each_resumption(detector: Collector, loop_name: str) -> None:
    # A generator runs a bit at each resumption, in its consumer's context:
    # the scope covers the generator's own code, never the consumer's.
    @aiocop.allow_blocking("os.stat")
    async def listing() -> AsyncGenerator[int, str | None]:
        for i in range(3):
            os.stat(".")
            sent = yield i
            assert sent in (None, "more")
            await asyncio.sleep(0)

    @aiocop.allow_blocking("os.stat")
    def numbers() -> Iterator[int]:
        for i in range(2):
            os.stat(".")
            yield i

    async def main() -> list[int]:
        seen = [i async for i in listing()]
        partial = listing()
        seen.append(await partial.__anext__())
        seen.append(await partial.asend("more"))
        await partial.aclose()
        for i in numbers():
            os.stat(".")  # the consumer's own call, between resumptions: reported
            seen.append(i)
        return seen

    assert run_on(loop_name, main()) == [0, 1, 2, 0, 1, 0, 1]
    assert detector.names() == ["os.stat", "os.stat"]


def test_scoped_allow_everything(detector: Collector, loop_name: str) -> None:
    async def main() -> None:
        with aiocop.allow_blocking():
            blocking_calls.do_sleep()
            blocking_calls.do_open_read()

    run_on(loop_name, main())
    assert detector.names() == []


def test_harmless_internals_are_not_reported(detector: Collector, loop_name: str) -> None:
    import sys

    async def main() -> None:
        for name in [m for m in list(sys.modules) if m.startswith("encodings.idna")]:
            del sys.modules[name]
        "bücher.example".encode("idna")  # lazily imports encodings.idna
        await asyncio.to_thread(lambda: None)  # Thread.start() and executor set-up
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)  # binds its socket
        server.close()
        await server.wait_closed()

    aiocop.register_blocking_event("socket.bind", aiocop.WEIGHT_TRIVIAL)
    run_on(loop_name, main())
    assert detector.names() == []


# The code of aiocop's wrapper of `with lock:` (one code object for every lock type it wraps).
_LOCK_ENTER_CODE = _wrappers._lock_enter(lambda lock: True, "threading.Lock.acquire").__code__


def _waiting_in_a_lock_wrapper(thread_id: int) -> bool:
    """Whether the thread waits in aiocop's `with lock:` wrapper past its audit hook (at its last line, the wait)."""
    frame = sys._current_frames().get(thread_id)
    if frame is None or frame.f_code is not _LOCK_ENTER_CODE:
        return False
    return frame.f_lineno == max(line for *_, line in _LOCK_ENTER_CODE.co_lines() if line is not None)


async def _hold(lock: Any) -> None:
    """Have another thread hold `lock` until this loop's thread waits for it in aiocop's wrapper."""
    loop_thread, held = threading.get_ident(), threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            deadline = time.monotonic() + 30  # a safety net: the control case below fails if it is reached
            while not _waiting_in_a_lock_wrapper(loop_thread) and time.monotonic() < deadline:
                time.sleep(0.001)

    threading.Thread(target=hold, daemon=True).start()
    await asyncio.to_thread(held.wait)


def test_a_futures_own_lock_held_for_a_moment_is_not_reported(detector: Collector, loop_name: str) -> None:
    # Found running Starlette's suite: anyio's portal calls future.cancelled()
    # on the loop as a call ends, while the test's thread holds the future's
    # Condition for a moment. `with` on a Condition puts threading's
    # __enter__ between the lock and concurrent.futures.
    import concurrent.futures

    async def main() -> None:
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        await _hold(future._condition)
        assert not future.cancelled()  # waits for the lock: not reported
        mine = threading.Condition()
        await _hold(mine)
        with mine:  # the same wait on the application's own Condition: reported
            pass

    run_on(loop_name, main())
    assert detector.names() == ["threading.Lock.acquire"]
    assert detector.calls[0]["entry_point"].endswith(":main")


def test_waiting_on_the_loop_for_another_threads_work_is_reported(detector: Collector, loop_name: str) -> None:
    # Future.result() and Queue.join() wait in Condition.wait, called from
    # concurrent.futures and queue: the rule for their brief locks must not
    # cover the wait for the work itself.
    import concurrent.futures
    import queue

    wait_code = _wrappers._condition_wait(lambda condition: True, "threading.Condition.wait").__code__
    loop_thread = threading.get_ident()

    def once_the_loop_waits_in(function: str) -> None:
        deadline = time.monotonic() + 30  # a safety net: the test fails if it is reached
        while time.monotonic() < deadline:
            frame = sys._current_frames().get(loop_thread)
            while frame is not None and frame.f_code is not wait_code:
                frame = frame.f_back
            if frame is not None and frame.f_back is not None and frame.f_back.f_code.co_name == function:
                return  # inside aiocop's wrapper of Condition.wait, called by `function`: reported, or about to be
            time.sleep(0.001)

    jobs: queue.Queue[int] = queue.Queue()

    def worker() -> None:
        once_the_loop_waits_in("join")
        jobs.get()
        jobs.task_done()

    async def main() -> None:
        pool.submit(once_the_loop_waits_in, "result").result()  # the loop waits for the work
        jobs.put(1)
        pool.submit(worker)
        jobs.join()  # and for the queue's work

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(int).result()  # its thread started before the loop runs
        run_on(loop_name, main())
    assert detector.names() == ["threading.Condition.wait", "threading.Condition.wait"]
    assert [call["trace"].split(" <- ")[0].rsplit(":", 1)[1] for call in detector.calls] == ["result", "join"]


def test_asyncio_debug_mode_tracebacks_are_not_reported(detector: Collector, loop_name: str) -> None:
    async def main() -> None:
        asyncio.get_running_loop().set_debug(True)
        await asyncio.sleep(0)
        fut = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(fut.set_result, None)
        await fut
        os.stat(".")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # debug mode's own checks
        run_on(loop_name, main())
    assert detector.names() == ["os.stat"]
    assert detector.calls[0]["entry_point"].endswith(":main")


def test_user_import_is_reported_once(detector: Collector, loop_name: str, tmp_path: object) -> None:
    import sys

    pkg = os.path.join(str(tmp_path), "lazy_user_module.py")
    with open(pkg, "w", encoding="utf-8") as f:
        f.write("with open(__file__) as f:\n    DATA = f.read()\n")
    sys.path.insert(0, str(tmp_path))
    try:

        async def main() -> None:
            import lazy_user_module  # noqa: F401

        run_on(loop_name, main())
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("lazy_user_module", None)
    assert detector.names() == ["import"]


@pytest.mark.parametrize("bad", [{"call_site": ""}, {"module": 3}])
def test_bad_rules(bad: dict[str, object]) -> None:
    with pytest.raises(TypeError):
        aiocop.AllowRule(**bad)  # type: ignore[arg-type]


# f_code reads made by aiocop's own frames: the expensive part of recording a
# call (each is an audit event of its own). Counted by an audit hook that
# stays (hooks cannot be removed) and counts only while `_reads` is a list.
_reads: list[str] | None = None


def _count_code_reads(event: str, args: tuple[object, ...]) -> None:
    if _reads is not None and event == "object.__getattr__" and args[1:] == ("f_code",):
        module = sys._getframe(1).f_globals.get("__name__")
        if isinstance(module, str) and module.startswith("aiocop"):
            _reads.append(module)


sys.addaudithook(_count_code_reads)


@pytest.fixture
def code_reads() -> Iterator[list[str]]:
    global _reads
    _reads = []
    try:
        yield _reads
    finally:
        _reads = None


def test_allowed_and_harmless_calls_are_dropped_before_their_trace_is_read(
    detector: Collector, loop_name: str, code_reads: list[str]
) -> None:
    # A debug-mode loop makes hundreds of harmless calls per connection (the
    # source lines of every callback's traceback): they, and allowed calls,
    # are decided on the stack's modules before aiocop reads any code object.
    aiocop.add_allow_rule("os.stat", module="tests.support.blocking_calls")
    silent: list[int] = []

    async def main() -> None:
        blocking_calls.do_stat()  # allowed, by module
        with aiocop.allow_blocking("os.listdir"):
            os.listdir(".")  # allowed, by scope
        traceback.extract_stack(limit=1)  # linecache stats this file: a harmless internal
        silent.append(len(code_reads))
        os.stat(".")  # reported: its trace is read

    run_on(loop_name, main())
    assert detector.names() == ["os.stat"]
    assert silent == [0]
    assert code_reads, "the reported call's trace reads code objects"


# --- a rule must say what it allows (issue 23) ------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(aiocop.add_allow_rule, id="add_allow_rule()"),
        pytest.param(aiocop.AllowRule, id="AllowRule()"),
        pytest.param(lambda: aiocop.AllowRule(events=()), id="AllowRule(events=())"),  # type: ignore[arg-type]  # a tuple
        pytest.param(lambda: aiocop.add_allow_rule(*[]), id="add_allow_rule(*empty_list)"),
    ],
)
def test_a_rule_with_nothing_to_match_is_refused(make: Callable[[], object]) -> None:
    # A rule built from an empty list or a blank setting would allow every call,
    # and a CI gate would pass on anything: it must be an error, never a rule.
    with pytest.raises(
        ValueError, match=r"an allow rule needs an event name or module=, path= or call_site="
    ) as raised:
        make()
    assert "everything=True" in str(raised.value)
    assert aiocop.get_allow_rules() == []


def test_allowing_everything_is_spelled_out(detector: Collector, loop_name: str) -> None:
    rule = aiocop.add_allow_rule(everything=True)
    assert rule == aiocop.AllowRule(everything=True)

    async def main() -> None:
        blocking_calls.do_sleep()
        os.stat(".")

    run_on(loop_name, main())
    assert detector.names() == []
    aiocop.remove_allow_rule(rule)
    run_on(loop_name, main())
    assert detector.names() == ["time.sleep", "os.stat"]


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: aiocop.AllowRule(everything=True, module="x"), ValueError, "takes no other field"),
        (lambda: aiocop.add_allow_rule("open", everything=True), ValueError, "takes no other field"),
        (lambda: aiocop.AllowRule(everything="yes"), TypeError, "everything must be True or False"),  # type: ignore[arg-type]
        (lambda: aiocop.add_allow_rule(everything=1), TypeError, "everything must be True or False"),  # type: ignore[arg-type]
        (lambda: aiocop.allow_blocking(everything="yes"), TypeError, "everything must be True or False"),  # type: ignore[arg-type]
        (
            lambda: aiocop.add_allow_rule(aiocop.AllowRule(everything=True), everything=True),
            TypeError,
            "either one AllowRule or the fields of one",
        ),
    ],
)
def test_everything_takes_nothing_else(make: Callable[[], object], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        make()
    assert aiocop.get_allow_rules() == []


def test_a_scope_with_no_argument_still_allows_everything_in_it(detector: Collector, loop_name: str) -> None:
    # `with allow_blocking():` names its extent: the scope is what is explicit.
    assert aiocop.allow_blocking().rule == aiocop.AllowRule(everything=True)
    assert aiocop.allow_blocking(everything=True).rule == aiocop.AllowRule(everything=True)

    async def main() -> None:
        with aiocop.allow_blocking(everything=True):
            blocking_calls.do_sleep()
        os.stat(".")

    run_on(loop_name, main())
    assert detector.names() == ["os.stat"]


def test_a_scope_entered_again_reuses_its_rule_and_its_compiled_matcher(detector: Collector, loop_name: str) -> None:
    # `with allow_blocking(...)` in a handler makes a new scope per request:
    # its rule is checked once per content, and the rules of the scope (with
    # the enclosing ones) are one object whose compiled matcher is kept.
    from aiocop._interception import allow as _allow

    assert aiocop.allow_blocking("os.stat").rule is aiocop.allow_blocking("os.stat").rule
    seen: list[tuple[object, object]] = []

    async def handler() -> None:
        with aiocop.allow_blocking(module="tests.support.blocking_calls"), aiocop.allow_blocking("os.stat"):
            os.stat(".")
            scoped = _allow.scoped_rules.get()
            seen.append((scoped, _allow.matcher("os.stat", scoped)))
        os.listdir(".")

    async def main() -> None:
        await asyncio.gather(handler(), handler(), handler())

    run_on(loop_name, main())
    assert detector.names() == ["os.listdir"] * 3
    assert len({id(scoped) for scoped, _ in seen}) == 1
    assert len({id(compiled) for _, compiled in seen}) == 1
    assert seen[0][0] == (
        aiocop.AllowRule(module="tests.support.blocking_calls"),
        aiocop.AllowRule(frozenset({"os.stat"})),
    )


def test_a_kept_scope_sees_global_rules_added_after_it_was_compiled(detector: Collector, loop_name: str) -> None:
    scope = aiocop.allow_blocking("open")

    async def main() -> None:
        with scope:
            os.listdir(".")
        aiocop.add_allow_rule("os.listdir")
        with scope:
            os.listdir(".")
            os.stat(".")

    run_on(loop_name, main())
    assert detector.names() == ["os.listdir", "os.stat"]


def test_a_kept_scope_rule_is_checked_again_once_its_event_is_unregistered() -> None:
    aiocop.register_blocking_event("tests.cost.event")
    try:
        assert aiocop.allow_blocking("tests.cost.event").rule.events == {"tests.cost.event"}
    finally:
        aiocop.unregister_blocking_event("tests.cost.event")
    with pytest.raises(ValueError, match=r"unknown event 'tests\.cost\.event'"):
        aiocop.allow_blocking("tests.cost.event")


def test_scopes_left_out_of_order_in_one_context_restore_everything_once_all_are_left() -> None:
    # Tasks sharing one context (veloxloop's) may leave their scopes out of
    # order: each leave undoes the innermost entry, whoever's it is.
    outer, inner = aiocop.allow_blocking("os.stat"), aiocop.allow_blocking("open")

    def enter_both_leave_outer_first() -> None:
        outer.__enter__()
        inner.__enter__()
        both = _allow.scoped_rules.get()
        outer.__exit__(None, None, None)
        assert _allow.scoped_rules.get() == (outer.rule,)  # inner's entry undone
        assert _allow.scoped_rules.get() != both
        inner.__exit__(None, None, None)
        assert _allow.scoped_rules.get() is _allow.NO_RULES
        assert _scope.entered.get() is None
        with pytest.raises(RuntimeError, match="allow_blocking"):
            inner.__exit__(None, None, None)

    contextvars.copy_context().run(enter_both_leave_outer_first)


def test_a_kept_scope_rule_is_checked_again_once_the_table_is_reset() -> None:
    aiocop.register_blocking_event("tests.cost.event")
    try:
        aiocop.allow_blocking("tests.cost.event", module="tests")
    finally:
        aiocop.reset_blocking_event_table()
    with pytest.raises(ValueError, match=r"unknown event 'tests\.cost\.event'"):
        aiocop.allow_blocking("tests.cost.event", module="tests")


@pytest.mark.parametrize("everything", [0, 1, None])
def test_a_kept_scope_never_stands_for_a_falsy_or_truthy_non_bool(everything: object) -> None:
    aiocop.allow_blocking("os.stat", everything=False)  # kept under a key 0 would equal
    with pytest.raises((TypeError, ValueError)):
        aiocop.allow_blocking("os.stat", everything=everything)  # type: ignore[arg-type]
