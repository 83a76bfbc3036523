"""The response scrubber alone: streamed output equals whole-body redaction for any chunking,
text that cannot begin a secret is released at once (the vault's rule: tests/vault), and headers
are scrubbed in place."""

from __future__ import annotations

import base64
import itertools

from hypothesis import given, settings
from hypothesis import strategies as st
from mitmproxy.http import Headers

from sandgate.proxy.scrubbing import Scrubber
from tests.support.tiers import examples

SECRET = "sk-live-5e2f9a0c7d1b"
SCRUBBER = Scrubber([SECRET, "user:pa55word-xyz"])
SECRET_FORMS = [SECRET.encode(), base64.b64encode(SECRET.encode()), b"pa55word-xyz"]


def streamed(chunks: list[bytes]) -> tuple[bytes, list[bytes]]:
    body = SCRUBBER.body()
    outputs = [b"".join(body(chunk)) for chunk in chunks]
    return b"".join(outputs) + b"".join(body(b"")), outputs


@settings(max_examples=examples(300), deadline=None)
@given(
    parts=st.lists(
        st.one_of(
            st.sampled_from(SECRET_FORMS), st.binary(max_size=12), st.sampled_from([b"sk-", b"c2st", b"\n"])
        ),
        max_size=12,
    ),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8),
)
def test_any_chunking_gives_the_whole_body_redaction(parts: list[bytes], cuts: list[int]) -> None:
    whole = b"".join(parts)
    bounds = sorted({0, len(whole), *(min(c, len(whole)) for c in cuts)})
    chunks = [whole[a:b] for a, b in itertools.pairwise(bounds)]
    out, _ = streamed(chunks)
    assert out == SCRUBBER.redactor.redact(whole)
    for form in SECRET_FORMS:
        assert form not in out


def test_text_that_cannot_begin_a_secret_is_released_at_once() -> None:
    event = b"id: 0\ndata: event 0\n\n"
    _, outputs = streamed([event, b"data: tail sk-", b"live-5e2f9a0c7d1b done\n"])
    assert outputs[0] == event  # nothing held back: an SSE event ends in bytes no secret starts with
    assert outputs[1] == b""  # "sk-" may be the start of the secret: held back
    assert outputs[2] == b"data: tail [REDACTED] done\n"  # released as soon as it cannot be


def test_empty_output_is_no_chunk_at_all() -> None:
    body = SCRUBBER.body()
    assert body(b"sk-li") == []  # an empty chunk would end an HTTP/1 chunked body early


def test_headers_are_scrubbed_in_place() -> None:
    headers = Headers(x_reflected=f"Bearer {SECRET}", server="origin")
    headers.add("set-cookie", f"t={SECRET}")
    headers.add("set-cookie", "other=1")
    SCRUBBER.headers(headers)
    assert headers["x-reflected"] == "Bearer [REDACTED]" and headers["server"] == "origin"
    assert headers.get_all("set-cookie") == ["t=[REDACTED]", "other=1"]


# -- the channels of issue 15, in process -----------------------------------------------------

import gzip  # noqa: E402
import zlib  # noqa: E402

import brotli  # noqa: E402
import pytest  # noqa: E402
import wsproto.events  # noqa: E402

from sandgate.proxy import errorpages  # noqa: E402
from sandgate.proxy.decoding import BodyDecoder, BodyRefused, UnknownCoding, codings, zstd  # noqa: E402
from sandgate.proxy.streaming import _unreadable_charset  # noqa: E402
from sandgate.proxy.websocket import CONTROL_PAYLOAD_MAX, scrub_control  # noqa: E402

ENCODERS = {
    "gzip": gzip.compress,
    "deflate": zlib.compress,
    "br": brotli.compress,
    "zstd": zstd.compress,
}


