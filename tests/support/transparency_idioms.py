"""Standard-library idioms whose outcome aiocop must not change.

Run as `python tests/support/transparency_idioms.py on|off WORKDIR`: with `on`,
detection (and the watchdog) start first. Each idiom runs twice, outside any
event loop and inside a task of a running loop (where aiocop's wrappers do
their work), and prints one line: its result, or the exception's type, errno
and message. tests/interception/test_wrappers.py runs both and compares every line.
"""

from __future__ import annotations

import _thread
import asyncio
import concurrent.futures
import dataclasses
import importlib
import inspect
import io
import multiprocessing
import os
import pathlib
import pickle
import queue
import re
import select
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import typing
import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

IDIOMS: dict[str, Callable[[str], Any]] = {}

# The idioms whose outcome aiocop changes, each listed with its reason in
# docs/concepts/guarantees.md ("Not promised"); every other idiom must give
# the same outcome with aiocop and without.
DOCUMENTED_DIFFERENCES = frozenset(
    {
        "builtin_types",
        "c_methods_given_no_arguments",
        "recursion_limit",
        "traceback_frames",
        "unpicklable_methods_pickled",
        "weak_references_to_c_methods",
    }
)


def idiom(func: Callable[[str], Any]) -> Callable[[str], Any]:
    IDIOMS[func.__name__] = func
    return func


def _tree(root: str) -> list[str]:
    return sorted(
        os.path.relpath(os.path.join(folder, name), root) + ("@" if os.path.islink(os.path.join(folder, name)) else "")
        for folder, dirs, files in os.walk(root)
        for name in dirs + files
    )


def _fresh(work: str, name: str) -> str:
    path = os.path.join(work, name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


# --- files ---------------------------------------------------------------------------------


@idiom
def shutil_with_symlinks(work: str) -> Any:
    root = _fresh(work, "shutil")
    src = os.path.join(root, "src")
    os.makedirs(os.path.join(src, "sub"))
    pathlib.Path(src, "sub", "f.txt").write_text("data")
    os.symlink(os.path.join(src, "sub", "f.txt"), os.path.join(src, "link"))
    os.symlink("missing-target", os.path.join(src, "dangling"))
    shutil.copy2(os.path.join(src, "link"), os.path.join(root, "copied-link"), follow_symlinks=False)
    shutil.copy2(os.path.join(src, "link"), os.path.join(root, "copied-target"))
    shutil.copytree(src, os.path.join(root, "tree"), symlinks=True)
    shutil.move(os.path.join(root, "tree"), os.path.join(root, "moved"))
    shutil.rmtree(os.path.join(root, "moved"))
    return _tree(root), shutil.rmtree.avoids_symlink_attacks


@idiom
def shutil_errors(work: str) -> Any:
    root = _fresh(work, "shutil-errors")
    os.symlink(root, os.path.join(root, "loop-link"))
    shutil.rmtree(os.path.join(root, "loop-link"))  # rmtree refuses a symlink: OSError


@idiom
def stat_errors(work: str) -> Any:
    return os.stat(os.path.join(work, "no", "such", "file"))


@idiom
def stat_follow_symlinks(work: str) -> Any:
    root = _fresh(work, "stat")
    os.symlink("nowhere", os.path.join(root, "dangling"))
    info = os.stat(os.path.join(root, "dangling"), follow_symlinks=False)
    return os.path.islink(os.path.join(root, "dangling")), oct(info.st_mode)[:4], os.stat in os.supports_follow_symlinks


@idiom
def tempfile_lifecycle(work: str) -> Any:
    with tempfile.TemporaryDirectory(dir=work) as folder:
        with tempfile.NamedTemporaryFile(dir=folder, delete=True) as named:
            named.write(b"x")
            named.flush()
            exists = os.path.exists(named.name)
        with tempfile.SpooledTemporaryFile(max_size=4) as spooled:
            spooled.write(b"more than four bytes")
            spooled.seek(0)
            data = spooled.read()
        return exists, os.path.exists(named.name), data, os.listdir(folder)


@idiom
def pathlib_walk(work: str) -> Any:
    root = pathlib.Path(_fresh(work, "pathlib"))
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "c.txt").write_text("c")
    return (
        sorted(str(p.relative_to(root)) for p in root.rglob("*")),
        (root / "a").is_dir(),
        (root / "nothing").exists(),
        (root / "a" / "b" / "c.txt").stat().st_size,
        (root / "a" / "b" / "c.txt").resolve() == (root / "a" / "b" / "c.txt"),
    )


