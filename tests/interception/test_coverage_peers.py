"""Nothing a peer catches that aiocop misses (issue 30).

Every function that blockbuster, Home Assistant's loop check and aiocop 1.2.1
flag is in aiocop's table of detected calls, reported under another event
(`DETECTED_AS`, each shown here by a real call), or deliberately not reported
with the reason (`NOT_REPORTED`); both are on the "Detected calls" docs page.
blockbuster's list is read from the installed package, so a function it adds
fails this test until it is accounted for.
"""

from __future__ import annotations

import ast
import contextlib
import glob
import http.client
import importlib
import os
import pathlib
import socket
import ssl
import subprocess
import sys
import tarfile
from typing import TYPE_CHECKING, Any

import pytest
from blockbuster import BlockBuster

from aiocop._interception.harmless import HARMLESS
from aiocop._interception.rules import BLOCKING_CALLS, DETECTED_AS, NOT_REPORTED
from tests.conftest import Collector, run_on

if TYPE_CHECKING:
    from collections.abc import Callable

# Home Assistant's list of blocking calls (`_BLOCKING_CALLS`: the object and
# function of each `BlockingCall`), copied from homeassistant/block_async_io.py
# of Home Assistant core (installing Home Assistant for one test is too heavy).
# Read from that file as it is in FrankyCTY/core at commit 2b7a5a449cf5, a
# fork of home-assistant/core from the 2025.7 development cycle (its
# homeassistant/const.py: 2025.7.0.dev0).
HOME_ASSISTANT_VERSION = "2025.7"
HOME_ASSISTANT_SOURCE = "home-assistant/core: homeassistant/block_async_io.py, _BLOCKING_CALLS"
HOME_ASSISTANT: tuple[str, ...] = (
    "http.client.HTTPConnection.putrequest",
    "time.sleep",
    "glob.glob",
    "glob.iglob",
    "os.walk",
    "os.listdir",
    "os.scandir",
    "builtins.open",
    "importlib.import_module",
    "ssl.SSLContext.load_default_certs",
    "ssl.SSLContext.load_verify_locations",
    "ssl.SSLContext.load_cert_chain",
    "ssl.SSLContext.set_default_verify_paths",
    "pathlib.Path.open",
    "pathlib.Path.read_text",
    "pathlib.Path.read_bytes",
    "pathlib.Path.write_text",
    "pathlib.Path.write_bytes",
)

# aiocop 1.2.1's events and patched functions: the keys of
# aiocop/core/blocking_io.py's BLOCKING_EVENTS_DICT (which takes in
# audit_patcher.py's FUNCTIONS_TO_PATCH_DICT). A released version never
# changes; test_the_aiocop_1x_list_is_its_sdists checks the copy.
AIOCOP_1X_VERSION = "1.2.1"
AIOCOP_1X: tuple[str, ...] = (
    "time.sleep",
    "socket.getaddrinfo",
    "socket.getnameinfo",
    "socket.gethostbyname",
    "socket.gethostbyaddr",
    "open",
    "tempfile.mkdtemp",
    "tempfile.mkstemp",
    "os.listdir",
    "os.scandir",
    "os.walk",
    "os.fwalk",
    "glob.glob",
    "pathlib.Path.glob",
    "pathlib.Path.rglob",
    "os.mkdir",
    "os.rmdir",
    "os.remove",
    "os.rename",
    "os.replace",
    "os.link",
    "os.symlink",
    "os.truncate",
    "shutil.copyfile",
    "shutil.copymode",
    "shutil.copystat",
    "shutil.move",
    "shutil.copytree",
    "shutil.rmtree",
    "fcntl.flock",
    "fcntl.lockf",
    "http.client.connect",
    "urllib.Request",
    "ftplib.connect",
    "smtplib.connect",
    "poplib.connect",
    "imaplib.open",
    "nntplib.connect",
    "os.system",
    "os.spawn",
    "os.posix_spawn",
    "os.exec",
    "os.fork",
    "subprocess.Popen",
    "os.kill",
    "sqlite3.connect",
    "builtins.input",
    "import",
    "syslog.syslog",
    "syslog.openlog",
    "os.getcwd",
    "os.path.abspath",
    "os.path.islink",
    "os.path.ismount",
    "os.readlink",
    "os.access",
    "os.stat",
    "os.statvfs",
    "os.path.samestat",
    "os.path.sameopenfile",
    "os.sendfile",
    "socket.socket.connect",
    "socket.socket.connect_ex",
    "socket.socket.accept",
    "socket.socket.bind",
    "socket.socket.send",
    "socket.socket.sendto",
    "socket.socket.sendmsg",
    "socket.socket.sendall",
    "socket.socket.recv",
    "socket.socket.recv_into",
    "socket.socket.recvfrom",
    "socket.socket.recvfrom_into",
    "socket.socket.recvmsg",
    "ssl.SSLSocket.write",
    "ssl.SSLSocket.send",
    "ssl.SSLSocket.read",
    "ssl.SSLSocket.recv",
)

