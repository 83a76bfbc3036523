"""Redaction of known secret values, in one pass over the data.

Rules:
1. Built once per credential set: every value's forms (`sandgate.vault.forms`, which owns the
   closed world of forms) go into one Aho-Corasick automaton (leftmost-longest), so cost does
   not grow with the number of secrets. Per-character escapes (JSON `\\u0026`, `%2F`, `&#x2F;`,
   `&amp;` ...) are not patterns: a value has exponentially many mixed forms. Data that holds an
   escape lead (`\\`, `%`, `&`) is also searched through its decoded views
   (`sandgate.vault.escapes`), up to ESCAPE_DEPTH levels, and a match there replaces the bytes
   that encode it (matches of all views that overlap are replaced as one).
2. Base64 at every alignment: a value inside a larger base64 blob (`Basic base64(user:TOKEN)`)
   encodes differently depending on its offset mod 3; each alignment's stable middle characters
   are a pattern of their own, so the value is found whatever precedes it.
3. Streams: `stream()` holds back at most `hold` bytes (the longest span a form can take once
   escaped, `forms.span_bound`), and only the longest pattern's length where the held bytes
   hold no escape lead (`settled`), so a value split across chunks is caught (and rule 4 sees
   the form one byte later), and the output of any chunking equals `redact()` of the whole.
4. A UTF-16 form is replaced by `[REDACTED]` in the same UTF-16 form, so the body stays
   well-formed UTF-16 (the replacement has an even length: alignment is kept). UTF-16 text has
   its characters at even offsets: a UTF-16 form matched at an odd offset gives way to a UTF-16
   form that starts one byte later and reaches at least as far. (A secret of one repeated
   character, `00000000` after `İ` in UTF-16-BE, also reads as the LE form one byte early; taken
   there, the replacement split `İ` and left the secret's last character.) A run of such forms
   back to back moves together (a secret, then a core of it, in LE text read as BE one byte
   early). Offsets count from the start of the data, or of the stream.
5. Fail towards redaction: a derived form shorter than `forms.MIN_DERIVED_LENGTH` is dropped (it
   would blank ordinary text), but a raw value is always redacted, however short, also escaped.
6. Runs of zero bytes are stepped over, not searched: the UTF-16 forms hold zero bytes (a
   UTF-16-BE form of ASCII text starts with one), so on a long zero run the automaton never gets
   back to its start state and its prefilter never skips: 1 MiB of zeros took 10 ms with one
   secret, 38 ms with three (binary files, sparse files and padding are full of them). A run of
   ZERO_RUN or more zeros cannot hold a match, only the ends of two (no form is all zeros or has
   more than ZERO_RUN // 2 zeros in a row: else nothing is skipped), so the automaton searches
   the pieces between such runs, each run's outer `margin` bytes included; the matches are
   exactly those of one search over the whole.
7. Early release (the one rule for when a stream may send bytes; the proxy uses it, it keeps no
   copy): holding `hold` bytes would delay the end of every SSE event or token chunk until the
   next one, so after each chunk the held bytes are released at once unless `may_continue`: a
   suffix of them, or of one of their decoded views, is a proper prefix of a form, or they end
   in what may be the start of an escape. Release never changes the output (rule 3).
8. Merged ends: a core (`forms.boundary_forms`, a value cut where an escape written beside it
   may take its start or end) that matches in a decoded view is extended over the escape it
   merged into, on the side it was cut: `%ab12\\/cd34` is replaced whole, not as `%ab` and a
   core, so no character of the value is left. `hold` counts that escape (`span_bound`'s
   `cuts`), and its lead lies inside the held window, so streams still equal `redact()`.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from functools import cached_property

import ahocorasick_rs

from sandgate.vault.escapes import LEADS, OffsetMap, decoded_view, ends_in_partial_escape, pattern_for
from sandgate.vault.forms import (
    ESCAPE_DEPTH,
    UTF16,
    boundary_forms,
    form_text,
    normal_forms,
    serialised_forms,
    span_bound,
)

REDACTED = b"[REDACTED]"
ZERO_RUN = 256  # zero bytes in a row that are stepped over, not searched (rule 6)
_ZEROS = memoryview(bytes(64 * 1024))


class Redactor:
    """Replaces known secret values and their encodings with `[REDACTED]`."""

    def __init__(self, values: Iterable[str], replacement: bytes = REDACTED) -> None:
        forms: dict[bytes, str] = {}
        cuts: dict[bytes, tuple[bool, bool]] = {}
        for value in values:
            forms.update(normal_forms(value))
            for core, (charset, cut_start, cut_end) in boundary_forms(value).items():
                forms.setdefault(core, charset)
                cuts[core] = (cut_start, cut_end)
        patterns = sorted(forms)
        self._patterns = patterns
        self.replacement = replacement
        # A UTF-16 form is replaced in UTF-16, so the text around it stays well-formed.
        self._replacements = [replacement.decode().encode(forms[pattern]) for pattern in patterns]
        self._utf16 = [forms[pattern] in UTF16 for pattern in patterns]
        self.pattern_count = len(patterns)
        self.max_pattern_length = max(map(len, patterns), default=0)
        self._cuts = [cuts.get(pattern, (False, False)) for pattern in patterns]
        self.hold = max(
            (span_bound(p, forms[p], sum(cut)) for p, cut in zip(patterns, self._cuts, strict=True)),
            default=0,
        )
        # Escapes of characters no form holds are not decoded (`escapes.pattern_for`).
        held = frozenset(c for pattern in patterns for c in form_text(pattern, forms[pattern]))
        self._escapes = pattern_for(held)
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
        for index, start, end in self._spans(data, offset % 2):
            if start >= settled:
                break
            out += (view[cursor:start], replacements[index])
            cursor = end
        if not out and settled == len(data):
            return data, settled  # nothing to replace: no copy
        consumed = max(cursor, settled)
        out.append(view[cursor:consumed])
        return b"".join(out), consumed

    def settled(self, data: bytes) -> int:
        """How much of `data` no form still to come can reach back into (rule 3). A form spans at
        most `hold` bytes, one without an escape at most `max_pattern_length` (the raw text before
        a form's first escape is shorter than that too): so up to the first escape lead of the last
        `hold` bytes, less the longest pattern (and rule 4's byte after a match). Without a lead
        there, a stream holds what it held before escapes were decoded."""
        size = len(data)
        window = max(0, size - self.hold)
        first_lead = min((at for lead in LEADS if (at := data.find(lead, window)) >= 0), default=size)
        return max(window, first_lead - self.max_pattern_length)

    def may_continue(self, tail: bytes, odd: int = 0) -> bool:
        """Could a form begin in `tail` and go on after its end? (rule 7; `odd`: rule 4)"""
        if self._automaton is None or not tail:
            return False
        if not any(lead in tail for lead in LEADS):
            return self._begins_a_form(tail)  # no escape, nor the start of one
        view = tail
        for depth in range(ESCAPE_DEPTH + 1):
            if self._begins_a_form(view):
                return True
            if depth == ESCAPE_DEPTH:
                return False
            if ends_in_partial_escape(view):
                return True
            decoded = decoded_view(view, odd, self._escapes)
            if decoded is None:
                return False
            view = decoded[0]
        return False

    def _begins_a_form(self, data: bytes) -> bool:
        tail = data[max(0, len(data) - self.max_pattern_length + 1) :]  # a proper prefix is shorter
        if not tail:
            return False
        first_bytes = self._prefix_index[0]
        if tail[-1] in first_bytes:
            return True
        if tail[-2:] not in self._prefix_index[1]:
            return False  # the one check most chunks need: no suffix of 2+ bytes can be a prefix
        return any(tail[i] in first_bytes and self._is_prefix(tail[i:]) for i in range(len(tail) - 1))

    @cached_property
    def _prefix_index(self) -> tuple[frozenset[int], frozenset[bytes]]:
        """The first bytes of the forms, and every two bytes in a row in a proper prefix (a prefix
        of 2+ bytes ends with one of them): built for the first stream, not by every Redactor."""
        pairs = frozenset(p[n - 2 : n] for p in self._patterns for n in range(2, len(p)))
        return frozenset(p[0] for p in self._patterns), pairs

    def _is_prefix(self, data: bytes) -> bool:
        at = bisect_left(self._patterns, data)
        return at < len(self._patterns) and self._patterns[at].startswith(data)

    def _spans(self, data: bytes, odd: int) -> Iterator[tuple[int, int, int]]:
        """The spans to replace, in order: the automaton's matches in `data` (rule 4 applied),
        and those in its decoded views mapped back, overlapping ones joined (rule 1)."""
        if not any(lead in data for lead in LEADS):
            yield from self._aligned(data, odd)
            return
        found = list(self._aligned(data, odd))
        view, maps = data, list[OffsetMap]()
        for _ in range(ESCAPE_DEPTH):
            decoded = decoded_view(view, odd, self._escapes)
            if decoded is None:
                break
            view, offsets = decoded
            maps.append(offsets)
            for index, start, end in self._aligned(view, odd):
                start, end = self._with_merged_escapes(index, start, end, offsets)
                for back in reversed(maps):
                    start, end = back.start(start), back.end(end)
                found.append((index, start, end))
        yield from self._joined(found)

    def _with_merged_escapes(self, index: int, start: int, end: int, offsets: OffsetMap) -> tuple[int, int]:
        """A core's match, with the escape its cut merged into (rule 8), in view offsets."""
        cut_start, cut_end = self._cuts[index]
        if cut_start:
            start = offsets.escape_ending_at(start)
        if cut_end:
            end = offsets.escape_starting_at(end)
        return start, end

    def _joined(self, spans: list[tuple[int, int, int]]) -> Iterator[tuple[int, int, int]]:
        """Spans in order, overlapping ones joined (the first one's replacement stands). A UTF-16
        replacement keeps the text's alignment only over an even span: a joined span of odd
        length starts with a form rule 4 left one byte early (it would have cut into the next
        match), so it starts one byte later, replaced as the member that starts there."""
        group: list[tuple[int, int, int]] = []
        for span in sorted(spans, key=lambda span: (span[1], -span[2])):
            if group and span[1] >= max(end for _, _, end in group):
                yield self._one_span(group)
                group = []
            group.append(span)
        if group:
            yield self._one_span(group)

    def _one_span(self, group: list[tuple[int, int, int]]) -> tuple[int, int, int]:
        index, start, _ = group[0]
        end = max(end for _, _, end in group)
        if len(group) == 1 or not self._utf16[index] or (end - start) % 2 == 0:
            return index, start, end
        later = next((m for m in group if m[1] % 2 != start % 2 and self._utf16[m[0]]), None)
        return (later[0], start + 1, end) if later else (index, start, end)

    def _aligned(self, data: bytes, odd: int) -> Iterator[tuple[int, int, int]]:
        """The matches to replace, in order: the automaton's, with rule 4's alignment. `odd` is 1
        when `data` starts at an odd offset."""
        matches = list(self._matches(data))
        laters = [self._utf16_one_byte_later(data, *match, odd) for match in matches]
        # A form moves one byte later unless it would then cut into the next match where that one
        # stands (itself moved, or not): decided from the last match back, so a run of forms read
        # one byte early (UTF-16 text read in the other byte order) moves whole. A next match at
        # or after the later form's end is the one a search from there finds.
        next_start: int | None = None
        for at in reversed(range(len(matches))):
            later = laters[at]
            if later is not None and (next_start is None or next_start >= later[2]):
                matches[at] = later
            next_start = matches[at][1]
        yield from matches

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

    def feed(self, chunk: bytes) -> bytes:
        """The redacted output that is final: everything but what may begin a form (rule 7)."""
        data = self._held + chunk
        settled = self._redactor.settled(data)
        out = b""
        if settled > 0:
            out, consumed = self._redactor._redact_until(data, settled, self._held_at)
            data = data[consumed:]
            self._held_at += consumed
        self._held = data
        if data and not self._redactor.may_continue(data, self._held_at % 2):
            out += self.flush()
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
    """What mainstream serialisers write `value` as, and the automaton's forms of it: examples
    from the closed world the redactor covers (`sandgate.vault.forms`)."""
    return serialised_forms(value)