@idiom
def fd_read_write(work: str) -> Any:
    read_end, write_end = os.pipe()
    try:
        written = os.write(write_end, b"hello")
        return written, os.read(read_end, 5)
    finally:
        os.close(read_end)
        os.close(write_end)


@idiom
def fd_errors(work: str) -> Any:
    return os.read(-1, 1)


@idiom
def fd_wrong_arguments(work: str) -> Any:
    return os.read(0)  # type: ignore[call-arg]


# --- processes -----------------------------------------------------------------------------


def _square(n: int) -> int:
    return n * n


@idiom
def process_pool(work: str) -> Any:
    with concurrent.futures.ProcessPoolExecutor(1) as pool:
        return list(pool.map(_square, range(4))), pool.submit(os.stat, work).result().st_mode == os.stat(work).st_mode


@idiom
def multiprocessing_contexts(work: str) -> Any:
    results: list[tuple[str, object]] = []
    for method in ("fork", "forkserver", "spawn"):
        if method not in multiprocessing.get_all_start_methods():
            results.append((method, "unavailable"))
            continue
        with multiprocessing.get_context(method).Pool(1) as pool:
            results.append((method, pool.map(_square, [2, 3])))
    return results


@idiom
def subprocess_pipes(work: str) -> Any:
    done = subprocess.run(
        [sys.executable, "-c", "import sys; sys.stdout.write(sys.stdin.read().upper())"],
        input="piped",
        capture_output=True,
        text=True,
        check=True,
    )
    with subprocess.Popen([sys.executable, "-c", "print('popen')"], stdout=subprocess.PIPE) as proc:
        out, _ = proc.communicate(timeout=30)
    return done.stdout, out.strip()


@idiom
def subprocess_timeout(work: str) -> Any:
    return subprocess.run([sys.executable, "-c", "import time; time.sleep(5)"], timeout=0.3, check=False)


# --- sockets, select -----------------------------------------------------------------------


@idiom
def socket_timeouts(work: str) -> Any:
    a, b = socket.socketpair()
    with a, b:
        a.settimeout(0.05)
        try:
            a.recv(1)
            timed_out = False
        except TimeoutError:
            timed_out = True
        b.sendall(b"ping")
        a.settimeout(None)
        got = a.recv(4)
        a.setblocking(False)
        try:
            a.recv(1)
            would_block = False
        except BlockingIOError:
            would_block = True
        return timed_out, got, would_block, a.gettimeout()


@idiom
def socket_closed(work: str) -> Any:
    a, b = socket.socketpair()
    a.close()
    b.close()
    return a.send(b"x")


@idiom
def select_poll_selectors(work: str) -> Any:
    a, b = socket.socketpair()
    with a, b:
        empty = select.select([a], [], [], 0.01)
        b.send(b"x")
        ready = select.select([a], [], [], 1.0)
        poller = select.poll()
        poller.register(a, select.POLLIN)
        polled = poller.poll(100)
        with selectors.DefaultSelector() as selector:
            selector.register(a, selectors.EVENT_READ)
            selected = selector.select(timeout=1.0)
        return empty, len(ready[0]), len(polled), len(selected)


@idiom
def select_bad_arguments(work: str) -> Any:
    return select.select([], [], [], -1)


@idiom
def ssl_context(work: str) -> Any:
    import ssl

    context = ssl.create_default_context()
    return context.verify_mode == ssl.CERT_REQUIRED, context.check_hostname


