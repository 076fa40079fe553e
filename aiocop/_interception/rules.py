"""What counts as a blocking call, and how much it weighs: the rules table.

Every entry is an audit event name. *Native* events are raised by CPython
itself; *wrapper* events are raised by aiocop's thin wrappers
(`patch_audit_functions`) around stdlib calls that have no event of their own.
The docs page "Detected calls" is generated from `BLOCKING_CALLS`.

The live table (`_weights`) starts as a copy of the defaults and can be
changed at run time with `register_blocking_event` / `unregister_blocking_event`;
the audit hook sees a change at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from aiocop._model import state as _state
from aiocop._model.severity import WEIGHT_HEAVY, WEIGHT_LIGHT, WEIGHT_MODERATE, WEIGHT_TRIVIAL

if TYPE_CHECKING:
    from collections.abc import Callable

Source = Literal["native", "wrapper"]
Condition = Literal["always", "blocking_socket", "positive_delay", "on_disk_database"]
Raises = Literal["always", "never", "delay_over_threshold"]


# What a condition and a `raises` of a rule check, given the call's arguments. The hook calls them, from its
# table compiled when the rules change (hook.rebuild), so they cost here what they cost in the hook.
def _blocking_socket(args: tuple[Any, ...]) -> bool:
    sock: Any = args[0] if args else None
    try:
        return bool(sock.gettimeout() != 0.0)
    except Exception:  # not a socket, or closed: let the call itself decide
        return True


def _positive_delay(args: tuple[Any, ...]) -> bool:
    delay: Any = args[0] if args else None
    return isinstance(delay, (int, float)) and delay > 0


def _on_disk_database(args: tuple[Any, ...]) -> bool:
    # sqlite3.connect(":memory:") (or a "file::memory:" URI) reads and writes no file.
    database: Any = args[0] if args else None
    if isinstance(database, bytes):
        database = database.decode(errors="replace")
    return not (isinstance(database, str) and (database == ":memory:" or database.startswith("file::memory:")))


def _never(args: tuple[Any, ...]) -> bool:
    return False


def _delay_over_threshold(args: tuple[Any, ...]) -> bool:
    delay: Any = args[0] if args else None
    return not isinstance(delay, (int, float)) or delay * 1000.0 >= _state.config.threshold_ms


_CHECK_OF_CONDITION: dict[Condition, Callable[[tuple[Any, ...]], bool]] = {
    "blocking_socket": _blocking_socket,
    "positive_delay": _positive_delay,
    "on_disk_database": _on_disk_database,
}
_CHECK_OF_RAISES: dict[Raises, Callable[[tuple[Any, ...]], bool]] = {
    "never": _never,
    "delay_over_threshold": _delay_over_threshold,
}


@dataclass(frozen=True, slots=True)
class BlockingCall:
    """One detected call: the audit event, its weight and where it comes from."""

    event: str
    """The audit event's name, e.g. `"os.stat"`."""
    weight: int
    """What one such call adds to its step's severity score (see `WEIGHT_HEAVY` and co.)."""
    category: str
    """A group for the docs: `"sleep"`, `"wait"`, `"network"`, `"file"`, ..."""
    source: Source
    """`"native"`: CPython raises the event; `"wrapper"`: aiocop wraps the function to raise it."""
    description: str
    """What the event stands for, in a few words."""
    condition: Condition = "always"
    """`"blocking_socket"`: only when the socket (first argument) is in blocking mode;
    `"positive_delay"`: only when the first argument is a delay above zero;
    `"on_disk_database"`: only when the first argument is not an in-memory SQLite database."""
    native_since: tuple[int, int] | None = None
    """For wrapper events: the Python version from which CPython raises the event itself (the wrapper is not
    installed from it on: `PatchTarget.until` reads it here)."""
    raises: Raises = "always"
    """Whether `raise_on_violations` stops the call (it is reported either way):
    `"never"` for imports (a first-use import, or a failing optional one,
    reads nothing slow enough to fail a request for); `"delay_over_threshold"`
    for a sleep shorter than the slow-task threshold (as 1.x let it pass)."""


H, M, L, T = WEIGHT_HEAVY, WEIGHT_MODERATE, WEIGHT_LIGHT, WEIGHT_TRIVIAL

