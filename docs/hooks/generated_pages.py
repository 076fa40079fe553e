"""mkdocs hook: the reference pages drawn from the code, rendered at every build.

Three pages list what the code holds: the detected calls (the rules tables),
every option (the signatures, docstrings and parsers) and the OpenTelemetry
names (`aiocop.opentelemetry.SIGNALS`). Their renderers live here, beside the
docs, and not in the `aiocop` package: only the docs build runs them, so they
stay out of the wheel every user installs.

At build time each page's text comes from its renderer, whatever the
committed copy says; the committed copy (what the repository shows, and
what the site is built from without this hook) is kept up to date by

    python docs/hooks/generated_pages.py

which a test checks (tests/test_docs.py).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from types import ModuleType

_HERE = os.path.dirname(os.path.abspath(__file__))
_DOCS = os.path.dirname(_HERE)

# The page (relative to docs/) and the renderer module beside this file that writes it.
PAGES = {
    "reference/detected-calls.md": "detected_calls",
    "reference/options.md": "options_page",
    "reference/opentelemetry.md": "opentelemetry_page",
}


def renderer(name: str) -> ModuleType:
    """The renderer module `name` of this folder, loaded from its file (mkdocs puts no hook folder on sys.path)."""
    loaded = sys.modules.get(f"aiocop_docs_{name}")
    if loaded is not None:
        return loaded
    spec = importlib.util.spec_from_file_location(f"aiocop_docs_{name}", os.path.join(_HERE, f"{name}.py"))
    if spec is None or spec.loader is None:
        raise ImportError(f"docs/hooks/{name}.py cannot be loaded")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def render(page: str) -> str:
    """The text of `page` (a key of `PAGES`) as the code gives it now."""
    text: str = renderer(PAGES[page]).render()
    return text


def on_page_read_source(page: Any, config: Any, **kwargs: Any) -> str | None:
    # None: mkdocs reads the file as usual (every page but the generated ones).
    path = page.file.src_uri
    return render(path) if path in PAGES else None


def write_pages(docs_dir: str = _DOCS) -> list[str]:
    """Rewrite the committed copy of every generated page; the pages whose text changed."""
    changed = []
    for page in PAGES:
        path = os.path.join(docs_dir, page)
        text = render(page)
        with open(path, encoding="utf-8") as old:
            if old.read() == text:
                continue
        with open(path, "w", encoding="utf-8") as new:
            new.write(text)
        changed.append(page)
    return changed


if __name__ == "__main__":
    for written in write_pages():
        print(f"rewrote docs/{written}")
