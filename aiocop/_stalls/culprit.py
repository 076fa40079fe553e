"""Naming what a stalled loop was doing, from a stack sample.

A loop stuck in a C function (`time.sleep` bound before patching, a lock, a
compression call) shows only the calling line on its Python stack. The
instruction it is stuck on is a call; its source text (from the code's
position table, 3.11+) names the callee, and the loop thread's CPU clock
tells waiting from working. What a known callee means is data: `WAITS`.
"""

from __future__ import annotations

import dis
import linecache
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import CodeType

# Callee names (last dotted part) whose stall is a wait, and what kind.
WAITS: dict[str, str] = {
    "sleep": "sleep",
    "select": "select/poll",
    "poll": "select/poll",
    "acquire": "lock",
    "wait": "wait",
    "wait_for": "wait",
    "join": "wait",
    "get": "queue",
    "put": "queue",
    "recv": "socket",
    "recv_into": "socket",
    "recvfrom": "socket",
    "accept": "socket",
    "connect": "socket",
    "sendall": "socket",
    "communicate": "subprocess",
    "waitpid": "subprocess",
    "getaddrinfo": "dns",
    "gethostbyname": "dns",
    "read": "read",
    "readline": "read",
    "input": "input",
}

_CALL_OPS = frozenset(op for name, op in dis.opmap.items() if name.startswith("CALL"))
_CACHE = dis.opmap.get("CACHE")  # inline cache entries after an instruction (3.11+)
_MAX_TEXT = 80


def instruction_at(code: CodeType, lasti: int) -> int:
    """The offset of the instruction a frame is on (f_lasti may point into its inline cache)."""
    raw = code.co_code
    offset = lasti
    while _CACHE is not None and 0 < offset < len(raw) and raw[offset] == _CACHE:
        offset -= 2
    return offset


def is_at_call(code: CodeType, lasti: int) -> bool:
    """Whether the frame is stopped on a call instruction (so inside the callee)."""
    raw = code.co_code
    offset = instruction_at(code, lasti)
    return 0 <= offset < len(raw) and raw[offset] in _CALL_OPS


def call_text(code: CodeType, lasti: int, lineno: int) -> str:
    """The source text of the expression at `lasti`, e.g. `time.sleep(0.05)`."""
    if sys.version_info >= (3, 11):
        positions = list(code.co_positions())
        index = instruction_at(code, lasti) // 2
        if 0 <= index < len(positions):
            start, end, col, end_col = positions[index]
            if start is not None and start == end and col is not None and end_col is not None:
                text = linecache.getline(code.co_filename, start)[col:end_col]
                if text:
                    return _shorten(text)
    return _shorten(linecache.getline(code.co_filename, lineno).strip())


def _shorten(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MAX_TEXT else text[: _MAX_TEXT - 3] + "..."


def callee(text: str) -> str:
    """`time.sleep(0.05)` -> `sleep`."""
    head = text.partition("(")[0].strip()
    return head.rpartition(".")[2]


def describe(code: CodeType, lasti: int, lineno: int, waiting: bool) -> str:
    """One line saying what the loop was doing at this sample."""
    if not is_at_call(code, lasti):
        return "running Python code" if not waiting else "waiting"
    text = call_text(code, lasti, lineno)
    if waiting:
        kind = WAITS.get(callee(text))
        return f"waiting in {text}" + (f" ({kind})" if kind else "")
    return f"running {text}"
