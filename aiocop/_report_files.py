"""Writing the run's picture files (`--html`, `--speedscope`, `--folded`): one model, three renderers.

The renderers (and the timeline that feeds them) are imported only by a run
that asks for one of these files: a run that never does loads none of them.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from aiocop._inputs import open_for_writing

if TYPE_CHECKING:
    from collections.abc import Mapping

    from aiocop._timeline import Facts, Timeline

FLAGS = ("--html", "--speedscope", "--folded")


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


def write(timeline: Timeline, facts: Facts, paths: Mapping[str, str | None]) -> bool:
    """Write each file asked for (option -> path, None: not asked); False if one could not be written.

    Each failure is said on stderr, naming the option; the others are still written.
    """
    asked = {flag: path for flag, path in paths.items() if path is not None}
    if not asked:
        return True
    from aiocop import _exports, _html, _timeline  # noqa: PLC0415 - only for a run that asked for a file

    model = _timeline.build(timeline, facts)
    renderers = {"--html": _html.render, "--speedscope": _exports.speedscope_text, "--folded": _exports.folded}
    ok = True
    for flag, path in asked.items():
        try:
            text = renderers[flag](model)
            with open_for_writing(path) as out:
                out.write(text)
        except (OSError, UnicodeError) as error:
            print(f"aiocop: could not write {flag} file: {error}", file=sys.stderr)
            ok = False
    return ok
