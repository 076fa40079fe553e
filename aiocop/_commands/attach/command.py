"""`python -m aiocop attach PID`: watch a running Python process for a while, without restarting it.

CPython 3.14 can ask another CPython process of the same version to run a
script at its next safe point (`sys.remote_exec`, PEP 768). This side writes
a bootstrap script into a private folder, has the target run it, waits with
a progress line, then prints the target's report as `run` prints its own.
The target's side is `attach.agent`: it detaches on its own at the end of
the window, whatever happens here.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import sys
import time
from pathlib import Path
from typing import Any

import aiocop
from aiocop._commands.attach import proc as _attach_proc
from aiocop._commands.attach import report as _attach_report
from aiocop._commands.attach.files import AttachError, Exchange, Pin, agent_sources, temporary_folder
from aiocop._commands.attach.report import BadReportError
from aiocop._commands.exits import EXIT_ERROR, EXIT_FAIL_ON, EXIT_INTERRUPTED, EXIT_NOT_RUN, EXIT_USAGE
from aiocop._common.escape import printable
from aiocop._model.severity import level_rank
from aiocop._reporting import report_files as _report_files
from aiocop._reporting.report import Summary

# How long the target may take to run the bootstrap: it runs at the main
# thread's next safe point, which an idle server reaches at its next request
# or timer. Past this the attach gives up (and a late run does nothing).
START_TIMEOUT_VARIABLE = "AIOCOP_ATTACH_START_TIMEOUT_S"
DEFAULT_START_TIMEOUT_S = 10.0
MAX_START_TIMEOUT_S = 86_400.0
# After the window: the report (the pending events delivered, the summary written).
REPORT_GRACE_S = 10.0

# Run by the target on its main thread: a few lines, then a thread of its own.
BOOTSTRAP = """\
# Written by `python -m aiocop attach` (PID {by}) for PID {pid}; it removes its folder when done.
def _aiocop_attach(settings):
    import os, threading
    try:
        with open("/proc/self/stat", "rb") as stream:
            start = int(stream.read().rpartition(b")")[2].split()[19])
    except (OSError, ValueError, IndexError):
        start = None
    if os.getpid() != settings["pid"] or start != settings["start"]:
        return  # not the process this was written for (its PID was given to another since): nothing here
    folder = settings["folder"]
    if os.path.exists(os.path.join(folder, "cancelled")):
        __import__("shutil").rmtree(folder, ignore_errors=True)  # the attaching side gave up: do nothing
        return
    try:  # once: a script run twice does nothing the second time
        os.close(os.open(os.path.join(folder, "ran"), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    except OSError:
        return
    busy = [getattr(t, "_aiocop_by", "?") for t in threading.enumerate() if t.name == "aiocop-attach"]
    name = "aiocop-attach-refused" if busy else "aiocop-attach"
    thread = threading.Thread(target=_aiocop_session, args=(settings, busy), name=name, daemon=True)
    thread._aiocop_by = settings["by"]
    thread.start()


def _aiocop_session(settings, busy):
    import atexit, importlib.util, json, os, sys

    def say(status):  # best effort: the attaching side reports a silence too
        path = os.path.join(settings["folder"], "status.json")
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
            with open(os.open(path + ".partial", flags, 0o600), "w") as out:
                json.dump({{**status, "nonce": settings["nonce"]}}, out)
            os.replace(path + ".partial", path)
        except OSError:
            pass

    if busy:
        say({{"state": "error", "error": f"another attach (by PID {{busy[0]}}) is running"}})
        return

    class Finder:  # serves the aiocop the attaching side sent, from memory: nothing is imported from a path
        def __init__(self, sources):
            self.sources = sources

        def find_spec(self, name, path=None, target=None):
            if name not in self.sources:
                return None
            file, _, package = self.sources[name]
            spec = importlib.util.spec_from_loader(name, self, origin=file, is_package=package)
            spec.has_location = True
            return spec

        def create_module(self, spec):
            return None

        def exec_module(self, module):
            file, source, _ = self.sources[module.__spec__.name]
            module.__file__ = file
            exec(compile(source, file, "exec", dont_inherit=True), module.__dict__)

        def get_source(self, name):
            return self.sources[name][1]

    modules_before = [n for n in sys.modules if n == "aiocop" or n.startswith("aiocop.")]
    injected = "aiocop" not in sys.modules
    package_before = [] if injected else list(vars(sys.modules["aiocop"]))
    finder = None
    try:
        if injected:
            fd = os.open(os.path.join(settings["folder"], "agent.json"), os.O_RDONLY | os.O_NOFOLLOW)
            with open(fd, "rb") as stream:
                finder = Finder(json.loads(stream.read()))
            sys.meta_path.insert(0, finder)
        import aiocop._commands.attach.agent as agent
    except BaseException as error:
        aiocop = sys.modules.get("aiocop")
        where = f"aiocop {{getattr(aiocop, '__version__', '?')}}"
        if not injected:
            where += f" ({{getattr(aiocop, '__file__', '?')}})"
        for name in [n for n in sys.modules if (n == "aiocop" or n.startswith("aiocop.")) and n not in modules_before]:
            for module_name, handler in (("aiocop._api", "_at_exit"), ("aiocop._reporting.delivery", "drain")):
                if name == module_name and hasattr(sys.modules[name], handler):
                    atexit.unregister(getattr(sys.modules[name], handler))
            del sys.modules[name]
        if finder is not None:
            sys.meta_path.remove(finder)
        say({{"state": "error", "error": f"could not load {{where}}: {{type(error).__name__}}: {{error}}"}})
        return
    try:  # the agent says its own errors; whatever escapes it (an older aiocop of the target's) is said too
        agent.run({{**settings, "injected": injected, "modules_before": modules_before,
                   "package_before": package_before, "finder": finder}})
    except BaseException as error:
        say({{"state": "error", "error": f"the attach agent failed: {{type(error).__name__}}: {{error}}"}})


_aiocop_attach(__import__("json").loads({settings!r}))
del _aiocop_attach, _aiocop_session
"""


class UsageError(AttachError):
    """The command cannot run as given (exit status 2)."""


class NotRunError(AttachError):
    """The target's main thread did not run the script in time (exit status 4)."""


def default_hang_after_ms(seconds: float) -> float:
    """When `attach` calls a step hung: after 5 s, or half the window if shorter (a hang is seen within it)."""
    return min(5000.0, seconds * 1000.0 / 2)


def start_timeout_s() -> float:
    """`AIOCOP_ATTACH_START_TIMEOUT_S`, read when the command runs and checked: a positive, finite number of seconds."""
    text = os.environ.get(START_TIMEOUT_VARIABLE, "").strip()
    if not text:
        return DEFAULT_START_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= MAX_START_TIMEOUT_S):
        raise UsageError(
            f"{START_TIMEOUT_VARIABLE}={printable(text[:40])!r}: expected a number of seconds above 0 and at most "
            f"{MAX_START_TIMEOUT_S:g} (the default is {DEFAULT_START_TIMEOUT_S:g})"
        )
    return value


def check_interpreter() -> None:
    if sys.version_info < (3, 14) or not hasattr(sys, "remote_exec"):
        version = f"{sys.version_info[0]}.{sys.version_info[1]}"
        raise UsageError(
            f"attach needs CPython 3.14 or later (sys.remote_exec, PEP 768); this is {version}. Run the program "
            "under aiocop instead: python -m aiocop run your_app.py (or -m your.module)"
        )


def check_target(pin: Pin) -> None:
    """Errors found before asking the target anything: another user's, remote debugging off."""
    pid = pin.pid
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        raise AttachError(f"no process with PID {pid}") from None
    except PermissionError:
        raise AttachError(
            f"PID {pid} belongs to another user: attach as that user, or as root (CAP_SYS_PTRACE)"
        ) from None
    proc = Path(f"/proc/{pid}")
    try:
        argv = (proc / "cmdline").read_bytes().split(b"\0")
        environ = (proc / "environ").read_bytes().split(b"\0")
    except OSError:
        return  # not Linux, or not readable: sys.remote_exec will say
    pin.check()  # what was read was the pinned process's
    options = _interpreter_options(argv)
    if b"disable_remote_debug" in options:
        raise AttachError(f"remote debugging is disabled in PID {pid} (started with -X disable_remote_debug)")
    # -E and -I (alone or in a cluster, -IE) make the interpreter ignore PYTHON* variables.
    ignores_environment = any(
        o[:1] == b"-" and o[1:2] not in (b"-", b"W") and (b"E" in o[1:] or b"I" in o[1:]) for o in options
    )
    set_vars = {entry.partition(b"=")[0] for entry in environ if entry.partition(b"=")[2]}
    if b"PYTHON_DISABLE_REMOTE_DEBUG" in set_vars and not ignores_environment:
        raise AttachError(f"remote debugging is disabled in PID {pid} (PYTHON_DISABLE_REMOTE_DEBUG is set)")


def _interpreter_options(argv: list[bytes]) -> list[bytes]:
    """The interpreter's own options in a command line (before the script, `-m` or `-c`), `-X` values apart.

    `python app.py -X disable_remote_debug` passes those words to the app.
    """
    options: list[bytes] = []
    args = iter(argv[1:])
    for arg in args:
        if not arg.startswith(b"-") or arg in (b"-", b"--"):
            break
        if arg in (b"-X", b"-W"):
            value = next(args, b"")
            if arg == b"-X":
                options.append(value)
            continue
        if arg.startswith(b"-X"):
            options.append(arg[2:])
            continue
        options.append(arg)
        if arg[:2] in (b"-m", b"-c") or (arg[1:2] != b"-" and (b"m" in arg or b"c" in arg)):
            break
    return options


def _explain(pid: int, error: BaseException) -> AttachError:
    text = str(error)
    if isinstance(error, PermissionError):
        return AttachError(
            f"not allowed to attach to PID {pid} ({text}): attach as its user, or as root (CAP_SYS_PTRACE); "
            "/proc/sys/kernel/yama/ptrace_scope may forbid it too (see docs/how-to/attach.md)"
        )
    if "Can't send commands from a Python" in text:
        version = text.rsplit("Python ", 1)[-1].split(maxsplit=1)[0].rstrip(".")
        return AttachError(
            f"PID {pid} runs Python {version}, this is {sys.version_info[0]}.{sys.version_info[1]}: attach with "
            f"the same version (python{version} -m aiocop attach {pid})"
        )
    if "PyRuntime" in text or "debug offsets" in text:
        return AttachError(f"PID {pid} is not a CPython 3.14+ process ({text})")
    if "not enabled" in text:
        return AttachError(f"remote debugging is disabled in PID {pid} ({text})")
    return AttachError(f"could not attach to PID {pid}: {type(error).__name__}: {text}")


def not_run_message(pid: int, timeout: float) -> str:
    """Why PID's main thread ran no Python code for `timeout` s, as far as the OS and its memory say (lines)."""
    head = f"PID {pid} did not run aiocop's script within {timeout:g} s"
    later = "If it runs the script later, the script does nothing."
    wait = _attach_proc.thread_wait(pid, pid)
    seen = wait.describe()
    stack = _attach_proc.python_stack(pid)
    lines = []
    if seen:
        lines.append(f"  the OS says its main thread (TID {pid}) is {seen}")
    if stack:
        lines.append("  its Python stack (innermost first, read from outside):")
        lines += [f"    {frame}" for frame in stack]
    if not seen:
        first = (
            f"{head}: its main thread has not reached Python code since (blocked in a call, or an idle server "
            "waiting for its next request), or remote debugging is disabled in it."
        )
        return "\n".join([first, *lines, f"  {later}"])
    if wait.in_io_wait:
        first = f"{head}: its main thread is waiting for I/O, outside Python."
        last = (
            "  An idle event loop waits like this, and runs the script at its next event (a request, a timer): "
            f"attach again when it has work, or raise {START_TIMEOUT_VARIABLE}. {later}"
        )
    else:
        first = f"{head}: its main thread is blocked outside Python, in a call that has not returned."
        last = (
            "  Python code cannot run on that thread until the call returns: if its event loop runs there, the loop "
            f"is hung in that call. {later}"
        )
    return "\n".join([first, *lines, last])


def _progress(text: str) -> None:
    if sys.stderr.isatty():
        print(f"\r{text}\033[K", end="", file=sys.stderr, flush=True)


def attach(
    pid: int,
    seconds: float,
    threshold_ms: float | None,
    hang_after_ms: float | None = None,
    *,
    pictures: bool = False,
) -> dict[str, Any]:
    """Watch PID for `seconds`; its checked report. Raises AttachError; KeyboardInterrupt ends the window early.

    `hang_after_ms`: when a step counts as hung (None: `default_hang_after_ms`; 0: never).
    `pictures`: the report also carries the steps, for `--html`, `--speedscope`, `--folded`.
    """
    check_interpreter()
    start_timeout = start_timeout_s()
    if pid == os.getpid():
        raise AttachError("cannot attach to itself")
    pin = Pin.take(pid)
    try:
        check_target(pin)
        # Who may have written what the target is made to run: root, and the target's own user.
        owners = frozenset({0, pin.uid})
        sources = agent_sources(Path(aiocop.__file__).resolve().parent, owners)
        session = _Session(pin, Exchange(temporary_folder(owners | {os.geteuid()}), pin), start_timeout)
        try:
            hang_after = default_hang_after_ms(seconds) if hang_after_ms is None else hang_after_ms or None
            return session.run(sources, seconds, threshold_ms, hang_after, pictures)
        finally:
            session.close()
    finally:
        pin.close()


class _Session:
    """One attach, from the folder's files written to the folder removed."""

    def __init__(self, pin: Pin, exchange: Exchange, start_timeout: float) -> None:
        self.pin = pin
        self.pid = pin.pid
        self.exchange = exchange
        self.nonce = secrets.token_hex(16)  # given to this target only: what it writes back must carry it
        self.start_timeout = start_timeout
        self.late = False  # the target may still run the script: leave it, and `cancelled`, for it

    def run(
        self,
        sources: dict[str, list[object]],
        seconds: float,
        threshold_ms: float | None,
        hang_after_ms: float | None,
        pictures: bool,
    ) -> dict[str, Any]:
        settings = {
            "folder": str(self.exchange.path),
            "pid": self.pid,
            "start": self.pin.start,
            "nonce": self.nonce,
            "seconds": seconds,
            "threshold_ms": threshold_ms,
            "hang_after_ms": hang_after_ms,
            "pictures": pictures,
            "by": os.getpid(),
        }
        self.exchange.write("agent.json", json.dumps(sources).encode())
        bootstrap = BOOTSTRAP.format(by=os.getpid(), pid=self.pid, settings=json.dumps(settings))
        self.exchange.write("bootstrap.py", bootstrap.encode())
        self.exchange.hand_over()
        self.pin.check()  # the last moment before the PID is used: still the process pinned
        try:
            sys.remote_exec(self.pid, str(self.exchange.path / "bootstrap.py"))  # type: ignore[attr-defined]
        except (RuntimeError, OSError) as error:
            raise _explain(self.pid, error) from None  # not sent: nothing to cancel
        except KeyboardInterrupt:
            self._cancel()  # sent or not: if it was, the script must find `cancelled`
            raise KeyboardInterrupt("if the target runs aiocop's script later, the script does nothing") from None
        try:
            self._wait_started()
        except AttachError:
            self._cancel()
            raise
        except KeyboardInterrupt:
            if self.exchange.has("ran"):  # under way: as if interrupted during the window
                raise KeyboardInterrupt(self._interrupted()) from None
            self._cancel()
            raise KeyboardInterrupt(
                "the target had not run aiocop's script: if it runs it later, the script does nothing"
            ) from None
        try:
            status = self._wait_done(time.monotonic(), seconds)
        except KeyboardInterrupt:
            raise KeyboardInterrupt(self._interrupted()) from None
        finally:
            _progress("")
        if status["state"] == "error":
            raise AttachError(f"PID {self.pid}: {status['error']}")
        data = self.exchange.read("report.json", _attach_report.MAX_REPORT_BYTES)
        if data is None:
            raise AttachError(f"PID {self.pid} said it was done but left no report")
        try:
            return _attach_report.report(
                _attach_report.parse(data, "report.json", _attach_report.MAX_REPORT_BYTES), self.nonce, self.pid
            )
        except BadReportError as error:
            raise AttachError(f"PID {self.pid} sent back a report aiocop cannot use: {error}") from None

    def _interrupted(self) -> str:
        """Ask the target to end its window now; what became of it, said."""
        _progress("")
        print("aiocop: interrupted: asking the target to detach...", file=sys.stderr)
        self.exchange.leave("stop")  # the target ends its window now, and detaches
        try:
            self._wait_done(time.monotonic(), 0.0)  # its undoing, within the grace period
        except (AttachError, KeyboardInterrupt):
            return "the target did not confirm it had detached; it detaches on its own at the end of its window"
        return "the target has detached"

    def _status(self) -> dict[str, Any] | None:
        data = self.exchange.read("status.json", _attach_report.MAX_STATUS_BYTES)
        if data is None:
            return None
        try:
            document = _attach_report.parse(data, "status.json", _attach_report.MAX_STATUS_BYTES)
            return _attach_report.status(document, self.nonce)
        except BadReportError as error:
            raise AttachError(f"PID {self.pid} sent back a status aiocop cannot use: {error}") from None

    def _cancel(self) -> None:
        """Before the script ran (timeout, Ctrl-C): it must do nothing if it runs later, and clean up then."""
        self.exchange.leave("stop")
        self.exchange.leave("cancelled")
        # Ran already: it sees `cancelled` and the folder going, and detaches. Not yet: only
        # the script and `cancelled` are left, for it to find and remove if it runs.
        self.late = not self.exchange.has("ran") and not self.pin.exited()

    def close(self) -> None:
        if self.late:
            self.exchange.remove(keep=("bootstrap.py", "cancelled"))
            self.exchange.close()
        else:
            self.exchange.remove()

    def _wait_started(self) -> None:
        asked = time.monotonic()
        while (status := self._status()) is None:
            if self.pin.exited():
                raise AttachError(f"PID {self.pid} exited before it ran aiocop's script")
            if time.monotonic() - asked > self.start_timeout:
                if self.exchange.has("ran"):
                    raise AttachError(
                        f"PID {self.pid} ran aiocop's script but said nothing within {self.start_timeout:g} s "
                        "(it could not write in the exchange folder: a full disk?); it detaches on its own"
                    )
                message = not_run_message(self.pid, self.start_timeout)
                if self.pin.exited():  # checked after the reads: what they said was of the pinned process
                    raise AttachError(f"PID {self.pid} exited before it ran aiocop's script")
                raise NotRunError(message)
            _progress(f"aiocop: waiting for PID {self.pid} to run aiocop's script...")
            time.sleep(0.05)
        if status["state"] == "error":
            raise AttachError(f"PID {self.pid}: {status['error']}")

    def _wait_done(self, began: float, seconds: float) -> dict[str, Any]:
        """The final status, once the target has written it (the window over, or stopped)."""
        while True:
            status = self._status()
            if status is not None and status["state"] != "started":
                return status
            if self.pin.exited():
                raise AttachError(f"PID {self.pid} exited during the window: nothing to report")
            elapsed = time.monotonic() - began
            if elapsed > seconds + REPORT_GRACE_S:
                raise AttachError(f"PID {self.pid} did not report within {REPORT_GRACE_S:g} s of the window's end")
            _progress(f"aiocop: attached to PID {self.pid}, watching: {min(elapsed, seconds):.1f} / {seconds:g} s")
            time.sleep(0.05)


def main(
    pid: int,
    seconds: float,
    threshold_ms: float | None,
    json_path: str | None,
    fail_on: str | None,
    top: int,
    hang_after_ms: float | None = None,
    pictures: dict[str, str | None] | None = None,
    command: str = "python -m aiocop attach",
) -> int:
    """The `attach` command: the report printed, the files asked for written, the exit status."""
    pictures = pictures or {}
    began = time.time()
    try:
        report = attach(pid, seconds, threshold_ms, hang_after_ms, pictures=any(pictures.values()))
    except AttachError as error:
        # Printable: parts of it (an error the target sent, a version it reported) are the target's.
        # Line by line: the lines are this side's (the target's own text is escaped, its newlines too).
        print("aiocop attach: " + "\n".join(map(printable, str(error).split("\n"))), file=sys.stderr)
        if isinstance(error, NotRunError):
            return EXIT_NOT_RUN
        return EXIT_USAGE if isinstance(error, UsageError) else EXIT_ERROR
    except KeyboardInterrupt as interrupt:
        said = interrupt.args[0] if interrupt.args else "nothing was sent to the target"
        print(f"aiocop attach: interrupted; {said}", file=sys.stderr)
        return EXIT_INTERRUPTED
    summary = Summary.from_dict(report)
    state = "running aiocop already: its detection is left as it was" if report["already_running"] else "detached"
    print(
        f"aiocop: watched PID {pid} (Python {report['python']}) for {report['seconds']:.1f} s, "
        f"{report['loops']} event loop(s), threshold {report['threshold_ms']:g} ms; {state}.",
        file=sys.stderr,
    )
    hangs = _attach_report.render_hangs(report["hangs"])
    if hangs:
        print("\n" + hangs, file=sys.stderr)
    table = summary.render(limit=top)
    if hangs and not summary.rows():
        table = "aiocop: no other blocking call or stall was seen (a hung step's calls are reported when it ends)."
    print("\n" + table, file=sys.stderr)
    written = _write_json(json_path, pid, report) if json_path else True
    if any(pictures.values()):
        written = _report_files.write_model(_model(report, command, began), pictures, own_files=True) and written
    worst = summary.worst_level()
    if any(hang["ended_after_ms"] is None for hang in report["hangs"]):
        worst = "high"  # a loop still hung at the end of the window: the worst there is
    if fail_on and worst is not None and level_rank(worst) >= level_rank(fail_on):
        print(f"aiocop: failing: a call site reached impact {worst!r} (--fail-on {fail_on})", file=sys.stderr)
        return EXIT_FAIL_ON
    return 0 if written else EXIT_ERROR


def _write_json(path: str, pid: int, report: dict[str, Any]) -> bool:
    document = {"aiocop": aiocop.__version__, "attached_to": pid, **report}
    if document["timeline"] is None:
        del document["timeline"]
    try:
        with _report_files.open_own("--json", path) as out:
            json.dump(document, out, indent=2)
            out.write("\n")
    except OSError as error:
        print(f"aiocop attach: --json: cannot write {path!r}: {error.strerror or error}", file=sys.stderr)
        return False
    return True


def _model(report: dict[str, Any], command: str, began: float) -> dict[str, Any]:
    """The HTML report's model (`_timeline.build`'s shape) from the checked report: one model for `run` and `attach`."""
    from aiocop._reporting.timeline import CAUSES  # noqa: PLC0415 - only for an attach that asked for a picture

    timeline = report["timeline"] or {"steps": [], "steps_dropped": 0, "duration_ms": report["seconds"] * 1000.0}
    steps = timeline["steps"]
    loops = sorted({step["loop"].partition("@")[0] for step in steps if step["loop"]})
    return {
        "facts": {
            "command": command,
            "python": f"CPython {report['python']} (PID {report['pid']})",
            "loop": "the target's" + (f"; seen: {', '.join(loops)}" if loops else ""),
            "threshold_ms": report["threshold_ms"],
            "duration_ms": round(max([timeline["duration_ms"], *(step["t1"] for step in steps)]), 3),
            "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(began)),
            "aiocop": report["aiocop"],
            "exit_status": None,
            "cwd": os.getcwd(),
        },
        "summary": {key: report[key] for key in ("events", "dropped_calls", "worst_impact", "call_sites")},
        "steps": steps,
        "steps_dropped": timeline["steps_dropped"],
        "causes": CAUSES,
    }