BLOCKING_CALLS: tuple[BlockingCall, ...] = (
    # --- sleeping and waiting ---
    BlockingCall(
        "time.sleep",
        H,
        "sleep",
        "wrapper",
        "time.sleep() with a positive delay",
        "positive_delay",
        native_since=(3, 13),
        raises="delay_over_threshold",
    ),
    BlockingCall("select.select", H, "wait", "wrapper", "select.select() with a non-zero timeout"),
    BlockingCall("select.poll", H, "wait", "wrapper", "select.poll().poll() with a non-zero timeout"),
    BlockingCall(
        "threading.Lock.acquire",
        H,
        "wait",
        "wrapper",
        "acquiring a threading.Lock or RLock held by another thread (acquire() or `with`)",
    ),
    BlockingCall("threading.Event.wait", H, "wait", "wrapper", "Event.wait() on an event that is not set"),
    BlockingCall("threading.Condition.wait", H, "wait", "wrapper", "Condition.wait() with a non-zero timeout"),
    BlockingCall("queue.Queue.get", H, "wait", "wrapper", "a blocking Queue.get() on an empty queue"),
    BlockingCall("queue.Queue.put", H, "wait", "wrapper", "a blocking Queue.put() on a full queue"),
    # --- DNS ---
    BlockingCall("socket.getaddrinfo", H, "dns", "native", "socket.getaddrinfo()"),
    BlockingCall("socket.getnameinfo", H, "dns", "native", "socket.getnameinfo()"),
    BlockingCall("socket.gethostbyname", H, "dns", "native", "socket.gethostbyname() and gethostbyname_ex()"),
    BlockingCall("socket.gethostbyaddr", H, "dns", "native", "socket.gethostbyaddr()"),
    # --- sockets (blocking mode only) ---
    BlockingCall(
        "socket.connect", H, "network", "native", "connect()/connect_ex() on a blocking socket", "blocking_socket"
    ),
    BlockingCall("socket.sendto", M, "network", "native", "sendto() on a blocking socket", "blocking_socket"),
    BlockingCall("socket.sendmsg", M, "network", "native", "sendmsg() on a blocking socket", "blocking_socket"),
    BlockingCall("socket.socket.accept", H, "network", "wrapper", "accept() on a blocking socket"),
    BlockingCall("socket.socket.send", M, "network", "wrapper", "send() on a blocking socket"),
    BlockingCall("socket.socket.sendall", M, "network", "wrapper", "sendall() on a blocking socket"),
    BlockingCall("socket.socket.recv", M, "network", "wrapper", "recv() on a blocking socket"),
    BlockingCall("socket.socket.recv_into", M, "network", "wrapper", "recv_into() on a blocking socket"),
    BlockingCall("socket.socket.recvfrom", M, "network", "wrapper", "recvfrom() on a blocking socket"),
    BlockingCall("socket.socket.recvfrom_into", M, "network", "wrapper", "recvfrom_into() on a blocking socket"),
    BlockingCall("socket.socket.recvmsg", M, "network", "wrapper", "recvmsg() on a blocking socket"),
    BlockingCall("ssl.SSLSocket.read", M, "network", "wrapper", "reading a blocking SSL socket (read/recv/recv_into)"),
    BlockingCall("ssl.SSLSocket.write", M, "network", "wrapper", "writing a blocking SSL socket (write/send/sendall)"),
    BlockingCall(
        "ssl.SSLSocket.do_handshake",
        H,
        "network",
        "wrapper",
        "a TLS handshake on a blocking SSL socket (`wrap_socket()`, `connect()`, `do_handshake()`); "
        "the loops' own, on non-blocking sockets or memory BIOs, never",
    ),
    BlockingCall("http.client.connect", H, "network", "native", "http.client connection"),
    BlockingCall("urllib.Request", H, "network", "native", "urllib.request.urlopen()"),
    BlockingCall("ftplib.connect", H, "network", "native", "ftplib connection"),
    BlockingCall("smtplib.connect", H, "network", "native", "smtplib connection"),
    BlockingCall("poplib.connect", H, "network", "native", "poplib connection"),
    BlockingCall("imaplib.open", H, "network", "native", "imaplib connection"),
    BlockingCall("nntplib.connect", H, "network", "native", "nntplib connection"),
    # --- files and descriptors ---
    BlockingCall("open", M, "file", "native", "open(), io.open(), os.open(), Path.open()"),
    BlockingCall("os.read", M, "file", "wrapper", "os.read() on a blocking file descriptor"),
    BlockingCall("os.write", M, "file", "wrapper", "os.write() on a blocking file descriptor"),
    BlockingCall("os.sendfile", M, "file", "wrapper", "os.sendfile()"),
    BlockingCall("tempfile.mkstemp", M, "file", "native", "tempfile.mkstemp() and friends"),
    BlockingCall("tempfile.mkdtemp", M, "file", "native", "tempfile.mkdtemp()"),
    BlockingCall("fcntl.flock", L, "file", "native", "fcntl.flock()"),
    BlockingCall("fcntl.lockf", L, "file", "native", "fcntl.lockf()"),
    # --- certificates and keys (read by OpenSSL: no audit event of CPython's) ---
    BlockingCall(
        "ssl.SSLContext.set_default_verify_paths",
        H,
        "tls",
        "wrapper",
        "loading the system's CA certificates: `ssl.create_default_context()` (without `cafile`), "
        "`SSLContext.load_default_certs()`, `set_default_verify_paths()`",
    ),
    BlockingCall(
        "ssl.SSLContext.load_verify_locations",
        H,
        "tls",
        "wrapper",
        "loading CA certificates from a file or folder: `ssl.create_default_context(cafile=certifi.where())`, "
        "`load_verify_locations(cafile, capath)` (in-memory `cadata` alone: not reported)",
    ),
    BlockingCall(
        "ssl.SSLContext.load_cert_chain",
        M,
        "tls",
        "wrapper",
        "loading a certificate chain and its private key from files",
    ),
    BlockingCall(
        "ssl.get_default_verify_paths",
        L,
        "tls",
        "wrapper",
        "`ssl.get_default_verify_paths()`: looks for the default CA file and folder",
    ),
    # --- metadata ---
    BlockingCall(
        "os.stat",
        L,
        "metadata",
        "wrapper",
        "os.stat() and the os.path helpers built on it (exists, isfile, getsize, ...)",
    ),
    BlockingCall("os.lstat", L, "metadata", "wrapper", "os.lstat(), os.path.islink(), os.path.lexists()"),
    BlockingCall("os.access", L, "metadata", "wrapper", "os.access()"),
    BlockingCall("os.statvfs", L, "metadata", "wrapper", "os.statvfs()"),
    BlockingCall("os.readlink", L, "metadata", "wrapper", "os.readlink()"),
    BlockingCall("os.getcwd", T, "metadata", "wrapper", "os.getcwd() (reported, weighs nothing)"),
    # --- directories ---
    BlockingCall("os.listdir", M, "directory", "native", "os.listdir()"),
    BlockingCall("os.scandir", M, "directory", "native", "os.scandir()"),
    BlockingCall("os.walk", H, "directory", "native", "os.walk()"),
    BlockingCall("os.fwalk", H, "directory", "native", "os.fwalk()"),
    BlockingCall("glob.glob", H, "directory", "native", "glob.glob() and glob.iglob()"),
    BlockingCall("pathlib.Path.glob", H, "directory", "native", "Path.glob()"),
    BlockingCall("pathlib.Path.rglob", H, "directory", "native", "Path.rglob()"),
    # --- file-system mutations ---
    BlockingCall("os.mkdir", M, "mutation", "native", "os.mkdir(), os.makedirs()"),
    BlockingCall("os.rmdir", M, "mutation", "native", "os.rmdir()"),
    BlockingCall("os.remove", M, "mutation", "native", "os.remove(), os.unlink()"),
    BlockingCall("os.rename", M, "mutation", "native", "os.rename(), os.replace()"),
    BlockingCall("os.link", M, "mutation", "native", "os.link()"),
    BlockingCall("os.symlink", M, "mutation", "native", "os.symlink()"),
    BlockingCall("os.truncate", M, "mutation", "native", "os.truncate()"),
    BlockingCall("os.chmod", L, "mutation", "native", "os.chmod()"),
    BlockingCall("os.chown", L, "mutation", "native", "os.chown()"),
    BlockingCall("os.utime", L, "mutation", "native", "os.utime()"),
    BlockingCall("shutil.copyfile", M, "mutation", "native", "shutil.copyfile()"),
    BlockingCall("shutil.copymode", M, "mutation", "native", "shutil.copymode()"),
    BlockingCall("shutil.copystat", M, "mutation", "native", "shutil.copystat()"),
    BlockingCall("shutil.move", M, "mutation", "native", "shutil.move()"),
    BlockingCall("shutil.copytree", H, "mutation", "native", "shutil.copytree()"),
    BlockingCall("shutil.rmtree", H, "mutation", "native", "shutil.rmtree()"),
    BlockingCall("shutil.make_archive", H, "mutation", "native", "shutil.make_archive()"),
    BlockingCall("shutil.unpack_archive", H, "mutation", "native", "shutil.unpack_archive()"),
    # --- processes ---
    BlockingCall("subprocess.Popen", H, "process", "native", "subprocess.run(), Popen(), check_output(), ..."),
    BlockingCall("os.system", H, "process", "native", "os.system()"),
    BlockingCall("os.spawn", H, "process", "native", "os.spawn*()"),
    BlockingCall("os.posix_spawn", H, "process", "native", "os.posix_spawn()"),
    BlockingCall("os.exec", H, "process", "native", "os.exec*()"),
    BlockingCall("os.fork", H, "process", "native", "os.fork()"),
    BlockingCall("os.kill", L, "process", "native", "os.kill()"),
    # --- databases ---
    BlockingCall(
        "sqlite3.connect", M, "database", "native", "sqlite3.connect() of a database file", "on_disk_database"
    ),
    # --- miscellaneous ---
    BlockingCall("builtins.input", H, "misc", "native", "input()"),
    BlockingCall(
        "import",
        H,
        "misc",
        "native",
        "an import statement that loads a module (not one already in sys.modules)",
        raises="never",
    ),
    BlockingCall(
        "importlib.import_module",
        H,
        "misc",
        "wrapper",
        "importlib.import_module() of a module not imported yet (importlib's own path raises no `import` event)",
        raises="never",
    ),
    BlockingCall("syslog.syslog", L, "misc", "native", "syslog.syslog()"),
    BlockingCall("syslog.openlog", L, "misc", "native", "syslog.openlog()"),
    BlockingCall("webbrowser.open", H, "misc", "native", "webbrowser.open()"),
)
"""Every call aiocop detects by default, with its weight: the rules table ("Detected calls" in the docs)."""

