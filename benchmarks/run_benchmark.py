"""aiocop's benchmark suite: what detection costs, against event loops aiocop never touched.

    python benchmarks/run_benchmark.py            # the full run, a few minutes (make bench)
    python benchmarks/run_benchmark.py --quick    # every part at toy sizes, well under a minute (CI)

Sections (SPEC §3), each against its target:

1. per-task overhead: the scenarios of the aiocop 1.x benchmark on every
   installed loop, every blocking call detected and delivered to a callback
   with a 5-frame trace (checked);
2. throughput: a 1 KB hello-world ASGI app under Granian and uvicorn (uvloop,
   one worker; wrk, or a Python load generator where wrk is missing), and a
   1 KB TCP echo over asyncio streams and an `asyncio.Protocol` on uvloop;
3. scaling: producer/consumer, task workflow and chat fan-out from 1 k to 1 M
   concurrent tasks: relative speed and memory per task.

Every figure comes from child processes; the baseline process never imports
aiocop, and runs alternate with the aiocop runs over several rounds. Writes
`results.json`, `results.md` and PNG plots to `--out` (default
benchmarks/results/); `--docs` also writes the results into docs/benchmarks.md
and the plots into docs/assets/benchmarks/ (`--from-json` re-renders a
results.json without measuring again).
Timings are reported, never asserted: the exit status is non-zero only when a
correctness check failed (an event not delivered, a baseline that imported aiocop).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from suite import common, loadgen, pertask, plots, report, scaling, targets, throughput

if TYPE_CHECKING:
    from collections.abc import Callable

SECTIONS = ("pertask", "asgi", "echo", "scaling")
DOCS_ASSETS = common.ROOT / "docs" / "assets" / "benchmarks"
DOCS_PAGE = common.ROOT / "docs" / "benchmarks.md"
# The page's generated blocks, each between its two markers: the machine at the
# top beside the summary (whose table is written by hand), the tables in "Results".
DOCS_BLOCKS = ("machine", "results")
ECHO_GENERATOR = "python (children/echo_client.py, uvloop)"
HTTP_FALLBACK = "python (children/http_client.py, uvloop)"


@dataclass(frozen=True)
class Preset:
    pertask_tasks: dict[str, int]
    pertask_reps: int
    pertask_rounds: int
    pertask_modes: tuple[str, ...]
    pertask_all_modes_loops: tuple[str, ...] | None  # None: every loop runs every mode
    asgi_modes: tuple[str, ...]
    echo_modes: tuple[str, ...]
    throughput_rounds: int
    warmup: float
    duration: float
    scaling_sizes: tuple[int, ...]
    scaling_rounds: dict[int, int] = field(default_factory=dict)
    scaling_reps: dict[int, int] = field(default_factory=dict)


ALL_ASGI_MODES = ("baseline", "aiocop", "aiocop+watchdog", "aiocop+middleware", "aiocop+otel")
ECHO_MODES = ("baseline", "aiocop", "aiocop+watchdog")
PERTASK_MODES = ("baseline", "aiocop", "aiocop+watchdog", "aiocop+otel")

FULL = Preset(
    # The pure task is cheap and has the tightest target: more tasks.
    pertask_tasks={"pure": 20_000, "getcwd": 5000, "stat": 5000, "file_read": 5000, "handler": 5000},
    pertask_reps=3,
    pertask_rounds=5,
    pertask_modes=PERTASK_MODES,
    pertask_all_modes_loops=("asyncio", "uvloop"),  # the watchdog and otel variants on the targets' loops only
    asgi_modes=ALL_ASGI_MODES,
    echo_modes=ECHO_MODES,
    throughput_rounds=3,
    warmup=1.0,
    duration=2.0,
    scaling_sizes=(1_000, 10_000, 100_000, 1_000_000),
    # Small sizes are short and noisy: more rounds, and repeated inside each child.
    # At 1 M one run takes 15-20 s and 1-2 GB: one round (one baseline, one aiocop run per workload).
    scaling_rounds={1_000: 5, 10_000: 5, 100_000: 3, 1_000_000: 1},
    scaling_reps={1_000: 10, 10_000: 3, 100_000: 1, 1_000_000: 1},
)
QUICK = Preset(
    pertask_tasks=dict.fromkeys(pertask.SCENARIOS, 1000),
    pertask_reps=1,
    pertask_rounds=1,
    pertask_modes=PERTASK_MODES,
    pertask_all_modes_loops=None,
    asgi_modes=ALL_ASGI_MODES,
    echo_modes=ECHO_MODES,
    throughput_rounds=1,
    warmup=0.0,
    # Each server and mode is loaded this long (wrk: 1 s, its least). No check
    # rests on how much load ran (the probes, the baseline's imports), but
    # each run must count some requests, and the Python client's window opens
    # before it imports its loop and connects (about 0.15 s here): 0.5 s
    # leaves it most of its time. The quick run took 56-57 s of CPU at 1 s
    # (16 loaded runs, each on both cores), 44-46 s at 0.5 s (alternating).
    duration=0.5,
    scaling_sizes=(1_000, 2_000),
    scaling_rounds={1_000: 1, 2_000: 1},
    scaling_reps={1_000: 1, 2_000: 1},
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--quick", action="store_true", help="every part at toy sizes (proves it works; timings mean nothing)"
    )
    parser.add_argument("--out", type=Path, default=common.ROOT / "benchmarks" / "results", help="results directory")
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--loops", nargs="+", help="loops for the per-task section (default: all installed)")
    parser.add_argument(
        "--pertask-modes",
        nargs="+",
        choices=(*PERTASK_MODES[1:], "blockbuster"),
        help="per-task section: the modes measured against the baseline (default: every aiocop mode); "
        "blockbuster's column, in the same run, with `blockbuster`",
    )
    parser.add_argument("--scaling-loop", default="uvloop", help="loop of the scaling section (default uvloop)")
    parser.add_argument("--loadgen", choices=("auto", "wrk", "python"), default="auto", help="HTTP load generator")
    parser.add_argument("--no-pin", action="store_true", help="do not pin server and load generator to separate CPUs")
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument(
        "--docs", action="store_true", help="also update docs/benchmarks.md's results and docs/assets/benchmarks/*.png"
    )
    parser.add_argument("--from-json", type=Path, help="measure nothing: render tables and plots of a results.json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = json.loads(args.from_json.read_text(encoding="utf-8")) if args.from_json else measure(args)
    results["plots"] = write_plots(results, args)
    return write(results, args)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    preset = QUICK if args.quick else FULL
    started = time.monotonic()
    generator = loadgen.choose(args.loadgen)
    server_cpu, client_cpu = common.pin_cpus(not args.no_pin)
    loops = tuple(args.loops or common.available_loops())
    machine = common.machine()
    results: dict[str, Any] = {
        "suite": {"preset": "quick" if args.quick else "full", "argv": sys.argv[1:], "sections": args.sections},
        "machine": machine,
        "load_generators": {
            "http": f"wrk ({machine['wrk']})" if generator == "wrk" else HTTP_FALLBACK,
            "echo": ECHO_GENERATOR,
        },
        "cpu_pinning": {"server": server_cpu, "load_generator": client_cpu},
    }
    common.progress(f"aiocop benchmarks ({results['suite']['preset']}): {', '.join(args.sections)}; loops {loops}")
    tp = throughput_settings(preset, generator, server_cpu, client_cpu)
    sections: dict[str, Callable[[], dict[str, Any]]] = {
        "pertask": lambda: run_pertask(preset, loops, args.pertask_modes),
        "asgi": lambda: throughput.run_asgi(tp),
        "echo": lambda: throughput.run_echo(tp),
        "loadgen_crosscheck": lambda: run_crosscheck(tp, args.sections),
        "scaling": lambda: run_scaling(preset, args.scaling_loop),
    }
    timings: dict[str, float] = {}
    for name, section in sections.items():
        if name not in args.sections and name != "loadgen_crosscheck":
            results[name] = {"skipped": "not selected with --sections"}
            continue
        t0 = time.monotonic()
        results[name] = section()
        timings[name] = round(time.monotonic() - t0, 1)
    results["targets"] = targets.evaluate(results)
    results["checks"] = checks(results)
    machine["load_average_at_end"] = common.load_average()
    results["suite"].update(section_seconds=timings, seconds=round(time.monotonic() - started, 1))
    return results


def run_pertask(preset: Preset, loops: tuple[str, ...], modes: list[str] | None = None) -> dict[str, Any]:
    settings = pertask.Settings(
        loops=loops,
        modes=preset.pertask_modes if not modes else ("baseline", *dict.fromkeys(modes)),
        tasks=preset.pertask_tasks,
        reps=preset.pertask_reps,
        rounds=preset.pertask_rounds,
        all_modes_loops=loops if preset.pertask_all_modes_loops is None else preset.pertask_all_modes_loops,
    )
    return pertask.run(settings)


def throughput_settings(
    preset: Preset, generator: str, server_cpu: int | None, client_cpu: int | None
) -> throughput.Settings:
    return throughput.Settings(
        servers=("granian", "uvicorn"),
        asgi_modes=preset.asgi_modes,
        echo_kinds=("streams", "protocol"),
        echo_modes=preset.echo_modes,
        echo_loop="uvloop",
        rounds=preset.throughput_rounds,
        warmup=preset.warmup,
        duration=preset.duration,
        http_connections=64,
        echo_connections=32,
        generator=generator,
        server_cpu=server_cpu,
        client_cpu=client_cpu,
    )


def run_crosscheck(settings: throughput.Settings, sections: list[str]) -> dict[str, Any]:
    if "asgi" not in sections:
        return {"skipped": "the asgi section was not selected"}
    if shutil.which("wrk") is None:
        return {"skipped": "wrk is not installed: every HTTP figure comes from the Python load generator"}
    return throughput.crosscheck(settings)


def run_scaling(preset: Preset, loop: str) -> dict[str, Any]:
    settings = scaling.Settings(
        loop=loop,
        modes=("baseline", "aiocop"),
        sizes=preset.scaling_sizes,
        rounds=preset.scaling_rounds,
        reps=preset.scaling_reps,
    )
    return scaling.run(settings)


def checks(results: dict[str, Any]) -> dict[str, Any]:
    """Correctness of the runs (not timings): every expected event delivered, baselines untouched."""
    problems: list[str] = []
    for loop, scenarios in results["pertask"].get("loops", {}).items():
        for scenario, by_mode in scenarios.items():
            for mode, entry in by_mode.items():
                if "delivery_ok" in entry and not entry["delivery_ok"]:
                    problems.append(
                        f"pertask {loop} {scenario} {mode}: {entry['problems'] or entry['events_delivered']}"
                    )
    for section, key in (("asgi", "servers"), ("echo", "kinds")):
        for group, by_mode in results[section].get(key, {}).items():
            for mode, entry in by_mode.items():
                if not entry["checks_ok"]:
                    problems.append(f"{section} {group} {mode}: {entry['problems']}")
    for workload, by_size in results["scaling"].get("results", {}).items():
        for size, entry in by_size.items():
            if not entry["checks_ok"]:
                problems.append(f"scaling {workload} {size}: an event was delivered, or the baseline imported aiocop")
    return {"all_ok": not problems, "problems": problems}


def write_plots(results: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    if args.no_plots:
        return {"skipped": "--no-plots"}
    try:
        import matplotlib  # noqa: F401 - only whether it is installed
    except ImportError:
        common.progress("plots skipped: matplotlib is not installed (pip install matplotlib)")
        return {"skipped": "matplotlib is not installed"}
    names = plots.write_all(results, args.out)
    if args.docs:
        DOCS_ASSETS.mkdir(parents=True, exist_ok=True)
        for name in names:
            shutil.copyfile(args.out / name, DOCS_ASSETS / name)
    return {"directory": str(args.out), "files": names, "copied_to_docs": bool(args.docs)}


def write(results: dict[str, Any], args: argparse.Namespace) -> int:
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    text = report.markdown(results)
    (out / "results.md").write_text(text, encoding="utf-8")
    print(text)
    if args.docs:
        update_docs_page({"machine": report.machine(results) + "\n", "results": report.tables(results, level=3)})
    print(f"{results['suite']['seconds']:.0f} s; results in {out}", file=sys.stderr)
    if not results["checks"]["all_ok"]:
        print("CHECKS FAILED:\n  " + "\n  ".join(results["checks"]["problems"]), file=sys.stderr)
        return 1
    return 0


def docs_markers(block: str) -> tuple[str, str]:
    return f"<!-- {block}: written by `run_benchmark.py --docs`, do not edit by hand -->", f"<!-- end of {block} -->"


def update_docs_page(blocks: dict[str, str], page_path: Path = DOCS_PAGE) -> None:
    """Replace the generated blocks of docs/benchmarks.md; the prose around them is written by hand."""
    page = page_path.read_text(encoding="utf-8")
    for block in DOCS_BLOCKS:
        start, end = docs_markers(block)
        if page.count(start) != 1 or page.count(end) != 1 or page.index(start) > page.index(end):
            raise SystemExit(f"{page_path}: the markers {start!r} and {end!r} must each appear once, in that order")
        before, _, rest = page.partition(start)
        after = rest.partition(end)[2]
        page = f"{before}{start}\n\n{blocks[block]}\n{end}{after}"
    page_path.write_text(page, encoding="utf-8")
    common.progress(f"updated {page_path} and {DOCS_ASSETS}")
    common.progress("the summary table at the top of the page is written by hand: update it from the Targets table")


if __name__ == "__main__":
    sys.exit(main())
