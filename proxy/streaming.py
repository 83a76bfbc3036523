"""Streaming: bodies flow through as they arrive, counted, and scrubbed of the sandbox's secrets.

Rules:
1. Every allowed request body and every response body is streamed (never buffered whole), so
   SSE and LLM token streams arrive as the origin sends them and memory stays flat; the one
   exception is a request whose binding substitutes placeholders in the body.
2. Response headers always, and text bodies of responses to requests that carried a credential,
   pass through the sandbox's redactor (a sandbox with no bound credentials has none and pays
   nothing). The body redactor holds back at most the longest secret form minus one byte, so a
   value split across chunks is still caught; that is why bodies of other responses (which the
   origin answered without ever being sent a credential) stream without it.
3. WebSocket message history is trimmed to the last message (mitmproxy would keep all of it),
   and text messages from the server are scrubbed like bodies.
"""

from __future__ import annotations

from collections.abc import Callable

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


class StreamingAddon:
    def requestheaders(self, flow: http.HTTPFlow) -> None:
        request_state: RequestState | None = flow.metadata.get(FLOW_KEY)
        if flow.response or request_state is None:
            return
        if request_state.sandbox.credentials.redactor is not None:
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
        if response is None or request_state is None:
            return
        redactor = request_state.sandbox.credentials.redactor
        if redactor is not None:
            for name, value in list(response.headers.items(multi=True)):
                if redactor.redact_text(value) != value:
                    response.headers.set_all(
                        name, [redactor.redact_text(v) for v in response.headers.get_all(name)]
                    )
        carried_credential = bool(request_state.bindings)
        scrub = (
            redactor.stream() if redactor is not None and carried_credential and _is_text(response) else None
        )
        if scrub is not None and "content-length" in response.headers:
            # Scrubbing may change the length: frame the body by chunks (HTTP/1) or frames (HTTP/2).
            del response.headers["content-length"]
            if not flow.request.is_http2:
                response.headers["transfer-encoding"] = "chunked"
        response.stream = _counting(
            request_state, scrub.feed if scrub else None, scrub.flush if scrub else None
        )

    def websocket_message(self, flow: http.HTTPFlow) -> None:
        assert flow.websocket is not None
        messages = flow.websocket.messages
        message = messages[-1]
        request_state: RequestState | None = flow.metadata.get(FLOW_KEY)
        redactor = request_state.sandbox.credentials.redactor if request_state else None
        if redactor is not None and not message.from_client:
            message.content = redactor.redact(message.content)
        del messages[:-1]


def _counting(
    request_state: RequestState, feed: Callable[[bytes], bytes] | None, flush: Callable[[], bytes] | None
) -> Callable[[bytes], bytes | list[bytes]]:
    def stream(chunk: bytes) -> bytes | list[bytes]:
        request_state.bytes_in += len(chunk)
        if feed is None or flush is None:
            return chunk
        scrubbed = feed(chunk) if chunk else flush()  # mitmproxy signals the end with b""
        # The scrubber may hold a whole small chunk back; an empty bytes would go out as an empty
        # chunk, which in HTTP/1 chunked framing ("0\r\n\r\n") ends the body early. No chunks instead.
        return scrubbed if scrubbed else []

    return stream


def _is_text(response: http.Response) -> bool:
    content_type = response.headers.get("content-type", "").lower()
    encoding = response.headers.get("content-encoding", "identity").lower()
    # Compressed bodies cannot be scanned in flight; requests ask for identity when it matters.
    return encoding in ("identity", "") and (not content_type or any(t in content_type for t in TEXT_TYPES))
