"""The attaching side's hold on its target, on any Python: pin, exchange folder, code sent.

The code: aiocop/_commands/attach/files.py.

Root is needed to give files to another user (CI runs as root); the
end-to-end cases are in tests/commands/test_attach.py (CPython 3.14+).
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from aiocop._commands.attach import command as _attach
from aiocop._commands.attach.files import AttachError, Exchange, Pin, agent_sources, check_path, temporary_folder

if TYPE_CHECKING:
    from collections.abc import Iterator

ROOT = Path(__file__).resolve().parents[2]
NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give files to another user (CI runs as root)")


@pytest.fixture
def exchange(tmp_path: Path) -> Iterator[Exchange]:
    pin = Pin.take(os.getpid())
    made = Exchange(tmp_path, pin)
    yield made
    made.remove()
    pin.close()


def test_the_folder_is_private_and_the_target_s_file_is_read(exchange: Exchange) -> None:
    assert stat.S_IMODE(os.stat(exchange.path).st_mode) == 0o700
    assert exchange.read("status.json", 100) is None
    (exchange.path / "status.json").write_bytes(b"{}")
    assert exchange.read("status.json", 100) == b"{}"
    (exchange.path / "status.json").write_bytes(b"x" * 500)
    assert exchange.read("status.json", 100) == b"x" * 101  # the limit plus one: the caller says it is too big


def test_a_hard_link_is_refused(exchange: Exchange, tmp_path: Path) -> None:
    secret = tmp_path / "secret.json"
    secret.write_text('{"password": "x"}')
    os.link(secret, exchange.path / "report.json")
    with pytest.raises(AttachError, match=r"report.json in .* has 2 links \(a hard link to another file\): refused"):
        exchange.read("report.json", 100)


def _replacing_fstat(exchange: Exchange, times: int) -> object:
    """os.fstat, after the target writes status.json anew (as it does: os.replace) the first `times` times."""
    real = os.fstat
    done: list[int] = []

    def fstat(fd: int) -> os.stat_result:
        if len(done) < times:
            done.append(fd)
            partial = exchange.path / "status.json.partial"
            partial.write_bytes(b'{"state": "done", "write": %d}' % len(done))
            os.replace(partial, exchange.path / "status.json")
        return real(fd)

    return fstat


def test_a_file_the_target_replaces_as_it_is_read_is_read_again(
    exchange: Exchange, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The file opened lost its name before fstat (0 links): not a hard link, the
    # target's next write; read that. (Once refused as "0 links", CI, 3.14.)
    (exchange.path / "status.json").write_bytes(b'{"state": "started"}')
    monkeypatch.setattr(os, "fstat", _replacing_fstat(exchange, 2))
    assert exchange.read("status.json", 100) == b'{"state": "done", "write": 2}'


def test_a_file_replaced_at_every_read_is_refused(exchange: Exchange, monkeypatch: pytest.MonkeyPatch) -> None:
    (exchange.path / "status.json").write_bytes(b"{}")
    monkeypatch.setattr(os, "fstat", _replacing_fstat(exchange, 100))
    with pytest.raises(AttachError, match=r"status.json in .* was replaced 5 times as it was read: refused"):
        exchange.read("status.json", 100)


def test_a_symbolic_link_is_refused(exchange: Exchange, tmp_path: Path) -> None:
    secret = tmp_path / "secret.json"
    secret.write_text("{}")
    (exchange.path / "report.json").symlink_to(secret)
    with pytest.raises(AttachError, match=r"report.json in .* cannot be opened \(Too many levels of symbolic links\)"):
        exchange.read("report.json", 100)


def test_a_fifo_or_a_folder_is_refused_without_blocking(exchange: Exchange) -> None:
    os.mkfifo(exchange.path / "report.json")
    with pytest.raises(AttachError, match=r"report.json in .* is not a regular file: refused"):
        exchange.read("report.json", 100)
    (exchange.path / "status.json").mkdir()
    with pytest.raises(AttachError, match=r"status.json in .* is not a regular file: refused"):
        exchange.read("status.json", 100)


@needs_root
def test_a_file_of_another_user_is_refused(exchange: Exchange) -> None:
    (exchange.path / "report.json").write_text("{}")
    os.chown(exchange.path / "report.json", NOBODY, NOBODY)
    with pytest.raises(AttachError, match=r"belongs to uid 65534 \(nobody\), not to the target's user: refused"):
        exchange.read("report.json", 100)


def test_the_folder_is_used_by_descriptor_not_by_name(exchange: Exchange, tmp_path: Path) -> None:
    """The target renames the folder and puts a link to elsewhere in its place: nothing there is touched."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious").write_text("keep me")
    (elsewhere / "status.json").write_text("{}")
    moved = tmp_path / "moved"
    exchange.path.rename(moved)
    exchange.path.symlink_to(elsewhere)
    assert exchange.read("status.json", 100) is None  # the folder's own, not elsewhere's
    exchange.leave("stop")
    assert (moved / "stop").exists() and not (elsewhere / "stop").exists()
    exchange.remove()
    assert (elsewhere / "precious").read_text() == "keep me"
    assert exchange.path.is_symlink()  # a link is not removed as if it were the folder
    assert list(moved.iterdir()) == []


