"""`python -m aiocop run`: run a program with detection on and summarise what blocked its loops."""

from __future__ import annotations

import argparse
import asyncio
import builtins
import contextlib
import importlib.machinery
import importlib.util
import io
import json
import math
import os
import runpy
import shlex
import signal
import sys
import threading
import types
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

import aiocop
from aiocop._commands import exits as _exits
from aiocop._commands.exits import EXIT_ERROR, EXIT_FAIL_ON, EXIT_USAGE
from aiocop._common.escape import printable
from aiocop._common.inputs import open_for_writing
from aiocop._configuration import baseline as _baseline
from aiocop._configuration.config import MAX_HANG_AFTER_MS, MAX_THRESHOLD_MS, ConfigError, parse_allow_line, read_config
from aiocop._interception.frames import set_app_paths
from aiocop._model import state as _state
from aiocop._model.events import is_hang_report
from aiocop._model.severity import LEVELS, level_rank
from aiocop._reporting import hangs as _hangs
from aiocop._reporting import report_files as _report_files
from aiocop._reporting.report import Summary, describe, describe_hang
from aiocop._stalls.settings import sampling as _sampling

if TYPE_CHECKING:
    from collections.abc import Callable, Generator, Iterator, Sequence
    from types import CodeType

    from aiocop._interception.allow import AllowRule
    from aiocop._model.events import SlowTaskEvent
    from aiocop._reporting.timeline import Timeline

PROG = "python -m aiocop"

# aiocop's own options of `run` that take a value: everything up to the
# program (a script path, or `-m module`) is aiocop's, the rest the program's.
_VALUE_OPTIONS = frozenset(
    {
        "--threshold-ms",
        "--hang-after-ms",
        "--trace-depth",
        "--json",
        "--html",
        "--speedscope",
        "--folded",
        "--fail-on",
        "--top",
        "--config",
        "--allow",
        "--app-path",
        "--library-path",
        "--baseline",
        "--write-baseline",
    }
)
DEFAULT_THRESHOLD_MS = 30.0
DEFAULT_TRACE_DEPTH = 10


# Read by the attach command only (never by `run`, nor at import): seconds the target may take to start.


