"""Writing the run's picture files (`--html`, `--speedscope`, `--folded`): one model, three renderers."""

from __future__ import annotations

import os
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


def output_problem(flag: str, path: str) -> str | None:
    """Why `path` cannot be written, as far as can be known before a run (None: it may be), naming `flag`.

    What cannot be known yet (a full disk) fails the run after it.
    """
    if not path:
        return f"{flag}: expected a file name, got ''"
    if os.path.isdir(path):
        return f"{flag}: {path!r} is a directory, not a file"
    folder = os.path.dirname(os.path.abspath(path))
    folder_ok = os.path.isdir(folder) and os.access(folder, os.W_OK | os.X_OK)
    # /dev/stdout, or a file one may write in a folder one may not: fine.
    if not folder_ok and not (os.path.exists(path) and os.access(path, os.W_OK)):
        return f"{flag}: cannot write a file in {folder!r}"
    return None


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
