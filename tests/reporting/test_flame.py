"""The flame graphs' stacks weighed in loop time (`aiocop/_reporting/flame.py`), not in samples (issue 37)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from aiocop._model.events import CpuStackSample, SlowTaskEvent
from aiocop._reporting import flame as _flame
from aiocop._reporting import timeline as _timeline
from aiocop._reporting.report import Summary

if TYPE_CHECKING:
    from collections.abc import Sequence

APP, SLEEP, DUMPS = ["/app/app.py", 13, "encode"], ["/app/app.py", 19, "nap"], ["/lib/json/__init__.py", 231, "dumps"]


def _step(
    elapsed_ms: float,
    samples: Sequence[tuple[list[list[Any]], int]] = (),  # (frames, count)
    calls: Sequence[tuple[list[list[Any]], int]] = (),  # (frames, weight)
    *,
    reason: str = "cpu_blocking",
    t1: float = 10_000.0,
    thread: str = "MainThread",
) -> dict[str, Any]:
    """A step of the model (`_timeline.build`), with the fields the weighing reads."""
    return {
        "reason": reason,
        "elapsed_ms": elapsed_ms,
        "t0": max(0.0, t1 - elapsed_ms),
        "t1": t1,
        "loop": "L@1",
        "thread": thread,
        "samples": [{"frames": frames, "count": count, "app_frame": 0} for frames, count in samples],
        "calls": [{"frames": frames, "app_frame": 0, "weight": weight} for frames, weight in calls],
    }


def _weights(*steps: dict[str, Any]) -> list[list[tuple[str, int, float]]]:
    return [[(s.source, s.index, s.ms) for s in stacks] for stacks in _flame.weighed_steps({"steps": list(steps)})]


def test_a_step_weighs_its_time_however_often_it_was_sampled() -> None:
    # C code holding the GIL (json.dumps) is sampled a few times, a sleep at every look: time ranks them.
    dumps = _step(2400.0, [([DUMPS, APP], 3)])
    sleep = _step(1300.0, [([SLEEP], 60)], [([SLEEP], 50)], reason="io_blocking", t1=20_000.0)
    assert _weights(dumps, sleep) == [[("samples", 0, 2400.0)], [("samples", 0, 1300.0)]]


def test_a_steps_time_is_split_among_its_stacks_as_the_samples_found_them() -> None:
    weights = _weights(_step(400.0, [([DUMPS, APP], 3), ([], 5), ([APP], 1), ([SLEEP], 0)]))
    # The stack without frames cannot be drawn, the one found no time weighs nothing: the rest share the step.
    assert weights == [[("samples", 0, 300.0), ("samples", 2, 100.0)]]


def test_a_steps_time_is_split_by_the_time_its_samples_stand_for() -> None:
    # One step: 2.4 s of json.dumps holding the GIL, seen once by the look it kept out, then the `await` after
    # it, seen by the next look: by count half each, by the time each sample stands for almost all json.dumps.
    step = _step(2405.0, [([DUMPS, APP], 1), ([SLEEP], 1)])
    step["samples"][0]["ms"], step["samples"][1]["ms"] = 2400.0, 5.0
    assert _weights(step) == [[("samples", 0, 2400.0), ("samples", 1, 5.0)]]
    # A model from an aiocop before samples had a time (a sample without `ms`), or times all 0: by count.
    del step["samples"][1]["ms"]
    assert _weights(step) == [[("samples", 0, 1202.5), ("samples", 1, 1202.5)]]
    step["samples"][0]["ms"] = step["samples"][1]["ms"] = 0.0
    assert _weights(step) == [[("samples", 0, 1202.5), ("samples", 1, 1202.5)]]


def test_the_model_gives_each_sample_its_time() -> None:
    frames = [("/lib/json/__init__.py", 231, "dumps"), ("/app/app.py", 13, "encode")]
    older = CpuStackSample(trace="", entry_point="/app/app.py:13:encode", count=1, frames=frames)
    timed = CpuStackSample(trace="", entry_point="/app/app.py:13:encode", count=1, frames=frames, time_ms=80.0)
    timeline = _timeline.Timeline(Summary())
    timeline(SlowTaskEvent(2405.0, 30.0, True, 51, "high", "cpu_blocking", [], cpu_stack_samples=[older]))
    timeline(SlowTaskEvent(90.0, 30.0, True, 51, "high", "cpu_blocking", [], cpu_stack_samples=[timed]))
    model = _timeline.build(timeline, _timeline.Facts("cmd", 30.0, "asyncio"))
    assert ["ms" in step["samples"][0] for step in model["steps"]] == [False, True]
    assert model["steps"][1]["samples"][0]["ms"] == 80.0


def test_a_step_no_sample_found_is_drawn_at_its_heaviest_call() -> None:
    stat, sleep, sleep_again = ([APP], 1), ([SLEEP], 50), ([SLEEP, APP], 50)
    assert _weights(_step(80.0, calls=[stat, sleep, sleep_again], reason="io_blocking")) == [[("calls", 1, 80.0)]]
    # No weights (a model from an older aiocop), or none with frames: the first call with frames, or nothing.
    unweighed = _step(80.0, calls=[([], 50), stat, sleep], reason="io_blocking")
    for call in unweighed["calls"]:
        del call["weight"]
    assert _weights(unweighed, _step(80.0, calls=[([], 50)])) == [[("calls", 1, 80.0)], []]


def test_the_model_gives_each_call_its_weight() -> None:
    light = {"event": "os.stat", "trace": "", "entry_point": "/app/app.py:13:encode", "severity": 1, "frames": [APP]}
    heavy = {"event": "time.sleep", "trace": "", "entry_point": "/app/app.py:19:nap", "severity": 50, "frames": [SLEEP]}
    timeline = _timeline.Timeline(Summary())
    timeline(SlowTaskEvent(70.0, 30.0, True, 51, "high", "io_blocking", [light, heavy]))  # type: ignore[list-item]
    model = _timeline.build(timeline, _timeline.Facts("cmd", 30.0, "asyncio"))
    assert [call["weight"] for call in model["steps"][0]["calls"]] == [1, 50]
    [[stack]] = _flame.weighed_steps(model)
    assert (stack.source, stack.index, stack.frames) == ("calls", 1, [SLEEP])
    assert stack.ms == pytest.approx(70.0)


def test_a_hung_step_weighs_its_time_once() -> None:
    hung = [([SLEEP], 1)]
    reports = [_step(ms, hung, reason="hang", t1=1000.0 + ms) for ms in (1000.0, 2000.0, 4000.0)]
    final = _step(5000.0, [([SLEEP], 480)], reason="cpu_blocking", t1=6000.0)
    later = _step(100.0, [([APP], 9)], t1=6200.0)
    other_thread = _step(3000.0, hung, reason="hang", t1=5000.0, thread="worker")
    # Delivered in any order (two threads deliver them): only the final event counts the step's time.
    weights = _weights(reports[0], reports[1], final, reports[2], later, other_thread)
    assert [sum(ms for *_, ms in stacks) for stacks in weights] == [0.0, 0.0, 5000.0, 0.0, 100.0, 3000.0]
    # Still hung at the end of the run: its latest report, once.
    still = _weights(*reports, later)
    assert [sum(ms for *_, ms in stacks) for stacks in still] == [0.0, 0.0, 4000.0, 100.0]
