"""Known event-loop machinery and the import system, as data.

* `KNOWN_LOOPS`: the event loops aiocop knows, one `KnownLoop` each; every
  list of loops (`LOOP_FRAMES`, `LOOP_PACKAGES`, `PYTHON_LOOP_PACKAGES`,
  `KNOWN_LOOP_PACKAGES`, the loops that serve, the loops that announce nothing)
  is derived from it, so a new loop is one line. `LOOP_FRAMES` (documented on
  the "Detected calls" docs page): functions of Python-level event loops that
  mark the edge of a step. A walk up the stack from a blocking call stops at a
  *dispatch* frame (the loop calling a callback or task step: the call was
  inside a step) and gives up at a *core* frame (the loop's own iteration,
  outside any step).
* `IMPORT_SYSTEM_MODULES` and `IMPORT_EVENTS`: the import system's modules and events.

The known-harmless internals, the other table of that page, live beside their
matcher, in `harmless.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

LoopFrameRole = Literal["dispatch", "core"]


@dataclass(frozen=True, slots=True)
class LoopFrame:
    """A function of an event loop written in Python that bounds steps."""

    module: str
    function: str
    role: LoopFrameRole


# Modules of the import system: a call made under them is part of an import,
# which is reported once, as the `import` event.
IMPORT_SYSTEM_MODULES: frozenset[str] = frozenset(
    {"importlib._bootstrap", "importlib._bootstrap_external", "_frozen_importlib", "_frozen_importlib_external"}
)


@dataclass(frozen=True, slots=True)
class KnownLoop:
    """An event loop aiocop knows, by its top-level package: one row of `KNOWN_LOOPS`.

    * `frames`: written in Python, the functions of it that bound steps (its
      `LOOP_FRAMES`); a loop written in C has none and is bounded by the frame
      that called into it;
    * `internal`: its files and frames are loop internals, never the user's line
      (`LOOP_PACKAGES`); Leviathan, built by hand, is not counted so;
    * `serves`: it binds its listening socket inside `create_server` and the
      like (the harmless `socket.bind` rule's callers);
    * `announces`: its start and stop go through the signals aiocop wraps
      (asyncgen hooks, `_set_running_loop`); a loop that binds both when
      imported (Leviathan) starts unseen and only a look at the threads'
      stacks finds it (`loops.UNANNOUNCED_LOOP_MODULES`).
    """

    name: str
    frames: tuple[LoopFrame, ...] = ()
    internal: bool = True
    serves: bool = False
    announces: bool = True


# trio's run loop: the module of its dispatch frame (below), which also keeps the run's per-thread namespace
# (`trio_runs`). Written here only (tests/interception/test_internals.py checks).
TRIO_RUN_MODULE = "trio._core._run"

KNOWN_LOOPS: tuple[KnownLoop, ...] = (
    KnownLoop(
        "asyncio",
        frames=(
            LoopFrame("asyncio.events", "_run", "dispatch"),  # Handle._run: calls a callback or task step
            LoopFrame("asyncio.base_events", "_run_once", "core"),  # the loop's own iteration
        ),
        serves=True,
    ),
    KnownLoop("uvloop", serves=True),
    KnownLoop("winloop", serves=True),
    KnownLoop("rloop", frames=(LoopFrame("rloop.loop", "run_forever", "dispatch"),), serves=True),  # steps called here
    KnownLoop("veloxloop", frames=(LoopFrame("veloxloop", "run_forever", "dispatch"),), serves=True),
    KnownLoop("granian"),
    # trio's run loop (not asyncio: its runs are found by trio_runs): a task's step is
    # `task.context.run(coro.send, ...)` in here, so the task's outermost frame is just inside.
    KnownLoop("trio", frames=(LoopFrame(TRIO_RUN_MODULE, "unrolled_run", "dispatch"),)),
    KnownLoop("leviathan", internal=False, announces=False),
)

# The lists of loops, each derived from KNOWN_LOOPS (tests/interception/test_internals.py checks none is written out).
LOOP_FRAMES: tuple[LoopFrame, ...] = tuple(f for loop in KNOWN_LOOPS for f in loop.frames)
# Packages whose frames are "loop internals": never the user's line.
LOOP_PACKAGES: tuple[str, ...] = tuple(loop.name for loop in KNOWN_LOOPS if loop.internal)
# Loops written in Python: bounded by their own frames, nothing kept for them at their start.
PYTHON_LOOP_PACKAGES: frozenset[str] = frozenset(loop.name for loop in KNOWN_LOOPS if loop.frames)
# Every loop's package: a class from these runs no code of the application's when asked (discovery).
KNOWN_LOOP_PACKAGES: frozenset[str] = frozenset(loop.name for loop in KNOWN_LOOPS)
# Loops that bind their listening sockets themselves, in create_server and the like.
SERVING_LOOP_PACKAGES: tuple[str, ...] = tuple(loop.name for loop in KNOWN_LOOPS if loop.serves)
# Loops that announce neither start nor stop (see KnownLoop.announces).
UNANNOUNCED_LOOP_PACKAGES: frozenset[str] = frozenset(loop.name for loop in KNOWN_LOOPS if not loop.announces)


# An import statement's event (raised by the C import) and importlib.import_module()'s (aiocop's wrapper).
IMPORT_EVENTS: tuple[str, ...] = ("import", "importlib.import_module")