@idiom
def ssl_socket_against_a_plain_peer(work: str) -> Any:
    # SSLSocket.write and read (wrapped) on a blocking socket whose peer answers
    # the handshake with plain text: the same SSLError either way.
    import ssl

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    a, b = socket.socketpair()
    with a, b:
        b.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n" * 4)
        a.settimeout(5)
        with context.wrap_socket(a, do_handshake_on_connect=False) as tls:
            try:
                tls.write(b"hello")
                outcome = "written"
            except ssl.SSLError as error:
                outcome = f"SSLError {error.reason}"
            try:
                tls.read(1)
            except (ssl.SSLError, OSError) as error:
                outcome += f", then {type(error).__name__}"
            return outcome


# --- sleeps, locks, threads, signals -------------------------------------------------------


@idiom
def sleep_arguments(work: str) -> Any:
    outcomes = []
    # Calls wrong on purpose: the wrapper must refuse them as the original does.
    sleeps: tuple[Callable[[], object], ...] = (
        lambda: time.sleep(0),
        lambda: time.sleep(secs=0),  # type: ignore[call-arg]
        lambda: time.sleep(-1),
        lambda: time.sleep("1"),  # type: ignore[arg-type]
    )
    for call in sleeps:
        try:
            call()
            outcomes.append("ok")
        except Exception as error:
            outcomes.append(f"{type(error).__name__}: {error}")
    return outcomes


@idiom
def lock_arguments(work: str) -> Any:
    outcomes = []
    lock = threading.Lock()
    # Calls wrong on purpose: the wrapper must refuse them as the original does.
    calls: tuple[Callable[[], object], ...] = (
        lambda: lock.acquire(blocking="no"),  # type: ignore[arg-type]
        lambda: lock.acquire(timeout=-5),
        lambda: lock.acquire(False, 1),
        lambda: lock.__enter__(1),  # type: ignore[call-arg]
        lambda: threading.RLock().acquire(timeout="x"),  # type: ignore[arg-type]
    )
    for call in calls:
        try:
            outcomes.append(repr(call()))
        except Exception as error:
            outcomes.append(f"{type(error).__name__}: {error}")
        if lock.locked():
            lock.release()
    return outcomes


class _CountingEvent(threading.Event):
    calls = 0

    def is_set(self) -> bool:
        _CountingEvent.calls += 1
        return super().is_set()


class _CountingQueue(queue.Queue):  # type: ignore[type-arg]
    calls = 0

    def _qsize(self) -> int:
        _CountingQueue.calls += 1
        return super()._qsize()


class _CountingSocket(socket.socket):
    calls = 0

    def gettimeout(self) -> float | None:
        _CountingSocket.calls += 1
        return super().gettimeout()


@idiom
def primitives_through_subclasses(work: str) -> Any:
    _CountingEvent.calls = _CountingQueue.calls = _CountingSocket.calls = 0
    event = _CountingEvent()
    event.set()
    waited = event.wait(0.01)
    jobs = _CountingQueue()
    jobs.put(1)
    got = jobs.get(timeout=0.01)
    a, b = socket.socketpair()
    with a, b:
        sock = _CountingSocket(fileno=os.dup(a.fileno()))
        with sock:
            b.send(b"z")
            data = sock.recv(1)
    return waited, got, data, _CountingEvent.calls, _CountingQueue.calls, _CountingSocket.calls


