"""The attaching side's hold on its target: the process pinned, the exchange folder, the code it sends.

Everything here assumes the target, and anyone who can write where files
are read from, is hostile:

- `Pin`: the target is the process that had this PID when the attach began
  (a pidfd, and its start time from `/proc/PID/stat`), so a PID reused in the
  meantime is refused rather than attached to. The bootstrap re-checks the
  same start time from inside, so a reused PID that received it anyway runs
  nothing.
- `Exchange`: a folder made by this side (`mkdtemp`, 0700) under a temporary
  directory no other user can rename things in, used through a directory
  descriptor held from its creation; handed to the target's user only when
  root attaches to another user's process. What the target writes in it is
  read only if it is a regular file, owned by the target's user, with one
  link (a hard link to another file is refused), not through a symbolic link,
  and not larger than a limit.
- `agent_sources`: the aiocop code the target runs, read here and sent in the
  folder, never imported by the target from a path; refused when a user
  other than root or the target's could have changed it.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import select
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path


class AttachError(Exception):
    """A reason the attach cannot go on, said in one line."""


def start_ticks(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot, `/proc/PID/stat` field 22); None without /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stream:
            fields = stream.read().rpartition(b")")[2].split()
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            raise ProcessLookupError(pid) from None
        return None  # no /proc (not Linux): the PID alone
    except OSError:
        return None
    return int(fields[19])


def _file_uid(pid: int) -> int:
    """The user whose files process `pid` creates (its filesystem uid: /proc/PID's owner can be root's)."""
    with open(f"/proc/{pid}/status", "rb") as stream:
        for line in stream:
            if line.startswith(b"Uid:"):
                return int(line.split()[4])
    return os.stat(f"/proc/{pid}").st_uid


@dataclass
class Pin:
    """The process that had `pid` when the attach began."""

    pid: int
    start: int | None  # its start time, or None where /proc is missing
    uid: int
    pidfd: int | None  # None where pidfd_open is missing (not Linux, or Linux < 5.3)

    @classmethod
    def take(cls, pid: int) -> Pin:
        pidfd = None
        if hasattr(os, "pidfd_open"):
            try:
                pidfd = os.pidfd_open(pid)
            except ProcessLookupError:
                raise AttachError(f"no process with PID {pid}") from None
            except OSError:
                pidfd = None  # a kernel without pidfds: the start time alone
        try:
            start = start_ticks(pid)
            uid = _file_uid(pid) if start is not None else os.getuid()
        except (ProcessLookupError, FileNotFoundError):
            if pidfd is not None:
                os.close(pidfd)
            raise AttachError(f"no process with PID {pid}") from None
        return cls(pid, start, uid, pidfd)

    def close(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None

    def exited(self) -> bool:
        """Whether the pinned process has ended (a zombie not yet reaped has ended)."""
        if self.pidfd is not None:
            poller = select.poll()
            poller.register(self.pidfd, select.POLLIN)
            if poller.poll(0):
                return True
        try:
            if start_ticks(self.pid) != self.start:
                return True  # another process has the PID now
            state = Path(f"/proc/{self.pid}/stat").read_bytes().rpartition(b")")[2].split()[0]
        except (ProcessLookupError, FileNotFoundError):
            return True
        except (OSError, IndexError):
            return False
        return state in (b"Z", b"X")

    def check(self) -> None:
        """Raise unless PID still names the pinned process."""
        if self.exited():
            raise AttachError(
                f"PID {self.pid} is no longer the process aiocop was asked to attach to (it exited, and its PID "
                "may have been given to another process): nothing was sent to it"
            )


def _trusted_owner(st: os.stat_result, owners: frozenset[int]) -> bool:
    return st.st_uid in owners


def _others_can_write(st: os.stat_result) -> bool:
    """Writable by a user other than its owner (a sticky directory lets no one replace another's entries)."""
    if stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX:
        return False
    if st.st_mode & stat.S_IWOTH:
        return True
    if not st.st_mode & stat.S_IWGRP:
        return False
    # Group-writable is fine under the user-private-group convention (Debian's
    # umask 002): the group is the owner's own, named after it, with no one else in it.
    try:
        owner = pwd.getpwuid(st.st_uid)
        group = grp.getgrgid(st.st_gid)
    except KeyError:
        return True
    return not (
        owner.pw_gid == st.st_gid and group.gr_name == owner.pw_name and not set(group.gr_mem) - {owner.pw_name}
    )


def _who(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def check_path(path: Path, owners: frozenset[int], what: str) -> None:
    """`path` and every folder above it: owned by one of `owners` and writable by no one else."""
    for place in (path, *path.parents):
        try:
            st = os.lstat(place)
        except OSError as error:
            raise AttachError(f"{what}: cannot check {place}: {error.strerror}") from None
        if stat.S_ISLNK(st.st_mode):
            raise AttachError(f"{what}: {place} is a symbolic link (checked only once resolved)")
        if not _trusted_owner(st, owners):
            raise AttachError(f"{what}: {place} belongs to {_who(st.st_uid)}, who could change it")
        if _others_can_write(st):
            raise AttachError(
                f"{what}: {place} can be written by users other than its owner (mode {st.st_mode & 0o7777:o})"
            )


def temporary_folder(owners: frozenset[int]) -> Path:
    """Where the exchange folder goes: the temporary directory, if no one else can rename things in it."""
    place = Path(os.path.realpath(tempfile.gettempdir()))
    check_path(place, owners, "the temporary directory (TMPDIR, else /tmp)")
    return place


# The package's files that the target never needs (their paths under aiocop/): the command line.
_NOT_SENT = frozenset(("_commands/cli.py", "__main__.py"))


def agent_sources(package: Path, owners: frozenset[int]) -> dict[str, list[object]]:
    """The source of every module of the `aiocop` package at `package`: `{name: [file, source, is_package]}`.

    Read here, checked (regular files owned by one of `owners`, in folders only
    they can write), and sent to the target as text: the target never imports
    aiocop from a path, so nothing another user can write reaches it.
    """
    what = (
        "aiocop's own code, which the target would run"
        ", comes from a place another user can change (install aiocop where only root or the target's user can write)"
    )
    check_path(package, owners, what)
    sources: dict[str, list[object]] = {}
    for folder in [package, *_subpackages(package)]:
        if folder != package:
            check_path(folder, owners, what)
        prefix = ".".join(("aiocop", *folder.relative_to(package).parts))
        for file in sorted(folder.glob("*.py")):
            if file.relative_to(package).as_posix() in _NOT_SENT:
                continue
            source = _read_trusted(file, owners, what)
            package_init = file.name == "__init__.py"
            name = prefix if package_init else f"{prefix}.{file.stem}"
            sources[name] = [str(file), source, package_init]
    return sources


def _subpackages(folder: Path) -> list[Path]:
    # Every folder with an __init__.py below `folder`, at any depth (`_commands/attach/`), parents first;
    # a folder without one is no package and is not entered.
    found = []
    for child in sorted(p for p in folder.iterdir() if p.is_dir() and (p / "__init__.py").exists()):
        found += [child, *_subpackages(child)]
    return found


def _read_trusted(file: Path, owners: frozenset[int], what: str) -> str:
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as error:
        raise AttachError(f"{what}: {file} cannot be opened ({error.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise AttachError(f"{what}: {file} is not a regular file")
        if not _trusted_owner(st, owners):
            raise AttachError(f"{what}: {file} belongs to {_who(st.st_uid)}, who could change it")
        if _others_can_write(st):
            raise AttachError(f"{what}: {file} can be written by users other than its owner")
        with open(fd, "rb", closefd=False) as stream:
            return stream.read().decode("utf-8")
    finally:
        os.close(fd)


class Exchange:
    """The private folder this side and the target talk through, used by descriptor, never re-resolved."""

    def __init__(self, parent: Path, pin: Pin) -> None:
        self.pin = pin
        self.parent_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            self.path = Path(tempfile.mkdtemp(prefix=f"aiocop-attach-{pin.pid}-", dir=parent))
            self.fd = os.open(self.path.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=self.parent_fd)
        except BaseException:
            os.close(self.parent_fd)
            raise
        # Another user's process, attached to by root: the folder becomes that user's (so that it can write
        # there, and remove it if it runs the script after this side has gone). This side then reads only
        # what passes `read`'s checks, and creates files with O_EXCL, never through a link.
        self.handed_over = pin.uid != os.geteuid() and os.geteuid() == 0
        self.closed = False

    def write(self, name: str, data: bytes) -> None:
        """A file this side makes, before the folder is handed over."""
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=self.fd)
        with open(fd, "wb") as stream:
            if self.handed_over:
                os.fchown(stream.fileno(), self.pin.uid, -1)
            stream.write(data)

    def hand_over(self) -> None:
        if self.handed_over:
            os.fchown(self.fd, self.pin.uid, -1)

    def leave(self, name: str) -> None:
        """An empty file the target looks for (`stop`, `cancelled`)."""
        # Already there, or the folder gone: once handed over, the target owns it and may have removed it.
        with contextlib.suppress(OSError):
            os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=self.fd))

    def has(self, name: str) -> bool:
        try:
            os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except OSError:
            return False
        return True

    def read(self, name: str, limit: int) -> bytes | None:
        """What the target wrote in `name` (at most `limit + 1` bytes), or None if absent.

        Raises AttachError for a file that is there but is not one the target
        could only have made itself: not regular, another owner, more than one link.
        """
        for _ in range(_REPLACED_RETRIES):
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY, dir_fd=self.fd)
            except FileNotFoundError:
                return None
            except OSError as error:
                raise AttachError(
                    f"{name} in {self.path} cannot be opened ({error.strerror}): not a file the target wrote"
                ) from None
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise AttachError(f"{name} in {self.path} is not a regular file: refused")
                if st.st_uid != self.pin.uid:
                    raise AttachError(
                        f"{name} in {self.path} belongs to {_who(st.st_uid)}, not to the target's user: refused"
                    )
                if st.st_nlink == 0:
                    # The target wrote the file anew (os.replace) between our open and fstat: the
                    # file opened has just lost its name. Read the new one.
                    continue
                if st.st_nlink != 1:
                    raise AttachError(
                        f"{name} in {self.path} has {st.st_nlink} links (a hard link to another file): refused"
                    )
                with open(fd, "rb", closefd=False) as stream:
                    return stream.read(limit + 1)
            finally:
                os.close(fd)
        raise AttachError(f"{name} in {self.path} was replaced {_REPLACED_RETRIES} times as it was read: refused")

    def remove(self, keep: tuple[str, ...] = ()) -> None:
        """Remove the folder (or, with `keep`, everything in it but those names), by descriptor throughout."""
        if self.closed:
            return
        _clear(self.fd, keep)
        if not keep:
            # By name under the parent held open since the start: a symbolic link put in its place is
            # not followed (rmdir removes only an empty directory, never a link's target).
            with contextlib.suppress(OSError):
                os.rmdir(self.path.name, dir_fd=self.parent_fd)
            self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            os.close(self.fd)
            os.close(self.parent_fd)


# A file the target replaces as it is read is read again, this many times at most (the target
# rewrites status.json a handful of times in a whole attach; more is not the target writing).
_REPLACED_RETRIES = 5


def _clear(fd: int, keep: tuple[str, ...] = (), depth: int = 0) -> None:
    """Remove what is in the directory open at `fd` but `keep`, following no link (what the target made too)."""
    for entry in os.listdir(fd):
        if entry in keep:
            continue
        with contextlib.suppress(OSError):
            if stat.S_ISDIR(os.stat(entry, dir_fd=fd, follow_symlinks=False).st_mode):
                if depth < _MAX_DEPTH:  # deeper than aiocop ever makes: the target's, left to it
                    inner = os.open(entry, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                    try:
                        _clear(inner, (), depth + 1)
                    finally:
                        os.close(inner)
                    os.rmdir(entry, dir_fd=fd)
            else:
                os.unlink(entry, dir_fd=fd)


_MAX_DEPTH = 8
