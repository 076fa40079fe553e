"""`importlib.reload()` of a module aiocop patched: the patches applied again, at once.

Reloading runs a module's code again in the same module object: `os.stat`
becomes the builtin again, `threading.Event` a new class, and detection of
those calls would silently stop. While any patch is applied,
`importlib.reload` is a thin wrapper that calls the original and then hands
the reloaded module to aiocop. A `reload` bound before aiocop started (`from
importlib import reload` at import time) is not seen: the next
`start_blocking_io_detection()` wraps the reloaded module's functions again.

Reloading `threading` also gives it a new registry of threads, without
aiocop's own (the watchdog, the delivery thread), which would then fail to
unregister themselves as they end (a `KeyError` printed at exit): they are
registered again in the new one.
"""

from __future__ import annotations

import functools
import importlib
import logging
import sys
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType

logger = logging.getLogger("aiocop")

# The reload function aiocop wrapped, and its wrapper, while installed.
_installed: tuple[Callable[..., Any], Callable[..., Any]] | None = None


def install(after_reload: Callable[[ModuleType], None]) -> None:
    """Wrap `importlib.reload` (once) so that `after_reload` sees every module reloaded through it."""
    global _installed
    if _installed is not None and importlib.reload is _installed[1]:
        return
    original = importlib.reload

    @functools.wraps(original)
    def reload(module: ModuleType) -> ModuleType:
        threads = _aiocop_threads() if module is sys.modules.get("threading") else None
        reloaded = original(module)
        try:
            if threads:
                _register_again(reloaded, threads)
            after_reload(reloaded)
        except Exception:  # never the application's problem: say so, at the time
            logger.warning(
                "aiocop: could not wrap the functions of %r again after its reload; they are not detected "
                "until detection is started again",
                getattr(reloaded, "__name__", reloaded),
                exc_info=True,
            )
        return reloaded

    importlib.reload = reload
    _installed = (original, reload)


def uninstall() -> None:
    """Put `importlib.reload` back, unless another tool has replaced it since."""
    global _installed
    if _installed is not None and importlib.reload is _installed[1]:
        importlib.reload = _installed[0]
    _installed = None


def _aiocop_threads() -> dict[int, threading.Thread]:
    # threading's own registry of running threads (private: read defensively,
    # this runs inside the application's reload()).
    active = getattr(threading, "_active", None)
    if not isinstance(active, dict):
        return {}
    return {
        ident: thread
        for ident, thread in list(active.items())
        if isinstance(thread, threading.Thread) and thread.name.startswith("aiocop-")
    }


def _register_again(module: ModuleType, threads: dict[int, threading.Thread]) -> None:
    active = getattr(module, "_active", None)
    lock = getattr(module, "_active_limbo_lock", None)
    if isinstance(active, dict) and lock is not None:
        with lock:
            for ident, thread in threads.items():
                active.setdefault(ident, thread)