def test_leaving_a_file_never_follows_a_link(exchange: Exchange, tmp_path: Path) -> None:
    target = tmp_path / "target"
    (exchange.path / "cancelled").symlink_to(target)
    exchange.leave("cancelled")
    assert not target.exists()


def test_removing_all_but_the_script(exchange: Exchange) -> None:
    for name in ("bootstrap.py", "agent.json", "cancelled", "stop"):
        (exchange.path / name).write_text("")
    (exchange.path / "sub" / "deeper").mkdir(parents=True)
    (exchange.path / "sub" / "deeper" / "file").write_text("")
    exchange.remove(keep=("bootstrap.py", "cancelled"))
    assert sorted(os.listdir(exchange.path)) == ["bootstrap.py", "cancelled"]


@needs_root
def test_the_folder_is_handed_to_another_user_s_target(tmp_path: Path) -> None:
    pin = Pin(os.getpid(), None, NOBODY, None)  # as if the target were nobody's
    made = Exchange(tmp_path, pin)
    try:
        made.write("bootstrap.py", b"pass")
        made.hand_over()
        assert os.stat(made.path).st_uid == NOBODY
        assert os.stat(made.path / "bootstrap.py").st_uid == NOBODY
        (made.path / "status.json").write_text("{}")  # root's, in the target's folder: not the target's
        with pytest.raises(AttachError, match="belongs to uid 0"):
            made.read("status.json", 100)
    finally:
        made.remove()
    assert not made.path.exists()


def test_check_path_refuses_another_owner_and_a_writable_folder(tmp_path: Path) -> None:
    owners = frozenset({0, os.geteuid()})
    folder = tmp_path / "a" / "b"
    folder.mkdir(parents=True)
    check_path(folder, owners, "what")
    folder.parent.chmod(0o777)
    with pytest.raises(AttachError, match=r"^what: .*/a can be written by users other than its owner \(mode 777\)$"):
        check_path(folder, owners, "what")
    folder.parent.chmod(0o1777)  # sticky, as /tmp: no one replaces another's entries
    check_path(folder, owners, "what")
    with pytest.raises(AttachError, match=r"^what: .*/b belongs to uid \d+"):
        check_path(folder, frozenset({12345}), "what")


