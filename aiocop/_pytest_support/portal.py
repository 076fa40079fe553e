"""The test's line behind a synchronous `TestClient`'s requests.

Starlette's `TestClient` runs the app on a loop in another thread, through
anyio's blocking portal: the app's stack ends in the framework, and the
test's line is on the calling thread. At the portal's `start_task_soon` (which
`call()` uses) the caller's innermost application line is put in a context
variable; on asyncio, the task the portal starts runs in a copy of the
calling thread's context (`call_soon_threadsafe` copies it there), so a
context provider hands it to the step's event, as `context["called_from"]`.
Installed by the pytest plugin only, once anyio's portal has been imported.
"""

from __future__ import annotations

import contextvars
import sys
from typing import TYPE_CHECKING, Any

from aiocop._interception.frames import format_frame, is_app_file, is_internal_file

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import FrameType

KEY = "called_from"
_caller: contextvars.ContextVar[str | None] = contextvars.ContextVar("aiocop_portal_caller", default=None)
_original: list[Callable[..., Any]] = []  # the portal's own start_task_soon, while wrapped


def _app_line(frame: FrameType | None) -> str | None:
    while frame is not None:
        filename = frame.f_code.co_filename
        if not is_internal_file(filename) and is_app_file(filename):
            return format_frame((filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return None


def _wrap(original: Callable[..., Any]) -> Callable[..., Any]:
    def start_task_soon(self: object, *args: Any, **kwargs: Any) -> Any:
        site = _app_line(sys._getframe(1)) if _caller.get() is None else None
        if site is None:
            return original(self, *args, **kwargs)
        token = _caller.set(site)
        try:
            return original(self, *args, **kwargs)
        finally:
            _caller.reset(token)

    start_task_soon.__wrapped__ = original  # type: ignore[attr-defined]  # for introspection, as functools.wraps
    return start_task_soon


def install() -> None:
    """Wrap the portal's `start_task_soon`, if anyio's portal is loaded and not wrapped yet (cheap when done)."""
    if _original:
        return
    module = sys.modules.get("anyio.from_thread")
    portal = getattr(module, "BlockingPortal", None)
    original = getattr(portal, "start_task_soon", None)
    if portal is None or original is None:
        return
    _original.append(original)
    portal.start_task_soon = _wrap(original)


def uninstall() -> None:
    """Put the portal's own method back."""
    if not _original:
        return
    module = sys.modules.get("anyio.from_thread")
    portal = getattr(module, "BlockingPortal", None)
    if portal is not None:
        portal.start_task_soon = _original[0]
    _original.clear()


def provider() -> dict[str, Any]:
    """The context provider: the test's line that called through the portal, where there is one."""
    site = _caller.get()
    return {KEY: site} if site is not None else {}
