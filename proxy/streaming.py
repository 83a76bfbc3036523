"""Streaming: bodies flow through as they arrive, counted, and scrubbed of the sandbox's secrets.

Rules:
1. Every allowed request body and every response body is streamed (never buffered whole), so
   SSE and LLM token streams arrive as the origin sends them and memory stays flat; the
   exceptions are a request whose binding substitutes placeholders in the body, and rule 6.
2. Closed world for a sandbox that holds a credential: every byte the proxy sends it passes the
   redactor, or it is not sent. The channels read here: the status line's reason phrase, header
   names (a header whose name holds a secret is dropped) and values, trailers, every body
   whatever its type, through the content codings `decoding` undoes (the body is sent decoded)
   and in every charset whose ASCII range is ASCII or UTF-16 (the redactor knows UTF-16 forms).
   Refused with the proxy's own 502 (audited, `detail` says why): a content coding it cannot
   decode, a charset it cannot read, a partial (206/Content-Range) response. Requests of such a
   sandbox ask for `identity` and lose `Range`/`If-Range`, so an origin has no reason to answer
   in pieces: six 12-byte ranges would each be shorter than the secret and pass unrecognised.
   WebSocket messages and control frames: `websocket.py`; proxy-made error pages: `errorpages.py`.
3. A scrubbed body may change length, so its content-length is dropped: HTTP/1.1 frames it as
   chunked, HTTP/1.0 by closing the connection, HTTP/2 by DATA frames up to END_STREAM.
4. A body that turns out corrupt or a decompression bomb half-way is cut short there (its head
   is already sent): nothing unscrubbed goes out, and the audit record's detail says so.
5. WebSocket message history is trimmed to the last message (mitmproxy would keep all of it).
6. A request is refused, not forwarded, when its framing is invalid: an HTTP/2 or HTTP/3 request
   carrying a credential whose DATA disagrees with its `content-length` is found only when the
   stream ends (h2 checks at END_STREAM, or when DATA overruns), and a streamed request's head,
   with the credential, would have left before that. So such a request that declares a length
   of at most CHECKED_BODY_MAX is read whole first (mitmproxy's protocol layer refuses the
   mismatch and nothing goes upstream); a longer one is streamed without its `content-length`,
   so upstream frames it by what was really sent (chunked or END_STREAM) and a cut-off stream
   reaches the origin as an incomplete message, never as a complete one of another length.
   HTTP/1.1 framing is checked by mitmproxy before the head is handed on.
"""

from __future__ import annotations

import codecs
import json
import string
from collections.abc import Callable, Iterable

from mitmproxy import http
from mitmproxy.net.http.headers import parse_content_type

from sandgate.policy import Reason
from sandgate.proxy.credentials import SandboxCredentials
from sandgate.proxy.decoding import BodyDecoder, BodyRefused, UnknownCoding, codings
from sandgate.proxy.scrubbing import BodyScrub
from sandgate.proxy.state import BODY_KEY, FLOW_KEY, SCRUB_KEY, RequestState

BODYLESS_STATUS = (204, 304)
RANGE_HEADERS = ("range", "if-range")
CHECKED_BODY_MAX = 16 * 1024 * 1024  # rule 6: read whole before a credentialed HTTP/2 request goes
UTF16_CODECS = frozenset({"utf-16", "utf-16-le", "utf-16-be"})
ASCII_PROBE = string.ascii_letters + string.digits + "-_.~+/=:%\\\"'{}[],"


def whole_identity(headers: http.Headers) -> None:
    """Ask for the whole response, uncoded: what a request of a sandbox that holds secrets sends
    (idempotent: injection signs a request after applying it, this addon applies it again)."""
    headers["accept-encoding"] = "identity"  # decoding is the fallback, not the plan
    for name in RANGE_HEADERS:
        headers.pop(name, None)  # whole responses only: a piece shorter than a secret hides it


class StreamingAddon:
    def requestheaders(self, flow: http.HTTPFlow) -> None:
        request_state: RequestState | None = flow.metadata.get(FLOW_KEY)
        if flow.response or request_state is None:
            return
        credentials = request_state.sandbox.credentials
        if credentials.holds_secrets:
            flow.metadata[SCRUB_KEY] = credentials
            whole_identity(flow.request.headers)
        if BODY_KEY in flow.metadata or _read_whole_first(flow, request_state):
            return

        def count_out(chunk: bytes) -> bytes:
            request_state.bytes_out += len(chunk)
            return chunk

        flow.request.stream = count_out

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        request_state: RequestState | None = flow.metadata.get(FLOW_KEY)
        response = flow.response
        if response is None or request_state is None or not request_state.verdict.allowed:
            return  # a refusal is the proxy's own answer: nothing to scrub, nothing to stream
        credentials: SandboxCredentials | None = flow.metadata.get(SCRUB_KEY)
        scrubber = credentials.scrubber if credentials else None
        if scrubber is None:
            response.stream = _counting(request_state, None)
            return
        has_body = _has_body(flow)
        refusal = _unreadable(response, has_body)
        if refusal:
            _refuse(flow, request_state, refusal)
            return
        response.reason = scrubber.redactor.redact_text(response.reason)
        scrubber.headers(response.headers)
        if not has_body:
            response.stream = _counting(request_state, None)
            return
        decoder = BodyDecoder(codings(response.headers.get("content-encoding", "")))
        response.headers.pop("content-encoding", None)  # sent decoded
        _frame_without_length(flow)
        response.stream = _counting(request_state, _scrubbed(request_state, decoder, scrubber.body()))

    def response(self, flow: http.HTTPFlow) -> None:
        credentials: SandboxCredentials | None = flow.metadata.get(SCRUB_KEY)
        scrubber = credentials.scrubber if credentials else None
        if scrubber is not None and flow.response is not None and flow.response.trailers:
            scrubber.headers(flow.response.trailers)  # sent after this hook

    def websocket_message(self, flow: http.HTTPFlow) -> None:
        assert flow.websocket is not None
        messages = flow.websocket.messages
        message = messages[-1]
        credentials: SandboxCredentials | None = flow.metadata.get(SCRUB_KEY)
        scrubber = credentials.scrubber if credentials else None
        if scrubber is not None and not message.from_client:
            message.content = scrubber.redactor.redact(message.content)  # mitmproxy re-frames it
        del messages[:-1]


