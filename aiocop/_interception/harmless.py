"""The known-harmless internals (`HARMLESS`: blocking calls that loops, the stdlib and test tooling make
on their own, which the user cannot change and which are not reported by default), and their matcher.

Runs in the hook for every detected call on a loop, so the part of a rule
that depends only on the event and on the caller's module is decided once per
(event, module) pair and cached: for nearly every call that leaves no rule in
play, and the hook moves on after two dict look-ups. The rest of a rule (the
caller's function, the arguments, the modules further down the stack, the
loop's debug mode) is checked per call, for the few rules left.
"""

from __future__ import annotations

import dis
import os
import stat
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiocop._interception import frames as _frames
from aiocop._interception.frames import Kind
from aiocop._interception.internals import IMPORT_EVENTS, SERVING_LOOP_PACKAGES

if TYPE_CHECKING:
    from asyncio import AbstractEventLoop
    from types import FrameType

    from aiocop._interception.trio_runs import TrioRun


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
    # (see _went_through below), kept on the rule to spare hashing the rule per call.
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

_STDLIB_MODULES: frozenset[str] = frozenset(getattr(sys, "stdlib_module_names", ()))

# event -> caller's module name -> the rules that event and module leave in
# play, each with where its walk for `inside_modules` starts (see `_start`).
InPlay = tuple[tuple[HarmlessRule, int], ...]
in_play: dict[str, dict[object, InPlay]] = {}

# Where a rule's walk for `inside_modules` starts, decided with the rules in
# play from the caller's module and kind (the walk's first frame is the
# caller's, and what it decides there depends on nothing else but its
# function, for a loop's frame):
_MET = 0  # nothing to walk: the rule names no inside_modules, or the caller's module is one of them
_FROM_CALLER = 1  # a loop's frame: whether it bounds a step depends on its function, asked per call
_FROM_BACK = 2  # the caller's frame settles nothing: the walk starts at the frame below it


def rules_in_play(event: str, caller_module: object, caller_kind: int) -> InPlay:
    """The rules whose event and caller-module conditions the call meets (cached), each with its walk's start.

    A frame's kind is a function of its module name (see `_frames.frame_kind`),
    so the pair (event, module name) decides these conditions, and what the
    walks for `inside_modules` and `inside_functions` would decide at the
    caller's frame: a rule whose walk the caller's frame would end without a
    match (the user's frame, for `inside_modules`; any but the stdlib's, for
    `inside_functions`) can never match there, and is left out.
    """
    by_module = in_play.get(event)
    if by_module is None:
        by_module = in_play[event] = {}
    rules = by_module.get(caller_module)
    if rules is None:
        if len(by_module) >= _frames.MAX_CACHED_MODULES:  # bounded, as _frames' cache
            by_module.clear()
        rules = by_module[caller_module] = tuple(
            (rule, start)
            for rule in HARMLESS
            if (not rule.event or event in rule.event) and _caller_module_matches(rule, caller_module, caller_kind)
            for start in (_start(rule, caller_module, caller_kind),)
            if start is not None
        )
    return rules


def _start(rule: HarmlessRule, module: object, kind: int) -> int | None:
    # What `_inside_function` and the walk of `any_matches` decide at the
    # caller's frame, from its module and kind alone (the caller is never the
    # edge: the hook's walk stops there before it asks). None: no match.
    if rule.inside_functions and kind != Kind.STDLIB:
        return None
    if not rule.inside_modules or module_in(module, rule.inside_modules, rule.inside_prefixes):
        return _MET
    if kind == Kind.USER:
        return None
    return _FROM_CALLER if kind == Kind.LOOP else _FROM_BACK


def _caller_module_matches(rule: HarmlessRule, module: object, kind: int) -> bool:
    if rule.caller_internal and kind == Kind.USER:
        return False
    return not rule.caller_modules or module_in(module, rule.caller_modules, rule.caller_prefixes)


def module_in(module: object, modules: tuple[str, ...], prefixes: tuple[str, ...]) -> bool:
    """Whether `module` is one of `modules` or below one of `prefixes` (`"pkg."`)."""
    return isinstance(module, str) and (module in modules or module.startswith(prefixes))


# How far below the caller the walks for `inside_*` look for the user's frame.
_MAX_BELOW = 64
_USER, _LOOP = int(Kind.USER), int(Kind.LOOP)