del H, M, L, T

DEFAULT_WEIGHTS: dict[str, int] = {call.event: call.weight for call in BLOCKING_CALLS}
# What the hook checks of a call's arguments, by event, derived from the rules (none: always reported; raised).
CONDITION_CHECKS: dict[str, Callable[[tuple[Any, ...]], bool]] = {
    call.event: _CHECK_OF_CONDITION[call.condition] for call in BLOCKING_CALLS if call.condition != "always"
}
RAISE_CHECKS: dict[str, Callable[[tuple[Any, ...]], bool]] = {
    call.event: _CHECK_OF_RAISES[call.raises] for call in BLOCKING_CALLS if call.raises != "always"
}
# The Python version from which CPython raises a wrapper event itself, by event.
NATIVE_SINCE: dict[str, tuple[int, int]] = {
    call.event: call.native_since for call in BLOCKING_CALLS if call.native_since is not None
}

# The live table. Mutated in place (never rebound) so that every reader holds
# the same dict; the hook compiles its own lookup from it (see _hook.rebuild).
_weights: dict[str, int] = dict(DEFAULT_WEIGHTS)


def live_weights() -> dict[str, int]:
    """The table of detected events and their weights, itself: for this part's readers (the hook compiles
    it, allow checks rule names against it), who must not change it. The public API changes it through
    set_weight, remove_weight and reset_weights, and then has the hook rebuild its table."""
    return _weights


