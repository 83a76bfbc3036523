"""Identity: the source address of a connection names its sandbox; unknown sources are refused.

Rules: the address is read once, when the client connects, and normalised (IPv4-mapped IPv6 is
the IPv4 it carries). Only the address is kept on the connection; the sandbox entry itself is
looked up again at every decision, so updates and removals apply to open connections.
"""

from __future__ import annotations

from mitmproxy import connection

from sandgate.policy import Reason
from sandgate.proxy.auditing import REVOKED, security_event
from sandgate.proxy.resolver import normalise_ip
from sandgate.proxy.revocation import cancel_connection
from sandgate.proxy.state import ConnState, ProxyState


class IdentityAddon:
    def __init__(self, state: ProxyState) -> None:
        self.state = state

    def client_connected(self, client: connection.Client) -> None:
        source = normalise_ip(client.peername[0])
        sandbox = self.state.table.get(source)
        if sandbox is None:
            client.error = f"source {source} is not a registered sandbox"
            security_event(self.state, "-", client.peername, Reason.UNKNOWN_SOURCE, client.error)
            return
        self.state.connections[client.id] = ConnState(  # dropped by AuditAddon
            sandbox_address=source,
            sandbox_id=sandbox.id,
            client=client.peername,
            close=lambda: cancel_connection(client, REVOKED),
        )