DETECTED = {call.event for call in BLOCKING_CALLS}
DETECTED_AS_EVENT = {d.function: d.event for d in DETECTED_AS}
NOT_REPORTED_FUNCTIONS = {f: n.reason for n in NOT_REPORTED for f in n.functions}


def blockbuster_functions() -> list[str]:
    # The installed blockbuster's own table (it is not activated).
    return sorted(BlockBuster().functions)


def unaccounted(functions: list[str] | tuple[str, ...]) -> list[str]:
    return [
        f for f in functions if f not in DETECTED and f not in DETECTED_AS_EVENT and f not in NOT_REPORTED_FUNCTIONS
    ]


@pytest.mark.parametrize(
    ("peer", "functions"),
    [
        pytest.param("blockbuster", blockbuster_functions(), id="blockbuster"),
        pytest.param(
            f"Home Assistant {HOME_ASSISTANT_VERSION} ({HOME_ASSISTANT_SOURCE})", HOME_ASSISTANT, id="home-assistant"
        ),
        pytest.param(f"aiocop {AIOCOP_1X_VERSION}", AIOCOP_1X, id="aiocop-1.2.1"),
    ],
)
def test_every_function_a_peer_flags_is_accounted_for(peer: str, functions: list[str]) -> None:
    assert functions, f"no list read for {peer}"
    missing = unaccounted(functions)
    assert missing == [], (
        f"{peer} flags {missing}: add each to aiocop's rules (aiocop/_interception/rules.py: BLOCKING_CALLS, "
        "or DETECTED_AS with a call in this file's CALLS), or to NOT_REPORTED with the reason, then regenerate "
        "docs/reference/detected-calls.md"
    )


def test_the_tables_agree_with_each_other() -> None:
    assert set(DETECTED_AS_EVENT.values()) <= DETECTED, "DETECTED_AS names an event aiocop does not detect"
    assert not set(DETECTED_AS_EVENT) & set(NOT_REPORTED_FUNCTIONS), "both reported and not reported"
    assert not DETECTED & set(NOT_REPORTED_FUNCTIONS), "both detected and not reported"
    assert all(n.reason for n in NOT_REPORTED)
    assert all(rule.reason for rule in HARMLESS)
    assert len(DETECTED_AS_EVENT) == len(DETECTED_AS), "a function listed twice"


def test_the_docs_page_lists_each_function_not_reported() -> None:
    page = (pathlib.Path(__file__).parents[2] / "docs" / "reference" / "detected-calls.md").read_text()
    for function in [*DETECTED_AS_EVENT, *NOT_REPORTED_FUNCTIONS]:
        assert f"`{function}`" in page, function


# --- each DETECTED_AS entry, shown by a real call ----------------------------------------------

HERE = pathlib.Path(__file__).parents[1]  # tests/, beside tls/
CERT = HERE / "tls" / "cert.pem"
DH = HERE / "tls" / "dh.pem"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _refused(call: Callable[[socket.socket, tuple[str, int]], Any]) -> None:
    with socket.socket() as s, contextlib.suppress(OSError):
        call(s, ("127.0.0.1", _closed_port()))


def _udp(call: Callable[[socket.socket, tuple[str, int]], Any]) -> None:
    with (
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as receiver,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s,
    ):
        receiver.bind(("127.0.0.1", 0))
        call(s, receiver.getsockname())


def _http_request() -> None:
    connection = http.client.HTTPConnection("127.0.0.1", _closed_port(), timeout=5)
    with contextlib.suppress(OSError):
        connection.request("GET", "/")  # putrequest(), then the connection it opens
    connection.close()


def _tmp(tmp: pathlib.Path, name: str = "f") -> pathlib.Path:
    path = tmp / name
    path.write_bytes(b"x")
    return path


def _relative_abspath(tmp: pathlib.Path) -> None:
    os.path.abspath("relative")


def _import_module(tmp: pathlib.Path) -> None:
    name = "aiocop_peer_check_module"
    (tmp / f"{name}.py").write_text("")
    sys.path.insert(0, str(tmp))
    try:
        importlib.import_module(name)
    finally:
        sys.path.remove(str(tmp))
        sys.modules.pop(name, None)


