"""PNG figures of the results (matplotlib, headless); docs/benchmarks.md embeds them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

BASELINE = "baseline"
COLORS = {"asyncio": "#4c72b0", "uvloop": "#dd8452", "rloop": "#55a868", "veloxloop": "#c44e52"}
MODE_COLORS = {"aiocop": "#dd8452", "aiocop+watchdog": "#55a868", "aiocop+middleware": "#8172b3", BASELINE: "#4c72b0"}


def write_all(results: dict[str, Any], directory: Path) -> list[str]:
    """Write every figure the results allow; the file names written."""
    import matplotlib

    matplotlib.use("Agg")  # no display: CI, servers
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    if "loops" in results["pertask"]:
        written.append(_pertask(results["pertask"], directory / "pertask_overhead.png"))
    if "servers" in results["asgi"] and "kinds" in results["echo"]:
        written.append(_throughput(results["asgi"]["servers"], results["echo"]["kinds"], directory / "throughput.png"))
    if "results" in results["scaling"]:
        written.append(_scaling(results["scaling"], directory / "scaling.png"))
    return written


def _pertask(section: dict[str, Any], path: Path) -> str:
    import matplotlib.pyplot as plt

    from suite import targets

    modes = section["settings"]["modes"][1:]
    loops = list(section["loops"])
    scenarios = list(next(iter(section["loops"].values())))
    fig, axes = plt.subplots(1, len(modes), figsize=(6 * len(modes), 4.2), sharey=True, squeeze=False)
    width = 0.8 / len(loops)
    for ax, mode in zip(axes[0], modes, strict=True):
        for i, loop in enumerate(loops):
            if mode not in section["loops"][loop][scenarios[0]]:
                continue  # this mode did not run on this loop
            extras = [section["loops"][loop][s][mode]["extra_us_per_task"] for s in scenarios]
            xs = [x + (i - (len(loops) - 1) / 2) * width for x in range(len(scenarios))]
            ax.bar(
                xs,
                [e["median"] for e in extras],
                width,
                yerr=[e["stdev"] for e in extras],
                label=loop,
                color=COLORS.get(loop),
                capsize=2,
            )
        for x, scenario in enumerate(scenarios):
            limit = targets.PURE_TASK_US if scenario == "pure" else targets.BLOCKING_CALL_US
            limit *= targets.BLOCKING_SCENARIOS.get(scenario, 1)
            ax.hlines(limit, x - 0.45, x + 0.45, colors="black", linestyles="dashed", linewidth=1)
        ax.axhline(0, color="grey", linewidth=0.5)
        ax.set_xticks(range(len(scenarios)), scenarios)
        ax.set_title(f"extra time per task, {mode} vs. untouched loop")
        ax.set_ylabel("µs per task (median ± sd); dashed: target")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def _throughput_panel(ax: Any, groups: dict[str, Any], title: str) -> None:
    from suite import targets

    names = list(groups)
    modes = [m for m in next(iter(groups.values())) if m != BASELINE]
    width = 0.8 / len(modes)
    for i, mode in enumerate(modes):
        ratios = [groups[g][mode]["ratio_to_baseline"] for g in names]
        xs = [x + (i - (len(modes) - 1) / 2) * width for x in range(len(names))]
        ax.bar(
            xs,
            [r["median"] * 100 for r in ratios],
            width,
            yerr=[r["stdev"] * 100 for r in ratios],
            label=mode,
            color=MODE_COLORS.get(mode),
            capsize=2,
        )
        cpu = [groups[g][mode].get("cpu_ratio_to_baseline") for g in names]
        if all(c is not None for c in cpu):
            ax.plot(xs, [c["median"] * 100 for c in cpu], "kD", markersize=5, label="by CPU time" if i == 0 else None)
    ax.axhline(targets.THROUGHPUT_RATIO * 100, color="black", linestyle="dashed", linewidth=1, label="target 97 %")
    ax.axhline(100, color="grey", linewidth=0.5)
    ax.set_xticks(range(len(names)), names)
    values = [groups[g][m]["ratio_to_baseline"]["median"] * 100 for g in names for m in modes]
    ax.set_ylim(min(50.0, min(values) - 10), max(130.0, max(values) + 10))
    ax.set_ylabel("% of baseline req/s (bars: median ± sd)")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="lower right")


def _throughput(asgi: dict[str, Any], echo: dict[str, Any], path: Path) -> str:
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    _throughput_panel(left, asgi, "ASGI hello world, 1 KB, uvloop")
    _throughput_panel(right, echo, "TCP echo, 1 KB, uvloop")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def _scaling(section: dict[str, Any], path: Path) -> str:
    import matplotlib.pyplot as plt

    modes = section["settings"]["modes"]
    workloads = list(section["results"])
    fig, axes = plt.subplots(2, len(workloads), figsize=(4.5 * len(workloads), 7), squeeze=False)
    for column, workload in enumerate(workloads):
        by_size = section["results"][workload]
        sizes = [int(s) for s in by_size]
        speed, memory = axes[0][column], axes[1][column]
        for mode in modes[1:]:
            rel = [by_size[str(s)][mode]["relative_speed"] for s in sizes]
            speed.errorbar(
                sizes,
                [r["median"] for r in rel],
                yerr=[r["stdev"] for r in rel],
                marker="o",
                capsize=3,
                label=mode,
                color=MODE_COLORS.get(mode),
            )
        speed.axhline(1.0, color="grey", linewidth=0.8)
        values = [by_size[str(s)][m]["relative_speed"]["median"] for s in sizes for m in modes[1:]]
        speed.set_ylim(min(0.5, min(values) - 0.1), max(1.5, max(values) + 0.1))
        speed.set_title(workload)
        speed.set_ylabel("relative speed (baseline time / time)")
        for mode in modes:
            memory.plot(
                sizes,
                [by_size[str(s)][mode]["bytes_per_task"]["median"] for s in sizes],
                marker="o",
                label=mode,
                color=MODE_COLORS.get(mode),
            )
        top = max(by_size[str(s)][m]["bytes_per_task"]["median"] for s in sizes for m in modes)
        memory.set_ylim(0, top * 1.3)  # room for the legend above the lines
        memory.set_ylabel("RSS growth per live task, bytes")
        for ax in (speed, memory):
            ax.set_xscale("log")
            ax.set_xlabel("concurrent tasks")
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name
