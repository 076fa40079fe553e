"""The stacks the flame graphs draw, each weighed in the loop time of its step.

The watchdog's stack samples count its looks at a stuck loop, not time. C
code that holds the GIL (`json.dumps` of a big list) keeps the watchdog
out, and is sampled a few times however long it runs, while a `time.sleep`
is sampled at every poll: counted, a 1.3 s sleep outweighed 2.4 s of
`json.dumps` (56 samples against 21) while the table ranked them the other
way. So the pictures of the stacks (the HTML report's flame graph,
speedscope, folded stacks) weigh each step as the table does: by the time
it held its loop (`elapsed_ms`), split among its stacks in proportion to
the loop time their samples stand for (`ms`: each sample the time since
the one before). The samples still say where a step's time went; only the
step's time says how much there was.

Within a step, too, a count misleads where C code held the GIL: one late
look sees the hold as it ends, and the looks after it find the step's next
lines. Split by count, a step of 2.4 s of `json.dumps` and a moment at the
`await` after it went half to each. A model from an aiocop before the
samples had a time (no `ms`) is split by count.

A step no sample found (a blocking call shorter than the watchdog's poll, or
a run with no watchdog: the pytest plugin's default) puts its whole time on
the stack of its heaviest call, the call the table's severity rests on.

Computed from the model's fields when a picture is drawn, so that `run` and
`attach` draw the same weights and the model carries nothing more to check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The model's names of a step's two lists of stacks.
SAMPLES = "samples"
CALLS = "calls"


@dataclass(frozen=True)
class Stack:
    """One stack of a step, and the part of the step's loop time it weighs."""

    source: str  # SAMPLES or CALLS: the step's list it is in
    index: int  # its place in that list
    frames: list[list[Any]]  # innermost first, [file, line, function], as the model keeps them
    app_frame: int  # the index of the application's frame, or -1
    ms: float


def weighed_steps(model: dict[str, Any]) -> list[list[Stack]]:
    """Each step's stacks (in the order of `model["steps"]`), weighing together the time the step held its loop.

    Only stacks with frames are kept: a stack with none cannot be drawn, and
    the step's time goes to those that can. A step with none weighs nothing
    here (it is still in the table and on the timeline).
    """
    steps = model["steps"]
    covered = _covered_hang_reports(steps)
    return [[] if n in covered else _stacks_of(step) for n, step in enumerate(steps)]


def _stacks_of(step: dict[str, Any]) -> list[Stack]:
    elapsed = max(0.0, float(step["elapsed_ms"]))
    sampled = [(n, sample) for n, sample in enumerate(step[SAMPLES]) if sample["frames"] and sample["count"] > 0]
    key = "ms" if sampled and all("ms" in sample for _, sample in sampled) else "count"
    total = sum(sample[key] for _, sample in sampled)
    if not total and key == "ms":  # (times all 0: only a report handed to `attach` can say so)
        key, total = "count", sum(sample["count"] for _, sample in sampled)
    if total:
        return [
            Stack(SAMPLES, n, sample["frames"], sample["app_frame"], elapsed * sample[key] / total)
            for n, sample in sampled
        ]
    calls = [(n, call) for n, call in enumerate(step[CALLS]) if call["frames"]]
    if not calls:
        return []
    # The heaviest call, the first of equals (the step's story starts there).
    # A model from an aiocop before the calls had a weight: the first call,
    # the one the step's call site names.
    n, call = max(calls, key=lambda item: (item[1].get("weight", 0), -item[0]))
    return [Stack(CALLS, n, call["frames"], call["app_frame"], elapsed)]


def _covered_hang_reports(steps: list[dict[str, Any]]) -> set[int]:
    """The hang reports whose time another event of the same step already counts.

    A hang report says how long its step has held the loop so far; the
    step's later reports, and its final event, count that time again. Summed,
    a step hung 9 s and reported at 1, 2, 4 and 8 s would weigh 24 s: one event
    of the step is kept, its final one (the table's), or while it is still
    hung its latest report. They are told apart from the loop's other steps by
    time, not by order: hang reports and final events are delivered by two
    threads, in either order. A loop thread runs one step at a time, so
    another event on the lane over most of a hang report's span is its step's.
    """
    lanes: dict[tuple[str, str], list[int]] = {}
    for n, step in enumerate(steps):
        lanes.setdefault((step["loop"], step["thread"]), []).append(n)
    covered: set[int] = set()
    for members in lanes.values():
        for n in members:
            report = steps[n]
            if report["reason"] != "hang":
                continue
            span = report["t1"] - report["t0"]
            for m in members:
                other = steps[m]
                if m == n:
                    continue
                # The final event, as in the table (its time may be estimated a little
                # short of a report's); among reports, the longest (equals: the later).
                kept = other["reason"] != "hang" or (other["elapsed_ms"], m) > (report["elapsed_ms"], n)
                overlap = min(report["t1"], other["t1"]) - max(report["t0"], other["t0"])
                if kept and overlap >= span / 2:
                    covered.add(n)
                    break
    return covered
