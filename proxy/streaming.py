"""Streaming: bodies flow through as they arrive, counted, and scrubbed of the sandbox's secrets.

Rules:
1. Every allowed request body and every response body is streamed (never buffered whole), so
   SSE and LLM token streams arrive as the origin sends them and memory stays flat; the one
   exception is a request whose binding substitutes placeholders in the body.
2. Every response to a sandbox with a bound credential is scrubbed, whatever its request carried
   (an origin can reflect or leak a value it got elsewhere): headers always, bodies when they are
   text (`TEXT_TYPES`, or no content-type) and not compressed (such sandboxes ask upstream for
   `identity`). Binary types (images, archives, octet-stream, ...) are not scrubbed: scanning
   them costs throughput and a secret inside them is not reliably findable anyway.
3. A scrubbed body may change length, so its content-length is dropped: HTTP/1.1 frames it as
   chunked, HTTP/1.0 by closing the connection, HTTP/2 by DATA frames up to END_STREAM.
4. WebSocket message history is trimmed to the last message (mitmproxy would keep all of it),
   and messages from the server are scrubbed like bodies.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from mitmproxy import http

from sandgate.proxy.injection import BODY_KEY
from sandgate.proxy.state import FLOW_KEY, RequestState

TEXT_TYPES = (
    "text/",
    "application/json",
    "application/javascript",
    "application/xml",
    "+json",
    "+xml",
    "application/x-www-form-urlencoded",
    "application/x-ndjson",
)
BODYLESS_STATUS = (204, 304)


class StreamingAddon:
    def requestheaders(self, flow: http.HTTPFlow) -> None:
        request_state: RequestState | None = flow.metadata.get(FLOW_KEY)
        if flow.response or request_state is None:
            return
        if request_state.sandbox.credentials.scrubber is not None:
            flow.request.headers["accept-encoding"] = "identity"  # compressed bodies cannot be scrubbed
        if BODY_KEY in flow.metadata:
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
        scrubber = request_state.sandbox.credentials.scrubber
        scrub: Callable[[bytes], list[bytes]] | None = None
        if scrubber is not None:
            scrubber.headers(response.headers)
            if _has_body(flow) and _is_text(response):
                scrub = scrubber.body()
                _frame_without_length(flow)
        response.stream = _counting(request_state, scrub)

    def websocket_message(self, flow: http.HTTPFlow) -> None:
        assert flow.websocket is not None
        messages = flow.websocket.messages
        message = messages[-1]
        request_state: RequestState | None = flow.metadata.get(FLOW_KEY)
        scrubber = request_state.sandbox.credentials.scrubber if request_state else None
        if scrubber is not None and not message.from_client:
            message.content = scrubber.redactor.redact(message.content)
        del messages[:-1]


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


def _is_text(response: http.Response) -> bool:
    content_type = response.headers.get("content-type", "").lower()
    encoding = response.headers.get("content-encoding", "identity").lower()
    # Compressed bodies cannot be scanned in flight; requests ask for identity when it matters.
    return encoding in ("identity", "") and (not content_type or any(t in content_type for t in TEXT_TYPES))
