"""Section 1: the cost aiocop adds to each task, against a process it never touched.

For each round, each loop runs one child per mode (baseline first, then the
aiocop modes: A B C A B C ...). A child runs every scenario; its figure for
a scenario is the fastest of its repetitions, the one least disturbed by
other processes (as timeit does; the same rule for every mode). The extra
cost of a mode in a round is its figure minus the baseline's of the same
round; the report gives the median and spread (sd) of those paired
differences over the rounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from suite.common import progress, run_child, summary

SCENARIOS = ("pure", "getcwd", "stat", "file_read", "handler")
DESCRIPTIONS = {
    "pure": "`await asyncio.sleep(0)`",
    "getcwd": "`os.getcwd()` + `sleep(0)`",
    "stat": '`os.stat(".")` + `sleep(0)`',
    "file_read": "open + read 100 B + `sleep(0)`",
    "handler": "realistic handler: `sleep(1 ms)`, `os.path.exists`, `os.getcwd`, `sleep(1 ms)`",
}


@dataclass(frozen=True)
class Settings:
    loops: tuple[str, ...]
    modes: tuple[str, ...]  # the first is the baseline
    tasks: dict[str, int]  # per scenario
    reps: int
    rounds: int
    # Loops that also run the modes after the first two (the watchdog
    # variant): the targets' loops, which keeps the full run short.
    all_modes_loops: tuple[str, ...] = ("asyncio", "uvloop")

    def modes_for(self, loop: str) -> tuple[str, ...]:
        return self.modes if loop in self.all_modes_loops else self.modes[:2]


def run(settings: Settings) -> dict[str, Any]:
    # raw[loop][mode][scenario] -> one figure per round; checks[loop][mode][scenario] -> ok per round
    raw: dict[str, dict[str, dict[str, list[float]]]] = {}
    checks: dict[str, dict[str, dict[str, list[dict[str, Any]]]]] = {}
    for round_no in range(settings.rounds):
        for loop in settings.loops:
            for mode in settings.modes_for(loop):
                progress(f"  per-task: round {round_no + 1}/{settings.rounds} {loop} {mode}")
                sizes = [f"{name}={settings.tasks[name]}" for name in SCENARIOS]
                result = run_child("pertask_child.py", mode, loop, settings.reps, *sizes)
                if mode == settings.modes[0] and result["aiocop_imported"]:
                    raise RuntimeError("the baseline child imported aiocop")
                for scenario, data in result["scenarios"].items():
                    raw.setdefault(loop, {}).setdefault(mode, {}).setdefault(scenario, []).append(
                        min(data["us_per_task"])
                    )
                    if "ok" in data:
                        checks.setdefault(loop, {}).setdefault(mode, {}).setdefault(scenario, []).append(data)
    return {
        "settings": settings.__dict__,
        "scenarios": {name: DESCRIPTIONS[name] for name in SCENARIOS},
        "loops": {
            loop: _loop_results(raw[loop], checks.get(loop, {}), settings.modes_for(loop)) for loop in settings.loops
        },
    }


def _loop_results(
    raw: dict[str, dict[str, list[float]]],
    checks: dict[str, dict[str, list[dict[str, Any]]]],
    modes: tuple[str, ...],
) -> dict[str, Any]:
    baseline = modes[0]
    out: dict[str, Any] = {}
    for scenario in SCENARIOS:
        base = raw[baseline][scenario]
        entry: dict[str, Any] = {baseline: {"us_per_task": summary(base)}}
        for mode in modes[1:]:
            figures = raw[mode][scenario]
            runs = checks[mode][scenario]
            entry[mode] = {
                "us_per_task": summary(figures),
                "extra_us_per_task": summary([m - b for m, b in zip(figures, base, strict=True)]),
                "events_expected_per_run": runs[0]["expected_events"],
                "events_delivered": [d for run in runs for d in run["delivered"]],
                "events_checked": sum(run["checked_events"] for run in runs),
                "problems": sorted({p for run in runs for p in run["problems"]}),
                "delivery_ok": all(run["ok"] for run in runs),
            }
        out[scenario] = entry
    return out
