"""A stand-in for Leviathan: an event loop written in C that binds its start signals at import.

Leviathan (a loop written in Zig, not on PyPI) looks up
`sys.set_asyncgen_hooks` and `asyncio._set_running_loop` once, when it is
imported; imported before aiocop is set up, it never calls aiocop's wrappers
of them, and no start of it is seen. This loop is uvloop's (written in C:
no Python frame between the code that runs it and its steps) run with the
two functions as they were when this module was imported. Import it before
aiocop is set up.
"""

from __future__ import annotations

import asyncio.events
import sys

import uvloop

from aiocop._interception import loops as _loops

# As Leviathan, named in aiocop's table of loops that announce nothing.
_loops.UNANNOUNCED_LOOP_MODULES.add(__name__)
_bound_set_hooks = sys.set_asyncgen_hooks
_bound_set_running = asyncio.events._set_running_loop


class BoundLoop(uvloop.Loop):
    def run_forever(self) -> None:
        # uvloop looks both up at every run: give it the import-time ones for
        # this run, as a loop that bound them would use. (Process-wide for the
        # run's length: use it in one thread at a time.)
        current = sys.set_asyncgen_hooks, asyncio.events._set_running_loop
        sys.set_asyncgen_hooks, asyncio.events._set_running_loop = _bound_set_hooks, _bound_set_running
        try:
            super().run_forever()
        finally:
            sys.set_asyncgen_hooks, asyncio.events._set_running_loop = current
