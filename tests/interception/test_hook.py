"""Blocking calls are reported at the caller's line, on every loop and in every context."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import socket
import ssl
import sys
import threading
from typing import Any

import pytest

import aiocop
from tests.conftest import Collector, loop_factory, quiet_rloop, run_in_thread, run_on
from tests.support.blocking_calls import CASES, Case, do_bound_sleep

LOOP_MODULES = {
    "asyncio": "asyncio.",
    "uvloop": "uvloop.",
    "winloop": "winloop.",
    "rloop": "rloop.",
    "veloxloop": "veloxloop",
}
CASE_PARAMS = [pytest.param(case, id=case.name) for case in CASES]


def assert_reported_once(detector: Collector, case: Case) -> None:
    matching = [c for c in detector.calls if c["name"] == case.event]
    assert len(matching) == 1, f"{case.event} reported {len(matching)} times: {detector.names()}"
    same_line = [c["name"] for c in detector.calls if c["entry_point"] == matching[0]["entry_point"]]
    assert same_line == [case.event], "one call, one report (not also its internals)"
    assert matching[0]["entry_point"].endswith(case.site), matching[0]
    assert matching[0]["trace"].startswith(case.site) or case.site in matching[0]["trace"]


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_in_task(detector: Collector, loop_name: str, case: Case) -> None:
    async def main() -> None:
        case.func()

    run_on(loop_name, main())
    assert_reported_once(detector, case)
    event = next(e for e in detector.events if any(c["name"] == case.event for c in e.blocking_events))
    assert event.reason == "io_blocking"
    assert event.task_name is not None
    assert event.loop.startswith(LOOP_MODULES[loop_name])


def test_a_kept_event_names_its_task_and_keeps_no_task_alive(detector: Collector, loop_name: str) -> None:
    # The task's name is asked for only once the callbacks are done, and only
    # of an event one of them kept (get_name() formats a default name at its
    # first call): read long after its task is gone, it is still there.
    import gc
    import weakref

    tasks: list[weakref.ref[asyncio.Task[Any]]] = []

    async def blocks() -> None:
        os.stat(".")

    async def main() -> None:
        for name in ("named-task", None):
            task = asyncio.ensure_future(blocks())
            if name is not None:
                task.set_name(name)
            tasks.append(weakref.ref(task))
            await task
            del task
        await asyncio.sleep(0)

    run_on(loop_name, main())
    gc.collect()
    assert [ref() for ref in tasks] == [None, None], "a kept event keeps its task alive"
    names = [event.task_name for event in detector.events]
    assert names[0] == "named-task"
    assert isinstance(names[1], str) and names[1], names  # a default name ("Task-N"), read after the task went
    assert len(names) == 2


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_in_call_later_callback(detector: Collector, loop_name: str, case: Case) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def callback() -> None:
            case.func()
            done.set_result(None)

        loop.call_later(0.001, callback)
        await done

    run_on(loop_name, main())
    assert_reported_once(detector, case)
    event = next(e for e in detector.events if any(c["name"] == case.event for c in e.blocking_events))
    assert event.task_name is None  # a plain callback, not a task


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_in_protocol_data_received(detector: Collector, loop_name: str, case: Case) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        class Server(asyncio.Protocol):
            def data_received(self, data: bytes) -> None:
                case.func()
                done.set_result(data)

        server = await loop.create_server(Server, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        transport, _ = await loop.create_connection(asyncio.Protocol, "127.0.0.1", port)
        transport.write(b"ping")
        await asyncio.wait_for(done, 10)
        transport.close()
        server.close()
        await server.wait_closed()

    run_on(loop_name, main())
    assert_reported_once(detector, case)


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_in_loop_of_non_main_thread(detector: Collector, loop_name: str, case: Case) -> None:
    async def main() -> None:
        case.func()

    run_in_thread(loop_name, main)
    assert_reported_once(detector, case)
    assert detector.events[0].thread_name == "loop-thread"


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_in_second_run(detector: Collector, loop_name: str, case: Case) -> None:
    async def main() -> None:
        case.func()

    run_on(loop_name, main())
    run_on(loop_name, main())
    matching = [c for c in detector.calls if c["name"] == case.event]
    assert len(matching) == 2
    assert all(c["entry_point"].endswith(case.site) for c in matching)


def test_second_asyncio_run(detector: Collector) -> None:
    async def main() -> None:
        CASES[0].func()

    asyncio.run(main())
    asyncio.run(main())
    assert detector.names() == ["time.sleep", "time.sleep"]


def test_several_loops_in_several_threads_at_once(detector: Collector, loop_name: str) -> None:
    started = threading.Barrier(3)

    async def main() -> None:
        await asyncio.get_running_loop().run_in_executor(None, started.wait)
        CASES[2].func()  # os.stat
        await asyncio.sleep(0)
        CASES[0].func()  # time.sleep
        await asyncio.get_running_loop().run_in_executor(None, started.wait)

    def run_one() -> None:
        # One run per loop, all of them running at once. (rloop 0.5 closes a
        # stale fd when one loop stops while another starts in a parallel
        # thread, with or without aiocop; one start and stop per loop, with
        # every start before any stop, keeps its race out of this test.)
        loop = loop_factory(loop_name)()
        try:
            loop.run_until_complete(main())
        finally:
            loop.close()

    threads = [threading.Thread(target=run_one, name=f"t{i}") for i in range(3)]
    with quiet_rloop(loop_name):
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert sorted(detector.names()) == ["os.stat"] * 3 + ["time.sleep"] * 3
    assert {e.thread_name for e in detector.events} == {"t0", "t1", "t2"}


@pytest.mark.skipif(sys.version_info < (3, 13), reason="time.sleep has a native audit event from 3.13")
def test_sleep_bound_before_setup_is_caught_by_native_event(detector: Collector, loop_name: str) -> None:
    async def main() -> None:
        do_bound_sleep()

    run_on(loop_name, main())
    assert [c["entry_point"].split(":")[1] for c in detector.calls if c["name"] == "time.sleep"]


@pytest.mark.skipif(sys.version_info >= (3, 13), reason="before 3.13 only the wrapper sees time.sleep")
def test_sleep_bound_before_setup_is_invisible_to_interception(detector: Collector, loop_name: str) -> None:
    # `from time import sleep` taken before patching holds the original
    # function: interception cannot see it (the stall watchdog can).
    async def main() -> None:
        do_bound_sleep()

    run_on(loop_name, main())
    assert "time.sleep" not in detector.names()


@pytest.mark.skipif(sys.version_info < (3, 12), reason="eager tasks are new in 3.12")
@pytest.mark.parametrize("how", ["eager_task_factory", "eager_start"])
def test_eager_tasks_and_create_task_keywords(detector: Collector, how: str) -> None:
    # 3.14 passes create_task()'s keyword arguments (eager_start, ...) on to
    # the task factory: everything aiocop touches must keep accepting them,
    # and an eager task's first step, run inside its creator's step, is still
    # reported at its own line, under its own name.
    if how == "eager_start" and sys.version_info < (3, 14):
        pytest.skip("create_task(eager_start=...) is new in 3.14")

    async def child() -> str:
        CASES[2].func()  # os.stat, in the eager first step
        await asyncio.sleep(0)
        return "done"

    async def main() -> str:
        loop = asyncio.get_running_loop()
        if how == "eager_task_factory" and sys.version_info >= (3, 12):  # 3.12+: the skip (mypy reads 3.10)
            loop.set_task_factory(asyncio.eager_task_factory)
            task = asyncio.create_task(child(), name="eager-child")
        else:
            task = asyncio.create_task(child(), name="eager-child", eager_start=True)  # type: ignore[call-arg]
        return await task

    assert run_on("asyncio", main()) == "done"
    assert detector.names() == ["os.stat"]
    assert detector.calls[0]["entry_point"].endswith(CASES[2].site)
    assert detector.events[0].task_name == "eager-child"


def test_arguments_say_what_they_were_at_the_call(detector: Collector, tmp_path: Any) -> None:
    # A socket closed before delivery is still shown as it was (its repr,
    # read later, says "closed, fd=-1"); an import shows its module, not the
    # live sys.path and sys.meta_path the audit event also carries.
    (tmp_path / "lazily_imported_here.py").write_text("X = 1\n", encoding="utf-8")
    sys.path.insert(0, str(tmp_path))

    async def main() -> int:
        left, right = socket.socketpair()
        with left, right:
            fd = left.fileno()
            left.send(b"x")  # a blocking socket
        import lazily_imported_here  # noqa: F401 - the import is the call under test

        return fd

    try:
        fd = run_on("asyncio", main())
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("lazily_imported_here", None)
    args = {call["name"]: call["args"] for call in detector.calls}
    assert args["socket.socket.send"] == f"<socket fd={fd} AF_UNIX SOCK_STREAM>", args
    assert args["import"] == "lazily_imported_here", args


# --- certificates, keys and TLS (issue 30) ------------------------------------------------------

TLS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "tls")
CERT, KEY, DH = (os.path.join(TLS, name) for name in ("cert.pem", "key.pem", "dh.pem"))


def load_certificates() -> None:
    ssl.create_default_context()  # LOADS ssl.SSLContext.set_default_verify_paths
    ssl.create_default_context(cafile=CERT)  # LOADS ssl.SSLContext.load_verify_locations
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(CERT, keyfile=KEY)  # LOADS ssl.SSLContext.load_cert_chain
    context.load_dh_params(DH)  # LOADS open  (CPython opens this file itself: its own event)
    ssl.get_default_verify_paths()  # LOADS ssl.get_default_verify_paths
    context.load_verify_locations(cadata=PEM)  # in memory: reads no file, not reported


with open(CERT, encoding="ascii") as _pem:
    PEM = _pem.read()


def marked_lines(func: Any, marker: str) -> list[tuple[str, str]]:
    """(event, site) for each line of `func` marked `# MARKER event`."""
    lines, first = inspect.getsourcelines(func)
    return [
        (text.split(f"# {marker} ")[1].split()[0], f"tests/interception/test_hook.py:{first + i}:{func.__name__}")
        for i, text in enumerate(lines)
        if f"# {marker} " in text
    ]


def test_certificate_and_key_loading_is_reported_at_its_line(detector: Collector, loop_name: str) -> None:
    # OpenSSL reads these files itself: no audit event, no Python I/O. A TLS
    # context made per request is a classic stall (36 ms in issue 30's report).
    async def main() -> None:
        load_certificates()

    run_on(loop_name, main())
    reported = [(c["name"], c["entry_point"]) for c in detector.calls]
    assert reported == marked_lines(load_certificates, "LOADS"), detector.calls
    weights = {c["name"]: c["severity"] for c in detector.calls}
    assert weights["ssl.SSLContext.set_default_verify_paths"] == aiocop.WEIGHT_HEAVY
    assert weights["ssl.SSLContext.load_cert_chain"] == aiocop.WEIGHT_MODERATE
    assert CERT in detector.calls[1]["args"]
    assert KEY in detector.calls[2]["args"]


def tls_echo_server(context: ssl.SSLContext) -> tuple[int, threading.Thread]:
    """A blocking TLS echo server on 127.0.0.1, one connection, in a thread."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with listener:
            connection, _ = listener.accept()
            # The client closes without TLS's close_notify: an EOF error here.
            with context.wrap_socket(connection, server_side=True) as tls, contextlib.suppress(OSError):
                while data := tls.recv(1 << 16):
                    tls.sendall(data)

    thread = threading.Thread(target=serve, name="tls-echo")
    thread.start()
    return listener.getsockname()[1], thread


