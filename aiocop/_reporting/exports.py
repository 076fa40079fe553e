"""The report's stall samples for the viewers people already use: speedscope's JSON, and folded stacks.

Both are drawn from the model `_timeline.build` makes (the HTML report's):
each step's stack samples, root (outermost frame) first. Samples are counts
of the watchdog's looks at a stuck loop, not time: the unit is "none".
"""

from __future__ import annotations

import json
import os
from typing import Any

SPEEDSCOPE_SCHEMA = "https://www.speedscope.app/file-format-schema.json"
_LINE_BREAKS = "\x85\u2028\u2029"  # (and every control character) read as line ends by some readers


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


def _stacks(model: dict[str, Any]) -> dict[str, dict[tuple[tuple[str, int, str], ...], int]]:
    """Per loop thread (`loop on thread`): each stack, root first, and how many samples found it."""
    profiles: dict[str, dict[tuple[tuple[str, int, str], ...], int]] = {}
    for step in model["steps"]:
        name = f"{step['loop'] or 'loop'} on thread {step['thread'] or '?'}"
        stacks = profiles.setdefault(name, {})
        for sample in step["samples"]:
            stack = tuple((f[0], f[1], f[2]) for f in reversed(sample["frames"]))
            if stack:
                stacks[stack] = stacks.get(stack, 0) + sample["count"]
    return {name: stacks for name, stacks in profiles.items() if stacks}


def folded(model: dict[str, Any]) -> str:
    """One `frame;frame;frame count` line per distinct stack (all loops together), for flamegraph.pl or inferno."""
    cwd = model["facts"]["cwd"]
    totals: dict[str, int] = {}
    for stacks in _stacks(model).values():
        for stack, count in stacks.items():
            line = ";".join(frame_label(list(f), cwd) for f in stack)
            totals[line] = totals.get(line, 0) + count
    return "".join(f"{line} {count}\n" for line, count in sorted(totals.items()))


def speedscope(model: dict[str, Any]) -> dict[str, Any]:
    """A speedscope file: one sampled profile per loop thread, frames shared."""
    frames: list[dict[str, Any]] = []
    frame_index: dict[tuple[str, int, str], int] = {}
    profiles = []
    for name, stacks in _stacks(model).items():
        samples: list[list[int]] = []
        weights: list[int] = []
        for stack, count in stacks.items():
            ids = []
            for frame in stack:
                if frame not in frame_index:
                    frame_index[frame] = len(frames)
                    frames.append({"name": frame[2], "file": frame[0], "line": frame[1]})
                ids.append(frame_index[frame])
            samples.append(ids)
            weights.append(count)
        profiles.append(
            {
                "type": "sampled",
                "name": name,
                "unit": "none",
                "startValue": 0,
                "endValue": sum(weights),
                "samples": samples,
                "weights": weights,
            }
        )
    return {
        "$schema": SPEEDSCOPE_SCHEMA,
        "shared": {"frames": frames},
        "profiles": profiles,
        "name": f"aiocop: stall samples of {model['facts']['command']}",
        "activeProfileIndex": 0,
        "exporter": f"aiocop {model['facts']['aiocop']}",
    }


def speedscope_text(model: dict[str, Any]) -> str:
    return json.dumps(speedscope(model), indent=1) + "\n"