# function -> a call of it (run in a task), given a fresh temporary folder. The
# files it needs are made before the loop (see test_detected_as).
CALLS: dict[str, Callable[[pathlib.Path], object]] = {
    "builtins.open": lambda tmp: open(tmp / "f", "rb").close(),
    "pathlib.Path.open": lambda tmp: (tmp / "f").open("rb").close(),
    "pathlib.Path.read_text": lambda tmp: (tmp / "f").read_text(),
    "pathlib.Path.read_bytes": lambda tmp: (tmp / "f").read_bytes(),
    "pathlib.Path.write_text": lambda tmp: (tmp / "g").write_text("x"),
    "pathlib.Path.write_bytes": lambda tmp: (tmp / "g").write_bytes(b"x"),
    "ssl.SSLContext.load_dh_params": lambda tmp: ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_dh_params(str(DH)),
    "os.replace": lambda tmp: os.replace(tmp / "f", tmp / "b"),
    "os.unlink": lambda tmp: os.unlink(tmp / "f"),
    "os.path.abspath": _relative_abspath,
    "os.path.islink": lambda tmp: os.path.islink(tmp / "f"),
    "os.path.ismount": lambda tmp: os.path.ismount(tmp / "f"),
    "glob.iglob": lambda tmp: list(glob.iglob(str(tmp / "*"))),
    "socket.socket.connect": lambda tmp: _refused(socket.socket.connect),
    "socket.socket.connect_ex": lambda tmp: _refused(socket.socket.connect_ex),
    "socket.socket.sendto": lambda tmp: _udp(lambda s, address: s.sendto(b"x", address)),
    "socket.socket.sendmsg": lambda tmp: _udp(lambda s, address: s.sendmsg([b"x"], [], 0, address)),
    "ssl.SSLContext.load_default_certs": lambda tmp: ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_default_certs(),
    "http.client.HTTPConnection.putrequest": lambda tmp: _http_request(),
    # (ssl.SSLSocket.recv and .send: test_hook.py's blocking TLS conversation, against a real server.)
}
SHOWN_ELSEWHERE = {"ssl.SSLSocket.recv": "tests/interception/test_hook.py::test_a_tls_handshake_on_a_blocking_socket"}
SHOWN_ELSEWHERE["ssl.SSLSocket.send"] = SHOWN_ELSEWHERE["ssl.SSLSocket.recv"]


def test_importlib_import_module_of_a_new_module(detector: Collector, tmp_path: pathlib.Path) -> None:
    # importlib's own import path raises no `import` event (only the C import
    # of the statement does): Home Assistant's check flags it, aiocop wraps it.
    async def main() -> None:
        _import_module(tmp_path)
        importlib.import_module("os")  # imported long ago: nothing to read

    run_on("asyncio", main())
    assert [c["name"] for c in detector.calls if c["name"] != "open"] == ["importlib.import_module"], detector.calls


def test_every_entry_of_detected_as_is_shown_by_a_call() -> None:
    assert set(CALLS) | set(SHOWN_ELSEWHERE) == set(DETECTED_AS_EVENT)


@pytest.mark.parametrize("function", sorted(CALLS))
def test_detected_as(detector: Collector, tmp_path: pathlib.Path, function: str) -> None:
    _tmp(tmp_path)
    call = CALLS[function]

    async def main() -> None:
        call(tmp_path)

    run_on("asyncio", main())
    expected = DETECTED_AS_EVENT[function]
    assert expected in detector.names(), f"{function}: {detector.calls}"


# pip's download gets up to 120 s (a slow index, a busy machine starting pip):
# the test's own timeout is above it, so subprocess's TimeoutExpired fires first and says why.
@pytest.mark.timeout(150)
def test_the_aiocop_1x_list_is_its_sdists(tmp_path: pathlib.Path) -> None:
    # Downloaded from PyPI as .ci/aiocop1_suite.py does; read, never imported.
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "-d", str(tmp_path)]
    done = subprocess.run(
        [*command, f"aiocop=={AIOCOP_1X_VERSION}"], check=False, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"could not download aiocop {AIOCOP_1X_VERSION}'s sdist from PyPI: {done.stderr}"
    with tarfile.open(tmp_path / f"aiocop-{AIOCOP_1X_VERSION}.tar.gz") as sdist:
        core = f"aiocop-{AIOCOP_1X_VERSION}/aiocop/core/"
        names: list[str] = []
        for module, table in (
            ("blocking_io.py", "BLOCKING_EVENTS_DICT"),
            ("audit_patcher.py", "FUNCTIONS_TO_PATCH_DICT"),
        ):
            member = sdist.extractfile(core + module)
            assert member is not None
            names += _dict_keys(member.read().decode(), table)
    assert sorted(set(names)) == sorted(AIOCOP_1X)


def _dict_keys(source: str, name: str) -> list[str]:
    """The string keys of the dict literal assigned to `name`, and of those set later by `name[...] = ...`."""
    keys: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and target.id == name:
                    value = node.value
                    if isinstance(value, ast.BinOp):  # {...} | OTHER_DICT
                        value = value.left
                    assert isinstance(value, ast.Dict)
                    keys += [str(k.value) for k in value.keys if isinstance(k, ast.Constant)]
                elif isinstance(target, ast.Subscript) and ast.unparse(target.value) == name:
                    assert isinstance(target.slice, ast.Constant)
                    keys.append(str(target.slice.value))
    assert keys, f"no {name} in the sdist"
    return keys


def test_a_function_a_peer_adds_fails_the_check() -> None:
    assert unaccounted(["time.sleep", "os.some_new_blocking_call"]) == ["os.some_new_blocking_call"]
