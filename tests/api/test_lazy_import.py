"""`import aiocop` is lazy (PEP 562): the detector loads on first use.

The pytest plugin, loaded by every pytest run, never loads it while switched off; and trio, an
optional dependency, is never imported for a program that does not import it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import TYPE_CHECKING

import pytest

import aiocop
from tests.conftest import ROOT, run_python
from tests.support.pytester_args import QUIET

if TYPE_CHECKING:
    from pathlib import Path

# Modules that make up the detector: none is needed to import aiocop or to load the plugin switched off.
DETECTOR = (
    "aiocop._interception.hook",
    "aiocop._reporting.delivery",
    "aiocop._stalls.watchdog",
    "aiocop._interception.wrappers",
    "aiocop._interception.loops",
    "aiocop._api",
)


def fresh(code: str) -> dict[str, list[str]]:
    """What the program printed last: a JSON object of lists of names."""
    result = run_python(code, check=True)
    out: dict[str, list[str]] = json.loads(result.stdout.splitlines()[-1])
    return out


def test_import_aiocop_loads_no_detector_module() -> None:
    out = fresh("""
        import json, sys
        import aiocop
        print(json.dumps({"loaded": sorted(m for m in sys.modules if m.startswith("aiocop"))}))
    """)
    assert not set(out["loaded"]) & set(DETECTOR), out


def test_every_public_name_imports_from_a_fresh_interpreter() -> None:
    out = fresh("""
        import json
        names = {}
        import aiocop
        for name in aiocop.__all__:
            exec(f"from aiocop import {name}", names)
        print(json.dumps({"imported": sorted(k for k in names if not k.startswith("__")), "dir": dir(aiocop)}))
    """)
    public = [n for n in aiocop.__all__ if not n.startswith("__")]
    assert out["imported"] == sorted(public)
    assert set(aiocop.__all__) <= set(out["dir"])


def test_the_lazy_table_matches_all() -> None:
    assert {*aiocop._LAZY, "__version__"} == set(aiocop.__all__)
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        aiocop.no_such_name


def test_pytest_plugin_switched_off_loads_no_detector_module(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import json, sys

        def test_modules():
            loaded = sorted(m for m in sys.modules if m.startswith("aiocop"))
            print("LOADED", json.dumps(loaded))
        """
    )
    result = pytester.runpytest_subprocess("-s", *QUIET)
    result.assert_outcomes(passed=1)
    line = next(line for line in result.outlines if "LOADED" in line)
    loaded = json.loads(line.split("LOADED", 1)[1])
    assert "aiocop.pytest_plugin" in loaded  # the plugin is there...
    assert not set(loaded) & set(DETECTOR), loaded  # ...and the detector is not
    result = pytester.runpytest_subprocess("-s", *QUIET, "--aiocop")
    result.assert_outcomes(passed=1)
    line = next(line for line in result.outlines if "LOADED" in line)
    assert set(DETECTOR) <= set(json.loads(line.split("LOADED", 1)[1]))  # switched on, it is


def test_detection_never_imports_trio_for_a_program_that_does_not(tmp_path: Path) -> None:
    # trio is an optional dependency (issue 41): aiocop looks for it in sys.modules, never imports it,
    # whether detection is started by the API or by `python -m aiocop run`.
    program = tmp_path / "prog.py"
    program.write_text(
        textwrap.dedent("""
        import asyncio, os, sys
        import aiocop

        if "--api" in sys.argv:
            aiocop.start_blocking_io_detection()

        async def main():
            os.stat(".")

        asyncio.run(main())
        print(sorted(m for m in sys.modules if m.partition(".")[0] in ("trio", "outcome", "sniffio")))
        """)
    )
    for command in ([str(program), "--api"], ["-m", "aiocop", "run", str(program)]):
        result = subprocess.run(
            [sys.executable, *command],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": ROOT},
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "[]", (command, result.stdout)
