"""The report's stacks for the viewers people already use: speedscope's JSON, and folded stacks.

Both are drawn from the model `_timeline.build` makes (the HTML report's),
weighed as the HTML report's flame graph is (`flame.py`): each step's stacks
together weigh the time the step held its loop, as the table counts it, not
how many times the watchdog sampled it. speedscope's unit is milliseconds;
folded stacks take whole numbers (inferno reads nothing else), so there each
stack's weight is in microseconds.
"""

from __future__ import annotations

import json
import os
from typing import Any

from aiocop._reporting.flame import weighed_steps

SPEEDSCOPE_SCHEMA = "https://www.speedscope.app/file-format-schema.json"
_LINE_BREAKS = "\x85\u2028\u2029"  # (and every control character) read as line ends by some readers

Frame = tuple[str, int, str]


def frame_label(frame: list[Any], cwd: str) -> str:
    """`function (path:line)`, the path relative to `cwd` when under it: one frame of a folded stack.

    `;` separates frames and a line ends a stack: neither may be in a
    frame's name, whatever the program named its files and functions (a
    space may: the count is after the last one).
    """
    filename, line, function = frame
    prefix = os.path.join(cwd, "")
    if filename.startswith(prefix):
        filename = filename[len(prefix) :]
    text = f"{function} ({filename}:{line})"
    return "".join("_" if ch == ";" or ch in _LINE_BREAKS or ord(ch) < 32 else ch for ch in text)


def _stacks(model: dict[str, Any]) -> dict[str, list[tuple[tuple[Frame, ...], float]]]:
    """Per loop thread (`loop on thread`): each step's stacks, root first, with their ms, in the steps' order."""
    profiles: dict[str, list[tuple[tuple[Frame, ...], float]]] = {}
    for step, stacks in zip(model["steps"], weighed_steps(model), strict=True):
        if stacks:
            name = f"{step['loop'] or 'loop'} on thread {step['thread'] or '?'}"
            profiles.setdefault(name, []).extend(
                (tuple((f[0], f[1], f[2]) for f in reversed(stack.frames)), stack.ms) for stack in stacks
            )
    return profiles


def folded(model: dict[str, Any]) -> str:
    """One `frame;frame;frame weight` line per distinct stack (all loops together), weights in microseconds."""
    cwd = model["facts"]["cwd"]
    totals: dict[str, float] = {}
    for stacks in _stacks(model).values():
        for stack, ms in stacks:
            line = ";".join(frame_label(list(f), cwd) for f in stack)
            totals[line] = totals.get(line, 0.0) + ms
    # Rounded once per line, from the sum: a stack found in many steps loses at most half a microsecond.
    weights = {line: round(ms * 1000.0) for line, ms in totals.items()}
    return "".join(f"{line} {us}\n" for line, us in sorted(weights.items()) if us > 0)


def speedscope(model: dict[str, Any]) -> dict[str, Any]:
    """A speedscope file: one sampled profile per loop thread, frames shared, weights in milliseconds.

    A profile's samples follow its steps' order: speedscope's time-order view
    shows the steps one after the other, each as long as it held the loop
    (the time between steps, when the loop ran freely, is left out).
    """
    frames: list[dict[str, Any]] = []
    frame_index: dict[Frame, int] = {}
    profiles = []
    for name, stacks in _stacks(model).items():
        samples: list[list[int]] = []
        weights: list[float] = []
        for stack, ms in stacks:
            ids = []
            for frame in stack:
                if frame not in frame_index:
                    frame_index[frame] = len(frames)
                    frames.append({"name": frame[2], "file": frame[0], "line": frame[1]})
                ids.append(frame_index[frame])
            samples.append(ids)
            weights.append(round(ms, 3))
        profiles.append(
            {
                "type": "sampled",
                "name": name,
                "unit": "milliseconds",
                "startValue": 0,
                "endValue": round(sum(weights), 3),
                "samples": samples,
                "weights": weights,
            }
        )
    return {
        "$schema": SPEEDSCOPE_SCHEMA,
        "shared": {"frames": frames},
        "profiles": profiles,
        "name": f"aiocop: the steps that held a loop, in {model['facts']['command']}",
        "activeProfileIndex": 0,
        "exporter": f"aiocop {model['facts']['aiocop']}",
    }


def speedscope_text(model: dict[str, Any]) -> str:
    return json.dumps(speedscope(model), indent=1) + "\n"