def _read_whole_first(flow: http.HTTPFlow, request_state: RequestState) -> bool:
    """Rule 6: should this request's body be read (and its framing checked) before it goes?"""
    request = flow.request
    if not request_state.bindings or not (request.is_http2 or request.is_http3):
        return False
    declared = request.headers.get("content-length")
    if declared is None:
        return False  # framed by END_STREAM alone: nothing to disagree with
    if declared.isdigit() and int(declared) <= CHECKED_BODY_MAX:
        return True
    del request.headers["content-length"]  # upstream frames it by the bytes really sent
    return False


def _unreadable(response: http.Response, has_body: bool) -> str | None:
    """Why the scrubber cannot judge this response, or None if it can."""
    if response.status_code == 206 or "content-range" in response.headers:
        return "partial response (206/Content-Range): a piece may hold part of a secret"
    if not has_body:
        return None
    try:
        BodyDecoder(codings(response.headers.get("content-encoding", "")))
    except UnknownCoding as exc:
        return str(exc)
    return _unreadable_charset(response.headers.get("content-type", ""))


def _unreadable_charset(content_type: str) -> str | None:
    parsed = parse_content_type(content_type)
    charset = parsed[2].get("charset", "").strip("\"' ") if parsed else ""
    if not charset:
        return None
    try:
        codec = codecs.lookup(charset).name
    except LookupError:
        return f"charset {charset!r} is unknown to the proxy"
    if codec in UTF16_CODECS:
        return None
    try:
        ascii_compatible = ASCII_PROBE.encode(codec) == ASCII_PROBE.encode("ascii")
    except UnicodeError:
        ascii_compatible = False
    return None if ascii_compatible else f"charset {charset!r} is not one the scrubber reads"


def _refuse(flow: http.HTTPFlow, request_state: RequestState, why: str) -> None:
    """Answer the proxy's own 502 instead (the head is not sent yet); the origin's body is dropped."""
    response = flow.response
    assert response is not None
    body = (
        json.dumps({"error": "response refused", "reason": Reason.RESPONSE_REFUSED, "detail": why}) + "\n"
    ).encode()
    response.status_code, response.reason = 502, "Bad Gateway"
    response.headers = http.Headers(content_type="application/json", content_length=str(len(body)))
    response.trailers = None
    request_state.detail = f"{Reason.RESPONSE_REFUSED}: {why}"

    def drop_upstream_body(chunk: bytes) -> bytes:
        request_state.bytes_in += len(chunk)
        return b"" if chunk else body

    response.stream = drop_upstream_body


def _scrubbed(
    request_state: RequestState, decoder: BodyDecoder, scrub: BodyScrub
) -> Callable[[bytes], list[bytes]]:
    failed = False

    def stream(chunk: bytes) -> list[bytes]:
        nonlocal failed
        if failed:
            return []
        out: list[bytes] = []
        try:
            for piece in decoder(chunk):
                out += scrub(piece)
        except BodyRefused as exc:
            failed = True
            request_state.detail = f"{Reason.RESPONSE_REFUSED}: {exc}; body cut short"
            return out
        if not chunk:
            out += scrub(b"")  # the end: what the scrubber held back
        return out

    return stream


def _counting(
    request_state: RequestState, scrub: Callable[[bytes], list[bytes]] | None
) -> Callable[[bytes], bytes | Iterable[bytes]]:
    def stream(chunk: bytes) -> bytes | Iterable[bytes]:
        request_state.bytes_in += len(chunk)
        return scrub(chunk) if scrub is not None else chunk  # mitmproxy signals the end with b""

    return stream


def _frame_without_length(flow: http.HTTPFlow) -> None:
    """The body's length is about to change: let the client's protocol frame it instead."""
    response = flow.response
    assert response is not None
    if "content-length" not in response.headers:
        return
    del response.headers["content-length"]
    if flow.request.http_version == "HTTP/1.1":
        response.headers["transfer-encoding"] = "chunked"
    elif flow.request.http_version == "HTTP/1.0":
        response.headers["connection"] = "close"  # the end of the connection ends the body


def _has_body(flow: http.HTTPFlow) -> bool:
    response = flow.response
    assert response is not None
    return (
        flow.request.method.upper() != "HEAD"
        and response.status_code >= 200
        and response.status_code not in BODYLESS_STATUS
    )
