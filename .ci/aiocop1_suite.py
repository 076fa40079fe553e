"""Run aiocop 1.2.1's own test suite, unchanged, against this checkout's aiocop.

    python .ci/aiocop1_suite.py [--version 1.2.1] [--keep DIR]

1.x users upgrade by changing nothing, so 1.x's tests must pass here, but
for the tests of 1.x's private names (listed below, each with the name it
touches: those test how 1.x was built, which a user never calls) and one
of behaviour 2.x changes on purpose (listed too, and in docs/migration.md). The
suite comes from 1.x's sdist on PyPI (`pip download`), is run with its own
pytest settings from its pyproject.toml, and this script exits non-zero on
any failure or error outside those lists. A listed test that passes is
reported, not an error.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from xml.etree import ElementTree

if sys.version_info >= (3, 11):
    import tomllib
else:  # tomli: installed with aiocop on 3.10
    import tomli as tomllib

# Tests of 1.x private names or internals, which no 1.x user touches: the
# name each reads, and why 2.x has no equivalent.
PRIVATE: dict[str, str] = {
    "tests/test_aiocop.py::TestActivation::test_initially_inactive": (
        "aiocop.core.state._monitoring_active (2.x: is_monitoring_active())"
    ),
    "tests/test_aiocop.py::TestSetupIdempotency::test_start_blocking_io_detection_twice_is_noop": (
        "aiocop.core.blocking_io._trace_depth; a second call reconfigures in 2.x (the spec)"
    ),
    "tests/test_aiocop.py::TestRaiseOnViolationsIntegration::test_check_and_raise_function_raises_on_high_severity": (
        "aiocop.core.slow_tasks._check_and_raise_if_needed, aiocop.core.state._reset_exception_flag"
    ),
    "tests/test_aiocop.py::TestRaiseOnViolationsIntegration::test_check_and_raise_does_not_raise_when_disabled": (
        "aiocop.core.slow_tasks._check_and_raise_if_needed"
    ),
    "tests/test_aiocop.py::TestRaiseOnViolationsIntegration::test_check_and_raise_does_not_raise_for_low_severity": (
        "aiocop.core.slow_tasks._check_and_raise_if_needed"
    ),
    "tests/test_aiocop.py::TestRaiseOnViolationsIntegration::test_exception_propagates_through_event_loop": (
        "aiocop.core.slow_tasks._patch_loop (2.x wraps no loop method)"
    ),
    "tests/test_aiocop.py::TestEdgeCases::test_duplicate_callback_registration": (
        "aiocop.core.callbacks._slow_task_callbacks"
    ),
    "tests/test_aiocop.py::TestEdgeCases::test_duplicate_context_provider_registration": (
        "aiocop.core.callbacks._context_providers"
    ),
    "tests/test_cpu_sampler.py::TestCpuSamplingSetup::test_package_dir_matches_the_installed_package": (
        "aiocop.core.cpu_sampler._AIOCOP_PACKAGE_DIR"
    ),
    "tests/test_cpu_sampler.py::TestFormatCpuSamples::test_identical_stacks_collapse_into_one_sample": (
        "aiocop.core.cpu_sampler.format_cpu_samples, an undocumented helper outside __all__"
    ),
    "tests/test_cpu_sampler.py::TestFormatCpuSamples::test_distinct_stacks_sorted_by_count": (
        "aiocop.core.cpu_sampler.format_cpu_samples"
    ),
    "tests/test_cpu_sampler.py::TestFormatCpuSamples::test_empty_samples_format_to_empty_list": (
        "aiocop.core.cpu_sampler.format_cpu_samples"
    ),
    "tests/test_cpu_sampler.py::TestForkSafety::test_watchdog_is_restarted_in_forked_child": (
        "1.x's sampler thread name 'aiocop-cpu-sampler' (2.x restarts its watchdog in the child too)"
    ),
    **{
        f"tests/test_cpu_sampler.py::TestDefaultOn::{name}": "aiocop.core.cpu_sampler._effective_arm_and_idle"
        for name in (
            "test_detect_slow_tasks_starts_sampling_with_derived_arm",
            "test_derived_idle_tracks_a_small_arm",
            "test_pre_start_rederives_arm_when_detect_sets_the_threshold",
            "test_pre_start_rederives_arm_below_a_small_threshold",
            "test_zero_arm_does_not_spin_the_watchdog",
            "test_explicit_start_before_detect_wins_over_the_auto_start",
        )
    },
    **{
        f"tests/test_uvloop.py::TestUvloopWithRun::{name}": (
            "its autouse fixture resets aiocop.core.state._on_activate_hooks, _monitoring_active and "
            "aiocop.core.slow_tasks._detect_slow_tasks_configured"
        )
        for name in (
            "test_uvloop_run_uses_uvloop",
            "test_detects_blocking_io_with_uvloop_run",
            "test_loop_is_patched_with_uvloop_run",
            "test_context_providers_with_uvloop_run",
            "test_severity_calculation_with_uvloop_run",
            "test_file_io_detection_with_uvloop_run",
            "test_deactivated_no_detection_with_uvloop_run",
            "test_exceeded_threshold_flag_with_uvloop_run",
        )
    },
}


# Tests of public behaviour that 2.x changes on purpose, each listed in
# docs/migration.md with the reason.
BY_DESIGN: dict[str, str] = {
    "tests/test_aiocop.py::TestSetupIdempotency::test_detect_slow_tasks_twice_is_noop": (
        "a second detect_slow_tasks() reconfigures (the specification asks for it) where 1.x ignored it"
    ),
}
EXPECTED = {**PRIVATE, **BY_DESIGN}


def fetch(version: str, into: Path) -> Path:
    """Download and unpack 1.x's sdist; the folder it unpacks to."""
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "-d", str(into)]
    subprocess.run([*command, f"aiocop=={version}"], check=True)
    (archive,) = into.glob(f"aiocop-{version}.tar.gz")
    with tarfile.open(archive) as sdist:
        sdist.extractall(into, filter="data")
    return into / f"aiocop-{version}"


