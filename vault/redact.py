"""Redaction of known secret values, in one pass over the data.

Rules:
1. Built once per credential set: every value is expanded into the forms it commonly travels
   in (raw, JSON-escaped with and without `\\/`, URL-encoded with every common set of characters
   left as they are (`/`, the URI reserved set, JavaScript's encodeURI/encodeURIComponent),
   upper- or lower-case hex, base64 and base64url at every byte alignment, and for `user:pass`
   or base64(`user:pass`) values the password alone), each of those also in UTF-16 LE and BE
   (a body in UTF-16 carries them so), and all forms go into one Aho-Corasick automaton
   (leftmost-longest), so cost does not grow with the number of secrets.
2. Base64 at every alignment: a value inside a larger base64 blob (`Basic base64(user:TOKEN)`)
   encodes differently depending on its offset mod 3; each alignment's stable middle characters
   are a pattern of their own, so the value is found whatever precedes it.
3. Streams: `stream()` holds back at most (longest pattern) bytes, so a value split across
   chunks is caught (and rule 4 sees the form one byte later), and the output of any chunking
   equals `redact()` of the whole.
4. A UTF-16 form is replaced by `[REDACTED]` in the same UTF-16 form, so the body stays
   well-formed UTF-16 (the replacement has an even length: alignment is kept). UTF-16 text has
   its characters at even offsets: a UTF-16 form matched at an odd offset gives way to a UTF-16
   form that starts one byte later and reaches at least as far. (A secret of one repeated
   character, `00000000` after `İ` in UTF-16-BE, also reads as the LE form one byte early; taken
   there, the replacement split `İ` and left the secret's last character.) Offsets count from
   the start of the data, or of the stream.
5. Fail towards redaction: a derived form shorter than MIN_DERIVED_LENGTH is dropped (it would
   blank ordinary text), but a raw value is always redacted, however short.
6. Runs of zero bytes are stepped over, not searched: the UTF-16 forms hold zero bytes (a
   UTF-16-BE form of ASCII text starts with one), so on a long zero run the automaton never gets
   back to its start state and its prefilter never skips: 1 MiB of zeros took 10 ms with one
   secret, 38 ms with three (binary files, sparse files and padding are full of them). A run of
   ZERO_RUN or more zeros cannot hold a match, only the ends of two (no form is all zeros or has
   more than ZERO_RUN // 2 zeros in a row: else nothing is skipped), so the automaton searches
   the pieces between such runs, each run's outer `margin` bytes included; the matches are
   exactly those of one search over the whole.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable, Iterator
from urllib.parse import quote, quote_plus

import ahocorasick_rs

REDACTED = b"[REDACTED]"
MIN_DERIVED_LENGTH = 6
UTF16 = ("utf-16-le", "utf-16-be")
# Characters URL encoders commonly leave as they are: none, `/` (Python's quote default), the
# URI reserved set (a whole URL quoted at once), and JavaScript's encodeURIComponent / encodeURI.
URL_SAFE_SETS = ("", "/", ":/?#[]@!$&'()*+,;=", "!'()*", ";,/?:@&=+$#!'()*")
ZERO_RUN = 256  # zero bytes in a row that are stepped over, not searched (rule 6)
_ZEROS = memoryview(bytes(64 * 1024))


class Redactor:
    """Replaces known secret values and their encodings with `[REDACTED]`."""

    def __init__(self, values: Iterable[str], replacement: bytes = REDACTED) -> None:
        forms: dict[bytes, str] = {}
        for value in values:
            forms.update(encoded_forms(value))
        patterns = sorted(forms)
        self.replacement = replacement
        # A UTF-16 form is replaced in UTF-16, so the text around it stays well-formed.
        self._replacements = [replacement.decode().encode(forms[pattern]) for pattern in patterns]
        self._utf16 = [forms[pattern] in UTF16 for pattern in patterns]
        self.pattern_count = len(patterns)
        self.max_pattern_length = max(map(len, patterns), default=0)
        self._automaton = (
            ahocorasick_rs.BytesAhoCorasick(patterns, matchkind=ahocorasick_rs.MatchKind.LeftmostLongest)
            if patterns
            else None
        )
        # The most zeros in a row inside a form: what a match may take of a zero run (rule 6).
        margin = max((_longest_zero_run(pattern) for pattern in patterns), default=0)
        inside_a_run = 2 * margin >= ZERO_RUN or any(not pattern.strip(b"\0") for pattern in patterns)
        self._zero_margin = None if inside_a_run else margin  # None: search everything

    def __repr__(self) -> str:
        return f"Redactor({self.pattern_count} patterns)"

    def redact(self, data: bytes) -> bytes:
        return self._redact_until(data, len(data), 0)[0]

    def redact_text(self, text: str) -> str:
        # surrogateescape: header text may hold bytes that are not UTF-8 (mitmproxy keeps them
        # so), and a UTF-16 form may match across UTF-8 characters; both round-trip unchanged.
        return self.redact(text.encode("utf-8", "surrogateescape")).decode("utf-8", "surrogateescape")

    def stream(self) -> RedactingStream:
        return RedactingStream(self)

    def _redact_until(self, data: bytes, settled: int, offset: int) -> tuple[bytes, int]:
        """Redact matches starting before `settled`; returns (output, bytes of `data` consumed).
        `offset` is where `data` starts in the stream (rule 4 needs its parity).

        A match that starts before `settled` is complete when `settled <= len(data) - longest + 1`
        (callers guarantee this), so everything up to the end of the last such match, or up to
        `settled` if that is later, is final.
        """
        if self._automaton is None or not data:
            return data[:settled], settled
        view = memoryview(data)  # slices of a view are not copies; join copies once
        out: list[bytes | memoryview] = []
        cursor = 0
        replacements = self._replacements
        for index, start, end in self._aligned(data, offset % 2):
            if start >= settled:
                break
            out += (view[cursor:start], replacements[index])
            cursor = end
        if not out and settled == len(data):
            return data, settled  # nothing to replace: no copy
        consumed = max(cursor, settled)
        out.append(view[cursor:consumed])
        return b"".join(out), consumed

    def _aligned(self, data: bytes, odd: int) -> Iterator[tuple[int, int, int]]:
        """The matches to replace, in order: the automaton's, with rule 4's alignment. `odd` is 1
        when `data` starts at an odd offset."""
        matches = self._matches(data)
        pending: tuple[int, int, int] | None = None
        while (current := pending or next(matches, None)) is not None:
            pending = None
            later = self._utf16_one_byte_later(data, *current, odd)
            if later is None:
                yield current
                continue
            pending = next(matches, None)
            # Unless the later form would cut into the next match: then the automaton's stands.
            # (A next match that starts at or after the later form's end is the one a search from
            # there finds, so the automaton's matches go on unchanged.)
            yield current if pending is not None and pending[1] < later[2] else later

    def _utf16_one_byte_later(
        self, data: bytes, index: int, start: int, end: int, odd: int
    ) -> tuple[int, int, int] | None:
        """For a UTF-16 form at an odd offset, a UTF-16 form starting one byte later and
        reaching at least as far, if there is one (rule 4)."""
        if not self._utf16[index] or (start + odd) % 2 == 0:
            return None
        after = start + 1
        for later, later_start, later_end in self._matches(data[after : end + self.max_pattern_length]):
            if later_start == 0 and after + later_end >= end and self._utf16[later]:
                return later, after, after + later_end
            return None
        return None

    def _matches(self, data: bytes) -> Iterator[tuple[int, int, int]]:
        """The automaton's matches in `data`, in order, without searching long zero runs (rule 6)."""
        assert self._automaton is not None
        margin = self._zero_margin
        if margin is None:
            yield from self._automaton.find_matches_as_indexes(data)
            return
        view, size, start = memoryview(data), len(data), 0
        while start < size:
            run = data.find(_ZEROS[:ZERO_RUN], start)
            end = size if run < 0 else run + margin
            for index, match_start, match_end in self._automaton.find_matches_as_indexes(view[start:end]):
                yield index, start + match_start, start + match_end
            if run < 0:
                return
            start = _zero_run_end(data, run + ZERO_RUN) - margin


