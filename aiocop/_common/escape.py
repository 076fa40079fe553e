"""Text made safe to show: what aiocop prints to a terminal or writes to a log.

A file name, a function name, a blocking call's arguments, a task's name or a
line of source comes from the program being watched, and often from its
clients (a file name chosen by an upload). Written raw, an ESC starts a
terminal escape sequence (`ESC]0;...BEL` retitles the window, `ESC[2J`
clears it), a CR overwrites the line before it in a log viewer, U+202E
reverses the text after it, and a newline forges a log line of its own.
Every such character is shown as its Python escape instead (`\\x1b`,
`\\u202e`, `\\x0a`): the text stays readable, and reads for what it is.

Text for machines keeps its characters (the `--json` report, the
`record.aiocop` data of a log entry: JSON escapes them itself), and the HTML
report escapes for HTML.
"""

from __future__ import annotations

import unicodedata

# Unicode categories never shown raw: C0/C1 controls and DEL (terminal escapes,
# CR, LF, tab), format characters (bidirectional overrides, zero-width), lone
# surrogates (which stderr could not even encode), line and paragraph separators.
_UNPRINTABLE = frozenset(("Cc", "Cf", "Cs", "Zl", "Zp"))


def printable(text: str) -> str:
    """`text` with every character a terminal could act on escaped (`\\x1b`, `\\u202e`)."""
    if text.isprintable():  # the usual case: nothing to do
        return text
    out = []
    for char in text:
        if unicodedata.category(char) in _UNPRINTABLE:
            code = ord(char)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(char)
    return "".join(out)
