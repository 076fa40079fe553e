"""`python -m aiocop attach PID`: watch a running Python process for a while, without restarting it.

CPython 3.14 can ask another CPython process of the same version to run a
script at its next safe point (`sys.remote_exec`, PEP 768). This side writes
a bootstrap script into a private folder, has the target run it, waits with
a progress line, then prints the target's report as `run` prints its own.
The target's side is `_attach_agent`: it detaches on its own at the end of
the window, whatever happens here.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiocop
from aiocop._report import Summary
from aiocop._severity import level_rank

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_FAIL_ON = 3
EXIT_INTERRUPTED = 130

# How long the target may take to run the bootstrap: it runs at the main
# thread's next safe point, which an idle server reaches at its next request
# or timer. Past this the attach gives up (and a late run does nothing).
START_TIMEOUT_S = float(os.environ.get("AIOCOP_ATTACH_START_TIMEOUT_S", "10"))
# After the window: the report (the pending events delivered, the summary written).
REPORT_GRACE_S = 10.0

BOOTSTRAP = """\
# Written by `python -m aiocop attach` (PID {by}) for this process; it removes its folder when done.
def _aiocop_attach(settings):
    import importlib.machinery, importlib.util, json, os, shutil, sys
    if os.path.exists(os.path.join(settings["folder"], "cancelled")):
        shutil.rmtree(settings["out"], ignore_errors=True)  # the attaching side gave up waiting: do nothing
        return
    try:
        modules_before = [n for n in sys.modules if n == "aiocop" or n.startswith("aiocop.")]
        injected = "aiocop" not in sys.modules
        if injected:
            # The attaching interpreter's copy, found through its own folder
            # only: sys.path is not touched, so nothing else of that folder
            # can be imported by the application meanwhile.
            spec = importlib.machinery.PathFinder.find_spec("aiocop", [settings["path"]])
            module = importlib.util.module_from_spec(spec)
            sys.modules["aiocop"] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules["aiocop"]
                raise
        import aiocop._attach_agent as agent
    except BaseException as error:
        aiocop = sys.modules.get("aiocop")
        where = f"aiocop {{getattr(aiocop, '__version__', '?')}} ({{getattr(aiocop, '__file__', '?')}})"
        status = {{"state": "error", "error": f"could not load {{where}}: {{type(error).__name__}}: {{error}}"}}
        with open(os.path.join(settings["out"], "status.json"), "w") as out:
            json.dump(status, out)
        return
    agent.start({{**settings, "injected": injected, "modules_before": modules_before}})


# The imports take tens of milliseconds: on a thread of their own, not on this
# one, which is often the target's event loop's.
__import__("threading").Thread(
    target=_aiocop_attach, args=(__import__("json").loads({settings!r}),), daemon=True
).start()
del _aiocop_attach
"""


class AttachError(Exception):
    """A reason the attach cannot go on, said in one line."""


def check_interpreter() -> None:
    if sys.version_info < (3, 14) or not hasattr(sys, "remote_exec"):
        version = f"{sys.version_info[0]}.{sys.version_info[1]}"
        raise AttachError(
            f"attach needs CPython 3.14 or later (sys.remote_exec, PEP 768); this is {version}. Run the program "
            "under aiocop instead: python -m aiocop run your_app.py (or -m your.module)"
        )


def check_target(pid: int) -> None:
    """Errors found before asking the target anything: no such process, another user's, remote debugging off."""
    if pid == os.getpid():
        raise AttachError("cannot attach to itself")
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


def _owner(pid: int) -> int:
    return os.stat(f"/proc/{pid}").st_uid if os.path.isdir(f"/proc/{pid}") else os.getuid()