def talk_tls_blocking(port: int, context: ssl.SSLContext) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as plain:
        tls = context.wrap_socket(plain, server_hostname="localhost", do_handshake_on_connect=False)
        tls.do_handshake()  # TLS ssl.SSLSocket.do_handshake
        tls.send(b"x" * 10)  # TLS ssl.SSLSocket.write
        tls.sendall(b"y" * 100_000)  # TLS ssl.SSLSocket.write
        tls.recv(10)  # TLS ssl.SSLSocket.read
        tls.close()


def test_a_tls_handshake_on_a_blocking_socket(detector: Collector, loop_name: str) -> None:
    # Contexts made before the loop: only the connection's own calls count.
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(CERT, KEY)
    client_context = ssl.create_default_context(cafile=CERT)
    port, server = tls_echo_server(server_context)

    async def main() -> None:
        talk_tls_blocking(port, client_context)

    try:
        run_on(loop_name, main())
    finally:
        server.join(10)
    reported = [(c["name"], c["entry_point"]) for c in detector.calls if c["name"].startswith("ssl.")]
    assert reported == marked_lines(talk_tls_blocking, "TLS"), detector.calls


def test_the_loops_own_tls_is_not_blocking(detector: Collector, loop_name: str) -> None:
    # asyncio and uvloop run TLS over memory BIOs on non-blocking sockets:
    # neither side's handshake, reads or writes is the application's blocking call.
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(CERT, KEY)
    client_context = ssl.create_default_context(cafile=CERT)

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(await reader.readexactly(5))
        await writer.drain()
        writer.close()

    async def main() -> bytes:
        try:
            server = await asyncio.start_server(echo, "127.0.0.1", 0, ssl=server_context)
        except NotImplementedError:
            return b"no TLS"
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client_context, server_hostname="localhost"
        )
        writer.write(b"hello")
        data = await reader.readexactly(5)
        writer.close()
        server.close()
        return data

    result = run_on(loop_name, main())
    if result == b"no TLS":
        pytest.skip(f"{loop_name} has no TLS servers (NotImplementedError)")
    assert result == b"hello"
    assert detector.names() == [], detector.calls
