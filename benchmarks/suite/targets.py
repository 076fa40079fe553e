"""The SPEC's performance targets (§3), and each measured figure's verdict against its target.

A verdict compares a median with its target; the spread is reported next to
it, never used to round a failure into a pass. A run whose correctness checks
failed (events not delivered, a baseline that imported aiocop) fails its
target whatever the timing says.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

PURE_TASK_US = 0.5  # pure async task, asyncio and uvloop
BLOCKING_CALL_US = 5.0  # one detected blocking call, delivered with a 5-frame trace
THROUGHPUT_RATIO = 0.97  # ASGI hello world and TCP echo, share of baseline requests/s
PURE_TARGET_LOOPS = ("asyncio", "uvloop")
# "Flat" from the reference size (the smallest of at least 10 k tasks) up: the
# overhead at the largest size may exceed the reference's by at most this.
FLAT_TIME_US = 0.5
FLAT_TIME_SHARE = 0.05  # ... or this share of the baseline's time per task, if larger
FLAT_BYTES = 32.0
FLAT_BYTES_SHARE = 0.03
FLAT_REFERENCE_MIN_TASKS = 10_000
BLOCKING_SCENARIOS = {"getcwd": 1, "stat": 1, "file_read": 1, "handler": 2}  # detected calls per task


@dataclass(frozen=True)
class Verdict:
    section: str
    what: str
    value: float
    unit: str
    target: str
    spread: float | None
    passed: bool | None  # None: reported without a target
    note: str = ""


def evaluate(results: dict[str, Any]) -> list[dict[str, Any]]:
    verdicts: list[Verdict] = []
    if "loops" in results.get("pertask", {}):
        verdicts += _pertask(results["pertask"])
    for section, key in (("asgi", "servers"), ("echo", "kinds")):
        if key in results.get(section, {}):
            verdicts += _throughput(section, results[section][key])
    if "results" in results.get("scaling", {}):
        verdicts += _scaling(results["scaling"]["results"])
    return [asdict(v) for v in verdicts]


def _pertask(section: dict[str, Any]) -> list[Verdict]:
    out = []
    for loop, scenarios in section["loops"].items():
        for scenario, by_mode in scenarios.items():
            for mode, entry in by_mode.items():
                if "extra_us_per_task" not in entry:
                    continue
                extra = entry["extra_us_per_task"]
                what = f"{loop}, {scenario}, {mode}"
                if mode == "blockbuster":
                    applies, limit = False, BLOCKING_CALL_US
                    note = "blockbuster, for comparison (raises before the call)"
                elif scenario == "pure":
                    applies = loop in PURE_TARGET_LOOPS
                    limit = PURE_TASK_US
                    note = "" if applies else "target set for asyncio and uvloop; shown for comparison"
                else:
                    calls = BLOCKING_SCENARIOS[scenario]
                    applies = True
                    limit = BLOCKING_CALL_US * calls
                    note = f"{calls} detected calls: {BLOCKING_CALL_US:g} µs each" if calls > 1 else ""
                    if not entry["delivery_ok"]:
                        note = f"events not delivered as expected: {entry['problems']}"
                passed = extra["median"] <= limit and entry["delivery_ok"]
                out.append(
                    Verdict(
                        "pertask",
                        what,
                        extra["median"],
                        "µs/task extra",
                        f"≤ {limit:g}",
                        extra["stdev"],
                        passed if applies else None,
                        note,
                    )
                )
    return out


def _throughput(section: str, groups: dict[str, Any]) -> list[Verdict]:
    out = []
    for group, by_mode in groups.items():
        for mode, entry in by_mode.items():
            if "ratio_to_baseline" not in entry:
                continue
            ok = entry["checks_ok"] and by_mode["baseline"]["checks_ok"]
            failed = "" if ok else f"check failed: {entry['problems'] or by_mode['baseline']['problems']}"
            measures = [("ratio_to_baseline", "% of baseline req/s", "")]
            if "cpu_ratio_to_baseline" in entry:
                measures.append(
                    ("cpu_ratio_to_baseline", "% of baseline, by server CPU time per request", "cross-check")
                )
            for key, unit, label in measures:
                ratio = entry[key]
                note = failed or _noise_note(ratio["median"], ratio["stdev"], THROUGHPUT_RATIO)
                out.append(
                    Verdict(
                        section,
                        f"{group}, {mode}" + (f" ({label})" if label else ""),
                        ratio["median"] * 100,
                        unit,
                        f"≥ {THROUGHPUT_RATIO * 100:g}",
                        ratio["stdev"] * 100,
                        ratio["median"] >= THROUGHPUT_RATIO and ok,
                        note,
                    )
                )
    return out


def _noise_note(median: float, stdev: float, limit: float) -> str:
    # Said next to the verdict, which stays the median's: the target lies
    # within one standard deviation of it, so another run may well say otherwise.
    return "within noise: the target is less than 1 sd away" if abs(median - limit) < stdev else ""


def _scaling(results: dict[str, Any]) -> list[Verdict]:
    out = []
    for workload, by_size in results.items():
        sizes = sorted(int(s) for s in by_size)
        reference = next((s for s in sizes if s >= FLAT_REFERENCE_MIN_TASKS), sizes[0])
        largest = sizes[-1]
        ref, big = by_size[str(reference)], by_size[str(largest)]
        ok = all(by_size[str(s)]["checks_ok"] for s in sizes)
        for mode in (m for m in big if m not in ("baseline", "checks_ok")):
            growth = big[mode]["extra_us_per_task"]["median"] - ref[mode]["extra_us_per_task"]["median"]
            allowed = max(FLAT_TIME_US, FLAT_TIME_SHARE * big["baseline"]["us_per_task"]["median"])
            span = f"{reference:,} → {largest:,} tasks"
            out.append(
                Verdict(
                    "scaling",
                    f"{workload}, {mode}, time overhead growth {span}",
                    growth,
                    "µs/task",
                    f"≤ {allowed:.2f}",
                    None,
                    growth <= allowed and ok,
                )
            )
            growth = big[mode]["extra_bytes_per_task"]["median"] - ref[mode]["extra_bytes_per_task"]["median"]
            allowed = max(FLAT_BYTES, FLAT_BYTES_SHARE * big["baseline"]["bytes_per_task"]["median"])
            out.append(
                Verdict(
                    "scaling",
                    f"{workload}, {mode}, memory overhead growth {span}",
                    growth,
                    "B/task",
                    f"≤ {allowed:.0f}",
                    None,
                    growth <= allowed and ok,
                )
            )
    return out
