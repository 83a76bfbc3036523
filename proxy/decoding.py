"""Content codings the scrubber reads through: streaming decoders for gzip, deflate, br, zstd.

Rules:
1. A sandbox holding a credential asks upstream for `identity`; an origin may answer compressed
   anyway, and the client would decompress a credential the redactor never saw. So the proxy
   decodes (every coding of the chain, last applied first), scrubs, and sends the body decoded.
   A coding without a decoder here is refused by the caller (`UnknownCoding`), never passed on.
2. Memory stays bounded: each decoder is fed one upstream chunk at a time and hands out its
   output in pieces of at most `PIECE` bytes. A body that decodes to more than
   `MAX_EXPANSION` times its encoded size (plus `SLACK`) is a decompression bomb: `BodyRefused`.
3. The decoders are the standard library's zlib, the brotli and zstd modules mitmproxy itself
   depends on (`brotli`, `backports.zstd` before Python 3.14).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from typing import Protocol

import brotli

try:
    from compression import zstd  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # Python < 3.14
    from backports import zstd  # type: ignore[no-redef,import-not-found,unused-ignore]

PIECE = 64 * 1024
MAX_EXPANSION = 200
SLACK = 16 * 1024 * 1024


class UnknownCoding(ValueError):
    """A content coding the proxy cannot decode (so it cannot scrub the body)."""


class BodyRefused(ValueError):
    """The body cannot be decoded safely (corrupt, or a decompression bomb)."""


class _Decoder(Protocol):
    def feed(self, data: bytes) -> Iterator[bytes]: ...

    def finish(self) -> Iterator[bytes]: ...


class _Zlib:
    def __init__(self, wbits: int) -> None:
        self._inflate = zlib.decompressobj(wbits)

    def feed(self, data: bytes) -> Iterator[bytes]:
        while data:
            piece = self._inflate.decompress(data, PIECE)
            data = self._inflate.unconsumed_tail
            if piece:
                yield piece
            if self._inflate.eof:
                return

    def finish(self) -> Iterator[bytes]:
        if not self._inflate.eof:
            raise BodyRefused("compressed body ended early")
        yield from ()


class _Deflate:
    """`deflate` is meant to be zlib-wrapped, but some servers send raw deflate: tell by the header."""

    def __init__(self) -> None:
        self._inner: _Zlib | None = None
        self._head = b""

    def feed(self, data: bytes) -> Iterator[bytes]:
        if self._inner is None:
            self._head += data
            if len(self._head) < 2:
                return
            zlib_wrapped = (self._head[0] & 0x0F) == 8 and int.from_bytes(self._head[:2]) % 31 == 0
            self._inner = _Zlib(zlib.MAX_WBITS if zlib_wrapped else -zlib.MAX_WBITS)
            data, self._head = self._head, b""
        yield from self._inner.feed(data)

    def finish(self) -> Iterator[bytes]:
        if self._inner is None:
            raise BodyRefused("deflate body ended early")
        yield from self._inner.finish()


class _Brotli:
    def __init__(self) -> None:
        self._decoder = brotli.Decompressor()

    def feed(self, data: bytes) -> Iterator[bytes]:
        piece = self._decoder.process(data, output_buffer_limit=PIECE)
        while True:
            if piece:
                yield piece
            if self._decoder.can_accept_more_data():
                return
            piece = self._decoder.process(b"", output_buffer_limit=PIECE)

    def finish(self) -> Iterator[bytes]:
        yield from self.feed(b"")  # the decoder may still hold output it was not asked for
        if not self._decoder.is_finished():
            raise BodyRefused("brotli body ended early")


class _Zstd:
    def __init__(self) -> None:
        self._decoder = zstd.ZstdDecompressor()

    def feed(self, data: bytes) -> Iterator[bytes]:
        while True:
            if self._decoder.eof:  # a second frame: start over (RFC 8878 allows concatenation)
                data = self._decoder.unused_data + data
                self._decoder = zstd.ZstdDecompressor()
            piece = self._decoder.decompress(data, PIECE)
            data = b""
            if piece:
                yield piece
            if self._decoder.needs_input and not self._decoder.eof:
                return
            if self._decoder.eof and not self._decoder.unused_data:
                return

    def finish(self) -> Iterator[bytes]:
        if not self._decoder.eof:
            raise BodyRefused("zstd body ended early")
        yield from ()


DECODERS: dict[str, Callable[[], _Decoder]] = {
    "gzip": lambda: _Zlib(16 + zlib.MAX_WBITS),
    "x-gzip": lambda: _Zlib(16 + zlib.MAX_WBITS),
    "deflate": _Deflate,
    "br": _Brotli,
    "zstd": _Zstd,
}


def codings(header: str) -> list[str]:
    """The codings of a Content-Encoding value, in the order they were applied (identity dropped)."""
    return [c for c in (part.strip().lower() for part in header.split(",")) if c and c != "identity"]


class BodyDecoder:
    """Undoes a chain of content codings, chunk by chunk; `__call__(b"")` ends the body."""

    def __init__(self, applied: list[str]) -> None:
        unknown = [coding for coding in applied if coding not in DECODERS]
        if unknown:
            raise UnknownCoding(f"content-encoding {', '.join(unknown)} cannot be decoded by the proxy")
        self._chain = [DECODERS[coding]() for coding in reversed(applied)]
        self._encoded = 0
        self._decoded = 0

    def __call__(self, chunk: bytes) -> Iterator[bytes]:
        self._encoded += len(chunk)
        pieces: Iterator[bytes] = iter([chunk]) if chunk else iter(())
        for decoder in self._chain:
            pieces = _through(decoder, pieces, end=not chunk)
        for piece in pieces:
            self._decoded += len(piece)
            if self._decoded > self._encoded * MAX_EXPANSION + SLACK:
                raise BodyRefused(f"body expands more than {MAX_EXPANSION}x: refused as a decompression bomb")
            yield piece


def _through(decoder: _Decoder, pieces: Iterator[bytes], end: bool) -> Iterator[bytes]:
    try:
        for piece in pieces:
            yield from decoder.feed(piece)
        if end:
            yield from decoder.finish()
    except (zlib.error, brotli.error, zstd.ZstdError) as exc:
        raise BodyRefused(f"compressed body is corrupt ({type(exc).__name__})") from None
