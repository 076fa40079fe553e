"""The cost guard: every scenario of the cost table within its instruction budget.

Instruction counts under valgrind do not move with the machine's load, so a
change that makes the hot path dearer fails here, naming the scenario and
its figure, instead of landing unnoticed. The budgets, and the targets of
issue 26 beside them, are `benchmarks/budgets.toml`; the measuring is
`benchmarks/instructions.py --json` (the table of docs/benchmarks.md).

Counts differ between Python versions, so the guard runs on CPython 3.12
only and skips elsewhere, saying so. Without valgrind it skips too, unless
AIOCOP_REQUIRE_VALGRIND is set, as in CI (`.ci/run` installs valgrind).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "instructions.py"
ON_312 = sys.implementation.name == "cpython" and sys.version_info[:2] == (3, 12)


def _instructions() -> ModuleType:
    spec = importlib.util.spec_from_file_location("aiocop_bench_instructions", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


instructions = _instructions()


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib (the budgets file's reader) is new in 3.11")
def test_budgets_file_covers_every_scenario_and_stays_above_its_target() -> None:
    budgets = instructions.load_budgets()  # exits with a message on an unknown, missing or malformed row
    assert set(budgets) == {row.key for row in instructions.TABLE}
    for key, row in budgets.items():
        # A budget is a measured figure plus a margin; the target is where issue 26 wants it.
        assert row["budget"] > 0, key
        assert row["budget"] >= row["target"] or key.startswith("pure-"), (key, row)


def test_a_figure_over_its_budget_is_named_with_its_figure() -> None:
    budgets = {
        "stat-uvloop": {"budget": 70_000.0, "target": 37_000.0},
        "pure-uvloop": {"budget": 500.0, "target": 500.0},
    }
    over = instructions.over_budget(
        {"stat-uvloop": {"aiocop": 70_001.0}, "pure-uvloop": {"aiocop": 120.0}},
        budgets,
    )
    assert over == ["stat-uvloop: +70001 instructions per task, over its budget of 70000 (target 37000)"]
    assert instructions.over_budget({"stat-uvloop": {"aiocop": 69_999.0}}, budgets) == []


def _skip_reason() -> str | None:
    if not ON_312:
        version = sys.version.split()[0]
        return f"the budgets are CPython 3.12's instruction counts (each version's differ); this is {version}"
    if shutil.which("valgrind") is None:
        if os.environ.get("AIOCOP_REQUIRE_VALGRIND"):
            pytest.fail("AIOCOP_REQUIRE_VALGRIND is set, but valgrind is not installed")
        return "valgrind is not installed (Debian: apt-get install valgrind)"
    return None


@pytest.mark.timeout(1500)  # five valgrind processes: about 2 minutes on a quiet machine, more on a busy one
def test_every_scenario_within_its_instruction_budget() -> None:
    reason = _skip_reason()
    if reason is not None:
        pytest.skip(reason)
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--json"],
        capture_output=True,
        text=True,
        timeout=1400,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout)
    budgets = instructions.load_budgets()
    assert set(figures) == set(budgets)  # every scenario measured, none left out
    table = "\n".join(
        f"  {key}: {fig['aiocop']:+.0f} (budget {budgets[key]['budget']:.0f})" for key, fig in figures.items()
    )
    over = instructions.over_budget(figures, budgets)
    assert not over, "over budget:\n  " + "\n  ".join(over) + f"\nall figures:\n{table}"
