"""The rules table (`_interception/rules.py`): each detected call's facts are stated once, on its rule."""

from __future__ import annotations

from aiocop._interception import hook, rules, wrappers
from aiocop._interception.rules import BLOCKING_CALLS
from aiocop._model import state


def test_a_wrapper_is_not_installed_from_the_version_its_rule_says_the_event_became_native() -> None:
    by_event = {call.event: call for call in BLOCKING_CALLS}
    for target in wrappers.PATCH_TARGETS:
        assert target.until == by_event[target.event].native_since, target
    sleep = next(t for t in wrappers.PATCH_TARGETS if t.event == "time.sleep")
    assert sleep.until == (3, 13)  # the one written on time.sleep's rule
    patched = {t.event for t in wrappers.PATCH_TARGETS}
    for call in BLOCKING_CALLS:
        if call.native_since is not None:
            assert call.source == "wrapper" and call.event in patched, call


def test_a_rules_condition_and_raises_are_what_the_hook_checks() -> None:
    for call in BLOCKING_CALLS:
        assert (call.event in rules.CONDITION_CHECKS) == (call.condition != "always"), call
        assert (call.event in rules.RAISE_CHECKS) == (call.raises != "always"), call
    checks = rules.CONDITION_CHECKS
    assert checks["time.sleep"]((0.1,)) and not checks["time.sleep"]((0,))
    assert not checks["sqlite3.connect"]((":memory:",)) and checks["sqlite3.connect"](("db.sqlite",))
    assert checks["socket.connect"]((object(),))  # not a socket: the call itself decides
    assert not rules.RAISE_CHECKS["import"](("json",))


def test_the_hook_compiles_each_rules_checks() -> None:
    # As detection on: the switches set, the table compiled; then as they were.
    started, active = state.started, state.active
    state.started = state.active = True
    try:
        hook.rebuild()
        # (The table's `get`, bound as the hook's `_lookup` default: read by name, not position.)
        code, given = hook.audit_hook.__code__, hook.audit_hook.__defaults__ or ()
        names = code.co_varnames[code.co_argcount - len(given) : code.co_argcount]
        table = dict(zip(names, given, strict=True))["_lookup"].__self__
        assert table["time.sleep"].condition is rules.CONDITION_CHECKS["time.sleep"]
        assert table["time.sleep"].raises is rules.RAISE_CHECKS["time.sleep"]
        assert table["os.stat"].condition is None and table["os.stat"].raises is None
    finally:
        state.started, state.active = started, active
        hook.rebuild()
