"""The docs build's hooks (docs/hooks/), loaded from their files as mkdocs loads them: they are no package."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tests.support import scripts

if TYPE_CHECKING:
    from types import ModuleType

HOOKS = Path(__file__).resolve().parents[2] / "docs" / "hooks"


def load(name: str) -> ModuleType:
    """docs/hooks/`name`.py, loaded once."""
    return scripts.load(f"docs/hooks/{name}.py")


def renderer(name: str) -> ModuleType:
    """A generated page's renderer, as the docs build loads it (through docs/hooks/generated_pages.py)."""
    module: ModuleType = load("generated_pages").renderer(name)
    return module
