"""The escape syntaxes servers write text in, and a decoding view that undoes them.

Rules:
1. Closed world: the set of escapes is every per-character escape a mainstream server,
   serialiser or template engine writes, in `ESCAPES` (one row per syntax, a table, not
   branches): JSON/JavaScript `\\uXXXX` (surrogate pairs too), `\\u{X...}`, `\\xHH`, the short
   escapes `\\/ \\" \\' \\\\ \\b \\f \\n \\r \\t`; percent-encoding `%HH` and `%uXXXX` in either case;
   HTML/XML character references, decimal `&#DDD;` and hex `&#xHHH;` (any case, leading zeros up
   to MAX_DIGITS digits) and every named reference of HTML5 (`html.entities.html5`: `&amp;`,
   `&sol;`, `&plus;` ...). Any character may be escaped or not, in any mix: a secret has
   exponentially many such forms, so they are not enumerated; the data is decoded instead.
   References are read with their `;` only: every writer ends them so, and a browser's lenient
   reading of `&#100` or `&amp` without it would make escapes of escapes ambiguous
   (`&#100\u003b` is `&#100;` in JSON, then `d`; decoded together it would read `d;`).
2. Each syntax is matched in UTF-8 (ASCII-compatible charsets) and in UTF-16 LE and BE, and is
   decoded to its character in the same encoding, so a UTF-16 body stays UTF-16 in the view.
   `%HH` decodes to one byte in UTF-8 (`%C3%A9` is `é`), to a character below 0x80 in UTF-16.
   A UTF-16 escape is read at the text's alignment (its characters at even offsets from the
   start of the body or stream: an LE escape starts at one, a BE escape's zero byte does); read
   one byte off it would straddle two characters (`ɜ` is `02 5C` in BE: `5C` is no `\\`).
3. `decoded_view(data)` is `data` with every escape replaced by what it decodes to, and an
   `OffsetMap` from view offsets back to `data`'s: a match in the view maps to the bytes that
   encode it (an escape is taken whole). One level; the redactor applies it up to its depth for
   escapes of escapes (`&amp;#43;`, JSON inside a JSON string: `\\\\u0026`).
4. Bounds, for streams: no escape is longer than `longest_escape(char)`, so a form of n
   characters spans at most the sum of its characters' bounds per level; `ends_in_partial_escape`
   says whether the end of some data could be the start of an escape still being written.
"""

from __future__ import annotations

import html.entities
import re
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from itertools import accumulate, compress

