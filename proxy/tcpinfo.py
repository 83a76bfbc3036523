"""Byte counts of a passed-through TCP connection, read from the kernel when it closes.

Rules: a pass-through connection's bytes are relayed by mitmproxy without a flow or any hook,
so counting them in Python would cost work per chunk; the kernel counts them anyway. At the
decision we keep a duplicate descriptor of the client's socket (mitmproxy closes its own before
the `client_disconnected` hook runs); at close we read `tcpi_bytes_acked` (sent to the client,
i.e. upstream -> client) and `tcpi_bytes_received` (client -> upstream) from TCP_INFO and close
the duplicate. Linux >= 4.2. Anything unavailable gives None, never an error: accounting must
not break a connection.
"""

from __future__ import annotations

import logging
import os
import socket
import struct

from mitmproxy import connection, ctx

log = logging.getLogger(__name__)

# struct tcp_info: u64 tcpi_bytes_acked at offset 120, u64 tcpi_bytes_received right after it.
TCP_INFO_BYTES = struct.Struct("=QQ")
TCP_INFO_BYTES_OFFSET = 120
TCP_INFO_SIZE = 256


class KernelCounters:
    """A duplicate of one client socket, kept until the connection ends."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    @classmethod
    def of(cls, client: connection.Client) -> KernelCounters | None:
        """Duplicate the live socket of `client` (None outside a running proxy or if it is gone)."""
        try:
            handler = ctx.master.addons.get("proxyserver").connections[client.id]
            transport_socket = handler.transports[client].writer.get_extra_info("socket")
            return cls(socket.socket(fileno=os.dup(transport_socket.fileno())))
        except (AttributeError, KeyError, OSError) as exc:
            log.debug("no kernel counters for %s: %r", client.peername, exc)
            return None

    def read_and_close(self) -> tuple[int, int] | None:
        """(bytes upstream -> client, bytes client -> upstream), then the duplicate is closed."""
        try:
            info = self._sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_SIZE)
        except OSError:
            return None
        finally:
            self._sock.close()
        if len(info) < TCP_INFO_BYTES_OFFSET + TCP_INFO_BYTES.size:
            return None
        acked, received = TCP_INFO_BYTES.unpack_from(info, TCP_INFO_BYTES_OFFSET)
        return acked, received
