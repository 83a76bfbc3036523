"""Record text made safe to show: one row per record, nothing a terminal or a browser acts on.

Rules: audit fields hold text that sandboxes and upstreams chose (a DNS name, a path, a reason
phrase). Printed raw, a newline forges a row, an ESC sequence retitles or clears the reviewer's
terminal, a bidi override reorders what they read. `visible` shows every character that
`str.isprintable` refuses (C0, DEL, C1, format characters such as bidi controls and zero-width
ones, line and paragraph separators, lone surrogates, unassigned code points, spaces other than
U+0020) as a Python-style escape (`\\n`, `\\x1b`, `\\u202e`), and a backslash as `\\\\`, so an
escape in the output always means the character was there. Every place a record field is
printed (the CLI's table and summary, `logs --follow`, the console's pages and live feed) uses
it; JSON output escapes these characters by itself.
"""

from __future__ import annotations

from typing import Any

_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}


def visible(text: str) -> str:
    """`text` with every character a terminal could act on written as a visible escape."""
    if text.isprintable() and "\\" not in text:
        return text
    return "".join(_escape(char) for char in text)


def _escape(char: str) -> str:
    if char in _SHORT:
        return _SHORT[char]
    if char.isprintable():
        return char
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def visible_record(record: dict[str, Any]) -> dict[str, Any]:
    """The record with each text field made `visible` (for views that print it, not for export)."""
    return {key: visible(value) if isinstance(value, str) else value for key, value in record.items()}
