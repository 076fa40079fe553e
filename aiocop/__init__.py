"""aiocop: find the calls that freeze your asyncio event loop.

```python
import aiocop

aiocop.start_blocking_io_detection()
aiocop.detect_slow_tasks(threshold_ms=30, on_slow_task=print)
```

PYTEST_DONT_REWRITE: aiocop is a pytest plugin, and `python -m aiocop run -m
pytest` imports it before pytest starts; without this marker pytest warns that
it cannot rewrite its asserts, which fails every suite that turns warnings
into errors.
"""

from __future__ import annotations

from importlib import import_module as _import_module

from aiocop._version import __version__

# Not `from typing import TYPE_CHECKING`: importing typing would be most of
# what `import aiocop` costs (type checkers know this name by itself).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from aiocop._api import (
        activate,
        configure,
        deactivate,
        detect_slow_tasks,
        disable_raise_on_violations,
        enable_raise_on_violations,
        get_slow_task_threshold_ms,
        is_cpu_sampling_started,
        is_monitored,
        is_monitoring_active,
        is_raise_on_violations_enabled,
        monitored,
        raise_on_violations,
        register_blocking_event,
        reset_blocking_event_table,
        reset_blocking_events,
        start_blocking_io_detection,
        start_cpu_sampling,
        stop,
        unregister_blocking_event,
    )
    from aiocop._configuration.config import ConfigError, ProjectConfig, load_config
    from aiocop._interception.allow import (
        AllowRule,
        add_allow_rule,
        allow_blocking,
        clear_allow_rules,
        get_allow_rules,
        remove_allow_rule,
    )
    from aiocop._interception.rules import BLOCKING_CALLS, BlockingCall, get_blocking_events_dict
    from aiocop._interception.wrappers import get_patched_functions, patch_audit_functions
    from aiocop._model.callbacks import (
        ContextProvider,
        SlowTaskCallback,
        clear_context_providers,
        clear_slow_task_callbacks,
        register_context_provider,
        register_slow_task_callback,
        unregister_context_provider,
        unregister_slow_task_callback,
    )
    from aiocop._model.events import BlockingEventInfo, CpuStackSample, RawBlockingEvent, SlowTaskEvent
    from aiocop._model.exceptions import HighSeverityBlockingIoException
    from aiocop._model.severity import (
        THRESHOLD_HIGH,
        THRESHOLD_LOW,
        THRESHOLD_MEDIUM,
        WEIGHT_HEAVY,
        WEIGHT_LIGHT,
        WEIGHT_MODERATE,
        WEIGHT_TRIVIAL,
        IoSeverityLevel,
        calculate_io_severity_score,
        get_severity_level_from_score,
    )
    from aiocop._reporting.building import format_blocking_event
    from aiocop._reporting.logs import LoggingCallback, log_events
del TYPE_CHECKING  # not a public name

