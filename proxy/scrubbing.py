"""Scrubbing a sandbox's secret values out of the responses it gets: head fields whole, bodies
while they stream.

Rules:
1. A `Scrubber` holds the values of the credentials a sandbox's bindings name (built with the
   vault's `Redactor`, which also finds their encoded forms). A sandbox without bound credentials
   has none and pays nothing.
2. Streaming: the vault's `RedactingStream` holds back up to (longest secret form - 1) bytes, so
   a value split across chunks is still caught. Holding that much would delay the end of every
   SSE event or token chunk until the next one arrives, so after each chunk the held bytes are
   released at once unless some suffix of them could be the start of a secret form (the forms
   are `sandgate.vault.secret_forms`, the ones the redactor is built from). The output is still
   exactly `Redactor.redact` of the whole body.
3. A chunk that scrubs to nothing yields no chunk at all: mitmproxy frames an empty HTTP/1 chunk
   as the terminating one.
"""

from __future__ import annotations

from collections.abc import Iterable

from mitmproxy.http import Headers

from sandgate.vault import Redactor, secret_forms


class Scrubber:
    def __init__(self, values: Iterable[str]) -> None:
        values = list(values)
        forms = {form for value in values for form in secret_forms(value)}
        self.redactor = Redactor(values)
        self.hold = self.redactor.max_pattern_length  # what RedactingStream may hold
        # Every proper prefix of every form: what the tail of a chunk may be the start of.
        self._prefixes = frozenset(form[:n] for form in forms for n in range(1, len(form)))
        self._first_bytes = frozenset(form[0] for form in forms)
        # Every two bytes in a row in a proper prefix: a prefix of 2+ bytes ends with one of them.
        self._pairs = frozenset(form[n - 2 : n] for form in forms for n in range(2, len(form)))
        # Early release is only sound for exactly the forms the redactor looks for; should the
        # vault ever derive others, fall back to its own (longer) hold rather than risk a leak.
        self._releases_early = len(forms) == self.redactor.pattern_count

    def __repr__(self) -> str:
        return f"Scrubber({self.redactor!r})"

    def headers(self, headers: Headers) -> None:
        """Scrub header (or trailer) fields in place: a value holding a secret form is redacted; a
        field whose *name* holds one is dropped (a name has no room for a valid replacement)."""
        redact = self.redactor.redact
        fields = tuple((name, redact(value)) for name, value in headers.fields if redact(name) == name)
        if fields != headers.fields:
            headers.fields = fields

    def body(self) -> BodyScrub:
        """A fresh scrubber for one streamed body; feed it chunks, then b"" at the end."""
        return BodyScrub(self)

    def may_continue(self, tail: bytes) -> bool:
        """Could some suffix of `tail` be the beginning of a secret form?"""
        if not self._releases_early or tail[-1:] in self._prefixes:
            return True
        if tail[-2:] not in self._pairs:
            return False  # the one check most chunks need: no suffix of 2+ bytes can be a prefix
        first_bytes, prefixes = self._first_bytes, self._prefixes
        return any(tail[i] in first_bytes and tail[i:] in prefixes for i in range(len(tail)))


class BodyScrub:
    """One body's scrubbing state; call it with each chunk (mitmproxy's `response.stream`)."""

    def __init__(self, scrubber: Scrubber) -> None:
        self._scrubber = scrubber
        self._stream = scrubber.redactor.stream()
        self._hold = scrubber.hold
        self._tail = b""  # the last input bytes since the stream last held nothing

    def __call__(self, chunk: bytes) -> list[bytes]:
        out = self._feed(chunk) if chunk else self._stream.flush()  # b"" marks the end
        return [out] if out else []

    def _feed(self, chunk: bytes) -> bytes:
        out = self._stream.feed(chunk)
        tail = (self._tail + chunk[-self._hold :])[-self._hold :] if self._hold else b""
        if tail and self._scrubber.may_continue(tail):
            self._tail = tail
            return out
        self._tail = b""
        return out + self._stream.flush()
