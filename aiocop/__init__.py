"""aiocop: find the calls that freeze your asyncio event loop.

```python
import aiocop

aiocop.start_blocking_io_detection()
aiocop.detect_slow_tasks(threshold_ms=30, on_slow_task=print)
```
"""

from __future__ import annotations

from aiocop._allow import (
    AllowRule,
    add_allow_rule,
    allow_blocking,
    clear_allow_rules,
    get_allow_rules,
    remove_allow_rule,
)
from aiocop._api import (
    activate,
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
from aiocop._callbacks import (
    ContextProvider,
    SlowTaskCallback,
    clear_context_providers,
    clear_slow_task_callbacks,
    register_context_provider,
    register_slow_task_callback,
    unregister_context_provider,
    unregister_slow_task_callback,
)
from aiocop._delivery import format_blocking_event
from aiocop._events import BlockingEventInfo, CpuStackSample, RawBlockingEvent, SlowTaskEvent
from aiocop._exceptions import HighSeverityBlockingIoException
from aiocop._logging import LoggingCallback, log_events
from aiocop._rules import BLOCKING_CALLS, BlockingCall, get_blocking_events_dict
from aiocop._severity import (
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
from aiocop._version import __version__
from aiocop._wrappers import get_patched_functions, patch_audit_functions

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
    "ContextProvider",
    "CpuStackSample",
    "HighSeverityBlockingIoException",
    "IoSeverityLevel",
    "LoggingCallback",
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
