"""Scrubbing a sandbox's secret values out of the responses it gets: head fields whole, bodies
while they stream.

Rules:
1. A `Scrubber` holds the values of the credentials a sandbox's bindings name (built with the
   vault's `Redactor`, which also finds their encoded forms). A sandbox without bound credentials
   has none and pays nothing.
2. Streaming: the vault's `RedactingStream` holds back what may still turn out to be part of a
   secret form and releases the rest at once (its rule 7), so the end of an SSE event or token
   chunk is not delayed until the next one. Which forms exist and when held bytes may go are the
   vault's rules alone (`sandgate.vault.redact`); this module keeps no copy of them. The output
   is exactly `Redactor.redact` of the whole body.
3. A chunk that scrubs to nothing yields no chunk at all: mitmproxy frames an empty HTTP/1 chunk
   as the terminating one.
"""

from __future__ import annotations

from collections.abc import Iterable

from mitmproxy.http import Headers

from sandgate.vault import RedactingStream, Redactor


class Scrubber:
    def __init__(self, values: Iterable[str]) -> None:
        self.redactor = Redactor(values)

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
        return BodyScrub(self.redactor.stream())


class BodyScrub:
    """One body's scrubbing state; call it with each chunk (mitmproxy's `response.stream`)."""

    def __init__(self, stream: RedactingStream) -> None:
        self._stream = stream

    def __call__(self, chunk: bytes) -> list[bytes]:
        out = self._stream.feed(chunk) if chunk else self._stream.flush()  # b"" marks the end
        return [out] if out else []
