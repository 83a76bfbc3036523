"""Redaction of known secret values, in one pass over the data.

Rules:
1. Built once per credential set: every value is expanded into the forms it commonly travels
   in (raw, JSON-escaped, URL-encoded, base64 and base64url at every byte alignment, and for
   `user:pass` or base64(`user:pass`) values the password alone), and all forms go into one
   Aho-Corasick automaton (leftmost-longest), so cost does not grow with the number of secrets.
2. Base64 at every alignment: a value inside a larger base64 blob (`Basic base64(user:TOKEN)`)
   encodes differently depending on its offset mod 3; each alignment's stable middle characters
   are a pattern of their own, so the value is found whatever precedes it.
3. Streams: `stream()` holds back at most (longest pattern - 1) bytes, so a value split across
   chunks is caught, and the output of any chunking equals `redact()` of the whole.
4. Fail towards redaction: a derived form shorter than MIN_DERIVED_LENGTH is dropped (it would
   blank ordinary text), but a raw value is always redacted, however short.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from urllib.parse import quote, quote_plus

import ahocorasick_rs

REDACTED = b"[REDACTED]"
MIN_DERIVED_LENGTH = 6


class Redactor:
    """Replaces known secret values and their encodings with `[REDACTED]`."""

    def __init__(self, values: Iterable[str], replacement: bytes = REDACTED) -> None:
        patterns: set[bytes] = set()
        for value in values:
            patterns |= secret_forms(value)
        self.replacement = replacement
        self.pattern_count = len(patterns)
        self.max_pattern_length = max(map(len, patterns), default=0)
        self._automaton = (
            ahocorasick_rs.BytesAhoCorasick(
                list(patterns), matchkind=ahocorasick_rs.MatchKind.LeftmostLongest
            )
            if patterns
            else None
        )

    def __repr__(self) -> str:
        return f"Redactor({self.pattern_count} patterns)"

    def redact(self, data: bytes) -> bytes:
        return self._redact_until(data, len(data))[0]

    def redact_text(self, text: str) -> str:
        # Patterns are whole UTF-8 strings, so a match never starts or ends inside a character.
        return self.redact(text.encode()).decode()

    def stream(self) -> RedactingStream:
        return RedactingStream(self)

    def _redact_until(self, data: bytes, settled: int) -> tuple[bytes, int]:
        """Redact matches starting before `settled`; returns (output, bytes of `data` consumed).

        A match that starts before `settled` is complete when `settled <= len(data) - longest + 1`
        (callers guarantee this), so everything up to the end of the last such match, or up to
        `settled` if that is later, is final.
        """
        if self._automaton is None or not data:
            return data[:settled], settled
        view = memoryview(data)  # slices of a view are not copies; join copies once
        out: list[bytes | memoryview] = []
        cursor = 0
        for _, start, end in self._automaton.find_matches_as_indexes(data):
            if start >= settled:
                break
            out += (view[cursor:start], self.replacement)
            cursor = end
        if not out and settled == len(data):
            return data, settled  # nothing to replace: no copy
        consumed = max(cursor, settled)
        out.append(view[cursor:consumed])
        return b"".join(out), consumed


class RedactingStream:
    """Feed chunks, get redacted output; `flush()` at the end returns what was held back."""

    def __init__(self, redactor: Redactor) -> None:
        self._redactor = redactor
        self._held = b""
        self._hold = max(redactor.max_pattern_length - 1, 0)

    def feed(self, chunk: bytes) -> bytes:
        data = self._held + chunk
        settled = len(data) - self._hold
        if settled <= 0:
            self._held = data
            return b""
        out, consumed = self._redactor._redact_until(data, settled)
        self._held = data[consumed:]
        return out

    def flush(self) -> bytes:
        out = self._redactor.redact(self._held)
        self._held = b""
        return out


def secret_forms(value: str) -> set[bytes]:
    """Every byte form of `value` the redactor looks for."""
    if not value:
        return set()
    raw = value.encode()
    texts = {value, *_password_parts(value)}
    forms = {raw}
    for text in texts:
        forms |= _text_encodings(text)
        forms |= _base64_cores(text.encode())
    return {form for form in forms if form == raw or len(form) >= MIN_DERIVED_LENGTH}


def _text_encodings(text: str) -> set[bytes]:
    url = quote(text, safe="")
    encoded = {
        text,
        json.dumps(text)[1:-1],
        json.dumps(text, ensure_ascii=False)[1:-1],
        url,
        _lower_hex(url),
        quote_plus(text),
        _lower_hex(quote_plus(text)),
    }
    return {form.encode() for form in encoded}


def _lower_hex(percent_encoded: str) -> str:
    parts = percent_encoded.split("%")
    return parts[0] + "".join("%" + part[:2].lower() + part[2:] for part in parts[1:])


def _base64_cores(data: bytes) -> set[bytes]:
    """The base64 characters that encode only `data`, at each of the three byte alignments.

    At alignment k the value starts k bytes into a 3-byte group; a base64 character covers
    6 bits, and those that fall wholly inside the value's bits do not depend on its
    neighbours. Alignment 0 also yields the complete, padded encoding.
    """
    cores = {base64.b64encode(data), base64.urlsafe_b64encode(data)}
    for k in range(3):
        encoded = base64.b64encode(bytes(k) + data)
        first = -(-8 * k // 6)  # first character whose bits start inside the value
        last = (8 * (k + len(data))) // 6  # characters before this end inside the value
        core = encoded[first:last]
        cores |= {core, core.translate(_URLSAFE)}
    return cores


_URLSAFE = bytes.maketrans(b"+/", b"-_")


def _password_parts(value: str) -> set[str]:
    """For `user:pass` and base64(`user:pass`) values, also the decoded pair and the password."""
    parts: set[str] = set()
    candidates = [value]
    decoded = _decode_basic(value)
    if decoded is not None:
        parts.add(decoded)
        candidates.append(decoded)
    for candidate in candidates:
        _, colon, password = candidate.partition(":")
        if colon and len(password) >= MIN_DERIVED_LENGTH:
            parts.add(password)
    return parts


def _decode_basic(value: str) -> str | None:
    """`user:pass` if `value` is base64 of a printable `user:pass`, else None."""
    try:
        text = base64.b64decode(value, validate=True).decode()
    except ValueError:
        return None
    return text if ":" in text and text.isprintable() else None