class RedactingStream:
    """Feed chunks, get redacted output; `flush()` at the end returns what was held back."""

    def __init__(self, redactor: Redactor) -> None:
        self._redactor = redactor
        self._held = b""
        self._held_at = 0  # where the held bytes start in the stream
        self._hold = redactor.max_pattern_length  # rule 3: a match, and rule 4's byte after it

    def feed(self, chunk: bytes) -> bytes:
        data = self._held + chunk
        settled = len(data) - self._hold
        if settled <= 0:
            self._held = data
            return b""
        out, consumed = self._redactor._redact_until(data, settled, self._held_at)
        self._held = data[consumed:]
        self._held_at += consumed
        return out

    def flush(self) -> bytes:
        out = self._redactor._redact_until(self._held, len(self._held), self._held_at)[0]
        self._held_at += len(self._held)  # the scrubber flushes mid-body too, then feeds on
        self._held = b""
        return out


def _longest_zero_run(pattern: bytes) -> int:
    return max((len(run) for run in re.findall(rb"\x00+", pattern)), default=0)


def _zero_run_end(data: bytes, at: int) -> int:
    """Where the zero bytes from `at` on end (`at` if data[at] is not zero): galloping, then
    halving steps, each one C-level prefix comparison."""
    step, end, size = 64, at, len(data)
    while end + step <= size and data.startswith(_ZEROS[:step], end):
        end += step
        step = min(step * 2, len(_ZEROS))
    while step > 1:
        step //= 2
        if end + step <= size and data.startswith(_ZEROS[:step], end):
            end += step
    return end


def secret_forms(value: str) -> set[bytes]:
    """Every byte form of `value` the redactor looks for."""
    return set(encoded_forms(value))


def encoded_forms(value: str) -> dict[bytes, str]:
    """Every byte form of `value` the redactor looks for -> the charset it is written in."""
    if not value:
        return {}
    raw = value.encode()
    texts = {value, *_password_parts(value)}
    utf8 = {raw}
    for text in texts:
        utf8 |= _text_encodings(text)
        utf8 |= _base64_cores(text.encode())
    forms = {form.decode().encode(utf16): utf16 for form in utf8 for utf16 in UTF16}
    forms.update(dict.fromkeys(utf8, "utf-8"))
    return {form: cs for form, cs in forms.items() if form == raw or len(form) >= MIN_DERIVED_LENGTH}


def _text_encodings(text: str) -> set[bytes]:
    escaped = {json.dumps(text)[1:-1], json.dumps(text, ensure_ascii=False)[1:-1]}
    escaped |= {form.replace("/", "\\/") for form in escaped}  # PHP, some JSON writers: `\/`
    urls = {quote(text, safe=safe) for safe in URL_SAFE_SETS}
    urls |= {quote_plus(text, safe=safe) for safe in URL_SAFE_SETS}
    urls |= {_lower_hex(url) for url in urls}
    return {form.encode() for form in {text, *escaped, *urls}}


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