@settings(max_examples=examples(120), deadline=None)
@given(
    secret=st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_/+=", min_size=10, max_size=32),
    chain=st.lists(st.sampled_from(sorted(ENCODERS)), min_size=1, max_size=2),
    filler=st.binary(max_size=300),
    chunk=st.integers(min_value=1, max_value=97),
)
def test_any_coding_chain_is_decoded_then_scrubbed(
    secret: str, chain: list[str], filler: bytes, chunk: int
) -> None:
    scrubber = Scrubber([secret])
    encoded = filler + secret.encode() + filler
    for coding in chain:
        encoded = ENCODERS[coding](encoded)
    decoder, scrub = BodyDecoder(codings(", ".join(chain))), scrubber.body()
    out = b""
    for start in range(0, len(encoded), chunk):
        for piece in decoder(encoded[start : start + chunk]):
            out += b"".join(scrub(piece))
    out += b"".join(piece for end in decoder(b"") for piece in scrub(end)) + b"".join(scrub(b""))
    assert secret.encode() not in out and out == scrubber.redactor.redact(filler + secret.encode() + filler)


def test_unknown_corrupt_and_bomb_bodies_are_refused() -> None:
    with pytest.raises(UnknownCoding):
        BodyDecoder(["compress"])
    with pytest.raises(BodyRefused):
        list(BodyDecoder(["gzip"])(b"not gzip at all"))
    bomb = gzip.compress(bytes(64 * 1024 * 1024))
    with pytest.raises(BodyRefused, match="decompression bomb"):
        for _ in BodyDecoder(["gzip"])(bomb):
            pass


@pytest.mark.parametrize(
    ("content_type", "readable"),
    [
        ("text/plain", True),
        ("text/plain; charset=utf-8", True),
        ("text/html; charset=ISO-8859-1", True),
        ("application/json; charset=UTF-16LE", True),
        ("text/plain; charset=utf-16", True),
        ("text/plain; charset=utf-32", False),
        ("text/plain; charset=utf-7", False),
        ("text/plain; charset=cp037", False),  # EBCDIC
        ("text/plain; charset=no-such-charset", False),
    ],
)
def test_charsets_the_scrubber_reads(content_type: str, readable: bool) -> None:
    assert (_unreadable_charset(content_type) is None) is readable


def test_header_names_and_trailers_lose_secrets() -> None:
    headers = Headers([(f"x-{SECRET}".encode(), b"v"), (b"x-ok", SECRET.encode()), (b"x-plain", b"fine")])
    SCRUBBER.headers(headers)
    assert headers.fields == ((b"x-ok", b"[REDACTED]"), (b"x-plain", b"fine"))


def test_websocket_control_frames_are_scrubbed_or_closed() -> None:
    ping = scrub_control(wsproto.events.Ping(payload=f"p {SECRET}".encode()), SCRUBBER)
    assert isinstance(ping, wsproto.events.Ping) and bytes(ping.payload) == b"p [REDACTED]"
    pong = scrub_control(wsproto.events.Pong(payload=b"nothing here"), SCRUBBER)
    assert bytes(pong.payload) == b"nothing here"
    close = scrub_control(wsproto.events.CloseConnection(1000, f"bye {SECRET} " + "x" * 200), SCRUBBER)
    assert isinstance(close, wsproto.events.CloseConnection) and close.code == 1000
    assert close.reason.startswith("bye [REDACTED]") and len(close.reason.encode()) <= 123
    # a secret shorter than "[REDACTED]" in a full payload: the scrubbed frame would not fit
    short = Scrubber(["abc123"])
    full = scrub_control(wsproto.events.Ping(payload=b"abc123" * (CONTROL_PAYLOAD_MAX // 6)), short)
    assert isinstance(full, wsproto.events.CloseConnection) and full.code == 1008


def test_error_pages_never_quote_the_message() -> None:
    body = errorpages.error_body(502, f"Bad HTTP response line: b'HTTP/1.1 200 {SECRET}'")
    assert SECRET.encode() not in body and b'"status": 502' in body
