"""The known-harmless matcher decides as the plain reading of each rule, on every stack shape.

`rules_in_play` decides with the rules in play what the walks for
`inside_modules` and `inside_functions` find at the caller's frame (issue 39):
a rule the caller's frame rules out is left out, and the walk starts below the
caller where its frame settles nothing. Here each rule is also read plainly
(every condition checked per call, every walk from the caller, as before that
change), on synthetic stacks of modules of every kind, and both must agree.
"""

from __future__ import annotations

import itertools
import os
import sys
import sysconfig
from typing import TYPE_CHECKING, Any

from aiocop._interception import frames as _frames
from aiocop._interception import harmless
from aiocop._interception.frames import Kind

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import FrameType

_STDLIB = sysconfig.get_paths()["stdlib"]

# (module, function) of the frames the stacks are made of, outermost first in a stack.
_USER = ("tests_harmless_matcher_app", "handler")
_FRAMES = (
    ("linecache", "checkcache"),
    ("traceback", "extract_stack"),
    ("asyncio.base_events", "create_unix_server"),
    ("asyncio.events", "_run"),  # a Python loop's dispatch frame: a step's edge
    ("asyncio.base_subprocess", "_connect_pipes"),
    ("subprocess", "communicate"),
    ("shutil", "rmtree"),
    ("os", "_walk"),
    ("threading", "__enter__"),
    ("concurrent.futures._base", "result"),
    ("_pytest.python", "pytest_pyfunc_call"),
    _USER,
)


def _function(module: str, name: str) -> Callable[..., Any]:
    stdlib = module != _USER[0] and not module.startswith("_pytest")
    path = os.path.join(_STDLIB if stdlib else "/srv/app", *module.split(".")) + ".py"
    namespace: dict[str, Any] = {"__name__": module, "__file__": path}
    # A frame of that module and function, calling the next one itself (no frame of this file between).
    exec(f"def {name}(inner, *rest):\n    return inner(*rest)\n", namespace)
    return namespace[name]  # type: ignore[no-any-return]


def _in_stack(frames: tuple[tuple[str, str], ...], leaf: Callable[[FrameType, FrameType], Any]) -> Any:
    """Run `leaf(caller, outermost)`, the innermost of `frames` its caller (`frames` outermost first)."""
    functions = [_function(module, name) for module, name in frames]

    def innermost() -> Any:
        caller = sys._getframe(1)
        outermost = caller
        for _ in range(len(frames) - 1):
            outermost = outermost.f_back  # type: ignore[assignment]
        return leaf(caller, outermost)

    return functions[0](*functions[1:], innermost)


def _went_through(rule: harmless.HarmlessRule, caller: FrameType, edge: FrameType | None) -> bool:
    frame: FrameType | None = caller
    for _ in range(64):
        if frame is None or frame is edge:
            return False
        module = frame.f_globals.get("__name__")
        if harmless.module_in(module, rule.inside_modules, rule.inside_prefixes):
            return True
        kind = _frames.frame_kind(frame)
        if kind == Kind.USER or (kind == Kind.LOOP and _frames.is_step_edge(frame, module)):
            return False
        frame = frame.f_back
    return False


def _plainly(event: str, args: tuple[Any, ...], caller: FrameType, edge: FrameType | None, debug: bool) -> bool:
    # Each rule read as written (the matcher before issue 39's walk start), on every call.
    module = caller.f_globals.get("__name__")
    kind = _frames.frame_kind(caller)
    for rule in harmless.HARMLESS:
        if rule.event and event not in rule.event:
            continue
        if not harmless._caller_module_matches(rule, module, kind):
            continue
        if rule.checks_call and not harmless._call_matches(rule, args, caller):
            continue
        if rule.inside_modules and not _went_through(rule, caller, edge):
            continue
        if rule.inside_functions and not harmless._inside_function(rule, caller, edge):
            continue
        if rule.debug_loop_only and not debug:
            continue
        return True
    return False


class _Loop:
    def __init__(self, debug: bool) -> None:
        self.debug = debug

    def get_debug(self) -> bool:
        return self.debug


_EVENTS = sorted({event for rule in harmless.HARMLESS for event in rule.event} | {"os.stat", "socket.connect"})


def test_the_matcher_decides_as_each_rule_read_plainly() -> None:
    stacks = [
        (outer, *middle, inner)
        for outer in (_USER, ("asyncio.events", "_run"))
        for middle in itertools.chain(((),), ((f,) for f in _FRAMES), itertools.permutations(_FRAMES[:6], 2))
        for inner in _FRAMES
    ]
    decided = {True: 0, False: 0}
    for stack in stacks:

        def leaf(caller: FrameType, outermost: FrameType, stack: object = stack) -> None:
            # The edge a C loop's entry frame would be: none, or the outermost frame.
            module = caller.f_globals.get("__name__")
            kind = _frames.frame_kind(caller)
            for event, edge, debug in itertools.product(_EVENTS, (None, outermost), (False, True)):
                if edge is caller:
                    continue  # the hook's walk stops at the edge before it asks the harmless rules
                args = ("/no/such/file",)
                # Twice: the second time with the cache filled and the rule that matched tried first.
                for _ in range(2):
                    rules = harmless.rules_in_play(event, module, kind)
                    got = bool(rules) and harmless.any_matches(rules, args, caller, edge, _Loop(debug), event, module)  # type: ignore[arg-type]
                    expected = _plainly(event, args, caller, edge, debug)
                    assert got == expected, (stack, event, edge is not None, debug)
                decided[expected] += 1

        _in_stack(stack, leaf)
    assert decided[True] > 100 and decided[False] > 100, decided  # both kinds of decision were made


def test_a_rule_the_callers_frame_rules_out_is_left_out() -> None:
    # linecache's os.stat under traceback: the rules naming linecache or any internal caller stay in
    # play, each walking from the frame below the caller.
    def leaf(caller: FrameType, outermost: FrameType) -> harmless.InPlay:
        return harmless.rules_in_play("os.stat", caller.f_globals["__name__"], _frames.frame_kind(caller))

    in_play = _in_stack((_USER, ("traceback", "extract_stack"), ("linecache", "checkcache")), leaf)
    assert {(rule.inside_modules, start) for rule, start in in_play} == {
        (("asyncio",), harmless._FROM_BACK),
        (("traceback",), harmless._FROM_BACK),
    }
    # subprocess's own `open`: met at the caller; the application's `open`: the rule is left out, as the
    # walk would stop at the caller's frame (the user's) without a match.
    stdlib, user, loop = int(Kind.STDLIB), int(Kind.USER), int(Kind.LOOP)
    by_subprocess = [(r.inside_modules, start) for r, start in harmless.rules_in_play("open", "subprocess", stdlib)]
    assert (("subprocess",), harmless._MET) in by_subprocess
    assert harmless.rules_in_play("open", _USER[0], user) == ()
    # A loop's frame is walked from itself (whether it bounds a step depends on its function).
    by_loop = [(r.inside_modules, start) for r, start in harmless.rules_in_play("os.stat", "asyncio.base_events", loop)]
    assert (("traceback",), harmless._FROM_CALLER) in by_loop
    # A rule naming stdlib functions is left out at any caller not the stdlib's.
    assert not [r for r, _ in harmless.rules_in_play("os.stat", "asyncio.base_events", loop) if r.inside_functions]
