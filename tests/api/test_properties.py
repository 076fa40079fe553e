"""Property-based tests: random interleavings of switches, scopes and rules never fool aiocop.

Hypothesis writes programs: global operations (activate, deactivate, global
allow rules, reconfiguration) made between loop runs or from inside tasks,
and concurrent tasks that enter and leave scopes (`monitored(False)`,
`allow_blocking(...)`, `raise_on_violations()`), spawn child tasks inside
them, and make blocking calls, on loops in the main thread or in another
one, plus calls from executor threads and from threads with no loop. A model
follows the program as it actually runs and says, call by call, whether it
must be reported and whether it must raise. Properties:

- a call made outside a loop thread is never reported;
- a call made in a step is reported exactly when the model says so (active,
  monitored, no rule allows it), and raises exactly when it must;
- no scope leaks: a task sees only the scopes it entered or inherited, and
  nothing is left behind after a run.

Runs are reproducible (derandomized, no example database) and CI-sized:
150 examples per property, or AIOCOP_PROPERTY_EXAMPLES.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aiocop
from tests.conftest import Collector, _loop_param, run_on

HEAVY, LIGHT = "prop.heavy", "prop.light"  # weights 50 (raises) and 1 (never raises)
WEIGHTS = {HEAVY: aiocop.WEIGHT_HEAVY, LIGHT: aiocop.WEIGHT_LIGHT}
SCOPES = ("unmonitored", "monitored", "allow_heavy", "allow_light", "allow_all", "raise")
GLOBAL_OPS = ("activate", "deactivate", "allow_heavy", "allow_light", "clear_rules", "reconfigure")


def _examples() -> int:
    # CI runs the full 150 where every loop is tested (3.12) and fewer on the
    # other Pythons (AIOCOP_PROPERTY_EXAMPLES, .ci/run): the model is the same
    # everywhere, and 150 examples are a seventh of a Python's deterministic run.
    raw = os.environ.get("AIOCOP_PROPERTY_EXAMPLES") or "150"  # unset or empty: the default
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"AIOCOP_PROPERTY_EXAMPLES must be a whole number of at least 1, got {raw!r}")
    return int(raw)


PROFILE = settings(
    max_examples=_examples(),
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

# --- the programs -----------------------------------------------------------------------------

event_names = st.sampled_from((HEAVY, LIGHT))
# Weighted towards calls and towards detection on: a program that switched
# detection off early would have little left to check.
global_ops = st.sampled_from(("activate", "activate", "activate", *GLOBAL_OPS, "clear_rules"))
leaf_actions = st.one_of(
    # Equal strategies are merged by one_of: each weight needs a strategy object of its own.
    *(st.tuples(st.just("call"), event_names) for _ in range(4)),
    st.tuples(st.just("enter"), st.sampled_from(SCOPES)),
    st.tuples(st.just("enter"), st.sampled_from(SCOPES)),
    st.tuples(st.just("exit"), st.none()),
    st.tuples(st.just("yield"), st.none()),
    st.tuples(st.just("executor_call"), event_names),
    st.tuples(st.just("global"), global_ops),
)
task_programs = st.lists(
    st.one_of(leaf_actions, leaf_actions, st.tuples(st.just("spawn"), st.lists(leaf_actions, min_size=1, max_size=6))),
    min_size=1,
    max_size=12,
)
phases = st.lists(
    st.one_of(
        *(
            st.tuples(st.just("loop"), st.tuples(st.booleans(), st.lists(task_programs, min_size=1, max_size=4)))
            for _ in range(3)
        ),
        st.tuples(st.just("global"), global_ops),
        st.tuples(st.just("no_loop_call"), st.tuples(event_names, st.booleans())),
    ),
    min_size=1,
    max_size=6,
)


# --- the model --------------------------------------------------------------------------------


@dataclass
class Model:
    """What must happen, updated as the program actually runs (tasks interleave as the loop decides)."""

    active: bool = True
    global_allowed: set[str] = field(default_factory=set)
    next_id: int = 0
    must_report: set[int] = field(default_factory=set)
    must_raise: set[int] = field(default_factory=set)
    never_report: set[int] = field(default_factory=set)
    raised: set[int] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def apply_global(self, op: str) -> None:
        if op == "activate":
            aiocop.activate()
            self.active = True
        elif op == "deactivate":
            aiocop.deactivate()
            self.active = False
        elif op in ("allow_heavy", "allow_light"):
            event = HEAVY if op == "allow_heavy" else LIGHT
            aiocop.add_allow_rule(event)
            self.global_allowed.add(event)
        elif op == "clear_rules":
            aiocop.clear_allow_rules()
            self.global_allowed.clear()
        else:  # reconfigure: settings change, detection goes on
            aiocop.start_blocking_io_detection(trace_depth=3, max_events_per_step=8)

    def expect(self, event: str, stack: list[str]) -> tuple[int, bool, bool]:
        """A new call id, whether that call must be reported, and whether it must raise."""
        monitored = True
        allowed = event in self.global_allowed
        raising = False
        for scope in stack:
            if scope in ("unmonitored", "monitored"):
                monitored = scope == "monitored"
            elif scope == "allow_all" or scope == f"allow_{event.rpartition('.')[2]}":
                allowed = True
            elif scope == "raise":
                raising = True
        report = self.active and monitored and not allowed
        call_id = self.new_id()
        if report:
            self.must_report.add(call_id)
        if report and raising and WEIGHTS[event] >= aiocop.THRESHOLD_HIGH:
            self.must_raise.add(call_id)
        return call_id, report, report and raising and WEIGHTS[event] >= aiocop.THRESHOLD_HIGH


def make_scope(kind: str) -> Any:
    if kind == "unmonitored":
        return aiocop.monitored(False)
    if kind == "monitored":
        return aiocop.monitored(True)
    if kind == "allow_heavy":
        return aiocop.allow_blocking(HEAVY)
    if kind == "allow_light":
        return aiocop.allow_blocking(LIGHT)
    if kind == "allow_all":
        return aiocop.allow_blocking()
    return aiocop.raise_on_violations()


def blocking_call(model: Model, event: str, stack: list[str]) -> None:
    call_id, _, must_raise = model.expect(event, stack)
    try:
        sys.audit(event, call_id)
    except aiocop.HighSeverityBlockingIoException:
        model.raised.add(call_id)
        if not must_raise:
            model.problems.append(f"call {call_id} raised outside a raise scope: {stack}")


async def run_task(model: Model, program: list[Any], stack: list[str]) -> None:
    """Run a task program; `stack` is the model of the scopes in force (inherited ones first)."""
    entered: list[Any] = []
    own = len(stack)
    children = []
    for action, arg in program:
        if action == "call":
            blocking_call(model, arg, stack)
            await asyncio.sleep(0)  # one call per step: a step's score never mixes calls
        elif action == "enter":
            scope = make_scope(arg)
            scope.__enter__()
            entered.append(scope)
            stack.append(arg)
        elif action == "exit" and entered:
            entered.pop().__exit__(None, None, None)
            stack.pop()
        elif action == "yield":
            await asyncio.sleep(0)
        elif action == "executor_call":
            call_id = model.new_id()
            model.never_report.add(call_id)
            await asyncio.get_running_loop().run_in_executor(None, sys.audit, arg, call_id)
        elif action == "global":
            model.apply_global(arg)
        elif action == "spawn":
            children.append(asyncio.ensure_future(run_task(model, arg, list(stack))))
        check_scopes(model, stack)
    while entered:
        entered.pop().__exit__(None, None, None)
        stack.pop()
    assert len(stack) == own
    check_scopes(model, stack)
    await asyncio.gather(*children)


def check_scopes(model: Model, stack: list[str]) -> None:
    """What this task sees of its scopes is what the model says: nothing leaked in from other tasks."""
    unmonitored = next((s == "unmonitored" for s in reversed(stack) if s in ("unmonitored", "monitored")), False)
    if aiocop.is_monitored() != (model.active and not unmonitored):
        model.problems.append(f"is_monitored() is {aiocop.is_monitored()} with scopes {stack}")
    if aiocop.is_raise_on_violations_enabled() != ("raise" in stack):
        model.problems.append(f"raise_on_violations is {aiocop.is_raise_on_violations_enabled()} with {stack}")


async def run_loop(model: Model, programs: list[list[Any]]) -> None:
    await asyncio.gather(*(run_task(model, program, []) for program in programs))
    await asyncio.sleep(0.002)  # the last steps' events are delivered


def no_loop_call(model: Model, event: str, in_thread: bool) -> None:
    call_id = model.new_id()
    model.never_report.add(call_id)
    if in_thread:
        thread = threading.Thread(target=sys.audit, args=(event, call_id))
        thread.start()
        thread.join()
    else:
        sys.audit(event, call_id)


def run_program(loop_name: str, program: list[Any]) -> tuple[Model, Collector]:
    model = Model()
    collector = Collector()
    aiocop.start_blocking_io_detection(trace_depth=5)
    for event, weight in WEIGHTS.items():
        aiocop.register_blocking_event(event, weight)
    aiocop.register_slow_task_callback(collector)
    try:
        for kind, arg in program:
            if kind == "global":
                model.apply_global(arg)
            elif kind == "no_loop_call":
                no_loop_call(model, *arg)
            else:
                in_thread, programs = arg
                if in_thread:
                    thread = threading.Thread(target=run_on, args=(loop_name, run_loop(model, programs)))
                    thread.start()
                    thread.join(30)
                else:
                    run_on(loop_name, run_loop(model, programs))
            # Between runs, in the main thread, nothing of any task's scopes is left.
            assert aiocop.is_monitored() == model.active
            assert not aiocop.is_raise_on_violations_enabled()
            assert set().union(*(r.events for r in aiocop.get_allow_rules())) == model.global_allowed
    finally:
        aiocop.stop()
        aiocop.clear_slow_task_callbacks()
        aiocop.clear_allow_rules()
        aiocop.reset_blocking_event_table()
        aiocop.activate()
    return model, collector


def reported_ids(collector: Collector) -> list[int]:
    return [int(call["args"]) for call in collector.calls if call["name"] in WEIGHTS]


@pytest.mark.parametrize("loop_name", [_loop_param("asyncio"), _loop_param("uvloop")])
@PROFILE
@given(program=phases)
def test_reports_follow_switches_scopes_and_rules(loop_name: str, program: list[Any]) -> None:
    model, collector = run_program(loop_name, program)
    assert not model.problems, model.problems
    reported = reported_ids(collector)
    assert len(reported) == len(set(reported)), "a call was reported twice"
    assert not set(reported) & model.never_report, "a call made outside a loop thread was reported"
    assert set(reported) == model.must_report, (
        f"missed: {sorted(model.must_report - set(reported))}, unexpected: {sorted(set(reported) - model.must_report)}"
    )
    assert model.raised == model.must_raise
    raised_in_events = {int(c["args"]) for c in collector.calls if c["name"] in WEIGHTS and c.get("raised")}
    assert raised_in_events == model.must_raise


@PROFILE
@given(
    ops=st.lists(
        st.sampled_from(("activate", "deactivate", "reconfigure", "call", "allow_light", "clear_rules")), max_size=30
    )
)
def test_switching_from_another_thread_while_a_loop_runs(ops: list[str]) -> None:
    """Global switches flipped from another thread while a loop runs: each call is reported
    exactly when detection was on when it was made, never twice; nothing else is reported."""
    collector = Collector()
    aiocop.start_blocking_io_detection()
    aiocop.register_blocking_event(LIGHT, 1)
    aiocop.register_slow_task_callback(collector)
    expected: set[int] = set()
    go, done = threading.Event(), threading.Event()
    state = {"active": True, "allowed": False}

    async def main() -> None:
        call_id = 0
        while not done.is_set() or call_id == 0:
            go.set()
            await asyncio.sleep(0)
            call_id += 1
            # The switches are read and the call made with no await in between, under the lock
            # the switching thread takes: the model sees exactly the state the call saw.
            with lock_free():
                if state["active"] and not state["allowed"]:
                    expected.add(call_id)
                sys.audit(LIGHT, call_id)
        await asyncio.sleep(0.002)

    def switch() -> None:
        go.wait(5)
        for op in ops:
            with lock_free():
                if op == "call":
                    continue
                if op in ("activate", "deactivate"):
                    getattr(aiocop, op)()
                    state["active"] = op == "activate"
                elif op == "allow_light":
                    aiocop.add_allow_rule(LIGHT)
                    state["allowed"] = True
                elif op == "clear_rules":
                    aiocop.clear_allow_rules()
                    state["allowed"] = False
                else:
                    aiocop.start_blocking_io_detection(trace_depth=4)
        done.set()

    switcher = threading.Thread(target=switch)
    # Each hand-over between the two threads waits out the switch interval
    # (5 ms), the loop thread spinning meanwhile: a shorter one gives the same
    # interleavings, more of them, at a sixth of the CPU (3.12: 18.7 s to 3.3 s).
    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.00005)
    switcher.start()
    try:
        run_on("asyncio", main())
    finally:
        switcher.join(10)
        sys.setswitchinterval(interval)
        aiocop.stop()
        aiocop.clear_slow_task_callbacks()
        aiocop.clear_allow_rules()
        aiocop.reset_blocking_event_table()
        aiocop.activate()
    reported = reported_ids(collector)
    assert len(reported) == len(set(reported))
    assert set(reported) == expected


_switch_lock = threading.Lock()


class lock_free:  # noqa: N801 - reads as a block
    """Holds the switching lock without aiocop seeing a blocking call (the wait is in this helper, not the app)."""

    def __enter__(self) -> None:
        while not _switch_lock.acquire(blocking=False):
            pass  # spins: a blocking acquire on the loop thread would be reported, and could raise

    def __exit__(self, *exc: object) -> None:
        _switch_lock.release()