@idiom
def signal_interrupts_sleep(work: str) -> Any:
    # A signal whose handler returns: sleep resumes (PEP 475) and lasts its
    # whole time. One whose handler raises: the exception comes out of sleep.
    if threading.current_thread() is not threading.main_thread():
        return "main thread only"
    seen = []
    previous = signal.signal(signal.SIGALRM, lambda *_: seen.append("alarm"))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.02)
        start = time.monotonic()
        time.sleep(0.1)
        resumed = time.monotonic() - start >= 0.095

        def interrupt(*_: object) -> None:
            raise KeyboardInterrupt

        signal.signal(signal.SIGALRM, interrupt)
        signal.setitimer(signal.ITIMER_REAL, 0.02)
        try:
            time.sleep(5)
            interrupted = False
        except KeyboardInterrupt:
            interrupted = True
        return seen, resumed, interrupted
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@idiom
def signal_interrupts_lock_wait(work: str) -> Any:
    # A held lock waited on with a timeout: a signal whose handler returns
    # lets the wait go on to its timeout; one whose handler raises ends it.
    if threading.current_thread() is not threading.main_thread():
        return "main thread only"
    held = threading.Lock()
    held.acquire()
    previous = signal.signal(signal.SIGALRM, lambda *_: None)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.02)
        start = time.monotonic()
        got = held.acquire(timeout=0.1)
        waited_out = time.monotonic() - start >= 0.095

        def interrupt(*_: object) -> None:
            raise KeyboardInterrupt

        signal.signal(signal.SIGALRM, interrupt)
        signal.setitimer(signal.ITIMER_REAL, 0.02)
        try:
            held.acquire(timeout=5)
            interrupted = False
        except KeyboardInterrupt:
            interrupted = True
        return got, waited_out, interrupted
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        held.release()


@idiom
def signal_interrupts_read(work: str) -> Any:
    if threading.current_thread() is not threading.main_thread():
        return "main thread only"
    read_end, write_end = os.pipe()
    previous = signal.signal(signal.SIGALRM, lambda *_: os.write(write_end, b"!"))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.02)
        return os.read(read_end, 1)  # EINTR, retried: the handler's byte arrives
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        os.close(read_end)
        os.close(write_end)


# --- introspection -------------------------------------------------------------------------


@idiom
def introspection(work: str) -> Any:
    functions = (os.stat, os.read, os.write, os.getcwd, select.select, time.sleep, socket.socket.send)
    return [
        (
            getattr(f, "__name__", None),
            getattr(f, "__qualname__", None),
            getattr(f, "__module__", None),
            _signature(f),
            callable(f),
            inspect.isroutine(f),
        )
        for f in functions
    ]


def _signature(f: Any) -> str:
    # Some versions have no signature for some C methods (socket.send on
    # 3.14): that is compared too, without hiding the other attributes.
    try:
        return str(inspect.signature(f))
    except ValueError as error:
        return f"no signature: {error}"


@idiom
def pickling(work: str) -> Any:
    functions = (os.stat, os.getcwd, time.sleep, select.select, socket.socket.send, socket.socket.recv)
    return [pickle.loads(pickle.dumps(f)) is f for f in functions]


@idiom
def as_class_attributes(work: str) -> Any:
    class Backoff:
        # Typed as attributes of the instance: mypy would read them as methods.
        sleep: Callable[[float], None] = time.sleep
        stat: Callable[[str], os.stat_result] = os.stat
        cwd: Callable[[], str] = os.getcwd

    backoff = Backoff()
    backoff.sleep(0)
    return backoff.stat(work).st_mode == os.stat(work).st_mode, backoff.cwd() == os.getcwd()


# --- where programs keep functions, and what frameworks read of them -----------------------


def _functions() -> dict[str, Any]:
    # Every module function aiocop may wrap (C builtins), read at the time of
    # the call (with detection on, the wrappers).
    return {
        "os.stat": os.stat,
        "os.lstat": os.lstat,
        "os.access": os.access,
        "os.statvfs": os.statvfs,
        "os.readlink": os.readlink,
        "os.getcwd": os.getcwd,
        "os.sendfile": os.sendfile,
        "os.read": os.read,
        "os.write": os.write,
        "time.sleep": time.sleep,
        "select.select": select.select,
    }


def _c_methods() -> dict[str, Any]:
    # Every C method aiocop may wrap (with a Python function).
    return {
        "poll.poll": type(select.poll()).poll,
        "socket.send": socket.socket.send,
        "socket.recv": socket.socket.recv,
        "LockType.acquire": _thread.LockType.acquire,
        "LockType.__enter__": _thread.LockType.__enter__,
        "RLock.acquire": _thread.RLock.acquire,
        "RLock.__enter__": _thread.RLock.__enter__,
    }


