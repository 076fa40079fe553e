"""Known event-loop machinery and known-harmless internals, as data.

Two tables live here, both documented on the "Detected calls" docs page:

* `KNOWN_LOOPS`: the event loops aiocop knows, one `KnownLoop` each; every
  list of loops (`LOOP_FRAMES`, `LOOP_PACKAGES`, `PYTHON_LOOP_PACKAGES`,
  `KNOWN_LOOP_PACKAGES`, the loops that serve, the loops that announce nothing)
  is derived from it, so a new loop is one line. `LOOP_FRAMES`: functions of
  Python-level event loops that mark the edge of a
  step. A walk up the stack from a blocking call stops at a *dispatch* frame
  (the loop calling a callback or task step: the call was inside a step) and
  gives up at a *core* frame (the loop's own iteration, outside any step).
* `HARMLESS`: blocking calls that loops, the stdlib and test tooling make on
  their own, which the user cannot change and which are not reported by
  default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

LoopFrameRole = Literal["dispatch", "core"]


@dataclass(frozen=True, slots=True)
class LoopFrame:
    """A function of an event loop written in Python that bounds steps."""

    module: str
    function: str
    role: LoopFrameRole


# Modules of the import system: a call made under them is part of an import,
# which is reported once, as the `import` event.
IMPORT_SYSTEM_MODULES: frozenset[str] = frozenset(
    {"importlib._bootstrap", "importlib._bootstrap_external", "_frozen_importlib", "_frozen_importlib_external"}
)


@dataclass(frozen=True, slots=True)
class KnownLoop:
    """An event loop aiocop knows, by its top-level package: one row of `KNOWN_LOOPS`.

    * `frames`: written in Python, the functions of it that bound steps (its
      `LOOP_FRAMES`); a loop written in C has none and is bounded by the frame
      that called into it;
    * `internal`: its files and frames are loop internals, never the user's line
      (`LOOP_PACKAGES`); Leviathan, built by hand, is not counted so;
    * `serves`: it binds its listening socket inside `create_server` and the
      like (the harmless `socket.bind` rule's callers);
    * `announces`: its start and stop go through the signals aiocop wraps
      (asyncgen hooks, `_set_running_loop`); a loop that binds both when
      imported (Leviathan) starts unseen and only a look at the threads'
      stacks finds it (`loops.UNANNOUNCED_LOOP_MODULES`).
    """

    name: str
    frames: tuple[LoopFrame, ...] = ()
    internal: bool = True
    serves: bool = False
    announces: bool = True


KNOWN_LOOPS: tuple[KnownLoop, ...] = (
    KnownLoop(
        "asyncio",
        frames=(
            LoopFrame("asyncio.events", "_run", "dispatch"),  # Handle._run: calls a callback or task step
            LoopFrame("asyncio.base_events", "_run_once", "core"),  # the loop's own iteration
        ),
        serves=True,
    ),
    KnownLoop("uvloop", serves=True),
    KnownLoop("winloop", serves=True),
    KnownLoop("rloop", frames=(LoopFrame("rloop.loop", "run_forever", "dispatch"),), serves=True),  # steps called here
    KnownLoop("veloxloop", frames=(LoopFrame("veloxloop", "run_forever", "dispatch"),), serves=True),
    KnownLoop("granian"),
    # trio's run loop (not asyncio: its runs are found by trio_runs): a task's step is
    # `task.context.run(coro.send, ...)` in here, so the task's outermost frame is just inside.
    KnownLoop("trio", frames=(LoopFrame("trio._core._run", "unrolled_run", "dispatch"),)),
    KnownLoop("leviathan", internal=False, announces=False),
)

# The lists of loops, each derived from KNOWN_LOOPS (tests/test_internals.py checks none is written out).
LOOP_FRAMES: tuple[LoopFrame, ...] = tuple(f for loop in KNOWN_LOOPS for f in loop.frames)
# Packages whose frames are "loop internals": never the user's line.
LOOP_PACKAGES: tuple[str, ...] = tuple(loop.name for loop in KNOWN_LOOPS if loop.internal)
# Loops written in Python: bounded by their own frames, nothing kept for them at their start.
PYTHON_LOOP_PACKAGES: frozenset[str] = frozenset(loop.name for loop in KNOWN_LOOPS if loop.frames)
# Every loop's package: a class from these runs no code of the application's when asked (discovery).
KNOWN_LOOP_PACKAGES: frozenset[str] = frozenset(loop.name for loop in KNOWN_LOOPS)
# Loops that bind their listening sockets themselves, in create_server and the like.
SERVING_LOOP_PACKAGES: tuple[str, ...] = tuple(loop.name for loop in KNOWN_LOOPS if loop.serves)
# Loops that announce neither start nor stop (see KnownLoop.announces).
UNANNOUNCED_LOOP_PACKAGES: frozenset[str] = frozenset(loop.name for loop in KNOWN_LOOPS if not loop.announces)


@dataclass(frozen=True, slots=True)
class HarmlessRule:
    """A blocking call made by internals, not reported by default.

    A rule matches an event when every field that is set matches:

    * `event`: the event name (a tuple means any of them);
    * `caller_modules`: the module of the *caller* (the innermost frame outside
      aiocop) is one of these or a submodule of one;
    * `caller_internal`: the caller belongs to the stdlib or an event loop;
    * `caller_functions`: the caller's function name is one of these;
    * `inside_modules`: the call was made by one of these modules, directly or
      through other stdlib or loop code (any frame below the user's);
    * `inside_functions`: the call was made inside one of these functions
      (`"module.function"`), directly or through other stdlib code;
    * `arg0_prefixes`: the event's first argument is a string with one of
      these prefixes;
    * `arg0_stdlib`: the first argument names a stdlib module;
    * `arg0_socket_file`: the first argument is the path of a Unix socket file;
    * `arg0_failed_import`: the first argument names a module whose import
      failed before in this process (it was not importable when the step
      that tried ended);
    * `imported_by_c`: the caller's current instruction is not an import
      statement (the import was made for it, by a function written in C);
    * `debug_loop_only`: the running loop is in debug mode.
    """

    event: tuple[str, ...]
    reason: str
    caller_modules: tuple[str, ...] = ()
    caller_internal: bool = False
    caller_functions: tuple[str, ...] = ()
    inside_modules: tuple[str, ...] = ()
    inside_functions: tuple[str, ...] = ()
    arg0_prefixes: tuple[str, ...] = ()
    arg0_stdlib: bool = False
    arg0_socket_file: bool = False
    arg0_failed_import: bool = False
    imported_by_c: bool = False
    debug_loop_only: bool = False
    caller_prefixes: tuple[str, ...] = field(init=False, repr=False, compare=False)
    inside_prefixes: tuple[str, ...] = field(init=False, repr=False, compare=False)
    # module name -> whether it is one of `inside_modules`: filled by the hook
    # (see _harmless), kept on the rule to spare hashing the rule per call.
    inside_hits: dict[object, bool] = field(default_factory=dict, init=False, repr=False, compare=False)
    # Whether the rule checks the call itself (caller's function, arguments, import statement): the hook
    # reads one flag for a rule that does not, not five.
    checks_call: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # `"pkg."` prefixes, so that the hook tests submodules with one startswith().
        object.__setattr__(self, "caller_prefixes", tuple(m + "." for m in self.caller_modules))
        object.__setattr__(self, "inside_prefixes", tuple(m + "." for m in self.inside_modules))
        checks_call = bool(self.caller_functions or self.arg0_prefixes or self.arg0_stdlib or self.imported_by_c)
        checks_call = checks_call or self.arg0_socket_file or self.arg0_failed_import
        object.__setattr__(self, "checks_call", checks_call)


# The file and directory operations a stdlib function makes inside.
_FILE_EVENTS: tuple[str, ...] = (
    "open",
    "os.access",
    "os.chmod",
    "os.chown",
    "os.getcwd",
    "os.link",
    "os.listdir",
    "os.lstat",
    "os.mkdir",
    "os.read",
    "os.readlink",
    "os.remove",
    "os.rename",
    "os.rmdir",
    "os.scandir",
    "os.sendfile",
    "os.stat",
    "os.statvfs",
    "os.symlink",
    "os.truncate",
    "os.utime",
    "os.write",
)
# Stdlib functions that raise a detected event of their own before their work:
# the functions as the stack shows them.
_REPORTED_COMPOSITES: tuple[str, ...] = (
    "shutil.copyfile",
    "shutil.copymode",
    "shutil.copystat",
    "shutil.move",
    "shutil.copytree",
    "shutil.rmtree",
    "shutil.make_archive",
    "shutil.unpack_archive",
    "tempfile.mkdtemp",
    "tempfile._mkstemp_inner",
    "os.walk",
    "os._walk",  # os.walk's generator before 3.12
    "os.fwalk",
    "os._fwalk",
    "glob.iglob",
    "glob._iglob",  # glob.iglob's generator
    "pathlib.glob",
    "pathlib.rglob",
    "pathlib._local.glob",
    "pathlib._local.rglob",
)

# An import statement's event (raised by the C import) and importlib.import_module()'s (aiocop's wrapper).
IMPORT_EVENTS: tuple[str, ...] = ("import", "importlib.import_module")

HARMLESS: tuple[HarmlessRule, ...] = (
    HarmlessRule(
        event=IMPORT_EVENTS,
        arg0_prefixes=("encodings.",),
        reason="codec look-up lazily imports an `encodings` module (e.g. `idna` for host names)",
    ),
    HarmlessRule(
        event=IMPORT_EVENTS,
        caller_internal=True,
        arg0_stdlib=True,
        reason="a stdlib module imported lazily by the stdlib or an event loop (e.g. "
        "`concurrent.futures.thread` on the first `run_in_executor`)",
    ),
    HarmlessRule(
        event=("socket.bind",),
        caller_modules=SERVING_LOOP_PACKAGES,
        caller_functions=(
            "create_server",
            "start_server",
            "_start_serving",
            "create_datagram_endpoint",
            "create_unix_server",
            "start_unix_server",
        ),
        reason="an event loop binding its listening socket inside `create_server`/`start_server` (Unix sockets too)",
    ),
    HarmlessRule(
        event=("os.stat", "os.remove", "os.unlink"),
        caller_modules=("asyncio",),
        caller_functions=("create_unix_server", "_stop_serving"),
        reason="asyncio checking for, and removing, a stale socket file before binding in `create_unix_server`, "
        "and its own socket file when the server closes (3.13+)",
    ),
    HarmlessRule(
        event=("os.remove", "os.unlink"),
        arg0_socket_file=True,
        reason="removing a stale Unix socket file (a loop written in C does it in `create_unix_server`, "
        "from C: the event shows the application's line)",
    ),
    HarmlessRule(
        event=IMPORT_EVENTS,
        arg0_failed_import=True,
        reason="an optional module that is not installed, tried again (httpcore's `import sniffio` on every "
        "request): only its first, failed, search of `sys.path` is reported",
    ),
    HarmlessRule(
        event=("import",),
        arg0_stdlib=True,
        imported_by_c=True,
        reason="a stdlib module imported on first use by a function written in C, at a line that makes no "
        "import (`datetime.strptime()` importing `_strptime`)",
    ),
    HarmlessRule(
        event=(
            "open",
            "os.posix_spawn",
            "os.read",
            "os.write",
            "select.poll",
            "select.select",
            "threading.Lock.acquire",
            "threading.Condition.wait",
            "threading.Event.wait",
        ),
        inside_modules=("subprocess",),
        reason="the spawn, pipes and waits of `subprocess.run()`/`communicate()`: already reported as "
        "`subprocess.Popen`",
    ),
    HarmlessRule(
        event=("subprocess.Popen", "os.kill"),
        caller_modules=("subprocess",),
        inside_modules=("asyncio.base_subprocess",),
        reason="the event loop's own process start and signals: `asyncio.create_subprocess_exec()`/`_shell()`, "
        "`loop.subprocess_exec()`/`_shell()` and their transports' `kill()`/`terminate()`/`close()` (asyncio, "
        "rloop), the way asyncio's documentation says to run a process; uvloop and winloop start theirs in C "
        "and raise no event. `subprocess.run()`/`Popen()` called by the application stay reported; a fork "
        "slow because the process is huge is a stall, which the watchdog times",
    ),
    HarmlessRule(
        event=("os.sendfile",),
        caller_modules=("asyncio",),
        caller_functions=("_sock_sendfile_native_impl",),
        reason="asyncio's `loop.sendfile()`/`sock_sendfile()` sending a file on its own non-blocking socket "
        "(aiohttp's `FileResponse`), one chunk per writable event",
    ),
    HarmlessRule(
        event=_FILE_EVENTS,
        caller_modules=("shutil", "tempfile", "os", "glob", "pathlib", "posixpath", "ntpath", "genericpath"),
        inside_functions=_REPORTED_COMPOSITES,
        reason="the file operations inside a stdlib function whose own event is reported (`shutil.rmtree`, "
        "`tempfile.mkdtemp`, `os.walk`, ...): one report for the call, not one per file it touches",
    ),
    HarmlessRule(
        # Not Condition.wait: what these modules wait for there is the work
        # itself (Future.result(), Queue.join()), a real block on the loop.
        event=("threading.Lock.acquire",),
        caller_modules=("asyncio", "concurrent.futures", "queue"),
        reason="the brief synchronisation between a loop and its executor's worker threads",
    ),
    HarmlessRule(
        # A Future's methods take its Condition with `with`, whose frame
        # (threading's Condition.__enter__) is the caller: the rule above,
        # on the caller's module, never sees concurrent.futures. The lock is
        # private to the Future and held only by these methods, never while
        # waiting (result() waits in Condition.wait, which stays reported).
        event=("threading.Lock.acquire",),
        caller_modules=("threading",),
        caller_functions=("__enter__",),
        inside_functions=tuple(
            f"concurrent.futures._base.{name}"
            for name in (
                "__repr__",
                "_get_snapshot",  # 3.15
                "add_done_callback",
                "cancel",
                "cancelled",
                "done",
                "exception",
                "result",
                "running",
                "set_exception",
                "set_result",
                "set_running_or_notify_cancel",
            )
        ),
        reason="a `concurrent.futures.Future` method taking the future's own lock while another thread holds it "
        "for a moment (anyio's portal calling `future.cancelled()` as a call ends, asyncio copying an executor "
        "future's result)",
    ),
    HarmlessRule(
        event=("threading.Lock.acquire",),
        caller_modules=("threading",),
        caller_functions=("_wait_for_tstate_lock", "join"),
        inside_modules=("asyncio",),
        reason="asyncio joining a thread it started: the default executor's at shutdown "
        "(`asyncio.run()`, `shutdown_default_executor()`), once its work is done",
    ),
    HarmlessRule(
        event=("threading.Event.wait", "threading.Lock.acquire"),
        caller_modules=("threading",),
        caller_functions=("start",),
        reason="`Thread.start()` waiting for the new thread to begin (e.g. an executor growing)",
    ),
    HarmlessRule(
        event=("os.stat", "open"),
        caller_modules=("linecache", "tokenize"),
        inside_modules=("asyncio",),
        reason="asyncio reading source lines to print a traceback (e.g. logging an unhandled exception)",
    ),
    HarmlessRule(
        event=("os.stat", "open"),
        caller_internal=True,
        inside_modules=("traceback",),
        reason="source lines read (by `linecache`, `tokenize`; `ast` on 3.13+) to format or record a "
        "traceback: `traceback.format_exc()` in an error handler (Starlette's error middleware), an event "
        "loop in debug mode recording one with every callback and future (uvloop calls `traceback` from C, "
        "so no loop frame shows)",
    ),
    HarmlessRule(
        event=("socket.getaddrinfo",),
        caller_modules=("socket",),
        inside_modules=("trio._socket",),
        reason="trio's `getaddrinfo()` (under `open_tcp_stream()`, `serve_tcp()`, a socket's `connect()`) "
        "trying the address as numeric first (`AI_NUMERICHOST`, no DNS), in the task; a name to resolve goes "
        "to a worker thread. A custom resolver of the application's stays reported",
    ),
    HarmlessRule(
        event=("threading.Lock.acquire",),
        caller_modules=("trio._core._entry_queue",),
        reason="trio's entry queue (`run_sync_soon`) taking its lock while a worker thread holds it for a moment "
        "to hand back a result (`trio.to_thread`), as asyncio's executor synchronisation above",
    ),
    HarmlessRule(
        event=("open",),
        caller_modules=("trio._subprocess",),
        caller_functions=("__init__",),
        reason="trio's `run_process()`/`open_process()` wrapping the process's pidfd in a file object "
        "(`FileIO(fd)`: no path is opened); the process itself starts in a worker thread",
    ),
    HarmlessRule(
        event=(),
        caller_modules=("_pytest", "pluggy", "coverage", "pytest_asyncio"),
        reason="pytest, pluggy, pytest-asyncio and coverage.py internals",
    ),
)
