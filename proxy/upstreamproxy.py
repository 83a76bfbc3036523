"""Chaining to an upstream proxy: allowed traffic leaves through a company's proxy.

Rules:
1. Which proxy: the sandbox entry's own `upstream_proxies`, else the server's
   `ProxyConfig.upstream_proxies`; the first whose `hosts` carry the destination name and whose
   `tenants` (if any) hold the entry's tenant wins. None carries it: the proxy dials the origin
   itself.
2. Decisions, pinning, injection, scrubbing and audit are unchanged; only the dial differs. Every
   path that dials goes through the upstream with `CONNECT name:port` (the name the decision was
   about, so the upstream resolves and logs it): the front door's spliced pass-through
   (`open_tunnel`, here), mitmproxy's intercepted and plain-HTTP requests (`flow.server_conn.via`,
   its own CONNECT layer, whose request proxy/chaining.py's `http_connect_upstream` completes),
   and the explicit listener's relayed pass-through (chaining's `next_layer` puts the same
   CONNECT layer over the tunnel). mitmproxy's relay of a transparent pass-through
   (`splice_passthrough` off) has no layer to put it in: such a connection is refused
   (enforcement's `server_connect`).
3. The login is a vault entry (`credential`, 'username:password'), read off the loop with the
   sandboxes' values (proxy/credentials.py), so it is in the audit writer's redactor and
   refreshed with them. It goes only into the `Proxy-Authorization` of the CONNECT request, with
   the `identity_header` (the sandbox id) and `tenant_header` (its tenant) beside it; nothing is
   added inside the tunnel.
4. An upstream that cannot be reached or refuses the CONNECT is never bypassed: the request gets
   a 502 naming the upstream (errorpages.py), a pass-through connection is closed, and both are
   in the audit record (`via` names the upstream, `detail` says what it answered).
"""

from __future__ import annotations

import asyncio
import base64
import socket

from sandgate.proxy.contract.config import SandboxEntry, UpstreamProxy, upstream_proxy_for
from sandgate.proxy.credentials import SecretValues

CONNECT_TIMEOUT = 30.0
RESPONSE_HEAD_MAX = 16 * 1024


class UpstreamProxyError(Exception):
    """The upstream could not be used; the message names it and says why (never its login)."""


class UpstreamProxies:
    """The configured upstream proxies and their logins (rules 1 and 3)."""

    def __init__(self, proxies: list[UpstreamProxy], values: SecretValues) -> None:
        self.proxies = proxies
        self.values = values

    def credential_names(self, extra: list[UpstreamProxy] | None = None) -> list[str]:
        return sorted({proxy.credential for proxy in [*self.proxies, *(extra or ())] if proxy.credential})

    def load(self, extra: list[UpstreamProxy] | None = None) -> None:
        """Read the logins from the vault. Blocking: from a thread, never the event loop."""
        self.values.load(self.credential_names(extra))

    def choose(self, entry: SandboxEntry, host: str) -> UpstreamProxy | None:
        """For the sandbox of `entry` (its own proxies, else the server's; its tenant), and `host`."""
        own = entry.upstream_proxies
        return upstream_proxy_for(self.proxies if own is None else own, host, entry.tenant)

    def connect_headers(self, proxy: UpstreamProxy, entry: SandboxEntry) -> list[tuple[str, str]]:
        """The headers of a CONNECT through `proxy` for the sandbox of `entry` (rule 3)."""
        headers = []
        if proxy.credential:
            login = self.values.current(proxy.credential)
            if login is None or ":" not in login:
                raise UpstreamProxyError(
                    f"upstream proxy {proxy.url}: its credential {proxy.credential!r} is not in the "
                    "vault as 'username:password'"
                )
            headers.append(("Proxy-Authorization", "Basic " + base64.b64encode(login.encode()).decode()))
        if proxy.identity_header:
            headers.append((proxy.identity_header, entry.sandbox_id))
        if proxy.tenant_header and entry.tenant:
            headers.append((proxy.tenant_header, entry.tenant))
        return headers


def connect_request(host: str, port: int, headers: list[tuple[str, str]]) -> bytes:
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    lines = [f"CONNECT {authority} HTTP/1.1", f"Host: {authority}", *(f"{k}: {v}" for k, v in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def open_tunnel(
    proxy: UpstreamProxy, headers: list[tuple[str, str]], host: str, port: int
) -> socket.socket:
    """A socket through `proxy` to host:port, the CONNECT answered 2xx (for the front door's
    splice); UpstreamProxyError naming the upstream otherwise. Bytes after the answer's head are
    the origin's: the head is read up to its end and not beyond."""
    loop = asyncio.get_running_loop()
    address = proxy.address
    sock = socket.socket(socket.AF_INET6 if ":" in address[0] else socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        async with asyncio.timeout(CONNECT_TIMEOUT):
            await loop.sock_connect(sock, address)
            await loop.sock_sendall(sock, connect_request(host, port, headers))
            head = b""
            while b"\r\n\r\n" not in head:
                if len(head) > RESPONSE_HEAD_MAX:
                    raise UpstreamProxyError(f"upstream proxy {proxy.url} sent no answer head to CONNECT")
                chunk = await loop.sock_recv(sock, 1)  # byte by byte: never read past the head
                if not chunk:
                    raise UpstreamProxyError(f"upstream proxy {proxy.url} closed the connection at CONNECT")
                head += chunk
    except (OSError, TimeoutError) as exc:
        sock.close()
        raise UpstreamProxyError(f"upstream proxy {proxy.url} is unreachable: {exc!r}") from None
    except UpstreamProxyError:
        sock.close()
        raise
    status = head.split(b" ", 2)[1] if head.count(b" ") >= 2 else b""
    if not (status.isdigit() and 200 <= int(status) < 300):
        sock.close()
        shown = status.decode() if status.isdigit() else "no status"
        raise UpstreamProxyError(f"upstream proxy {proxy.url} refused the CONNECT to {host}:{port}: {shown}")
    return sock