def test_check_path_refuses_a_link(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(AttachError, match="is a symbolic link"):
        check_path(tmp_path / "link", frozenset({0, os.geteuid()}), "what")


def test_a_temporary_directory_others_can_write_in_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    monkeypatch.setenv("TMPDIR", str(shared))
    monkeypatch.setattr(tempfile, "tempdir", None)  # the module attach reads it from
    with pytest.raises(AttachError, match=r"^the temporary directory \(TMPDIR, else /tmp\): .*shared can be written"):
        temporary_folder(frozenset({0, os.geteuid()}))


def test_the_code_sent_is_every_module_of_the_package() -> None:
    sources = agent_sources(ROOT / "aiocop", frozenset({0, os.geteuid()}))
    assert sources["aiocop"][2] is True and sources["aiocop._commands.attach.agent"][2] is False
    assert sources["aiocop.core"][2] is True and "aiocop.core.state" in sources
    assert "aiocop._docs" not in sources and "aiocop._commands.cli" not in sources
    assert sources["aiocop._api"][1] == (ROOT / "aiocop" / "_api.py").read_text()
    assert sources["aiocop._api"][0] == str(ROOT / "aiocop" / "_api.py")


@needs_root
@pytest.mark.parametrize("how", ["file of another user", "world-writable file", "linked file", "folder of another"])
def test_code_another_user_could_change_is_refused(tmp_path: Path, how: str) -> None:
    import shutil

    copy = tmp_path / "aiocop"
    shutil.copytree(ROOT / "aiocop", copy, ignore=shutil.ignore_patterns("__pycache__"))
    api = copy / "_api.py"
    if how == "file of another user":
        os.chown(api, NOBODY, NOBODY)
        said = "_api.py belongs to uid 65534 (nobody), who could change it"
    elif how == "world-writable file":
        api.chmod(0o666)
        said = "_api.py can be written by users other than its owner"
    elif how == "linked file":
        api.unlink()
        api.symlink_to(ROOT / "aiocop" / "_api.py")
        said = "Too many levels of symbolic links"
    else:
        os.chown(copy / "core", NOBODY, NOBODY)
        said = "core belongs to uid 65534 (nobody)"
    with pytest.raises(AttachError, match=re.escape(said)):
        agent_sources(copy, frozenset({0}))


def test_a_pid_that_does_not_exist_cannot_be_pinned() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    with pytest.raises(AttachError, match=f"^no process with PID {gone.pid}$"):
        Pin.take(gone.pid)


def test_a_pinned_process_that_exits_is_seen_gone_zombie_or_reaped() -> None:
    child = subprocess.Popen(["sleep", "60"])
    pin = Pin.take(child.pid)
    try:
        assert not pin.exited()
        pin.check()
        child.kill()
        with contextlib.suppress(ChildProcessError):
            os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
        assert pin.exited()
        child.wait()
        assert pin.exited()
        with pytest.raises(AttachError, match=f"PID {child.pid} is no longer the process aiocop was asked to attach"):
            pin.check()
    finally:
        pin.close()
        child.kill()
        child.wait()


def _last_pid_writable() -> bool:
    return os.geteuid() == 0 and os.access("/proc/sys/kernel/ns_last_pid", os.W_OK)


@pytest.mark.skipif(not _last_pid_writable(), reason="needs root to choose the next PID (CI runs as root)")
def test_a_pid_given_to_another_process_is_refused() -> None:
    """Issue 23, 9, for real: the pinned process ends, another gets its PID (ns_last_pid), the pin refuses it."""
    for _ in range(50):  # other processes of the machine may take the PID first: try again
        first = subprocess.Popen(["sleep", "60"])
        pin = Pin.take(first.pid)
        first.kill()
        first.wait()
        with open("/proc/sys/kernel/ns_last_pid", "w") as last:
            last.write(str(first.pid - 1))
        second = subprocess.Popen(["sleep", "60"])
        try:
            if second.pid != first.pid:
                continue
            assert pin.exited()
            with pytest.raises(AttachError, match=f"PID {first.pid} is no longer the process aiocop was asked"):
                pin.check()
            return
        finally:
            pin.close()
            second.kill()
            second.wait()
    pytest.fail("could not have a PID reused in 50 tries")


@pytest.mark.parametrize("value", ["abc", "nan", "NaN", "inf", "-inf", "-1", "0", "1e9", "\x1b[2J"])
def test_a_bad_start_timeout_is_named(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIOCOP_ATTACH_START_TIMEOUT_S", value)
    with pytest.raises(_attach.UsageError) as caught:
        _attach.start_timeout_s()
    assert str(caught.value).startswith("AIOCOP_ATTACH_START_TIMEOUT_S=")
    assert "expected a number of seconds above 0 and at most 86400 (the default is 10)" in str(caught.value)
    assert "\x1b" not in str(caught.value)


@pytest.mark.parametrize(("value", "seconds"), [(None, 10.0), ("", 10.0), (" 2.5 ", 2.5), ("86400", 86400.0)])
def test_a_good_start_timeout(value: str | None, seconds: float, monkeypatch: pytest.MonkeyPatch) -> None:
    if value is None:
        monkeypatch.delenv("AIOCOP_ATTACH_START_TIMEOUT_S", raising=False)
    else:
        monkeypatch.setenv("AIOCOP_ATTACH_START_TIMEOUT_S", value)
    assert _attach.start_timeout_s() == seconds


# its subprocess is given 60 s: the test's own timeout sits above it, so that bound fires first (issue 36)
@pytest.mark.timeout(90)
def test_a_bad_start_timeout_does_not_break_run(tmp_path: Path) -> None:
    """Issue 23, 4: the variable is attach's: `python -m aiocop run` does not read it (it broke at import)."""
    script = tmp_path / "app.py"
    script.write_text("print('ran')\n")
    result = subprocess.run(
        [sys.executable, "-m", "aiocop", "run", str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "AIOCOP_ATTACH_START_TIMEOUT_S": "abc"},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ran"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user (CI runs as root)")
def test_an_output_planted_after_the_check_is_refused_by_descriptor_untouched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 28: attach's --html/--json/... are opened without following a link, checked, then truncated."""
    from aiocop._reporting import report_files as _report_files

    planted = tmp_path / "report.html"
    planted.write_text("theirs")
    os.chown(planted, 65534, 65534)
    monkeypatch.setattr(_report_files, "planted_problem", lambda flag, path: None)  # planted after the check
    with pytest.raises(PermissionError, match="is a file of another user's"):
        _report_files.open_own("--html", str(planted))
    assert planted.read_text() == "theirs"  # not truncated
    link = tmp_path / "link.html"
    link.symlink_to(tmp_path / "elsewhere")
    monkeypatch.setattr(os, "lstat", lambda path: os.stat(tmp_path))  # the link appears after the look
    with pytest.raises(PermissionError, match="became a symbolic link while it was opened"):
        _report_files.open_own("--html", str(link))
    assert not (tmp_path / "elsewhere").exists()
    monkeypatch.undo()
    linked = tmp_path / "hardlink.html"  # a hard link to a file of root's, made where the kernel allows it
    precious = tmp_path / "precious"
    precious.write_text("precious")
    os.link(precious, linked)
    assert _report_files.planted_problem("--json", str(linked)) is not None
    with pytest.raises(PermissionError, match="is a file with 2 links"):
        _report_files.open_own("--json", str(linked))
    assert precious.read_text() == "precious"
    mine = tmp_path / "mine.html"
    mine.symlink_to(tmp_path / "target.html")  # one's own link is followed, as `run` follows it
    with _report_files.open_own("--html", str(mine)) as out:
        out.write("report")
    assert (tmp_path / "target.html").read_text() == "report"


@needs_root
def test_an_output_in_a_folder_another_user_controls_is_refused(tmp_path: Path) -> None:
    """Found by review: the folders above attach's output, not only the file, are checked.

    A folder of the target's user could be turned into a link to a folder of
    root's while attach runs, and root's file there truncated and rewritten.
    """
    from aiocop._reporting import report_files as _report_files

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 12345, -1)
    problem = _report_files.planted_problem("--html", str(theirs / "out" / "report.html"))
    assert problem is not None and "belongs to another user (uid 12345)" in problem
    open_to_all = tmp_path / "open"
    open_to_all.mkdir()
    open_to_all.chmod(0o777)  # writable by all, not sticky: an entry can be swapped for a link
    problem = _report_files.planted_problem("--json", str(open_to_all / "report.json"))
    assert problem is not None and "which other users can write to (mode 777)" in problem
    # The link's own folder is root's, but where it leads is not: checked as resolved too.
    (tmp_path / "link").symlink_to(theirs)
    problem = _report_files.planted_problem("--folded", str(tmp_path / "link" / "stacks.txt"))
    assert problem is not None and "uid 12345" in problem
    with pytest.raises(PermissionError, match="belongs to another user"):
        _report_files.open_own("--html", str(theirs / "report.html"))
    assert not (theirs / "report.html").exists()
    # A sticky folder writable by all (/tmp) and a folder of one's own are fine; the file is the user's alone.
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    assert _report_files.planted_problem("--html", str(sticky / "report.html")) is None
    with _report_files.open_own("--html", str(sticky / "report.html")) as out:
        out.write("ok")
    assert stat.S_IMODE(os.stat(sticky / "report.html").st_mode) == 0o600
