"""aiocop 1.x import path: `from aiocop.core.callbacks import ...` (aliases of the 2.x names)."""

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

__all__ = [
    "ContextProvider",
    "SlowTaskCallback",
    "clear_context_providers",
    "clear_slow_task_callbacks",
    "register_context_provider",
    "register_slow_task_callback",
    "unregister_context_provider",
    "unregister_slow_task_callback",
]
