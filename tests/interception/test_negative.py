"""What must never be reported: executor threads, code outside loops, the loops' own I/O."""

from __future__ import annotations

import asyncio
import contextlib
import linecache
import os
import shutil
import socket
import sqlite3
import tempfile
import time
import traceback
from typing import Any

import pytest

from tests.conftest import Collector, run_on, run_python
from tests.support import blocking_calls
from tests.support.blocking_calls import CASES, Case

CASE_PARAMS = [pytest.param(case, id=case.name) for case in CASES]


def test_pure_async_tasks_are_never_reported(detector: Collector, loop_name: str) -> None:
    async def tick() -> None:
        for _ in range(10):
            await asyncio.sleep(0)

    async def main() -> None:
        await asyncio.gather(*(tick() for _ in range(200)))

    run_on(loop_name, main())
    assert detector.events == []


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_blocking_calls_in_executor_threads_while_loop_is_busy(detector: Collector, loop_name: str, case: Case) -> None:
    async def busy() -> None:
        # Keep the loop thread itself busy (no blocking call) meanwhile.
        end = time.perf_counter() + 0.02
        while time.perf_counter() < end:
            await asyncio.sleep(0)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        await asyncio.gather(
            loop.run_in_executor(None, case.func),
            asyncio.to_thread(case.func),
            busy(),
        )

    run_on(loop_name, main())
    assert detector.names() == []


def test_loopback_echo_over_streams(detector: Collector, loop_name: str) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1024):
            writer.write(data)
            await writer.drain()
        writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        payload = b"x" * 1024
        for _ in range(200):
            writer.write(payload)
            await writer.drain()
            assert await reader.readexactly(len(payload)) == payload
        writer.close()
        await writer.wait_closed()
        server.close()
        await server.wait_closed()

    run_on(loop_name, main())
    assert detector.names() == []


def test_non_blocking_socket_send(detector: Collector, loop_name: str) -> None:
    async def main() -> None:
        a, b = socket.socketpair()
        with a, b:
            a.setblocking(False)
            b.setblocking(False)
            a.send(b"x")
            a.sendall(b"y")
            assert b.recv(2) == b"xy"

    run_on(loop_name, main())
    assert detector.names() == []


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_blocking_calls_before_any_loop_runs(detector: Collector, case: Case) -> None:
    case.func()
    assert detector.names() == []


def test_zero_timeouts_and_free_locks_are_not_blocking(detector: Collector, loop_name: str) -> None:
    import queue
    import select
    import threading

    async def main() -> None:
        time.sleep(0)
        select.select([], [], [], 0)
        threading.Event().wait(0)
        done = threading.Event()
        done.set()
        done.wait()
        lock = threading.Lock()
        with lock:
            pass
        lock.acquire()
        lock.release()
        rlock = threading.RLock()
        with rlock, rlock:
            pass
        q: queue.Queue[int] = queue.Queue()
        q.put(1)
        q.get()
        q.get(block=False) if not q.empty() else None

    run_on(loop_name, main())
    assert detector.names() == []


def test_asyncio_joining_its_default_executor_at_shutdown(detector: Collector) -> None:
    # asyncio.run() ends with shutdown_default_executor(): once the executor
    # is shut down, asyncio joins the thread that did it, which may not have
    # quite finished. Make sure it has not, as on a loaded machine.
    async def main() -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, int)
        shut_down = loop._do_shutdown  # type: ignore[attr-defined]

        def slow_to_finish(future: asyncio.Future[None]) -> None:
            shut_down(future)
            time.sleep(0.05)  # the future is resolved; the thread is still alive

        loop._do_shutdown = slow_to_finish  # type: ignore[attr-defined]
        await loop.shutdown_default_executor()
        os.stat(".")  # and a real blocking call, still reported

    run_on("asyncio", main())
    assert detector.names() == ["os.stat"]


# --- classes of internals (docs: detected calls, "known-harmless internals") ------------------


