"""mitmproxy's side of chaining to an upstream proxy (proxy/upstreamproxy.py rule 2): the CONNECT
requests mitmproxy sends to an upstream carry the login and the sandbox id, and an explicit
CONNECT tunnel to a destination an upstream carries is itself dialled through it."""

from __future__ import annotations

from mitmproxy import http
from mitmproxy.proxy import layer
from mitmproxy.proxy.layers.http._upstream_proxy import HttpUpstreamProxy

from sandgate.proxy.state import ConnState, ProxyState, Sandbox


class UpstreamProxyAddon:
    """mitmproxy's side of rule 2: its CONNECT requests to an upstream get our headers, and an
    explicit CONNECT tunnel to a destination an upstream carries gets a CONNECT layer of its own
    (for its relayed pass-through; its intercepted requests choose per request)."""

    def __init__(self, state: ProxyState) -> None:
        self.state = state

    def http_connect_upstream(self, flow: http.HTTPFlow) -> None:
        _conn, sandbox = self._lookup(flow.client_conn.id)
        if sandbox is None:
            return
        proxy = self.state.upstream_proxies.choose(sandbox.entry, flow.request.host)
        if proxy is None:
            return
        for name, value in self.state.upstream_proxies.connect_headers(proxy, sandbox.entry):
            flow.request.headers[name] = value  # checked when the destination was decided

    def next_layer(self, data: layer.NextLayer) -> None:
        conn, sandbox = self._lookup(data.context.client.id)
        server = data.context.server
        if (
            conn is None
            or sandbox is None
            or conn.connect_host is None  # the explicit listener's tunnels only
            or conn.tunnelled
            or data.layer is None
            or server.via is not None
            or server.address is None
        ):
            return
        proxy = self.state.upstream_proxies.choose(sandbox.entry, conn.connect_host)
        if proxy is None:
            return
        conn.tunnelled = True
        conn.via = proxy
        server.via = ("http", proxy.address)
        stack = HttpUpstreamProxy.make(data.context, send_connect=True)
        stack /= data.layer
        data.layer = stack[0]

    def _lookup(self, client_id: str) -> tuple[ConnState | None, Sandbox | None]:
        conn = self.state.connections.get(client_id)
        return (conn, self.state.table.get(conn.sandbox_address)) if conn else (None, None)
