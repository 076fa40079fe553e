"""Writing the run's picture files (`--html`, `--speedscope`, `--folded`): one model, three renderers.

The renderers (and the timeline that feeds them) are imported only by a run
that asks for one of these files: a run that never does loads none of them.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from aiocop._common.escape import printable
from aiocop._common.inputs import open_for_writing

if TYPE_CHECKING:
    from collections.abc import Mapping

    from aiocop._reporting.timeline import Facts, Timeline

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


def planted_problem(flag: str, path: str) -> str | None:
    """Why `path` must not be written by a process that may run as root (`attach`): None if it may.

    A symbolic link, or a file with other links, that belongs to another user
    (not this one, not root) may have been put there to make this process
    write over a file of its choosing; a file of another user's would let
    that user read the report. Checked again, by descriptor, when written.
    """
    folder = _folder_problem(flag, path)
    if folder is not None:
        return folder
    try:
        status = os.lstat(path)
    except (OSError, ValueError):
        return None  # absent: created by this process
    return _planted(flag, path, status)


def _folder_problem(flag: str, path: str) -> str | None:
    # Every folder above the file, as named and as resolved: one that another
    # user owns, or may write to (a sticky one such as /tmp aside: no one
    # renames another's entries there), could become, while attach runs, a
    # link to a folder of root's, and the report be written there.
    try:
        named = Path(os.path.abspath(path)).parent
        places = {named, *named.parents}
        resolved = Path(os.path.realpath(named))
        places |= {resolved, *resolved.parents}
    except (OSError, ValueError):
        return None  # not a path: the open says so
    trusted = (0, os.geteuid())
    for place in sorted(places, key=lambda p: len(p.parts)):
        try:
            status = os.lstat(place)
        except OSError:
            continue  # not there: the open says so
        if status.st_uid not in trusted:
            return (
                f"{flag}: {path!r} is in {str(place)!r}, which belongs to another user (uid {status.st_uid}), "
                "who could turn it into a link elsewhere: refused"
            )
        if stat.S_ISDIR(status.st_mode) and status.st_mode & 0o022 and not status.st_mode & stat.S_ISVTX:
            mode = status.st_mode & 0o7777
            return f"{flag}: {path!r} is in {str(place)!r}, which other users can write to (mode {mode:o}): refused"
    return None


def _planted(flag: str, path: str, status: os.stat_result) -> str | None:
    if stat.S_ISREG(status.st_mode) and status.st_nlink > 1:
        # A hard link another user made to a file of root's (where the kernel lets them) is root's to
        # look at, but writing it writes that file.
        return f"{flag}: {path!r} is a file with {status.st_nlink} links (a hard link to another file): refused"
    owner = status.st_uid
    if owner in (os.geteuid(), 0):
        return None
    kind = "a symbolic link" if stat.S_ISLNK(status.st_mode) else "a file"
    return f"{flag}: {path!r} is {kind} of another user's (uid {owner}), who could read or redirect it: refused"


def open_own(flag: str, path: str) -> TextIO:
    """`open_for_writing(path)`, refusing another user's file or link (`planted_problem`), checked as it opens.

    Not through a symbolic link unless it is this user's or root's (`/dev/stdout`),
    and truncated only once what was opened has been checked.
    """
    problem = planted_problem(flag, path)
    if problem is not None:
        raise PermissionError(problem)
    try:
        follow = stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError:
        follow = False
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags, 0o600)  # the target's stacks and values: its user and root only
    except OSError as error:
        if error.errno == errno.ELOOP:  # a link put there since the look above
            raise PermissionError(f"{flag}: {path!r} became a symbolic link while it was opened: refused") from None
        raise
    try:
        status = os.fstat(fd)
        problem = _planted(flag, path, status)
        if problem is not None:
            raise PermissionError(problem)
        os.set_blocking(fd, True)
        if stat.S_ISREG(status.st_mode):
            os.ftruncate(fd, 0)
        return open(fd, "w", encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise


def write(timeline: Timeline, facts: Facts, paths: Mapping[str, str | None]) -> bool:
    """Write each file asked for (option -> path, None: not asked); False if one could not be written.

    Each failure is said on stderr, naming the option; the others are still written.
    """
    if not any(path is not None for path in paths.values()):
        return True
    from aiocop._reporting import timeline as _timeline  # noqa: PLC0415 - only for a run that asked for a file

    return write_model(_timeline.build(timeline, facts), paths)


def write_model(model: dict[str, Any], paths: Mapping[str, str | None], *, own_files: bool = False) -> bool:
    """Write each file asked for from a report's model (`_timeline.build`'s, or one `attach` checked and rebuilt).

    `own_files`: refuse another user's file or link (`attach`, often run as root).
    """
    asked = {flag: path for flag, path in paths.items() if path is not None}
    if not asked:
        return True
    from aiocop._reporting import exports as _exports  # noqa: PLC0415 - only for a run that asked for a file
    from aiocop._reporting import html_report as _html  # noqa: PLC0415 - only for a run that asked for a file

    renderers = {"--html": _html.render, "--speedscope": _exports.speedscope_text, "--folded": _exports.folded}
    ok = True
    for flag, path in asked.items():
        try:
            text = renderers[flag](model)
            with open_own(flag, path) if own_files else open_for_writing(path) as out:
                out.write(text)
        except (OSError, UnicodeError) as error:
            print(f"aiocop: could not write {flag} file: {printable(str(error))}", file=sys.stderr)
            ok = False
    return ok