def set_weight(event: str, weight: int) -> None:
    """Detect `event` with `weight` (a checked name and weight: `register_blocking_event`)."""
    _weights[event] = weight


def remove_weight(event: str) -> None:
    """Stop detecting `event`; KeyError if it is not detected."""
    del _weights[event]


def reset_weights() -> None:
    """The table as aiocop ships it (DEFAULT_WEIGHTS)."""
    _weights.clear()
    _weights.update(DEFAULT_WEIGHTS)


def get_blocking_events_dict() -> dict[str, int]:
    """Return a copy of the table of detected events and their weights."""
    return dict(_weights)


@dataclass(frozen=True, slots=True)
class DetectedAs:
    """A function with no event of its own name, detected as another event (what a report names)."""

    function: str
    """The function as users and other tools name it, e.g. `"os.replace"`."""
    event: str
    """The event of `BLOCKING_CALLS` it raises, e.g. `"os.rename"`."""
    note: str = ""
    """When it raises it, where that is not always."""


DETECTED_AS: tuple[DetectedAs, ...] = (
    DetectedAs("builtins.open", "open"),
    DetectedAs("pathlib.Path.open", "open"),
    DetectedAs("pathlib.Path.read_text", "open"),
    DetectedAs("pathlib.Path.read_bytes", "open"),
    DetectedAs("pathlib.Path.write_text", "open"),
    DetectedAs("pathlib.Path.write_bytes", "open"),
    DetectedAs("ssl.SSLContext.load_dh_params", "open", "CPython opens the file itself"),
    DetectedAs("os.replace", "os.rename"),
    DetectedAs("os.unlink", "os.remove"),
    DetectedAs("os.path.abspath", "os.getcwd", "of a relative path (an absolute one touches nothing)"),
    DetectedAs("os.path.islink", "os.lstat"),
    DetectedAs("os.path.ismount", "os.lstat"),
    DetectedAs("glob.iglob", "glob.glob"),
    DetectedAs("socket.socket.connect", "socket.connect", "on a blocking socket"),
    DetectedAs("socket.socket.connect_ex", "socket.connect", "on a blocking socket"),
    DetectedAs("socket.socket.sendto", "socket.sendto", "on a blocking socket"),
    DetectedAs("socket.socket.sendmsg", "socket.sendmsg", "on a blocking socket"),
    DetectedAs("ssl.SSLSocket.recv", "ssl.SSLSocket.read", "on a blocking socket"),
    DetectedAs("ssl.SSLSocket.send", "ssl.SSLSocket.write", "on a blocking socket"),
    DetectedAs("ssl.SSLContext.load_default_certs", "ssl.SSLContext.set_default_verify_paths"),
    DetectedAs(
        "http.client.HTTPConnection.putrequest",
        "http.client.connect",
        "when `request()` opens the connection; its reads and writes as `socket.socket.*` of its blocking socket",
    ),
)
"""Functions other tools name that aiocop reports under another event ("Detected calls" in the docs)."""


