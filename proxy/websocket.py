"""WebSocket frames mitmproxy relays without a hook: ping and pong payloads, close reasons.

mitmproxy hands every WebSocket *message* (text or binary, fragmented or not, decompressed from
permessage-deflate by wsproto on its way in) to the `websocket_message` hook, where
streaming.py scrubs it whole; it relays control frames from one side to the other with no hook
at all. `install()` puts `ScrubbingWebsocketLayer` in the place of mitmproxy's layer: for a flow
of a sandbox holding credentials (`SCRUB_KEY`), the events read from the server side pass
`scrub_control` first. A ping/pong payload is redacted; if the redacted payload no longer fits
a control frame (125 bytes), the connection is closed instead (1008, policy violation). A close
reason is redacted and cut to the 123 bytes a close frame holds, at a character boundary.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import wsproto.events
from mitmproxy.proxy import events, layer
from mitmproxy.proxy.layers import websocket
from mitmproxy.proxy.utils import expect

from sandgate.proxy.scrubbing import Scrubber
from sandgate.proxy.state import SCRUB_KEY

CONTROL_PAYLOAD_MAX = 125
CLOSE_REASON_MAX = 123
POLICY_VIOLATION = 1008


def scrub_control(event: wsproto.events.Event, scrubber: Scrubber) -> wsproto.events.Event:
    """The event with its control payload scrubbed (messages are the hook's job)."""
    if isinstance(event, (wsproto.events.Ping, wsproto.events.Pong)):
        payload = bytes(event.payload)
        scrubbed = scrubber.redactor.redact(payload)
        if scrubbed == payload:
            return event
        if len(scrubbed) > CONTROL_PAYLOAD_MAX:
            return wsproto.events.CloseConnection(POLICY_VIOLATION, "control frame held a secret")
        return type(event)(payload=scrubbed)
    if isinstance(event, wsproto.events.CloseConnection) and event.reason:
        reason = scrubber.redactor.redact_text(event.reason)
        cut = reason.encode("utf-8", "surrogateescape")[:CLOSE_REASON_MAX]
        return wsproto.events.CloseConnection(event.code, cut.decode("utf-8", "ignore"))
    return event


class ScrubbingWebsocketLayer(websocket.WebsocketLayer):
    @expect(events.Start)
    def _start_scrubbing(self, event: events.Event) -> layer.CommandGenerator[None]:
        yield from super().start(event)  # builds client_ws and server_ws
        credentials = self.flow.metadata.get(SCRUB_KEY)
        if credentials is not None:
            self.server_ws.events = _scrubbed(self.server_ws.events, credentials)  # type: ignore[method-assign,assignment]

    _handle_event = _start_scrubbing


def _scrubbed(events_of: Callable[[], Iterator[Any]], credentials: Any) -> Callable[[], Iterator[Any]]:
    def scrubbed_events() -> Iterator[Any]:
        for event in events_of():
            scrubber = credentials.scrubber  # current: a value stored mid-connection counts
            yield scrub_control(event, scrubber) if scrubber is not None else event

    return scrubbed_events


def install() -> None:
    """Make mitmproxy's HTTP layer upgrade to `ScrubbingWebsocketLayer`."""
    websocket.WebsocketLayer = ScrubbingWebsocketLayer  # type: ignore[misc]