# Importing aiocop costs almost nothing until a name is used (PEP 562): the
# pytest plugin, installed with aiocop and loaded by every pytest run, must
# not load the detector when it is switched off. Each public name is imported
# from the module that defines it on first access, then kept here.
_LAZY: dict[str, str] = {
    "AllowRule": "aiocop._interception.allow",
    "add_allow_rule": "aiocop._interception.allow",
    "allow_blocking": "aiocop._interception.allow",
    "clear_allow_rules": "aiocop._interception.allow",
    "get_allow_rules": "aiocop._interception.allow",
    "remove_allow_rule": "aiocop._interception.allow",
    "activate": "aiocop._api",
    "configure": "aiocop._api",
    "deactivate": "aiocop._api",
    "detect_slow_tasks": "aiocop._api",
    "disable_raise_on_violations": "aiocop._api",
    "enable_raise_on_violations": "aiocop._api",
    "get_slow_task_threshold_ms": "aiocop._api",
    "is_cpu_sampling_started": "aiocop._api",
    "is_monitored": "aiocop._api",
    "is_monitoring_active": "aiocop._api",
    "is_raise_on_violations_enabled": "aiocop._api",
    "monitored": "aiocop._api",
    "raise_on_violations": "aiocop._api",
    "register_blocking_event": "aiocop._api",
    "reset_blocking_event_table": "aiocop._api",
    "reset_blocking_events": "aiocop._api",
    "start_blocking_io_detection": "aiocop._api",
    "start_cpu_sampling": "aiocop._api",
    "stop": "aiocop._api",
    "unregister_blocking_event": "aiocop._api",
    "ContextProvider": "aiocop._model.callbacks",
    "SlowTaskCallback": "aiocop._model.callbacks",
    "clear_context_providers": "aiocop._model.callbacks",
    "clear_slow_task_callbacks": "aiocop._model.callbacks",
    "register_context_provider": "aiocop._model.callbacks",
    "register_slow_task_callback": "aiocop._model.callbacks",
    "unregister_context_provider": "aiocop._model.callbacks",
    "unregister_slow_task_callback": "aiocop._model.callbacks",
    "ConfigError": "aiocop._configuration.config",
    "ProjectConfig": "aiocop._configuration.config",
    "load_config": "aiocop._configuration.config",
    "format_blocking_event": "aiocop._reporting.building",
    "BlockingEventInfo": "aiocop._model.events",
    "CpuStackSample": "aiocop._model.events",
    "RawBlockingEvent": "aiocop._model.events",
    "SlowTaskEvent": "aiocop._model.events",
    "HighSeverityBlockingIoException": "aiocop._model.exceptions",
    "LoggingCallback": "aiocop._reporting.logs",
    "log_events": "aiocop._reporting.logs",
    "BLOCKING_CALLS": "aiocop._interception.rules",
    "BlockingCall": "aiocop._interception.rules",
    "get_blocking_events_dict": "aiocop._interception.rules",
    "THRESHOLD_HIGH": "aiocop._model.severity",
    "THRESHOLD_LOW": "aiocop._model.severity",
    "THRESHOLD_MEDIUM": "aiocop._model.severity",
    "WEIGHT_HEAVY": "aiocop._model.severity",
    "WEIGHT_LIGHT": "aiocop._model.severity",
    "WEIGHT_MODERATE": "aiocop._model.severity",
    "WEIGHT_TRIVIAL": "aiocop._model.severity",
    "IoSeverityLevel": "aiocop._model.severity",
    "calculate_io_severity_score": "aiocop._model.severity",
    "get_severity_level_from_score": "aiocop._model.severity",
    "get_patched_functions": "aiocop._interception.wrappers",
    "patch_audit_functions": "aiocop._interception.wrappers",
}


# Names 1.x had at the top level besides its API, for 1.x code that reads
# them: its author, and `importlib.metadata.metadata`, imported there.
_FROM_1X: dict[str, str] = {"__author__": "aiocop._version", "metadata": "importlib.metadata"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name) or _FROM_1X.get(name)
    if module is None:
        raise AttributeError(f"module 'aiocop' has no attribute {name!r}")
    value = getattr(_import_module(module), name)
    globals()[name] = value  # later look-ups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "BLOCKING_CALLS",
    "THRESHOLD_HIGH",
    "THRESHOLD_LOW",
    "THRESHOLD_MEDIUM",
    "WEIGHT_HEAVY",
    "WEIGHT_LIGHT",
    "WEIGHT_MODERATE",
    "WEIGHT_TRIVIAL",
    "AllowRule",
    "BlockingCall",
    "BlockingEventInfo",
    "ConfigError",
    "ContextProvider",
    "CpuStackSample",
    "HighSeverityBlockingIoException",
    "IoSeverityLevel",
    "LoggingCallback",
    "ProjectConfig",
    "RawBlockingEvent",
    "SlowTaskCallback",
    "SlowTaskEvent",
    "__version__",
    "activate",
    "add_allow_rule",
    "allow_blocking",
    "calculate_io_severity_score",
    "clear_allow_rules",
    "clear_context_providers",
    "clear_slow_task_callbacks",
    "configure",
    "deactivate",
    "detect_slow_tasks",
    "disable_raise_on_violations",
    "enable_raise_on_violations",
    "format_blocking_event",
    "get_allow_rules",
    "get_blocking_events_dict",
    "get_patched_functions",
    "get_severity_level_from_score",
    "get_slow_task_threshold_ms",
    "is_cpu_sampling_started",
    "is_monitored",
    "is_monitoring_active",
    "is_raise_on_violations_enabled",
    "load_config",
    "log_events",
    "monitored",
    "patch_audit_functions",
    "raise_on_violations",
    "register_blocking_event",
    "register_context_provider",
    "register_slow_task_callback",
    "remove_allow_rule",
    "reset_blocking_event_table",
    "reset_blocking_events",
    "start_blocking_io_detection",
    "start_cpu_sampling",
    "stop",
    "unregister_blocking_event",
    "unregister_context_provider",
    "unregister_slow_task_callback",
]