def _methods() -> dict[str, Any]:
    # Every method aiocop may wrap: C methods, then Python ones.
    return {
        **_c_methods(),
        "socket.accept": socket.socket.accept,
        "ssl.read": __import__("ssl").SSLSocket.read,
        "Event.wait": threading.Event.wait,
        "Condition.wait": threading.Condition.wait,
        "Queue.get": queue.Queue.get,
        "Queue.put": queue.Queue.put,
    }


def _each(check: Callable[[Any], Any], functions: dict[str, Any] | None = None) -> list[str]:
    outcomes = []
    for name, func in (functions if functions is not None else {**_functions(), **_methods()}).items():
        try:
            outcome = f"{name}: {check(func)!r}"
        except Exception as error:
            outcome = f"{name}: {type(error).__name__}: {error}"
        outcomes.append(re.sub(r" at 0x[0-9a-f]+", " at 0x...", outcome))
    return outcomes


def _but(names: dict[str, Any], leave_out: dict[str, Any]) -> dict[str, Any]:
    return {name: func for name, func in names.items() if name not in leave_out}


# C methods of types that cannot be pickled (so neither can the methods).
_UNPICKLABLE = ("poll.poll", "LockType.acquire", "LockType.__enter__")


def _holder(func: Any) -> Any:
    return type("Holder", (), {"kept": func})


@idiom
def kept_as_class_attributes(work: str) -> Any:
    # A class made now (after aiocop started, with it on) keeps each function:
    # read back from the class it is the same object, with the same repr.
    return _each(lambda func: (_holder(func).kept is func, repr(_holder(func).kept) == repr(func)))


@idiom
def functions_kept_on_instances(work: str) -> Any:
    # A builtin read from an instance stays itself (it is no descriptor).
    return _each(lambda func: _holder(func)().kept is func, _functions())


@idiom
def methods_kept_on_instances_of_another_class(work: str) -> Any:
    # A method binds to an instance, and fails when called with it.
    return _each(lambda func: _holder(func)().kept(), _methods())


@dataclasses.dataclass
class _Opener:
    opener: Any = None


def _dataclass_default(func: Any) -> Any:
    return dataclasses.make_dataclass("Config", [("opener", Any, dataclasses.field(default=func))])().opener


@idiom
def kept_as_dataclass_defaults(work: str) -> Any:
    # `opener: Callable = os.stat` in a dataclass made now.
    return _each(lambda func: _dataclass_default(func) is func)


@idiom
def dataclass_configs_pickled(work: str) -> Any:
    # ... and the config pickled (as to a process pool): the same object comes back.
    def check(func: Any) -> Any:
        return pickle.loads(pickle.dumps(_Opener(_dataclass_default(func)))).opener is func

    everything = {**_functions(), **_methods()}
    return _each(check, {name: everything[name] for name in everything if name not in _UNPICKLABLE})


@idiom
def unpicklable_methods_pickled(work: str) -> Any:
    # Documented: the same PicklingError, with another message.
    return _each(pickle.dumps, {name: _c_methods()[name] for name in _UNPICKLABLE})


@idiom
def config_with_a_wrapped_function_to_a_process_pool(work: str) -> Any:
    with concurrent.futures.ProcessPoolExecutor(1) as pool:
        return pool.submit(_open_with, _Opener(os.stat), work).result()


def _open_with(config: Any, path: str) -> bool:
    return bool(config.opener(path).st_mode == os.lstat(path).st_mode)


@idiom
def type_hints(work: str) -> Any:
    # What dependency injection, validate_call and CLI builders read.
    return _each(typing.get_type_hints)


@idiom
def weak_references(work: str) -> Any:
    return _each(lambda func: weakref.ref(func)() is func, {**_functions(), **_but(_methods(), _c_methods())})


@idiom
def weak_references_to_c_methods(work: str) -> Any:
    # Documented: a C method takes none, its Python wrapper does.
    return _each(lambda func: weakref.ref(func)() is func, _c_methods())


