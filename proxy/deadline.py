"""Header deadline: a client connection must finish its first request's headers within
`ProxyConfig.header_timeout` seconds, or be closed (slowloris).

Rules:
1. The clock starts when a registered sandbox's TCP connection is accepted and stops at the
   first `requestheaders` (any HTTP/1 request, HTTP/2 stream or upgrade, allowed or refused) or
   when the connection is passed through (then nothing more is parsed). A CONNECT does not stop
   it: the request inside the tunnel must arrive in time too.
2. mitmproxy's own `tcp_timeout` is an idle timeout, which a client dribbling one byte at a time
   never hits; this deadline is absolute.
3. When it fires, the connection is cancelled the way mitmproxy cancels idle ones, and a
   `security_event` record with reason `header_timeout` is written.
"""

from __future__ import annotations

import asyncio

from mitmproxy import connection, http

from sandgate.policy import Reason
from sandgate.proxy.auditing import security_event
from sandgate.proxy.revocation import cancel_connection
from sandgate.proxy.state import ProxyState


class HeaderDeadlineAddon:
    def __init__(self, state: ProxyState, timeout: float) -> None:
        self.state = state
        self.timeout = timeout
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def client_connected(self, client: connection.Client) -> None:
        if client.transport_protocol != "tcp" or client.id not in self.state.connections:
            return  # UDP (DNS) has no headers; unknown sources are already refused
        loop = asyncio.get_running_loop()
        self._timers[client.id] = loop.call_later(self.timeout, self._expire, client)

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        self._stop(flow.client_conn.id)

    def client_disconnected(self, client: connection.Client) -> None:
        self._stop(client.id)

    def _stop(self, client_id: str) -> None:
        timer = self._timers.pop(client_id, None)
        if timer is not None:
            timer.cancel()

    def _expire(self, client: connection.Client) -> None:
        self._timers.pop(client.id, None)
        conn = self.state.connections.get(client.id)
        if conn is None or conn.passthrough:
            return
        sandbox = self.state.table.get(conn.sandbox_address)
        detail = f"no complete request headers within {self.timeout:g} s; connection closed"
        security_event(
            self.state, sandbox.id if sandbox else "-", client.peername, Reason.HEADER_TIMEOUT, detail
        )
        cancel_connection(client, Reason.HEADER_TIMEOUT)
