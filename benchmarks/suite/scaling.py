"""Section 4: from 1 k to 1 M concurrent tasks, aiocop on against a process that never imported it.

For each size, rounds alternate baseline and aiocop children (A B A B ...);
each child runs the workload `reps` times (small sizes are short, so they
repeat) and measures memory on the first run. Reported per size: time per
task (CPU time of the child: see scaling_child.py), relative speed (baseline
time / aiocop time, 1.0 = no cost; the presentation of the Leviathan loop's
benchmark page) and memory per live task.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from suite.common import progress, run_child, summary

WORKLOADS = ("producer_consumer", "task_workflow", "chat_fanout")
DESCRIPTIONS = {
    "producer_consumer": "N/2 producers and N/2 consumers on one `asyncio.Queue(maxsize=1024)`",
    "task_workflow": "N tasks wait on one `asyncio.Event`, then each awaits 3 stages of `sleep(0)`",
    "chat_fanout": "N members in rooms of 100 on a broadcast channel (a chain of futures); each room publishes"
    " 3 messages, every member wakes for each",
}


@dataclass(frozen=True)
class Settings:
    loop: str
    modes: tuple[str, ...]  # the first is the baseline
    sizes: tuple[int, ...]
    rounds: dict[int, int]  # per size
    reps: dict[int, int]  # per size


def run(settings: Settings) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for workload in WORKLOADS:
        by_size: dict[str, Any] = {}
        for size in settings.sizes:
            by_size[str(size)] = _one_size(settings, workload, size)
        results[workload] = by_size
    return {
        "settings": {**settings.__dict__, "rounds": _keys(settings.rounds), "reps": _keys(settings.reps)},
        "workloads": {name: DESCRIPTIONS[name] for name in WORKLOADS},
        "results": results,
    }


def _keys(by_size: dict[int, int]) -> dict[str, int]:
    return {str(k): v for k, v in by_size.items()}


def _one_size(settings: Settings, workload: str, size: int) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in settings.modes}
    rounds = settings.rounds[size]
    for round_no in range(rounds):
        for mode in settings.modes:
            progress(f"  scaling: {workload} {size:>9,} tasks, round {round_no + 1}/{rounds} {mode}")
            result = run_child("scaling_child.py", mode, settings.loop, workload, size, settings.reps[size])
            runs[mode].append(result)
    base_mode = settings.modes[0]
    base = runs[base_mode]
    out: dict[str, Any] = {}
    for mode, mode_runs in runs.items():
        times = [statistics.median(r["us_per_task"]) for r in mode_runs]
        entry: dict[str, Any] = {
            "us_per_task": summary(times),
            "wall_us_per_task": summary([statistics.median(r["wall_us_per_task"]) for r in mode_runs]),
            "bytes_per_task": summary([r["bytes_per_task"] for r in mode_runs]),
            "peak_rss_bytes": max(r["peak_rss"] for r in mode_runs),
            "events": sum(r["events"] for r in mode_runs),
            "aiocop_imported": [r["aiocop_imported"] for r in mode_runs],
        }
        if mode != base_mode:
            base_times = [statistics.median(r["us_per_task"]) for r in base]
            entry["extra_us_per_task"] = summary([m - b for m, b in zip(times, base_times, strict=True)])
            entry["relative_speed"] = summary([b / m for m, b in zip(times, base_times, strict=True)])
            entry["extra_bytes_per_task"] = summary(
                [m["bytes_per_task"] - b["bytes_per_task"] for m, b in zip(mode_runs, base, strict=True)]
            )
        out[mode] = entry
    out["checks_ok"] = not any(runs[base_mode][i]["aiocop_imported"] for i in range(rounds)) and all(
        r["events"] == 0 for mode in settings.modes for r in runs[mode]
    )
    return out