def _read(path: Path) -> dict[str, Any] | None:
    """A JSON file the target wrote: a regular file only (the target could make it a link or a FIFO)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, encoding="utf-8") as stream:
            fd = -1
            document: dict[str, Any] = json.loads(stream.read(_MAX_REPORT_BYTES))
    except (OSError, ValueError):
        return None
    finally:
        if fd >= 0:
            os.close(fd)
    return document


_MAX_REPORT_BYTES = 64 << 20


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a process that has exited but not been reaped by its parent yet is no target
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def _progress(text: str) -> None:
    if sys.stderr.isatty():
        print(f"\r{text}\033[K", end="", file=sys.stderr, flush=True)


def attach(pid: int, seconds: float, threshold_ms: float | None) -> dict[str, Any]:
    """Watch PID for `seconds`; its report. Raises AttachError; KeyboardInterrupt ends the window early."""
    check_interpreter()
    check_target(pid)
    # This user's folder (0700, or 0711 for another user's target: it may pass through, not list or write):
    # the bootstrap, and the `stop` and `cancelled` files this side leaves. The target writes in `out`
    # only, its own when root attaches to another user's process: it can plant nothing this side opens.
    folder = Path(tempfile.mkdtemp(prefix=f"aiocop-attach-{pid}-"))
    out = folder / "out"
    out.mkdir(mode=0o700)
    owner = _owner(pid)
    other_user = owner != os.getuid() and os.geteuid() == 0
    cancelled = False
    try:
        settings = {
            "folder": str(folder),
            "out": str(out),
            "path": str(Path(aiocop.__file__).resolve().parent.parent),
            "seconds": seconds,
            "threshold_ms": threshold_ms,
            "by": os.getpid(),
        }
        script = folder / "bootstrap.py"
        with open(os.open(script, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="utf-8") as stream:
            stream.write(BOOTSTRAP.format(by=os.getpid(), settings=json.dumps(settings)))
        if other_user:
            os.chmod(folder, 0o711)
            os.chown(script, owner, -1)
            os.chown(out, owner, -1)
        try:
            sys.remote_exec(pid, str(script))  # type: ignore[attr-defined]
        except (RuntimeError, OSError) as error:
            raise _explain(pid, error) from None
        try:
            return _wait(pid, folder, out, seconds)
        except BaseException:
            cancelled = (folder / "cancelled").exists()
            raise
    finally:
        if not cancelled:  # else a late bootstrap must still find it, and do nothing
            shutil.rmtree(folder, ignore_errors=True)


def _wait(pid: int, folder: Path, out: Path, seconds: float) -> dict[str, Any]:
    status_file = out / "status.json"
    try:
        _wait_started(pid, folder, status_file)
        status = _wait_done(pid, status_file, time.monotonic(), seconds)
    except KeyboardInterrupt:
        _progress("")
        print("aiocop: interrupted: asking the target to detach...", file=sys.stderr)
        _leave(folder, "stop")  # the target ends its window now, and detaches
        if _read(status_file) is None:
            _leave(folder, "cancelled")  # not started: if it starts, it stops at once and cleans up
        else:
            with contextlib.suppress(AttachError):
                _wait_done(pid, status_file, time.monotonic(), 0.0)  # its report, within the grace period
        raise
    finally:
        _progress("")
    report = _read(out / "report.json")
    if status["state"] == "error" or report is None:
        raise AttachError(f"PID {pid}: {status.get('error', 'it said it was done but left no report')}")
    return report


def _leave(folder: Path, name: str) -> None:
    """A file the target looks for: made here, in this side's own folder, never through a link."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644))


def _wait_started(pid: int, folder: Path, status_file: Path) -> None:
    asked = time.monotonic()
    while (status := _read(status_file)) is None:
        if not _alive(pid):
            raise AttachError(f"PID {pid} exited before it ran aiocop's script")
        if time.monotonic() - asked > START_TIMEOUT_S:
            _leave(folder, "stop")
            _leave(folder, "cancelled")
            raise AttachError(
                f"PID {pid} did not run aiocop's script within {START_TIMEOUT_S:g} s: its main thread has not "
                "reached Python code since (blocked in a call, or an idle server waiting for its next request), "
                "or remote debugging is disabled in it. If it runs the script later, the script does nothing."
            )
        _progress(f"aiocop: waiting for PID {pid} to run aiocop's script...")
        time.sleep(0.05)
    if status["state"] == "error":
        raise AttachError(f"PID {pid}: {status['error']}")


def _wait_done(pid: int, status_file: Path, began: float, seconds: float) -> dict[str, Any]:
    """The final status, once the target has written it (the window over, or stopped)."""
    while True:
        status = _read(status_file)
        if status is not None and status["state"] != "started":
            return status
        if not _alive(pid):
            raise AttachError(f"PID {pid} exited during the window: nothing to report")
        elapsed = time.monotonic() - began
        if elapsed > seconds + REPORT_GRACE_S:
            raise AttachError(f"PID {pid} did not report within {REPORT_GRACE_S:g} s of the window's end")
        _progress(f"aiocop: attached to PID {pid}, watching: {min(elapsed, seconds):.1f} / {seconds:g} s")
        time.sleep(0.05)


def main(
    pid: int, seconds: float, threshold_ms: float | None, json_path: str | None, fail_on: str | None, top: int
) -> int:
    """The `attach` command: the report printed, the exit status."""
    try:
        report = attach(pid, seconds, threshold_ms)
    except AttachError as error:
        print(f"aiocop attach: {error}", file=sys.stderr)
        return EXIT_USAGE if "3.14 or later" in str(error) else EXIT_ERROR
    except KeyboardInterrupt:
        print("aiocop attach: interrupted; the target has detached", file=sys.stderr)
        return EXIT_INTERRUPTED
    summary = Summary.from_dict(report)
    state = "running aiocop already: its detection is left as it was" if report["already_running"] else "detached"
    print(
        f"aiocop: watched PID {pid} (Python {report['python']}) for {report['seconds']:.1f} s, "
        f"{report['loops']} event loop(s), threshold {report['threshold_ms']:g} ms; {state}.",
        file=sys.stderr,
    )
    print("\n" + summary.render(limit=top), file=sys.stderr)
    if json_path:
        with open(json_path, "w", encoding="utf-8") as out:
            json.dump({"aiocop": aiocop.__version__, "attached_to": pid, **report}, out, indent=2)
            out.write("\n")
    worst = summary.worst_level()
    if fail_on and worst is not None and level_rank(worst) >= level_rank(fail_on):
        print(f"aiocop: failing: a call site reached impact {worst!r} (--fail-on {fail_on})", file=sys.stderr)
        return EXIT_FAIL_ON
    return 0