@idiom
def wrong_self_or_argument(work: str) -> Any:
    # Each called with an object of the wrong type: the original's error and message.
    return _each(lambda func: func(object()))


@idiom
def functions_given_no_arguments(work: str) -> Any:
    return _each(lambda func: func() if func is not os.getcwd else "skipped: takes none", _functions())


@idiom
def python_methods_given_no_arguments(work: str) -> Any:
    return _each(lambda func: func(), _but(_methods(), _c_methods()))


@idiom
def c_methods_given_no_arguments(work: str) -> Any:
    # Documented: the same TypeError, with another message.
    return _each(lambda func: func(), _c_methods())


@idiom
def builtin_types(work: str) -> Any:
    # Documented: a wrapped builtin is aiocop's stand-in, not a builtin.
    return _each(lambda func: (type(func).__name__, inspect.isbuiltin(func)), _functions())


@idiom
def traceback_frames(work: str) -> Any:
    # Documented: one frame more (aiocop's wrapper), hidden by pytest.
    try:
        os.stat(os.path.join(work, "missing"))
    except OSError as error:
        return [frame.name for frame in traceback.extract_tb(error.__traceback__)]
    return None


@idiom
def traceback_frames_outside_aiocop(work: str) -> Any:
    # The frames an error tracker shows as the application's (and pytest shows at all).
    try:
        os.stat(os.path.join(work, "missing"))
    except OSError as error:
        return [
            frame.name
            for frame in traceback.extract_tb(error.__traceback__)
            if f"{os.sep}aiocop{os.sep}" not in frame.filename
        ]
    return None


@idiom
def recursion_limit(work: str) -> Any:
    # Documented: a detected call inside a task runs aiocop's hook on top of
    # it, a few frames nearer the limit.
    def deeper(n: int) -> int:
        try:
            os.stat(work)
            return deeper(n + 1)
        except RecursionError:
            return n

    return deeper(0)


@idiom
def reload_patched_modules(work: str) -> Any:
    # importlib.reload of modules aiocop patched: they work as before, and
    # os.stat is the object it was.
    before = os.stat
    for name in ("os", "socket", "queue", "select", "time"):
        importlib.reload(sys.modules[name])
    a, b = socket.socketpair()
    with a, b:
        b.send(b"x")
        got = a.recv(1)
    return os.stat is before, got, os.stat(work).st_mode == os.lstat(work).st_mode


# --- the runner ----------------------------------------------------------------------------


def describe(func: Callable[[str], Any], work: str) -> str:
    try:
        result: Any = func(work)
    except BaseException as error:  # the outcome to compare, whatever it is
        return describe_error(error, work)
    if isinstance(result, subprocess.CompletedProcess):
        result = (result.returncode, result.stdout)
    text = repr(result).replace(work, "WORK")
    return f"returned {text}"


def describe_error(error: BaseException, work: str) -> str:
    message = str(error).replace(work, "WORK")
    if isinstance(error, subprocess.TimeoutExpired):
        message = message.rpartition(" timed out after ")[0]  # the seconds it measured differ from run to run
    return f"raised {type(error).__name__} errno={getattr(error, 'errno', None)}: {message}"


def run_all(work: str, where: str) -> list[str]:
    return [f"{where} {name}: {describe(func, work)}" for name, func in IDIOMS.items()]


async def in_a_task(work: str) -> list[str]:
    await asyncio.sleep(0)
    return run_all(work, "in-loop")


def main() -> None:
    mode, work = sys.argv[1], sys.argv[2]
    if mode == "on":
        import aiocop

        aiocop.start_blocking_io_detection()
        aiocop.detect_slow_tasks(threshold_ms=30, on_slow_task=lambda event: None)
    out = io.StringIO()
    for line in run_all(work, "no-loop") + asyncio.run(in_a_task(work)):
        print(line, file=out)
    sys.stdout.write(out.getvalue())


if __name__ == "__main__":
    main()
