"""Matching blocking calls against the known-harmless internals (`_internals.HARMLESS`).

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
from typing import TYPE_CHECKING, Any

from aiocop._interception import frames as _frames
from aiocop._interception.frames import Kind
from aiocop._interception.internals import HARMLESS, IMPORT_EVENTS, HarmlessRule

if TYPE_CHECKING:
    from asyncio import AbstractEventLoop
    from types import FrameType

    from aiocop._interception.trio_runs import TrioRun

_STDLIB_MODULES: frozenset[str] = frozenset(getattr(sys, "stdlib_module_names", ()))

# event -> caller's module name -> the rules that event and module leave in play.
in_play: dict[str, dict[object, tuple[HarmlessRule, ...]]] = {}


def rules_in_play(event: str, caller_module: object, caller_kind: int) -> tuple[HarmlessRule, ...]:
    """The rules whose event and caller-module conditions the call meets (cached).

    A frame's kind is a function of its module name (see `_frames.frame_kind`),
    so the pair (event, module name) decides these conditions.
    """
    by_module = in_play.get(event)
    if by_module is None:
        by_module = in_play[event] = {}
    rules = by_module.get(caller_module)
    if rules is None:
        if len(by_module) >= _frames.MAX_CACHED_MODULES:  # bounded, as _frames' cache
            by_module.clear()
        rules = by_module[caller_module] = tuple(
            rule
            for rule in HARMLESS
            if (not rule.event or event in rule.event) and _caller_module_matches(rule, caller_module, caller_kind)
        )
    return rules


def _caller_module_matches(rule: HarmlessRule, module: object, kind: int) -> bool:
    if rule.caller_internal and kind == Kind.USER:
        return False
    return not rule.caller_modules or module_in(module, rule.caller_modules, rule.caller_prefixes)


def module_in(module: object, modules: tuple[str, ...], prefixes: tuple[str, ...]) -> bool:
    """Whether `module` is one of `modules` or below one of `prefixes` (`"pkg."`)."""
    return isinstance(module, str) and (module in modules or module.startswith(prefixes))


def any_matches(
    rules: tuple[HarmlessRule, ...],
    args: tuple[Any, ...],
    caller: FrameType,
    edge: FrameType | None,
    loop: AbstractEventLoop | TrioRun,
    event: str | None = None,
    module: object = None,
) -> bool:
    """Whether one of `rules` (from `rules_in_play`) matches the call in full.

    `caller` is the innermost frame outside aiocop; `edge` the frame that
    entered a loop written in C, if any (the walk for `inside_modules` stops
    there, as at a Python loop's dispatch frame). `event` and `module`: the
    event and caller module `rules` came from, whose rule that matches is
    tried first next time.
    """
    index = 0
    for rule in rules:
        # The checks of the call itself, most rules have none (one flag says so).
        if rule.checks_call and not _call_matches(rule, args, caller):
            index += 1
            continue
        if rule.inside_modules and not _went_through(rule, caller, edge):
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


def _first(event: str, module: object, rules: tuple[HarmlessRule, ...], index: int) -> None:
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


# How far below the caller the walks for `inside_*` look for the user's frame.
_MAX_BELOW = 64
_USER, _LOOP = int(Kind.USER), int(Kind.LOOP)


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


def _went_through(rule: HarmlessRule, caller: FrameType, edge: FrameType | None) -> bool:
    """Whether the call went through one of the rule's `inside_modules`, below the user's first frame.

    Walks from the caller and stops at the first frame that settles it: in a
    debug-mode loop the frames under a harmless call are mostly asyncio's,
    and the rule that names asyncio matches at the first. A module name
    decides a match: cached on the rule, bounded as _frames' caches.
    """
    hits = rule.inside_hits
    module_kinds = _frames._module_kinds
    frame: FrameType | None = caller
    left = _MAX_BELOW
    while left:
        left -= 1
        if frame is None or frame is edge:
            return False
        module = frame.f_globals.get("__name__")
        hit = hits.get(module)
        if hit is None:
            if len(hits) >= _frames.MAX_CACHED_MODULES:
                hits.clear()
            hit = hits[module] = module_in(module, rule.inside_modules, rule.inside_prefixes)
        if hit:
            return True
        kind = module_kinds.get(module)
        if kind is None:
            kind = _frames.frame_kind(frame)
        # Plain ints (an enum member is a class attribute look-up and a rich compare).
        if kind == _USER or (kind == _LOOP and _frames.is_step_edge(frame, module)):
            return False
        frame = frame.f_back
    return False