def any_matches(  # noqa: PLR0912 - the walk is inlined on purpose: a call costs more than its branches
    rules: InPlay,
    args: tuple[Any, ...],
    caller: FrameType,
    edge: FrameType | None,
    loop: AbstractEventLoop | TrioRun,
    event: str | None = None,
    module: object = None,
) -> bool:
    """Whether one of `rules` (from `rules_in_play`) matches the call in full.

    `caller` is the innermost frame outside aiocop, never `edge`: the frame
    that entered a loop written in C, if any (the walk for `inside_modules`
    stops there, as at a Python loop's dispatch frame). `event` and
    `module`: the event and caller module `rules` came from, whose rule that
    matches is tried first next time.
    """
    index = 0
    for rule, start in rules:
        # The checks of the call itself, most rules have none (one flag says so).
        if rule.checks_call and not _call_matches(rule, args, caller):
            index += 1
            continue
        if start:
            # Whether the call went through one of the rule's inside_modules,
            # below the user's first frame: a walk from the caller (or, where
            # the caller's frame settles nothing, from the frame below it; see
            # _start) that stops at the first frame that settles it. In a
            # debug-mode loop the frames under a harmless call are mostly
            # asyncio's, and the rule that names asyncio matches at the first.
            # A module name decides a match: cached on the rule, bounded as
            # _frames' caches. Inlined (a call costs more than the walk).
            hits = rule.inside_hits
            module_kinds = _frames._module_kinds
            if start == _FROM_BACK:
                frame: FrameType | None = caller.f_back
                left = _MAX_BELOW - 1
            else:
                frame = caller
                left = _MAX_BELOW
            went = False
            while left:
                left -= 1
                if frame is None or frame is edge:
                    break
                name = frame.f_globals.get("__name__")
                hit = hits.get(name)
                if hit is None:
                    if len(hits) >= _frames.MAX_CACHED_MODULES:
                        hits.clear()
                    hit = hits[name] = module_in(name, rule.inside_modules, rule.inside_prefixes)
                if hit:
                    went = True
                    break
                kind = module_kinds.get(name)
                if kind is None:
                    kind = _frames.frame_kind(frame)
                if kind == _USER or (kind == _LOOP and _frames.is_step_edge(frame, name)):
                    break
                frame = frame.f_back
            if not went:
                index += 1
                continue
        if rule.inside_functions and not _inside_function(rule, caller, edge):
            index += 1
            continue
        if rule.debug_loop_only and not loop.get_debug():
            index += 1
            continue
        if index and event is not None:
            _first(event, module, rules, index)
        return True
    return False


def _call_matches(rule: HarmlessRule, args: tuple[Any, ...], caller: FrameType) -> bool:
    # Reading f_code is an audit event of its own: only for rules that need it.
    if rule.caller_functions and caller.f_code.co_name not in rule.caller_functions:
        return False
    if (rule.arg0_prefixes or rule.arg0_stdlib) and not _arg0_matches(rule, args):
        return False
    if rule.imported_by_c and _at_import_statement(caller):
        return False
    if rule.arg0_socket_file and not _socket_file(args):
        return False
    return not rule.arg0_failed_import or bool(args and args[0] in failed_imports)


def _first(event: str, module: object, rules: InPlay, index: int) -> None:
    # The rule that matched is tried first next time at this call's event and
    # caller module: which rule matches does not change what is decided, only
    # how many walks up the stack it takes (a rule that fails walks down to
    # the user's first frame; one that matches stops at its module).
    by_module = in_play.get(event)
    if by_module is not None and by_module.get(module) is rules:
        by_module[module] = (rules[index], *rules[:index], *rules[index + 1 :])


# Modules whose import failed (not in sys.modules once the step that imported
# them was over): an optional dependency that is not installed, which a
# library tries again on every call. Bounded, as the other caches.
failed_imports: set[str] = set()


def note_failed_imports(records: list[Any]) -> None:
    """After a step: remember the modules it failed to import (called on delivery, off the hot path)."""
    for record in records:
        if record[0] in IMPORT_EVENTS and record[1]:
            name = record[1][0]
            if isinstance(name, str) and name not in sys.modules:
                if len(failed_imports) >= _frames.MAX_CACHED_MODULES:
                    failed_imports.clear()
                failed_imports.add(name)


def _arg0_matches(rule: HarmlessRule, args: tuple[Any, ...]) -> bool:
    arg0 = args[0] if args else None
    if not isinstance(arg0, str):
        return False
    if rule.arg0_prefixes and not arg0.startswith(rule.arg0_prefixes):
        return False
    return not rule.arg0_stdlib or arg0.partition(".")[0] in _STDLIB_MODULES


# The instructions of an import statement (`import x`, `from x import y`).
_IMPORT_OPCODES = frozenset(dis.opmap[name] for name in ("IMPORT_NAME", "IMPORT_FROM") if name in dis.opmap)


def _at_import_statement(frame: FrameType) -> bool:
    """Whether `frame` is executing an import statement (else the import is made for it, from C)."""
    code = frame.f_code.co_code
    lasti = frame.f_lasti
    return 0 <= lasti < len(code) and code[lasti] in _IMPORT_OPCODES


def _socket_file(args: tuple[Any, ...]) -> bool:
    path = args[0] if args else None
    if not isinstance(path, (str, bytes)):
        return False
    try:
        return stat.S_ISSOCK(_lstat(path).st_mode)  # the C function: no audit event, no wrapper
    except (OSError, ValueError):
        return False


_lstat = os.lstat


def _inside_function(rule: HarmlessRule, caller: FrameType, edge: FrameType | None) -> bool:
    # Only frames of the stdlib are looked at, down to the user's first: a
    # callback of the user's (rmtree's onerror) is the user's own call.
    frame: FrameType | None = caller
    for _ in range(_MAX_BELOW):
        if frame is None or frame is edge or _frames.frame_kind(frame) != Kind.STDLIB:
            return False
        module = frame.f_globals.get("__name__")
        if f"{module}.{frame.f_code.co_name}" in rule.inside_functions:  # f_code: only stdlib frames
            return True
        frame = frame.f_back
    return False
