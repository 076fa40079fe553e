"""Writing the run's picture files (`--html`, `--speedscope`, `--folded`): one model, three renderers."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from aiocop import _exports, _html, _timeline
from aiocop._inputs import open_for_writing

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

# The option, and how it draws the model.
RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "--html": _html.render,
    "--speedscope": _exports.speedscope_text,
    "--folded": _exports.folded,
}


def write(timeline: _timeline.Timeline, facts: _timeline.Facts, paths: Mapping[str, str | None]) -> bool:
    """Write each file asked for (option -> path, None: not asked); False if one could not be written.

    Each failure is said on stderr, naming the option; the others are still written.
    """
    asked = {flag: path for flag, path in paths.items() if path is not None}
    if not asked:
        return True
    model = _timeline.build(timeline, facts)
    ok = True
    for flag, path in asked.items():
        try:
            text = RENDERERS[flag](model)
            with open_for_writing(path) as out:
                out.write(text)
        except (OSError, UnicodeError) as error:
            print(f"aiocop: could not write {flag} file: {error}", file=sys.stderr)
            ok = False
    return ok