@dataclass(frozen=True, slots=True)
class NotReported:
    """Functions aiocop deliberately does not report, and why."""

    functions: tuple[str, ...]
    reason: str


NOT_REPORTED: tuple[NotReported, ...] = (
    NotReported(
        (
            "io.BufferedReader.read",
            "io.BufferedWriter.write",
            "io.BufferedRandom.read",
            "io.BufferedRandom.write",
            "io.TextIOWrapper.read",
            "io.TextIOWrapper.write",
        ),
        "reads and writes of a file object: the `open()` that made it is the report (one per file, at the line "
        "that opened it); wrapping every read and write would tax all file and console I/O of the process "
        "(logging to stdout included). A long read of a file opened earlier is a stall, which the watchdog times",
    ),
    NotReported(
        (
            "sqlite3.Connection.execute",
            "sqlite3.Connection.executemany",
            "sqlite3.Connection.executescript",
            "sqlite3.Connection.commit",
            "sqlite3.Connection.rollback",
            "sqlite3.Cursor.execute",
            "sqlite3.Cursor.executemany",
            "sqlite3.Cursor.executescript",
            "sqlite3.Cursor.fetchone",
            "sqlite3.Cursor.fetchmany",
            "sqlite3.Cursor.fetchall",
        ),
        "queries on an open SQLite connection: `sqlite3.connect()` of a database file is the report (one per "
        "connection; an in-memory database is none); a slow query is a stall, which the watchdog times",
    ),
    NotReported(
        ("os.path.samestat",),
        "compares two `os.stat()` results already in memory: no system call at all",
    ),
    NotReported(
        ("os.path.sameopenfile",),
        "`os.fstat()` of two descriptors already open: no path to resolve, no disk read",
    ),
    NotReported(
        ("socket.socket.bind",),
        "binds a socket to a local address: no network traffic, never waits (aiocop 1.x weighed it nothing)",
    ),
    NotReported(
        ("threading.Lock.acquire_lock",),
        '"an obsolete synonym of acquire()" (its docstring), undocumented, which the stdlib and common '
        "libraries never call; `acquire()` and `with lock:` are reported",
    ),
)
"""Calls other tools flag that aiocop does not report, each with the reason ("Detected calls" in the docs)."""
