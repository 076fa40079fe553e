"""The docs build's hooks (docs/hooks/), loaded from their files as mkdocs loads them: they are no package."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import ModuleType

HOOKS = Path(__file__).resolve().parent.parent / "docs" / "hooks"


def load(name: str) -> ModuleType:
    """docs/hooks/`name`.py, loaded once."""
    key = f"aiocop_docs_hook_{name}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, HOOKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    spec.loader.exec_module(module)
    return module


def renderer(name: str) -> ModuleType:
    """A generated page's renderer, as the docs build loads it (through docs/hooks/generated_pages.py)."""
    module: ModuleType = load("generated_pages").renderer(name)
    return module
