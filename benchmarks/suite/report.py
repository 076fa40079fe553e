"""The results as Markdown tables: printed by run_benchmark.py, written to results.md, pasted into the docs."""

from __future__ import annotations

from typing import Any

BASELINE = "baseline"


def _pm(entry: dict[str, Any], scale: float = 1.0, digits: int = 2) -> str:
    return f"{entry['median'] * scale:.{digits}f} ± {entry['stdev'] * scale:.{digits}f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _verdict(passed: bool | None) -> str:
    return "—" if passed is None else "PASS" if passed else "**FAIL**"


def pertask(section: dict[str, Any]) -> str:
    modes = section["settings"]["modes"][1:]
    header = ["loop", "scenario", "baseline µs/task"]
    for mode in modes:
        header += [f"{mode} µs/task", f"{mode} extra µs/task"]
    header += ["events delivered / checked"]
    rows = []
    for loop, scenarios in section["loops"].items():
        for scenario, by_mode in scenarios.items():
            row = [loop, scenario, _pm(by_mode[BASELINE]["us_per_task"])]
            delivered = []
            for mode in modes:
                entry = by_mode.get(mode)
                if entry is None:  # this mode did not run on this loop
                    row += ["—", "—"]
                    continue
                row += [_pm(entry["us_per_task"]), _pm(entry["extra_us_per_task"])]
                expected = entry["events_expected_per_run"]
                ok = "ok" if entry["delivery_ok"] else "**MISSING**"
                delivered.append(f"{expected}/run, {entry['events_checked']} checked: {ok}")
            rows.append([*row, "; ".join(sorted(set(delivered)))])
    return _table(header, rows)


def throughput(groups: dict[str, Any], label: str) -> str:
    header = [label, "mode", "req/s", "% of baseline", "mean latency ms", "p99 latency ms"]
    header += ["server CPU µs/req", "% of baseline by CPU", "server CPU use %", "checks"]
    rows = []
    for group, by_mode in groups.items():
        for mode, entry in by_mode.items():
            ratio = entry.get("ratio_to_baseline")
            cpu_ratio = entry.get("cpu_ratio_to_baseline")
            cpu = entry.get("server_cpu_us_per_request")
            share = entry.get("server_cpu_share")
            rows.append(
                [
                    group,
                    mode,
                    _pm(entry["rps"], digits=0),
                    "100" if ratio is None else _pm(ratio, 100, 1),
                    _pm(entry["mean_us"], 1e-3),
                    _pm(entry["p99_us"], 1e-3),
                    "—" if cpu is None else _pm(cpu, digits=1),
                    ("100" if cpu is not None else "—") if cpu_ratio is None else _pm(cpu_ratio, 100, 1),
                    "—" if share is None else _pm(share, 100, 0),
                    "ok" if entry["checks_ok"] else "**" + "; ".join(entry["problems"]) + "**",
                ]
            )
    return _table(header, rows)


def scaling(section: dict[str, Any]) -> str:
    modes = section["settings"]["modes"]
    header = ["workload", "tasks", "baseline µs/task"]
    for mode in modes[1:]:
        header += [f"{mode} µs/task", "relative speed", "extra µs/task"]
    header += ["baseline B/task"] + [f"{mode} B/task" for mode in modes[1:]]
    header += ["peak RSS MB " + " / ".join(modes)]
    rows = []
    for workload, by_size in section["results"].items():
        for size, by_mode in by_size.items():
            row = [workload, f"{int(size):,}", _pm(by_mode[BASELINE]["us_per_task"])]
            for mode in modes[1:]:
                entry = by_mode[mode]
                row += [_pm(entry["us_per_task"]), _pm(entry["relative_speed"], digits=3)]
                row += [_pm(entry["extra_us_per_task"])]
            row += [f"{by_mode[mode]['bytes_per_task']['median']:.0f}" for mode in modes]
            row += [" / ".join(f"{by_mode[mode]['peak_rss_bytes'] / 2**20:.0f}" for mode in modes)]
            rows.append(row)
    return _table(header, rows)


def targets(verdicts: list[dict[str, Any]]) -> str:
    rows = []
    for v in verdicts:
        spread = "" if v["spread"] is None else f" ± {v['spread']:.2f}"
        rows.append(
            [
                v["section"],
                v["what"],
                f"{v['value']:.2f}{spread} {v['unit']}",
                v["target"],
                _verdict(v["passed"]),
                v["note"],
            ]
        )
    return _table(["section", "figure", "measured (median ± sd)", "target", "verdict", "note"], rows)


def crosscheck(section: dict[str, Any]) -> str:
    if "skipped" in section:
        return f"Skipped: {section['skipped']}."
    rows = []
    for server, by in section.items():
        rows.append(
            [
                server,
                f"{by['wrk']['rps']:.0f}",
                f"{by['python']['rps']:.0f}",
                f"{by['python_to_wrk_rps'] * 100:.0f} %",
                f"{by['wrk']['p99_us'] / 1000:.2f}",
                f"{by['python']['p99_us'] / 1000:.2f}",
            ]
        )
    return _table(
        ["server (baseline)", "wrk req/s", "python client req/s", "python / wrk", "wrk p99 ms", "python p99 ms"], rows
    )


def machine(results: dict[str, Any]) -> str:
    info, generators, suite = results["machine"], results["load_generators"], results["suite"]
    libraries = ", ".join(f"{k} {v}" for k, v in info["libraries"].items() if v)
    pinning = results.get("cpu_pinning", {})
    pinned = (
        f"server on CPU {pinning['server']}, load generator on CPU {pinning['load_generator']}"
        if pinning.get("server") is not None
        else "none"
    )
    return "\n".join(
        [
            f"- date: {info['date']}; {suite['preset']} run, {suite.get('seconds', 0):.0f} s",
            f"- CPU: {info['cpu_model']}, {info['cpus']} logical CPUs ({info['cpus_usable']} usable)",
            f"- OS: {info['platform']}",
            f"- Python: {info['python_implementation']} {info['python']}",
            f"- libraries: {libraries}",
            f"- load generators: HTTP {generators['http']}; TCP echo {generators['echo']}",
            f"- CPU pinning: {pinned}",
            f"- load average (1, 5, 15 min): {info['load_average_at_start']} at start,"
            f" {info.get('load_average_at_end')} at end",
        ]
    )


def markdown(results: dict[str, Any], level: int = 2) -> str:
    """The machine and every table, under headings of `level` (results.md and the printed report)."""
    return "\n\n".join([f"{'#' * level} Machine", machine(results), tables(results, level)])


def tables(results: dict[str, Any], level: int = 2) -> str:
    """Every table but the machine's, under headings of `level` (3 inside the docs page's "Results")."""
    h = "#" * level
    parts = [f"{h} Targets", targets(results["targets"])]
    if "loops" in results["pertask"]:
        parts += [f"{h} Per-task overhead", pertask(results["pertask"])]
    if "servers" in results["asgi"]:
        http = results["asgi"]["settings"].get("uvicorn_http", "httptools")
        title = f"{h} ASGI hello world, 1 KB, uvloop, one worker (uvicorn with {http})"
        parts += [title, throughput(results["asgi"]["servers"], "server")]
    if "kinds" in results["echo"]:
        parts += [f"{h} TCP echo, 1 KB, uvloop", throughput(results["echo"]["kinds"], "server")]
    if "results" in results["scaling"]:
        parts += [f"{h} Scaling ({results['scaling']['settings']['loop']})", scaling(results["scaling"])]
    parts += [f"{h} Load generators compared", crosscheck(results["loadgen_crosscheck"])]
    return "\n\n".join(parts) + "\n"