def prepare(sdist: Path, into: Path) -> Path:
    """1.x's tests and pytest settings in a folder without 1.x's own package (this checkout's aiocop is tested)."""
    suite = into / "suite"
    (suite / "tests").mkdir(parents=True)
    for test in (sdist / "tests").iterdir():
        if test.suffix == ".py":
            (suite / "tests" / test.name).write_bytes(test.read_bytes())
    settings = tomllib.loads((sdist / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    lines = ["[pytest]"] + [f"{key} = {value}" for key, value in settings.items()]
    (suite / "pytest.ini").write_text("\n".join(lines) + "\n")
    return suite


def outcomes(report: Path) -> dict[str, str]:
    """nodeid -> passed / failed / error / skipped, from pytest's JUnit XML."""
    results: dict[str, str] = {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        path = case.get("classname", "").replace(".", "/")
        module, _, cls = path.rpartition("/")
        if cls[:1].islower():  # a test function, not a method: the class part is the module
            module, cls = path, ""
        nodeid = f"{module}.py::" + (f"{cls}::" if cls else "") + str(case.get("name"))
        if case.find("error") is not None:
            results[nodeid] = "error"
        elif case.find("failure") is not None:
            results[nodeid] = "failed"
        elif case.find("skipped") is not None:
            results[nodeid] = "skipped"
        else:
            results[nodeid] = "passed"
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", default="1.2.1")
    parser.add_argument("--keep", type=Path, help="work in this folder and keep it")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        work = args.keep or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        suite = prepare(fetch(args.version, work), work)
        report = work / "results.xml"
        subprocess.run(
            [sys.executable, "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider", f"--junitxml={report}"],
            cwd=suite,
            check=False,
        )
        results = outcomes(report)
    bad = {test: outcome for test, outcome in results.items() if outcome in ("failed", "error")}
    unexpected = sorted(set(bad) - set(EXPECTED))
    now_passing = sorted(test for test in EXPECTED if results.get(test) == "passed")
    missing = sorted(set(EXPECTED) - set(results))
    counts = {outcome: list(results.values()).count(outcome) for outcome in ("passed", "failed", "error", "skipped")}
    print(f"\naiocop {args.version}'s suite against this checkout: {counts} of {len(results)} tests")
    print(f"{len(set(bad) & set(PRIVATE))} failing tests of 1.x private names, as listed in {__file__}")
    print(f"{len(set(bad) & set(BY_DESIGN))} failing tests of behaviour 2.x changes on purpose (docs/migration.md)")
    for test in now_passing:
        print(f"  listed but passes now (remove it from the list?): {test}")
    for test in missing:
        print(f"  listed but not in the suite: {test}")
    for test in unexpected:
        print(f"  FAILED, not a test of a private name: {test} ({bad[test]})")
    return 1 if unexpected or not results else 0


if __name__ == "__main__":
    sys.exit(main())
