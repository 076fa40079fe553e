"""The project's scripts (benchmarks/, docs/hooks/), loaded from their files: they are no package."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load(relative: str) -> ModuleType:
    """The script at `relative` (to the checkout, e.g. "benchmarks/syscalls.py"), loaded once.

    Its directory goes on sys.path, last (after everything a script there
    could shadow), for what it imports from beside it as it does when run
    (benchmarks/quiet_watchdog.py).
    """
    path = ROOT / relative
    if str(path.parent) not in sys.path:
        sys.path.append(str(path.parent))
    key = "aiocop_script_" + relative.removesuffix(".py").replace("/", "_")
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    spec.loader.exec_module(module)
    return module