MAX_DIGITS = 8  # numeric references: `&#x0000002F;`; nobody pads further
LEADS = (b"\\", b"%", b"&")  # every escape starts with one of these (a cheap test for "none")
_NAMED = html.entities.html5  # 'amp;' -> '&', and legacy names without ';' ('amp' -> '&')
_SHORT = {"\\": "\\", "/": "/", '"': '"', "'": "'", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_HEX = b"[0-9A-Fa-f]"


def _json(text: str) -> str | None:
    units = [int(text[at + 2 : at + 6], 16) for at in range(0, len(text), 6)]
    if len(units) == 2:  # a surrogate pair
        return chr(0x10000 + ((units[0] - 0xD800) << 10) + (units[1] - 0xDC00))
    return chr(units[0])


def _code_point(value: int) -> str | None:
    return chr(value) if value <= 0x10FFFF and not 0xD800 <= value <= 0xDFFF else None


def _named(text: str) -> str | None:
    return _NAMED.get(text[1:])


# kind -> (first character, the rest as a function of one-character patterns, decoder of the
# escape's text). Order matters where two share a start: the surrogate pair before one `\u`.
Unit = Callable[[bytes], bytes]
ESCAPES: dict[str, tuple[bytes, Callable[[Unit], bytes], Callable[[str], str | None]]] = {
    "json-pair": (
        b"\\\\",
        lambda u: (
            u(b"u")
            + u(b"[Dd]")
            + u(b"[89ABab]")
            + u(_HEX) * 2
            + u(b"\\\\")
            + u(b"u")
            + u(b"[Dd]")
            + u(b"[C-Fc-f]")
            + u(_HEX) * 2
        ),
        _json,
    ),
    "json": (b"\\\\", lambda u: u(b"u") + u(_HEX) * 4, _json),
    "js-braced": (
        b"\\\\",
        lambda u: u(b"u") + u(b"\\{") + b"(?:%s){1,%d}" % (u(_HEX), MAX_DIGITS) + u(b"\\}"),
        lambda t: _code_point(int(t[3:-1], 16)),
    ),
    "js-hex": (b"\\\\", lambda u: u(b"x") + u(_HEX) * 2, lambda t: chr(int(t[2:], 16))),
    "short": (b"\\\\", lambda u: u(b"[\\\\/\"'bfnrt]"), lambda t: _SHORT[t[1]]),
    "percent-u": (b"%", lambda u: u(b"[uU]") + u(_HEX) * 4, lambda t: _code_point(int(t[2:], 16))),
    "percent-utf8": (
        b"%",
        lambda u: u(b"[C-Fc-f]") + u(_HEX) + b"(?:%s%s%s){1,3}" % (u(b"%"), u(b"[89ABab]"), u(_HEX)),
        lambda t: bytes.fromhex(t.replace("%", "")).decode(),
    ),  # a character's UTF-8 bytes, one escape: a UTF-16 text holds the character
    "percent": (b"%", lambda u: u(_HEX) * 2, lambda t: chr(int(t[1:], 16))),
    "html-hex": (
        b"&",
        lambda u: u(b"#") + u(b"[xX]") + b"(?:%s){1,%d}" % (u(_HEX), MAX_DIGITS) + u(b";"),
        lambda t: _code_point(int(t[3:-1], 16)),
    ),
    "html-decimal": (
        b"&",
        lambda u: u(b"#") + b"(?:%s){1,%d}" % (u(b"[0-9]"), MAX_DIGITS) + u(b";"),
        lambda t: _code_point(int(t[2:-1])),
    ),
    "html-named": (
        b"&",
        lambda u: u(b"[A-Za-z]") + b"(?:%s){0,31}" % u(b"[A-Za-z0-9]") + u(b";"),
        _named,
    ),
}


_UTF16_ONLY = {"percent-utf8"}  # in UTF-8 each `%HH` is its byte, a character cut in two too


def _unit(encoding: str) -> Unit:
    """One character of a class after an escape's first byte, as it appears in `encoding`. For
    UTF-16 that is a zero byte, then the ASCII byte: after its first ASCII byte an escape reads
    the same in either byte order (LE has one zero byte more at the end, BE one before the
    start), and `_byte_order` tells them apart."""
    return (lambda cls: b"(?:\\x00%s)" % cls) if encoding == "utf-16" else (lambda cls: cls)


# What escapes are written with after their first byte: an escape of an escape needs these.
SYNTAX = frozenset("\\%&#;xXuU{}0123456789abcdefABCDEF" + "".join(sorted({c for n in _NAMED for c in n})))


def _pattern(relevant: frozenset[str] | None = None, utf8_split: bool = False) -> re.Pattern[bytes]:
    """One regex for every escape: an alternation per first byte (so the scan only stops at
    LEADS), each a named group per (encoding, kind). With `relevant` (the characters the
    redactor's forms hold, and SYNTAX), a short escape or a named reference that decodes to a
    character none of them holds is left out: it can be in no match, nor make an escape of an
    escape (`&quot;`, `&lt;`, `\\n` in most bodies). Numeric escapes are all kept.
    `utf8_split`: the same UTF-8 alternatives in one group and no other, for `re.split`."""
    by_lead: dict[bytes, list[bytes]] = {}
    for kind, (lead, rest, _) in ESCAPES.items():
        for encoding in ("utf-16", "utf-8")[: 1 if kind in _UTF16_ONLY else 2]:
            if utf8_split and encoding == "utf-16":
                continue
            group = (
                b"?:"
                if utf8_split
                else b"?P<%s>" % f"{encoding.replace('-', '')}__{kind.replace('-', '_')}".encode()
            )
            body = (
                _restricted(kind, _unit(encoding), relevant)
                if relevant is not None
                else rest(_unit(encoding))
            )
            if body:
                by_lead.setdefault(lead, []).append(b"(%s%s)" % (group, body))
    alternation = b"|".join(lead + b"(?:%s)" % b"|".join(rests) for lead, rests in by_lead.items())
    return re.compile(b"(%s)" % alternation if utf8_split else alternation)


def _restricted(kind: str, u: Unit, relevant: frozenset[str]) -> bytes | None:
    if kind == "short":
        chars = sorted(c for c, decoded in _SHORT.items() if decoded in relevant)
        return u(b"[%s]" % re.escape("".join(chars)).encode()) if chars else None
    if kind == "html-named":
        names = sorted((n for n, v in _NAMED.items() if n.endswith(";") and set(v) <= relevant), reverse=True)
        return (
            b"(?:%s)" % b"|".join(b"".join(u(re.escape(c).encode()) for c in n) for n in names)
            if names
            else None
        )
    return ESCAPES[kind][1](u)


@cache
def pattern_for(relevant: frozenset[str]) -> re.Pattern[bytes]:
    """The escape pattern for a redactor whose forms hold `relevant` characters (see _pattern)."""
    relevant = relevant | SYNTAX | {c for lead in LEADS for c in lead.decode()}
    pattern = _pattern(relevant)
    _UTF8_SPLIT[pattern] = _pattern(relevant, utf8_split=True)
    return pattern


# Each pattern's UTF-8 alternatives as one splitting regex: a body without a zero byte holds no
# UTF-16 escape, and `re.split` cuts it at every escape in C, where a loop over matches costs
# about 2 us of Python per escape (decoded_view_utf8).
_UTF8_SPLIT: dict[re.Pattern[bytes], re.Pattern[bytes]] = {}
_PATTERN = _pattern()
_UTF8_SPLIT[_PATTERN] = _pattern(utf8_split=True)
# What an escape's bytes decode to, by (group or UTF-16 byte order, bytes): the same few escapes
# (`&amp;`, `\\"`, `\\n`) make up most of any body, and decoding one costs more than finding it.
_DECODED: dict[bytes | tuple[str, bytes], bytes | None] = {}
_CACHE_MAX = 4096
_UNKNOWN = b""
_UTF16_GROUPS = frozenset(f"utf16__{kind.replace('-', '_')}" for kind in ESCAPES)
_GROUPS = {
    f"{encoding.replace('-', '')}__{kind.replace('-', '_')}": (encoding, ESCAPES[kind][2])
    for kind in ESCAPES
    for encoding in ("utf-16", "utf-8")
}


@dataclass(frozen=True)
class OffsetMap:
    """View offsets -> offsets in the data the view decodes: one entry per decoded escape."""

    view_starts: list[int]
    view_ends: list[int]
    starts: list[int]
    ends: list[int]

    def start(self, at: int) -> int:
        """Where a match starting at view offset `at` starts in the data (a whole escape)."""
        i = bisect_right(self.view_starts, at) - 1
        if i < 0:
            return at
        return self.starts[i] if at < self.view_ends[i] else self.ends[i] + at - self.view_ends[i]

    def escape_ending_at(self, at: int) -> int:
        """Where the escape whose decoding ends at view offset `at` starts in the view (else `at`)."""
        i = bisect_left(self.view_ends, at)
        return self.view_starts[i] if i < len(self.view_ends) and self.view_ends[i] == at else at

    def escape_starting_at(self, at: int) -> int:
        """Where the escape whose decoding starts at view offset `at` ends in the view (else `at`)."""
        i = bisect_left(self.view_starts, at)
        return self.view_ends[i] if i < len(self.view_starts) and self.view_starts[i] == at else at

    def end(self, at: int) -> int:
        """Where a match ending at view offset `at` (exclusive) ends in the data."""
        i = bisect_left(self.view_starts, at) - 1
        if i < 0:
            return at
        return self.ends[i] + max(0, at - self.view_ends[i])


def decoded_view(
    data: bytes, odd: int = 0, pattern: re.Pattern[bytes] | None = None
) -> tuple[bytes, OffsetMap] | None:
    """`data` with every escape decoded (rule 3), or None when it holds none. `odd` is 1 when
    `data` starts at an odd offset of its text (which UTF-16 byte order an escape is in)."""
    if not any(lead in data for lead in LEADS):
        return None
    if b"\0" not in data:
        return _decoded_view_utf8(data, pattern or _PATTERN)
    return _decoded_view_loop(data, odd, pattern or _PATTERN)


def _decoded_view_loop(data: bytes, odd: int, pattern: re.Pattern[bytes]) -> tuple[bytes, OffsetMap] | None:
    """decoded_view of any data (UTF-16 escapes too), one match at a time."""
    view = memoryview(data)
    pieces: list[bytes | memoryview] = []
    spans: list[tuple[int, int, int, int]] = []  # (view start, start, view end, end) per escape
    cursor = size = 0  # size: the view's length so far
    cache = _DECODED
    for match in pattern.finditer(data):
        start, end = match.span()
        group = match.lastgroup
        key: bytes | tuple[str, bytes]
        if group in _UTF16_GROUPS:
            encoding, start, end = _byte_order(data, start, end, cursor, odd)
            if not encoding:
                continue
            key = (encoding, data[start:end])
        else:
            encoding, key = "utf-8", match.group()  # in UTF-8 the bytes say which escape it is
        decoded = cache.get(key, _UNKNOWN)
        if decoded is _UNKNOWN:
            if len(cache) > _CACHE_MAX:
                cache.clear()
            text = data[start:end].decode(encoding)
            decoded = cache[key] = _decode(text, _GROUPS[str(group)][1], encoding)
        if decoded is None:
            continue
        pieces.append(view[cursor:start])
        pieces.append(decoded)
        size += start - cursor
        spans.append((size, start, size + len(decoded), end))
        size += len(decoded)
        cursor = end
    if not spans:
        return None
    pieces.append(view[cursor:])
    view_starts, starts, view_ends, ends = (list(column) for column in zip(*spans, strict=True))
    return b"".join(pieces), OffsetMap(view_starts, view_ends, starts, ends)


def _decoded_view_utf8(data: bytes, pattern: re.Pattern[bytes]) -> tuple[bytes, OffsetMap] | None:
    """decoded_view of data that holds no zero byte, so no UTF-16 escape: the same escapes (the
    same alternatives in the same order), cut out by `re.split`, decoded by their bytes, and
    their offsets summed in C (`accumulate`), not in a loop per escape."""
    parts = _UTF8_SPLIT[pattern].split(data)  # text, escape, text, escape, ..., text
    escapes = parts[1::2]
    cache = _DECODED
    decoded = [cache.get(escape, _UNKNOWN) for escape in escapes]
    for index in [i for i, value in enumerate(decoded) if value is _UNKNOWN]:
        if len(cache) > _CACHE_MAX:
            cache.clear()
        group = pattern.fullmatch(escapes[index]).lastgroup  # type: ignore[union-attr]  # split found it
        decoded[index] = cache[escapes[index]] = _decode(
            escapes[index].decode(), _GROUPS[str(group)][1], "utf-8"
        )
    kept = [value is not None for value in decoded]  # `&#xD800;` is no escape: it stays as it is
    if not any(kept):
        return None
    ends = list(accumulate(map(len, parts)))  # part i ends at ends[i]: escape k is part 2k + 1
    parts[1::2] = [escape if value is None else value for escape, value in zip(escapes, decoded, strict=True)]
    view_ends = list(accumulate(map(len, parts)))
    return b"".join(parts), OffsetMap(
        list(compress(view_ends[0::2], kept)),
        list(compress(view_ends[1::2], kept)),
        list(compress(ends[0::2], kept)),
        list(compress(ends[1::2], kept)),
    )


def _byte_order(data: bytes, lead: int, end: int, cursor: int, odd: int) -> tuple[str, int, int]:
    """A UTF-16 escape matched from its first ASCII byte at `lead`: which byte order it is in,
    and its span. UTF-16 has its characters at even offsets, so an LE escape's first byte
    is at one, a BE escape's zero byte before it: the other reading would straddle characters."""
    if (lead + odd) % 2 == 0:  # LE; at the end of the data, its last byte may be still to come
        return ("utf-16-le", lead, end + 1) if data[end : end + 1] == b"\0" else ("", 0, 0)
    return ("utf-16-be", lead - 1, end) if lead - 1 >= cursor and data[lead - 1] == 0 else ("", 0, 0)


def _decode(text: str, decode: Callable[[str], str | None], encoding: str) -> bytes | None:
    try:
        character = decode(text)
    except (KeyError, ValueError):
        return None
    if character is None:
        return None
    if text[0] == "%" and len(text) == 3 and encoding == "utf-8":
        return bytes([ord(character)])  # a byte of UTF-8 (perhaps of a character cut in two)
    if text[0] == "%" and len(text) == 3 and ord(character) >= 0x80:
        return None  # in UTF-16, one byte of a UTF-8 character is no character
    return character.encode(encoding, "surrogatepass")


def _longest_named() -> dict[str, int]:
    longest: dict[str, int] = {}
    for name, value in _NAMED.items():
        for character in value:
            longest[character] = max(longest.get(character, 0), len(name) + 1)
    return longest


_LONGEST_NAMED = _longest_named()
# `&#x` + MAX_DIGITS + `;`, or a surrogate pair `\uD83D\uDE00` for a character beyond the BMP.
_LONGEST_NUMERIC = 3 + MAX_DIGITS + 1
# The longest escape of any character: a named reference (`&CounterClockwiseContourIntegral;`).
LONGEST_ESCAPE = max(_LONGEST_NUMERIC, 12, *_LONGEST_NAMED.values())


@cache
def longest_escape(character: str) -> int:
    """The most characters one escape of `character` takes (rule 4), at least 1 (itself)."""
    return max(_LONGEST_NUMERIC, 12 if ord(character) > 0xFFFF else 0, _LONGEST_NAMED.get(character, 0))


# The characters escapes are written with: an escape of an escape has each of them escaped.
ESCAPE_ALPHABET = "\\/\"'bfnrtuxXU{}%&#;0123456789ABCDEFabcdef" + "".join(
    sorted({c for name in _NAMED for c in name})
)
LONGEST_ESCAPE_OF_ESCAPE_CHARACTER = max(map(longest_escape, ESCAPE_ALPHABET))


_PARTIAL_PIECES = (
    b"\\\\(?:u(?:%(h)s{0,3}|\\{%(h)s{0,8})?|u%(h)s{4}\\\\(?:u%(h)s{0,3})?|x%(h)s?)?"
    b"|%%(?:[uU]%(h)s{0,3}|%(h)s)?"
    b"|&(?:#(?:[xX]%(h)s{0,8}|[0-9]{0,8})|[A-Za-z][A-Za-z0-9]{0,31})?"
) % {b"h": _HEX}
_PARTIAL = re.compile(b"(?:%s)\\Z" % _PARTIAL_PIECES)
# What a value's end may be the beginning of, with what follows it: a partial escape, or a
# complete one that the next can extend (a high surrogate `\\uD83D` before its low half, and in
# UTF-16 a UTF-8 lead `%C3` before `%A9`). A superset, used only to cut values (boundary forms).
_ESCAPE_HEAD = re.compile(
    b"(?:%s)|" % _PARTIAL_PIECES
    + b"\\\\u[Dd][89ABab]%(h)s{2}|%%[C-Fc-f]%(h)s(?:%%[89ABab]%(h)s){0,2}" % {b"h": _HEX}
)
# What text can be the end of an escape that began before it (`%` + `ab`, `&#x` + `41;`, `\\` +
# `u0041`, `&am` + `p;`, `\\` + `n`, `\\u{41` + `}`, `\\uD83D` + `\\uDE00`, `%C3` + `%A9`): a
# superset, used only to cut values (boundary forms).
_ESCAPE_TAIL = re.compile(
    b"(?:[uU]\\{?|[xX]|\\{|#[xX]?)?%(h)s{1,%(n)d}[;}]?|%(h)s{0,%(n)d}[;}]|[A-Za-z0-9#]{0,32};"
    b"|[\\\\/\"'bfnrt]|\\\\u[Dd][C-Fc-f]%(h)s{2}|(?:%%[89ABab]%(h)s){1,3}" % {b"h": _HEX, b"n": MAX_DIGITS}
)
LONGEST_ESCAPE_TAIL = 40


def is_escape_head(data: bytes) -> bool:
    """May `data` be the beginning of an escape that what follows it completes or extends
    (`%4`, `\\u00`, `\\uD83D`)?"""
    return _ESCAPE_HEAD.fullmatch(data) is not None


def is_escape_tail(data: bytes) -> bool:
    """May `data` be the end of an escape that began before it (`ab` after `%`)?"""
    return _ESCAPE_TAIL.fullmatch(data) is not None


def ends_in_partial_escape(data: bytes) -> bool:
    """Could the end of `data` be the beginning of an escape whose rest is still to come?
    (In UTF-8, or in UTF-16 read as ASCII with the zero bytes taken out.)"""
    tail = data[-4 * 40 :]
    if _PARTIAL.search(tail):
        return True
    squeezed = tail.replace(b"\0", b"")  # UTF-16 of ASCII, either byte order, cut anywhere
    if squeezed == tail:
        return False
    # an LE escape may lack only its last zero byte: then it looks complete, one byte early
    cut_short = tail[-1:] != b"\0" and _PARTIAL.search(tail[:-1].replace(b"\0", b"")) is not None
    return cut_short or _PARTIAL.search(squeezed) is not None