def test_a_unix_server_replacing_a_stale_socket_file(detector: Collector, loop_name: str, tmp_path: Any) -> None:
    # asyncio's create_unix_server stats (and removes) a stale socket file
    # before binding: the loop's own work, as the bind of create_server.
    path = str(tmp_path / "s.sock")
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(path)
    stale.close()  # the file stays behind, as after a crashed server

    async def main() -> None:
        try:
            server = await asyncio.get_running_loop().create_unix_server(asyncio.Protocol, path)
        except NotImplementedError:
            pytest.skip(f"{loop_name} has no create_unix_server")
        server.close()
        await server.wait_closed()  # (3.13+ removes the socket file here)
        os.stat(".")  # and a real blocking call, still reported

    run_on(loop_name, main())
    assert detector.names() == ["os.stat"], detector.calls


# its subprocess is given 60 s: the test's own timeout sits above it, so that bound fires first (issue 36)
@pytest.mark.timeout(90)
def test_a_stdlib_module_imported_on_first_use_by_c_code() -> None:
    # datetime.strptime() imports _strptime the first time it is called: an
    # import the application's line does not make. An import statement of a
    # stdlib module at that line is still reported.
    result = run_python(
        """
        import asyncio, datetime
        import aiocop
        aiocop.start_blocking_io_detection()
        aiocop.register_slow_task_callback(
            lambda e: print(*(call["name"] + " " + call["args"] for call in e.blocking_events), sep="\\n")
        )

        async def main():
            datetime.datetime.strptime("2026-11-25", "%Y-%m-%d")
            import _pydecimal

        asyncio.run(main())
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["import _pydecimal"], result.stdout


def test_a_stdlib_function_with_an_event_of_its_own_is_one_report(detector: Collector, loop_name: str) -> None:
    # Each of these raises its own event, then touches many files: a
    # TemporaryDirectory's exit was shutil.rmtree and six calls inside it.
    async def main() -> None:
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "a"), "w") as out:
                out.write("a")
            shutil.copyfile(os.path.join(folder, "a"), os.path.join(folder, "b"))
            for _ in os.walk(folder):
                pass

    run_on(loop_name, main())
    assert detector.names() == ["tempfile.mkdtemp", "open", "shutil.copyfile", "os.walk", "shutil.rmtree"]


def test_an_in_memory_sqlite_database_is_not_a_blocking_call(detector: Collector, loop_name: str) -> None:
    async def main() -> None:
        sqlite3.connect(":memory:").close()
        sqlite3.connect("file::memory:?cache=shared", uri=True).close()
        sqlite3.connect(blocking_calls.SQLITE_FILE).close()  # a file: reported

    run_on(loop_name, main())
    assert detector.names() == ["sqlite3.connect"]  # the file (its path is bytes in 3.10's event)


def test_an_optional_module_that_is_not_installed_is_reported_once(detector: Collector, loop_name: str) -> None:
    # httpcore tries `import sniffio` on every request and carries on without
    # it: the first failed search of sys.path is real blocking and reported;
    # the same failure again, on every request, is not.
    missing = f"aiocop_optional_module_not_installed_{loop_name}"  # a new name per run: failures are remembered

    async def request() -> None:
        with contextlib.suppress(ImportError):
            __import__(missing)  # as `import missing`, with a name made at run time
        await asyncio.sleep(0)

    async def main() -> None:
        for _ in range(3):
            await request()
        await asyncio.sleep(0)  # the last step's delivery

    run_on(loop_name, main())
    assert detector.names() == ["import"], detector.calls
    assert missing in detector.calls[0]["event"]


def test_source_lines_read_to_format_a_traceback(detector: Collector, loop_name: str) -> None:
    # traceback.format_exc() in an error handler (Starlette's error
    # middleware) reads the source of every frame through linecache.
    async def main() -> str:
        linecache.clearcache()
        try:
            raise ValueError("handled")
        except ValueError:
            text = traceback.format_exc()
        os.stat(".")  # and a real blocking call, still reported
        return text

    assert "handled" in run_on(loop_name, main())
    assert detector.names() == ["os.stat"], detector.calls


def test_the_loops_own_subprocess_start(detector: Collector, loop_name: str) -> None:
    # asyncio's documented way to run a process (issue 30: haffmpeg in Home
    # Assistant was told to use asyncio.to_thread); subprocess.run() in the
    # same step is the application's blocking call, still reported.
    if loop_name == "veloxloop":
        pytest.skip("veloxloop 0.2 has no subprocess support (NotImplementedError)")

    async def main() -> None:
        process = await asyncio.create_subprocess_exec("true")
        await process.wait()
        process = await asyncio.create_subprocess_shell("true")
        await process.wait()
        loop = asyncio.get_running_loop()
        exited = loop.create_future()

        class Protocol(asyncio.SubprocessProtocol):
            def process_exited(self) -> None:
                exited.set_result(None)

        transport, _ = await loop.subprocess_exec(Protocol, "true")
        await exited
        transport.close()
        transport, _ = await loop.subprocess_shell(asyncio.SubprocessProtocol, "true")
        transport.close()
        blocking_calls.do_subprocess()

    run_on(loop_name, main())
    assert detector.names() == ["subprocess.Popen"], detector.calls
    assert detector.calls[0]["entry_point"].endswith(blocking_calls.CASES[7].site)


def test_asyncio_sendfile_on_its_own_non_blocking_socket(detector: Collector, loop_name: str, tmp_path: Any) -> None:
    # aiohttp's FileResponse: loop.sendfile() sends with os.sendfile(), a
    # chunk per writable event, on the transport's non-blocking socket
    # (issue 24). os.sendfile() onto a blocking socket stays reported.
    path = tmp_path / "payload"
    payload = os.urandom(1 << 20)
    path.write_bytes(payload)

    async def main() -> bool:
        loop = asyncio.get_running_loop()
        received = bytearray()
        done = loop.create_future()

        class Sink(asyncio.Protocol):
            def data_received(self, data: bytes) -> None:
                received.extend(data)
                if len(received) == len(payload):
                    done.set_result(None)

        server = await loop.create_server(Sink, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        transport, _ = await loop.create_connection(asyncio.Protocol, "127.0.0.1", port)
        try:
            await loop.sendfile(transport, file)
        except NotImplementedError:
            return False
        finally:
            transport.close()
            server.close()
        await done  # every byte arrived
        a, b = socket.socketpair()
        with a, b, path.open("rb") as again:
            os.sendfile(a.fileno(), again.fileno(), 0, 16)  # the application's own, blocking: reported
        return True

    # Opened here, not in the loop's executor as aiohttp does: veloxloop 0.2
    # never frees a loop that served, and its executor's threads spin for as
    # long as the loop lives (tests/conftest.py, _no_loop_runtime_left).
    with path.open("rb") as file:
        sent = run_on(loop_name, main())
    if not sent:
        pytest.skip(f"{loop_name} has no loop.sendfile() (NotImplementedError)")
    assert [(c["name"], c["args"]) for c in detector.calls if c["name"] != "open"] == [
        ("os.sendfile", detector.calls[-1]["args"])
    ], detector.calls


def test_an_import_under_a_module_that_is_no_package_is_not_reported(detector: Collector) -> None:
    # Found in websockets' suite: `@mock.patch("pkg.mod.Class.attr")` on an
    # async test tries `pkg.mod.Class` as a module (pkgutil.resolve_name),
    # which fails at once, before any finder looks at the disk. Under a
    # package, the same miss searches its folder: reported.
    import importlib
    from unittest import mock

    async def main() -> None:
        with pytest.raises(ModuleNotFoundError, match="is not a package"):
            importlib.import_module("tests.support.blocking_calls.Case")
        with mock.patch("tests.support.blocking_calls.Case.__repr__", return_value="patched"):
            pass
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module("tests.no_such_module_of_aiocop")

    run_on("asyncio", main())
    assert [(c["name"], c["args"]) for c in detector.calls] == [
        ("importlib.import_module", "tests.no_such_module_of_aiocop")
    ], detector.calls
