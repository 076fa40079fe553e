"""The benchmark suite runs end to end (`run_benchmark.py --quick`) and its correctness checks pass.

No timing is asserted here: `--quick` runs at toy sizes on whatever machine
CI has. What is checked is that every section produced results, that every
blocking call of the per-task scenarios was detected and delivered, that the
baselines never imported aiocop, and that the servers under load ran with
detection live.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import scripts

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "run_benchmark.py"
SECTIONS = ("pertask", "asgi", "echo", "loadgen_crosscheck", "scaling")


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path, str]:
    out = tmp_path_factory.mktemp("bench")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,  # about 35 s on a quiet machine; the bound is for one whose cores are all busy
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads((out / "results.json").read_text(encoding="utf-8")), out, done.stdout


@pytest.mark.timeout(660)  # one run of the whole quick suite: about 35 s, minutes on a busy machine
def test_every_section_ran(quick: tuple[dict[str, Any], Path, str]) -> None:
    results, out, stdout = quick
    for section in SECTIONS:
        assert section in results
    for section in ("pertask", "asgi", "echo", "scaling"):
        assert "skipped" not in results[section], results[section]
    assert results["checks"] == {"all_ok": True, "problems": []}
    assert (out / "results.md").read_text(encoding="utf-8").strip() == stdout.strip()
    assert results["machine"]["cpu_model"]
    assert results["machine"]["python"]


@pytest.mark.timeout(660)  # the module's `quick` run (600 s) is set up in whichever of its tests runs first (-k, xdist)
def test_every_blocking_call_was_delivered(quick: tuple[dict[str, Any], Path, str]) -> None:
    results = quick[0]
    loops = results["pertask"]["loops"]
    assert {"asyncio", "uvloop"} <= set(loops)
    for scenarios in loops.values():
        assert set(scenarios) == {"pure", "getcwd", "stat", "file_read", "handler"}
        for name, by_mode in scenarios.items():
            for mode, entry in by_mode.items():
                if mode == "baseline":
                    continue
                expected = 0 if name == "pure" else results["pertask"]["settings"]["tasks"][name]
                assert entry["events_expected_per_run"] == expected
                assert set(entry["events_delivered"]) == {expected}
                assert entry["delivery_ok"], entry["problems"]
                assert entry["events_checked"] == (0 if name == "pure" else 1)


@pytest.mark.timeout(660)  # the module's `quick` run (600 s) is set up in whichever of its tests runs first (-k, xdist)
def test_servers_ran_with_detection_live(quick: tuple[dict[str, Any], Path, str]) -> None:
    results = quick[0]
    generator = "wrk" if shutil.which("wrk") else "python"
    for server, by_mode in results["asgi"]["servers"].items():
        assert set(by_mode) == {"baseline", "aiocop", "aiocop+watchdog", "aiocop+middleware", "aiocop+otel"}, server
        for mode, entry in by_mode.items():
            assert entry["checks_ok"], (server, mode, entry["problems"])
            for run in entry["runs"]:
                assert run["generator"] == generator
                assert run["requests"] > 0
                assert run["server_status"]["aiocop_imported"] == (mode != "baseline")
                assert run["server_status"]["instrumented"] == (mode == "aiocop+otel")
    for kind, by_mode in results["echo"]["kinds"].items():
        for mode, entry in by_mode.items():
            assert entry["checks_ok"], (kind, mode, entry["problems"])
            assert all(run["requests"] > 0 for run in entry["runs"])


@pytest.mark.timeout(660)  # the module's `quick` run (600 s) is set up in whichever of its tests runs first (-k, xdist)
def test_fallback_load_generator_ran(quick: tuple[dict[str, Any], Path, str]) -> None:
    # Without wrk every HTTP figure comes from the fallback; with it, the
    # cross-check runs the fallback against wrk on the same server.
    results = quick[0]
    if shutil.which("wrk") is None:
        assert results["load_generators"]["http"].startswith("python")
        assert "wrk is not installed" in results["loadgen_crosscheck"]["skipped"]
    else:
        for by in results["loadgen_crosscheck"].values():
            assert by["python"]["generator"] == "python"
            assert by["python"]["requests"] > 0
            assert by["wrk"]["requests"] > 0


@pytest.mark.timeout(660)  # the module's `quick` run (600 s) is set up in whichever of its tests runs first (-k, xdist)
def test_scaling_and_targets(quick: tuple[dict[str, Any], Path, str]) -> None:
    results = quick[0]
    scaling = results["scaling"]["results"]
    assert set(scaling) == {"producer_consumer", "task_workflow", "chat_fanout"}
    for by_size in scaling.values():
        for entry in by_size.values():
            assert entry["checks_ok"]
            assert entry["aiocop"]["bytes_per_task"]["median"] > 0
    sections = {v["section"] for v in results["targets"]}
    assert sections == {"pertask", "asgi", "echo", "scaling"}
    assert all(v["passed"] in (True, False, None) for v in results["targets"])


@pytest.mark.timeout(660)  # the module's `quick` run (600 s) is set up in whichever of its tests runs first (-k, xdist)
def test_plots_written(quick: tuple[dict[str, Any], Path, str]) -> None:
    results, out, _ = quick
    if importlib.util.find_spec("matplotlib") is None:
        assert results["plots"] == {"skipped": "matplotlib is not installed"}
        pytest.skip("matplotlib is not installed: the suite ran without plots")
    assert results["plots"]["files"] == ["pertask_overhead.png", "throughput.png", "scaling.png"]
    for name in results["plots"]["files"]:
        assert (out / name).read_bytes().startswith(b"\x89PNG")


def test_docs_page_keeps_the_blocks_run_benchmark_writes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # `run_benchmark.py --docs` rewrites the page's generated blocks (the
    # machine beside the summary, the tables in "Results") and nothing else.
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    run_benchmark = importlib.import_module("run_benchmark")
    page = run_benchmark.DOCS_PAGE.read_text(encoding="utf-8")
    copy = tmp_path / "benchmarks.md"
    copy.write_text(page, encoding="utf-8")
    run_benchmark.update_docs_page({block: f"new {block}\n" for block in run_benchmark.DOCS_BLOCKS}, copy)
    written = copy.read_text(encoding="utf-8")
    kept = page
    for block in run_benchmark.DOCS_BLOCKS:
        start, end = run_benchmark.docs_markers(block)
        assert f"{start}\n\nnew {block}\n\n{end}" in written
        before, _, rest = kept.partition(start)
        kept = f"{before}{start}\n\nnew {block}\n\n{end}{rest.partition(end)[2]}"
    assert written == kept
    assert written.index("## Summary") < written.index("<!-- machine:") < written.index("## Run it")
    assert written.index("## Results") < written.index("<!-- results:")


INSTRUCTIONS = ROOT / "benchmarks" / "instructions.py"
SCENARIOS = ("pure", "stat", "stat2", "deep")


@pytest.mark.parametrize("mode", ["baseline", "inert", "full", "floor"])
@pytest.mark.timeout(390)  # up to six programs in turn, each given 60 s
def test_instruction_count_programs_check_their_events(mode: str) -> None:
    # The programs instructions.py runs under valgrind, run here without it:
    # each exits non-zero unless every blocking call of a full run was
    # delivered (and none in the other modes). "-" as the loop: the
    # audit-cost program.
    runs = [(scenario, "uvloop", "500") for scenario in (("stat",) if mode == "floor" else SCENARIOS)]
    runs += [(what, "-", "1000") for what in ("f_code", "getframe") if mode != "floor"]
    for program, loop_name, count in runs:
        done = subprocess.run(
            [sys.executable, str(INSTRUCTIONS), "--child", mode, program, loop_name, count],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, (program, done.stderr[-2000:])


@pytest.mark.parametrize("mode", ["baseline", "inert", "full", "watchdog"])
def test_instruction_count_programs_on_trio_check_their_events(mode: str) -> None:
    # `--loop trio` (issue 41): the same check, the tasks run by trio.run in nurseries (`--watchdog`:
    # with the watchdog watching the run, every event still delivered, none a stall).
    pytest.importorskip("trio")
    for scenario in ("pure", "stat", "stat2"):
        done = subprocess.run(
            [sys.executable, str(INSTRUCTIONS), "--child", mode, scenario, "trio", "500"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, (scenario, done.stderr[-2000:])


@pytest.mark.timeout(330)  # seconds on a quiet machine; the bound is for a busy one
def test_watchdog_busy_cost_runs_and_checks_its_events() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "watchdog_busy_cost.py"), "--rounds", "2", "--tasks", "1000"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    # Non-zero if a task's os.stat event was lost or doubled, or if any other
    # event is not a stall of the benchmark's own steps (which a starved
    # machine explains: the benchmark's _explained).
    assert done.returncode == 0, done.stderr[-2000:]
    assert "polling every 2 ms" in done.stdout and "polling every 10 ms" in done.stdout


@pytest.mark.timeout(200)
def test_debug_loop_connect_runs_and_reports_nothing() -> None:
    # Every call aiocop sees on a debug-mode loop's connect is known-harmless.
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "debug_loop_connect.py"), "--rounds", "1", "--connections", "20"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "events reported: 0" in done.stdout, done.stdout


BACK_TO_BACK = ROOT / "benchmarks" / "back_to_back_steps.py"


@pytest.mark.timeout(200)
def test_back_to_back_steps_runs_and_scores_its_rounds() -> None:
    # What it prints is the machine's; that it runs a round on each loop and scores it is not.
    # (uvloop and trio where this Python has them: not yet on every new CPython.)
    for loop in ("asyncio", *(name for name in ("uvloop", "trio") if importlib.util.find_spec(name))):
        command = [sys.executable, str(BACK_TO_BACK), "--loop", loop, "--rounds", "1", "--tasks", "2", "--steps", "5"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, (loop, done.stderr[-2000:])
        assert re.search(r"this tree +true stalls +\d+ +reported +\d+ .* false +\d+", done.stdout), done.stdout


def test_back_to_back_steps_scores_reports_against_true_stalls() -> None:
    module = scripts.load("benchmarks/back_to_back_steps.py")
    # W0 made 2 true stalls and was reported 3 times; W1 made none and was reported once.
    result = {"events": [["W0", 50.0], ["W0", 47.0], ["W0", 31.0], ["W1", 36.0]], "true": {"W0": 2}}
    assert module.score(result) == (2, 2, 2)


def test_back_to_back_steps_refuses_bad_settings(tmp_path: Path) -> None:
    for args, named in ((["--rounds", "0"], "--rounds"), (["--baseline-tree", str(tmp_path)], "--baseline-tree")):
        done = subprocess.run(
            [sys.executable, str(BACK_TO_BACK), *args], capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 2 and named in done.stderr, done.stderr


@pytest.mark.skipif(importlib.util.find_spec("blockbuster") is None, reason="blockbuster is the comparison's")
def test_the_per_task_child_times_blockbuster_and_counts_each_call_it_raised_for() -> None:
    # `--pertask-modes ... blockbuster` (issue 39): blockbuster raises at each
    # blocking call, before it runs; the child catches and counts them.
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "children" / "pertask_child.py"), "blockbuster", "asyncio", "1"]
        + [f"{name}=1000" for name in ("pure", "getcwd", "stat", "file_read", "handler")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert not result["aiocop_imported"]
    for name, data in result["scenarios"].items():
        assert data["ok"], (name, data["problems"])
        assert data["delivered"] == [0 if name == "pure" else 1000], name


@pytest.mark.timeout(200)
def test_crossings_follows_one_call_and_one_stall_to_the_callback() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "crossings.py"), "--json"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    stat, stall = (json.loads(line) for line in done.stdout.splitlines())
    # The call is seen by the wrapper's hook and ends in the callbacks' part, on the loop's thread alone.
    (call,) = stat["threads"]
    assert call["path"][0] == "aiocop._interception" and call["path"][-1] == "aiocop._model", call
    assert call["crossings"] == len(call["path"]) - 1 >= 2
    # The stall is handed to the reports (the watchdog's thread) and delivered from them (the loop's).
    assert any(thread["path"][-1] == "aiocop._model" for thread in stall["threads"]), stall
    assert all("aiocop._reporting" in thread["path"] for thread in stall["threads"]), stall