def _positive(kind: type[float] | type[int], at_most: float = math.inf) -> Any:
    def parse(text: str) -> float | int:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text!r}") from None
        if not 0 < value < math.inf:  # also refuses NaN
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text!r}")
        if value > at_most:
            raise argparse.ArgumentTypeError(f"expected at most {at_most:.15g}, got {text!r}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def _hang_after(text: str) -> float:
    """`--hang-after-ms`: milliseconds above 0 and at most a day, or 0 (off)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= MAX_HANG_AFTER_MS:  # also refuses NaN and infinity
        raise argparse.ArgumentTypeError(
            f"expected a number of milliseconds from 0 (off) to {MAX_HANG_AFTER_MS:.15g} (a day), got {text!r}"
        )
    return value


_hang_after.__name__ = "milliseconds"
DEFAULT_HANG_AFTER_MS = 5000.0


def build_parsers() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The `python -m aiocop` parser and its `run` sub-parser."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Find the calls that freeze your asyncio event loops.",
        epilog=f"Run '{PROG} run --help' or '{PROG} attach --help' for their options.",
    )
    parser.add_argument("--version", action="version", version=f"aiocop {aiocop.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="command")
    run = commands.add_parser(
        "run",
        # An abbreviated option (--thr 5) would be taken for one without a
        # value by split_program, and its value for the script.
        allow_abbrev=False,
        help="run a program with detection on and print a summary of blocking call sites at exit",
        usage=f"{PROG} run [options] (script.py | -m module) [args ...]",
        description=(
            "Run a Python program with aiocop watching every event loop it starts, then print a "
            "table of the call sites that blocked a loop: count, loop time lost, worst step, impact."
        ),
    )
    run.add_argument(
        "--uvloop",
        action="store_true",
        help="run the loops the program creates without a loop factory (asyncio.run(), asyncio.Runner, "
        "asyncio.new_event_loop()) on uvloop",
    )
    _add_threshold(run, ", or threshold_ms in [tool.aiocop]")
    run.add_argument(
        "--no-watchdog", action="store_true", help="intercepted calls only: do not look for CPU-bound stalls"
    )
    run.add_argument(
        "--trace-depth",
        type=_positive(int),
        metavar="N",
        help=f"frames kept per call (default: {DEFAULT_TRACE_DEPTH}, or trace_depth in [tool.aiocop])",
    )
    _add_json(run, "the summary, with one example trace per call site,")
    _add_picture_files(run)
    _add_fail_on(run, "; default: fail_on in [tool.aiocop], else never")
    run.add_argument(
        "--config",
        metavar="FILE",
        help="the pyproject.toml whose [tool.aiocop] table to use (default: $AIOCOP_CONFIG, else the nearest "
        "pyproject.toml from the working directory up)",
    )
    run.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="RULE",
        help="do not report matching calls, e.g. 'open module=myapp.templates' (repeatable; added to allow in "
        "[tool.aiocop])",
    )
    run.add_argument(
        "--app-path",
        action="append",
        default=[],
        metavar="PREFIX",
        help="files under this path are the application's own code, even if installed (repeatable)",
    )
    run.add_argument(
        "--library-path",
        action="append",
        default=[],
        metavar="PREFIX",
        help="files under this path are not the application's own code, e.g. vendored packages (repeatable)",
    )
    run.add_argument(
        "--baseline",
        metavar="FILE",
        help="call sites recorded in this file are reported but cannot fail the run (default: baseline in "
        "[tool.aiocop])",
    )
    run.add_argument(
        "--write-baseline",
        metavar="FILE",
        help="record every call site this run reports in FILE, as the baseline later runs compare with",
    )
    _add_hang_after(
        run,
        f"print a loop still stuck in one step after this long, while it is stuck, with its stack; 0: off, "
        f"at most a day (default: {DEFAULT_HANG_AFTER_MS:g}, or hang_after_ms in [tool.aiocop]); on SIGTERM, the "
        "report shows hung loops first",
    )
    _add_top(run)
    run.add_argument("-v", "--verbose", action="store_true", help="also print each event as it is reported")
    run.add_argument("-m", dest="module", metavar="module", help="run a library module as a script, like python -m")
    _add_attach(commands)
    return parser, run


def _add_picture_files(run: argparse.ArgumentParser) -> None:
    run.add_argument(
        "--html",
        metavar="FILE",
        help="also write a self-contained HTML report: the call sites with their traces, a timeline of the "
        "steps that held each loop, and flame graphs of their stacks weighed in loop time",
    )
    run.add_argument(
        "--speedscope",
        metavar="FILE",
        help="also write the stacks of the steps that held each loop in speedscope's JSON format, one profile per "
        "loop thread, weighed in milliseconds of loop time",
    )
    run.add_argument(
        "--folded",
        metavar="FILE",
        help="also write those stacks as folded stacks weighed in microseconds of loop time (flamegraph.pl, inferno)",
    )


def _add_attach(commands: Any) -> argparse.ArgumentParser:
    attach: argparse.ArgumentParser = commands.add_parser(
        "attach",
        allow_abbrev=False,
        help="watch a running Python 3.14+ process for a while, without restarting it, and print its blocking "
        "call sites",
        usage=f"{PROG} attach [options] PID",
        description=(
            "Attach to a running CPython 3.14+ process (sys.remote_exec), watch its event loops for a while, "
            "print the call sites that blocked them, and detach, leaving the process as it was. Needs the same "
            "Python version as the target, and the right to debug it (its user, or root)."
        ),
    )
    attach.add_argument("pid", type=_positive(int), metavar="PID", help="the process to watch")
    attach.add_argument(
        "--seconds",
        type=_positive(float, 86_400),
        default=10.0,
        metavar="N",
        help="how long to watch (default: 10; at most a day)",
    )
    _add_threshold(attach, "; a target running aiocop already keeps its own")
    _add_hang_after(
        attach,
        "report a loop stuck in one step this long as hung, with its stack, in the report and --html; 0: "
        "off (default: 5000, or half of --seconds if less); a target running aiocop's watchdog keeps its own",
    )
    _add_json(attach, "the report")
    _add_picture_files(attach)
    _add_fail_on(attach, "")
    _add_top(attach)
    return attach


# The options `run` and `attach` share: one definition each (flag, type and its checks, metavar), the part of
# the help that differs between the two commands (their defaults come from different places) passed in.


def _add_threshold(parser: argparse.ArgumentParser, after_default: str) -> None:
    parser.add_argument(
        "--threshold-ms",
        type=_positive(float, MAX_THRESHOLD_MS),
        metavar="MS",
        help=f"a step holding its loop this long is a stall (default: {DEFAULT_THRESHOLD_MS:g}{after_default})",
    )


def _add_hang_after(parser: argparse.ArgumentParser, help_text: str) -> None:
    parser.add_argument("--hang-after-ms", type=_hang_after, metavar="MS", help=help_text)


def _add_json(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--json", metavar="FILE", help=f"also write {what} as JSON")


def _add_fail_on(parser: argparse.ArgumentParser, default_note: str) -> None:
    parser.add_argument(
        "--fail-on",
        choices=LEVELS,
        metavar="IMPACT",
        help=f"exit with status {EXIT_FAIL_ON} if a call site reached this impact (low, medium or high{default_note})",
    )


def _add_top(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--top", type=_positive(int), default=20, metavar="N", help="rows shown (default: 20)")


def attach_parser() -> argparse.ArgumentParser:
    """The `attach` sub-parser (for the options page)."""
    parser, _ = build_parsers()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    attach: argparse.ArgumentParser = commands.choices["attach"]
    return attach


@dataclass(frozen=True)
class Program:
    """What to run: a script path or a module name, and its arguments."""

    script: str | None
    module: str | None
    args: list[str]


def split_program(argv: Sequence[str]) -> tuple[list[str], Program | None]:
    """aiocop's options, and the program with its own arguments (`None` if absent)."""
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "-m" or (token.startswith("-m") and not token.startswith("--")):
            module = token[2:] or (argv[i + 1] if i + 1 < len(argv) else "")
            rest = argv[i + 1 :] if token[2:] else argv[i + 2 :]
            return list(argv[:i]), Program(None, module, list(rest)) if module else None
        if token == "--":
            return list(argv[:i]), Program(argv[i + 1], None, list(argv[i + 2 :])) if i + 1 < len(argv) else None
        if not token.startswith("-") or token == "-":
            return list(argv[:i]), Program(token, None, list(argv[i + 1 :]))
        i += 2 if token in _VALUE_OPTIONS else 1
    return list(argv), None


def _usage_error(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    parser.error(message)  # prints usage and the message, exits with status 2


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI in this process, the program under a function of aiocop's; the exit status.

    `python -m aiocop` runs the program at its own top level instead (see
    `aiocop.__main__`), with no frame of aiocop's between it and the interpreter.
    """
    steps = session(argv)
    try:
        program = next(steps)
        steps.send(_execute(program))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    raise RuntimeError("the CLI session went on after the program's run")  # pragma: no cover - not reached


def session(argv: Sequence[str] | None = None) -> Generator[Program, int, int]:
    """The CLI's steps around the program: yields the program to run, is sent its exit status, returns aiocop's.

    A generator, so that nothing of aiocop's is on the stack while the
    program runs. Returns at once (with the status) for what runs no program:
    `--help`, a usage error, `attach`.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, run_parser = build_parsers()
    if not argv:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    if argv[0] == "attach":
        settings = parser.parse_args(argv)
        for flag in ("--json", *_report_files.FLAGS):
            path = getattr(settings, flag[2:])
            _check_output(attach_parser(), flag, path)
            if path is not None and (planted := _report_files.planted_problem(flag, path)) is not None:
                _usage_error(attach_parser(), planted)
        # Imported for this command only: `run` never loads attach, nor reads its environment.
        from aiocop._commands.attach import command as _attach  # noqa: PLC0415

        try:  # checked before anything else, on any Python: a usage error, said as attach says its errors
            _attach.start_timeout_s()
        except _attach.UsageError as problem:
            print(f"aiocop attach: {problem}", file=sys.stderr)
            return EXIT_USAGE
        return _attach.main(
            settings.pid,
            settings.seconds,
            settings.threshold_ms,
            settings.json,
            settings.fail_on,
            settings.top,
            settings.hang_after_ms,
            {flag: getattr(settings, flag[2:]) for flag in _report_files.FLAGS},
            f"{PROG} {shlex.join(argv)}",
        )
    if argv[0] != "run":
        parser.parse_args(argv)  # --help, --version, or an error naming the bad command
        _usage_error(parser, f"unknown command {argv[0]!r}")
    options, program = split_program(argv[1:])
    settings = run_parser.parse_args(options)
    if program is None:
        _usage_error(run_parser, "the program to run is missing: give a script path or -m module")
    if program.script is not None and not os.path.isfile(program.script):
        _usage_error(run_parser, f"can't open file {program.script!r}: no such file")
    if program.module is not None and not _module_exists(program.module):
        _usage_error(run_parser, f"no module named {program.module!r}")
    # Found out now rather than after a long run whose report is then lost.
    _check_output(run_parser, "--json", settings.json)
    _check_output(run_parser, "--write-baseline", settings.write_baseline)
    for flag in _report_files.FLAGS:
        _check_output(run_parser, flag, getattr(settings, flag[2:]))
    settings.command = f"{PROG} {shlex.join(argv)}"
    resolved = _resolve(settings, run_parser)
    factory = _uvloop_factory(run_parser) if settings.uvloop else None
    # A run looks at idle loops written in C every half threshold
    # (start_cpu_sampling's precise_idle): a program run to be checked wants
    # its stalls after a quiet spell seen more than the CPU saved in production.
    _sampling.precise_by_default = True
    with _default_loop_factory(factory):
        return (yield from _run(program, settings, resolved))


def _check_output(parser: argparse.ArgumentParser, flag: str, path: str | None) -> None:
    # What can be known before the run; what cannot (a full disk) fails the run after it.
    problem = None if path is None else _report_files.output_problem(flag, path)
    if problem is not None:
        _usage_error(parser, problem)


@dataclass(frozen=True)
class Resolved:
    """The run's settings: each flag, else `[tool.aiocop]`, else the default."""

    threshold_ms: float
    trace_depth: int
    fail_on: str | None
    allow: tuple[AllowRule, ...]
    app_paths: tuple[str, ...]
    library_paths: tuple[str, ...]
    baseline: frozenset[tuple[str, str]] | None
    hang_after_ms: float | None = DEFAULT_HANG_AFTER_MS  # None: off


def _resolve(settings: argparse.Namespace, parser: argparse.ArgumentParser) -> Resolved:
    try:
        project = read_config(settings.config, named_by="--config")
    except ConfigError as exc:
        _usage_error(parser, str(exc))
    cwd = os.getcwd()
    rules = list(project.allow)
    for line in settings.allow:
        try:
            rules.append(parse_allow_line(line, cwd))
        except ValueError as exc:
            _usage_error(parser, f"--allow: in rule {line!r}: {exc}")
    baseline: frozenset[tuple[str, str]] | None = None
    if settings.baseline is not None and not settings.baseline.strip():
        _usage_error(parser, f"--baseline: expected a file name, got {settings.baseline!r}")
    baseline_file = settings.baseline or project.baseline
    if baseline_file and not settings.write_baseline:
        try:
            baseline = _baseline.read(baseline_file)
        except _baseline.BaselineError as exc:
            origin = "" if settings.baseline else f"{project.source} [tool.aiocop] baseline: "
            _usage_error(parser, f"{origin}{exc}")
    return Resolved(
        threshold_ms=settings.threshold_ms or project.threshold_ms or DEFAULT_THRESHOLD_MS,
        trace_depth=settings.trace_depth or project.trace_depth or DEFAULT_TRACE_DEPTH,
        fail_on=settings.fail_on or project.fail_on,
        allow=tuple(rules),
        app_paths=(*project.app_paths, *(os.path.abspath(p) for p in settings.app_path)),
        library_paths=(*project.library_paths, *(os.path.abspath(p) for p in settings.library_path)),
        baseline=baseline,
        hang_after_ms=_pick_hang_after(settings.hang_after_ms, project.hang_after_ms),
    )


def _pick_hang_after(flag: float | None, table: float | None) -> float | None:
    """The flag, else the table, else the default; 0 (either) is off: None."""
    chosen = flag if flag is not None else table if table is not None else DEFAULT_HANG_AFTER_MS
    return chosen or None


def _module_exists(name: str) -> bool:
    # As `python -m`, which imports the parent packages to find the module.
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _uvloop_factory(parser: argparse.ArgumentParser) -> Callable[[], asyncio.AbstractEventLoop]:
    try:
        import uvloop  # noqa: PLC0415 - an optional dependency, needed only with --uvloop
    except ImportError:
        _usage_error(parser, "--uvloop needs uvloop: pip install 'aiocop[uvloop]'")
    return uvloop.new_event_loop


@contextlib.contextmanager
def _default_loop_factory(factory: Callable[[], asyncio.AbstractEventLoop] | None) -> Iterator[None]:
    """Make loops the program creates without naming a factory come from `factory`.

    Event loop policies are deprecated from 3.14 (gone in 3.16), so the CLI
    does not install one: `asyncio.run()` and `asyncio.Runner` without a
    `loop_factory`, and `asyncio.new_event_loop()`, all create their loop
    through `asyncio.events.new_event_loop` on every supported version; the
    program's run replaces that one name, and puts it back after.
    """
    if factory is None:
        yield
        return
    original = asyncio.events.new_event_loop

    def new_event_loop() -> asyncio.AbstractEventLoop:
        return factory()

    new_event_loop.__doc__ = original.__doc__
    asyncio.events.new_event_loop = asyncio.new_event_loop = new_event_loop
    try:
        yield
    finally:
        asyncio.events.new_event_loop = asyncio.new_event_loop = original


def _run(program: Program, settings: argparse.Namespace, resolved: Resolved) -> Generator[Program, int, int]:
    summary = Summary(resolved.baseline)
    pictures = {flag: getattr(settings, flag[2:]) for flag in _report_files.FLAGS}
    timeline: Timeline | None = None
    if any(pictures.values()):  # they need each step's time: kept only when one is asked for
        from aiocop._reporting.timeline import Timeline  # noqa: PLC0415 - loaded only by a run that asked

        timeline = Timeline(summary)
    collector = timeline or summary
    aiocop.start_blocking_io_detection(trace_depth=resolved.trace_depth)
    if settings.no_watchdog:  # intercepted calls only; the threshold still says which steps were slow
        _state.config.threshold_ms = resolved.threshold_ms
        aiocop.register_slow_task_callback(collector)
    else:
        aiocop.detect_slow_tasks(
            threshold_ms=resolved.threshold_ms, on_slow_task=collector, hang_after_ms=resolved.hang_after_ms
        )
    set_app_paths(resolved.app_paths, resolved.library_paths)
    for rule in resolved.allow:
        aiocop.add_allow_rule(rule)
    aiocop.register_slow_task_callback(_print_event if settings.verbose else _print_hang)
    pid = os.getpid()
    writing = threading.Lock()  # the report written once at a time: the late write (exits.GRACE_S) and the end's

    def on_exit(signum: int) -> None:  # from the signal handler: the process ends by the signal next
        with contextlib.suppress(Exception):  # (stderr closed, or in use by the interrupted write)
            print(f"\naiocop: terminated by {signal.Signals(signum).name}", file=sys.stderr, flush=True)
        with writing:
            _final_look(collector)
            _conclude(program, settings, resolved, 128 + signum, summary, timeline, pictures)

    def on_late(signum: int) -> None:  # the program handles the signal, and is still running GRACE_S later
        with writing:
            name = signal.Signals(signum).name
            print(f"aiocop: still running {_exits.GRACE_S:g} s after {name}: the report so far", file=sys.stderr)
            _final_look(collector)
            _conclude(program, settings, resolved, 128 + signum, summary, timeline, pictures, late=True)

    exits = _exits.ExitSignals(on_exit, on_late)
    exits.install()
    try:
        status = yield program  # run by the caller: nothing of aiocop's on the stack meanwhile
        if os.getpid() != pid:
            return status  # a forked child that returned: the summary is the parent's to print
        try:
            _wait_for_threads()
        except KeyboardInterrupt:
            status = 130
    finally:
        exits.restore()
    writing.acquire()  # (a late write under way ends first; none starts after this)
    _final_look(collector)  # a step still holding a loop (a daemon thread's) at the end
    aiocop.stop()  # delivers what is still pending
    aiocop.unregister_slow_task_callback(collector)
    aiocop.unregister_slow_task_callback(_print_event)
    aiocop.unregister_slow_task_callback(_print_hang)

    for rule in resolved.allow:
        aiocop.remove_allow_rule(rule)
    set_app_paths((), ())
    return _conclude(program, settings, resolved, status, summary, timeline, pictures)


def _final_look(collector: Callable[[SlowTaskEvent], None]) -> None:
    # The steps still holding a loop, past the threshold but short of a hang
    # report, never get an event of their own: without this the report would
    # be an all-clear (issue 38).
    for event in _hangs.ongoing():
        collector(event)


def _conclude(
    program: Program,
    settings: argparse.Namespace,
    resolved: Resolved,
    status: int,
    summary: Summary,
    timeline: Timeline | None,
    pictures: dict[str, str | None],
    *,
    late: bool = False,
) -> int:
    """After the run: the report printed, the files asked for written, the exit status.

    `late`: the report so far, while the program still runs (exits.GRACE_S): the files only, no baseline.
    """
    print("\n" + summary.render(limit=settings.top), file=sys.stderr)
    # A run asked for a file it did not get has not succeeded, whatever the program did:
    # CI would pass without the report it archives.
    written = _write_json(settings.json, program, status, summary) if settings.json else True
    if timeline is not None:
        from aiocop._reporting import timeline as _timeline  # noqa: PLC0415 - loaded already, by the run that asked

        timeline.finish()
        loop = "uvloop (--uvloop)" if settings.uvloop else "the program's own (asyncio's default unless it names one)"
        facts = _timeline.Facts(settings.command, resolved.threshold_ms, loop, status)
        written = _report_files.write(timeline, facts, pictures) and written
    if late:
        return status
    if settings.write_baseline:
        try:
            _baseline.write(settings.write_baseline, summary.counts())
        except OSError as error:
            print(f"aiocop: could not write --write-baseline file: {printable(str(error))}", file=sys.stderr)
            return status or EXIT_ERROR
        print(
            f"aiocop: wrote {len(summary.counts())} call site(s) to the baseline {settings.write_baseline!r}",
            file=sys.stderr,
        )
        # Today's call sites are the baseline: none of them fails this run.
        return status or (0 if written else EXIT_ERROR)
    fail_on = resolved.fail_on
    worst = summary.worst_level(new_only=True)
    if status == 0 and fail_on and worst is not None and level_rank(worst) >= level_rank(fail_on):
        what = "a call site not in the baseline" if resolved.baseline is not None else "a call site"
        source = f"--fail-on {fail_on}" if settings.fail_on else f"fail_on = {fail_on!r} in [tool.aiocop]"
        print(f"aiocop: failing: {what} reached impact {worst!r} ({source})", file=sys.stderr)
        return EXIT_FAIL_ON
    return status or (0 if written else EXIT_ERROR)


def _print_event(event: SlowTaskEvent) -> None:
    print("aiocop: " + describe(event), file=sys.stderr)


def prepare(program: Program) -> dict[str, Any]:
    """Make the process look as `python script.py` / `python -m module` makes it; the globals to run in.

    A fresh `__main__` module, with the interpreter's own attributes
    (`__builtins__` the module, a script's absolute `__file__`, its
    `SourceFileLoader`), `sys.argv` and `sys.path[0]` as Python sets them. A
    module's own attributes are set by `runpy`, as under `python -m`.
    """
    main_module = types.ModuleType("__main__")
    main_module.__builtins__ = builtins  # type: ignore[attr-defined] # a module, as in the interpreter's __main__
    if sys.version_info < (3, 14):
        main_module.__annotations__ = {}  # the interpreter gives its __main__ one up to 3.13
    sys.modules["__main__"] = main_module
    if program.module is not None:
        sys.argv = ["-m", *program.args]  # as Python while it finds the module; runpy then sets the module's path
        sys.path[0] = os.getcwd()
        return main_module.__dict__
    assert program.script is not None
    path = os.path.abspath(program.script)
    sys.argv = [program.script, *program.args]
    sys.path[0] = os.path.dirname(os.path.realpath(program.script))  # as Python: symlinks resolved
    main_module.__file__ = path
    if sys.version_info < (3, 15):
        main_module.__cached__ = None  # type: ignore[attr-defined] # gone from 3.15
    main_module.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    return main_module.__dict__


def script_code(program: Program) -> CodeType:
    """The script's code, compiled as `python script.py` compiles it (under its absolute path)."""
    assert program.script is not None
    path = os.path.abspath(program.script)
    with io.open_code(path) as source:
        return compile(source.read(), path, "exec", dont_inherit=True)


def program_failed(error: BaseException) -> int:
    """The exit status of a program that ended with `error`, shown as Python would show it."""
    if isinstance(error, SystemExit):
        return _exit_status(error.code)
    _print_program_error(error)
    return 130 if isinstance(error, KeyboardInterrupt) else 1


def _print_hang(event: SlowTaskEvent) -> None:
    # Hangs are printed as they happen, whatever --verbose says (from aiocop's own thread).
    if is_hang_report(event):
        print("aiocop: " + describe_hang(event), file=sys.stderr, flush=True)


def _execute(program: Program) -> int:
    """Run the program in this process (`main()`), under this function; its exit status."""
    saved = sys.argv, sys.path[0], sys.modules["__main__"]
    try:
        run_globals = prepare(program)
        if program.module is not None:
            runpy._run_module_as_main(program.module)  # type: ignore[attr-defined] # what `python -m` calls
        else:
            exec(script_code(program), run_globals)
    except BaseException as error:  # the program's own failure: show it as Python would, then the summary
        return program_failed(error)
    finally:
        sys.argv, sys.path[0], sys.modules["__main__"] = saved
    return 0


def _wait_for_threads() -> None:
    # The program is not over until its non-daemon threads are, and their
    # loops are watched to the end: wait for them as the interpreter would
    # at exit, having first told idle executor workers to quit (which a plain
    # join of every thread would not). Called again at exit, it returns at once.
    if threading.current_thread() is threading.main_thread():
        threading._shutdown()  # type: ignore[attr-defined] # private, but the interpreter's own next step


# aiocop's frames under the program (runpy's, under a module, are Python's own, as under `python -m`).
_OWN_FILES = (__file__, os.path.join(os.path.dirname(os.path.dirname(__file__)), "__main__.py"))


def _print_program_error(error: BaseException) -> None:
    # Start the traceback at the program's own frames, as `python script.py`
    # would: skip aiocop's own frames. Through sys.excepthook, which
    # the program may have replaced.
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in _OWN_FILES:
        tb = tb.tb_next
    sys.excepthook(type(error), error.with_traceback(tb), tb)  # the default hook reads __traceback__


def _exit_status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message") prints it and exits with 1
    return 1


def _write_json(path: str, program: Program, status: int, summary: Summary) -> bool:
    document = {
        "aiocop": aiocop.__version__,
        "program": program.script or f"-m {program.module}",
        "args": program.args,
        "exit_status": status,
        **summary.to_dict(),
    }
    try:
        with open_for_writing(path) as out:
            json.dump(document, out, indent=2)
            out.write("\n")
    except OSError as error:
        print(f"aiocop: could not write --json file: {printable(str(error))}", file=sys.stderr)
        return False
    return True
