"""aiocop 1.x code runs unchanged: its import paths and the names it read (issue 17)."""

from __future__ import annotations

import importlib

import pytest

import aiocop

# Every public name aiocop 1.2.1 defined in each of its modules, from where it
# defined it (read off its sdist), and the 2.x name it is now; None where the
# 1.x name is a module constant with no 2.x name of its own.
EXPORTS_1X: dict[str, dict[str, str | None]] = {
    "aiocop.core.blocking_io": {
        "start_blocking_io_detection": "start_blocking_io_detection",
        "reset_blocking_events": "reset_blocking_events",
        "format_blocking_event": "format_blocking_event",
        "get_blocking_events_dict": "get_blocking_events_dict",
        "format_stack_frame": None,
        "MAX_EVENTS_PER_TASK": None,
        "BLOCKING_EVENTS_DICT": None,
        "BLOCKING_EVENTS": None,
    },
    "aiocop.core.audit_patcher": {
        "patch_audit_functions": "patch_audit_functions",
        "get_patched_functions": "get_patched_functions",
        "FUNCTIONS_TO_PATCH_DICT": None,
        "FUNCTIONS_TO_PATCH": None,
    },
    "aiocop.core.callbacks": {
        name: name
        for name in (
            "SlowTaskCallback",
            "ContextProvider",
            "register_slow_task_callback",
            "unregister_slow_task_callback",
            "clear_slow_task_callbacks",
            "register_context_provider",
            "unregister_context_provider",
            "clear_context_providers",
        )
    },
    "aiocop.core.cpu_sampler": {
        "start_cpu_sampling": "start_cpu_sampling",
        "is_cpu_sampling_started": "is_cpu_sampling_started",
    },
    "aiocop.core.severity": {
        "calculate_io_severity_score": "calculate_io_severity_score",
        "get_severity_level_from_score": "get_severity_level_from_score",
    },
    "aiocop.core.slow_tasks": {
        "SlowTaskCallback": "SlowTaskCallback",
        "detect_slow_tasks": "detect_slow_tasks",
        "get_slow_task_threshold_ms": "get_slow_task_threshold_ms",
    },
    "aiocop.core.state": {
        "activate": "activate",
        "deactivate": "deactivate",
        "is_monitoring_active": "is_monitoring_active",
        "enable_raise_on_violations": "enable_raise_on_violations",
        "disable_raise_on_violations": "disable_raise_on_violations",
        "is_raise_on_violations_enabled": "is_raise_on_violations_enabled",
        "raise_on_violations_context": "raise_on_violations",
    },
    "aiocop.types": {
        "BlockingEventInfo": "BlockingEventInfo",
        "RawBlockingEvent": "RawBlockingEvent",
        "SlowTaskEvent": "SlowTaskEvent",
        "IoSeverityLevel": "IoSeverityLevel",
    },
    "aiocop.types.events": {
        "RawBlockingEvent": "RawBlockingEvent",
        "BlockingEventInfo": "BlockingEventInfo",
        "CpuStackSample": "CpuStackSample",
        "SlowTaskEvent": "SlowTaskEvent",
    },
    "aiocop.types.severity": {
        name: name
        for name in (
            "IoSeverityLevel",
            "WEIGHT_HEAVY",
            "WEIGHT_MODERATE",
            "WEIGHT_LIGHT",
            "WEIGHT_TRIVIAL",
            "THRESHOLD_HIGH",
            "THRESHOLD_MEDIUM",
            "THRESHOLD_LOW",
        )
    },
    "aiocop.exceptions": {"HighSeverityBlockingIoException": "HighSeverityBlockingIoException"},
}


@pytest.mark.parametrize(("module", "names"), EXPORTS_1X.items(), ids=list(EXPORTS_1X))
def test_every_name_1x_exported_imports_from_where_1x_exported_it(module: str, names: dict[str, str | None]) -> None:
    imported = importlib.import_module(module)
    for name, name_2x in names.items():
        assert hasattr(imported, name), f"from {module} import {name}"
        if name_2x is not None:
            assert getattr(imported, name) is getattr(aiocop, name_2x), f"{module}.{name} is aiocop.{name_2x}"
    assert sorted(imported.__all__) == sorted(names), "the alias module exports what 1.x's did, no more"


def test_the_1x_module_constants() -> None:
    from aiocop.core import audit_patcher, blocking_io

    assert aiocop.get_blocking_events_dict() == blocking_io.BLOCKING_EVENTS_DICT
    assert set(aiocop.get_blocking_events_dict()) == blocking_io.BLOCKING_EVENTS
    assert blocking_io.MAX_EVENTS_PER_TASK == 64
    assert audit_patcher.FUNCTIONS_TO_PATCH_DICT["os.stat"] == aiocop.WEIGHT_LIGHT
    assert list(audit_patcher.FUNCTIONS_TO_PATCH_DICT) == audit_patcher.FUNCTIONS_TO_PATCH
    assert blocking_io.format_stack_frame(("/srv/app/main.py", 3, "handler")).endswith("main.py:3:handler")


def test_the_top_level_names_1x_code_reads() -> None:
    import importlib.metadata

    assert aiocop.__author__ == "aiocop developers"
    assert aiocop.metadata is importlib.metadata.metadata
