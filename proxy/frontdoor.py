"""The front door: the proxy's own TCP listeners, where every sandbox connection is admitted or
refused before mitmproxy spends anything on it.

Rules:
1. The transparent and explicit listeners are bound here, not by mitmproxy, with an accept
   queue of `ProxyConfig.listen_backlog` (mitmproxy's asyncio default is 100, which a burst
   from one sandbox overflows, so every sandbox's SYNs were dropped and retried after 1 s, 3 s...).
   The accept loop drains the queue at once, whoever the connections are from.
2. Each accepted connection is admitted by `fairness.Admission` against its sandbox's limits
   (the entry's own `limits`, else `ProxyConfig.limits`; a source that is no sandbox gets the
   defaults and is then refused by the identity addon as before). Over a limit, the connection
   is reset at once (SO_LINGER 0: an RST, no FIN handshake, nothing read) and audited as a
   `security_event` (`connection-limit` or `accept-rate`), rate-limited per fairness rule 3.
   Nothing waits: a refused connection is never queued behind anyone.
3. An admitted connection is handed to mitmproxy's own server instance for its mode (the same
   `handle_stream` its listener would call, in this process, on this socket), and its slot is
   released when mitmproxy is done with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import time
from dataclasses import dataclass

from mitmproxy.addons.proxyserver import Proxyserver
from mitmproxy.proxy.mode_servers import ServerInstance

from sandgate.proxy.auditing import security_event
from sandgate.proxy.config import ConnectionLimits, ProxyConfig
from sandgate.proxy.fairness import REFUSAL_WINDOW, TOO_FAST, Admission, RefusalWindows
from sandgate.proxy.resolver import normalise_ip
from sandgate.proxy.state import ProxyState

log = logging.getLogger(__name__)

ACCEPTS_PER_WAKEUP = 64  # then the loop runs other work before draining the queue further
RESET_ON_CLOSE = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends an RST


@dataclass
class Listener:
    sock: socket.socket
    instance: ServerInstance  # mitmproxy's server for this mode; never started, only handed streams


class FrontDoor:
    def __init__(self, state: ProxyState, config: ProxyConfig, proxyserver: Proxyserver) -> None:
        self.state = state
        self.config = config
        self.proxyserver = proxyserver
        self.admission = Admission()
        self.refusals = RefusalWindows()
        self._listeners: list[Listener] = []
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        host = self.config.listen_host
        for spec in (
            f"transparent@{host}:{self.config.transparent_port}",
            f"regular@{host}:{self.config.explicit_port}",
        ):
            instance: ServerInstance = ServerInstance.make(spec, self.proxyserver)
            port = instance.mode.listen_port()
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            sock = socket.create_server((host, port), family=family, backlog=self.config.listen_backlog)
            sock.setblocking(False)
            listener = Listener(sock, instance)
            asyncio.get_running_loop().add_reader(sock.fileno(), self._accept, listener)
            self._listeners.append(listener)
            log.info("%s listening at %s:%s", instance.mode.description, host, port)

    async def stop(self) -> None:
        loop = asyncio.get_running_loop()
        for listener in self._listeners:
            loop.remove_reader(listener.sock.fileno())
            listener.sock.close()
        self._listeners = []
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # ------------------------------------------------------------------ accept

    def _accept(self, listener: Listener) -> None:
        for _ in range(ACCEPTS_PER_WAKEUP):
            try:
                sock, peer = listener.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and friends: leave it queued, say so
                log.warning("accept on %s failed: %s", listener.instance.mode.description, exc)
                return
            sock.setblocking(False)
            source = normalise_ip(peer[0])
            sandbox = self.state.table.get(source)
            limits = (sandbox.entry.limits if sandbox else None) or self.config.limits
            refused = self.admission.admit(source, limits, time.monotonic())
            if refused is not None:
                self._refuse(sock, peer, sandbox.id if sandbox else "-", refused, limits)
                continue
            task = asyncio.create_task(self._serve(listener, sock, source, limits))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _serve(
        self, listener: Listener, sock: socket.socket, source: str, limits: ConnectionLimits
    ) -> None:
        try:
            reader, writer = await asyncio.open_connection(sock=sock)
            await listener.instance.handle_stream(reader, writer)
        finally:
            self.admission.release(source, limits, time.monotonic())

    # ------------------------------------------------------------------ refusals

    def _refuse(
        self,
        sock: socket.socket,
        peer: tuple[str, int],
        sandbox_id: str,
        limit: str,
        limits: ConnectionLimits,
    ) -> None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET_ON_CLOSE)
        sock.close()
        key = (sandbox_id, limit)
        if not self.refusals.refused(key):
            self.state.metrics.security_events[limit] += 1  # counted; its window's summary records it
            return
        security_event(
            self.state, sandbox_id, peer, limit, _limit_detail(limit, limits) + "; connection reset"
        )
        asyncio.get_running_loop().call_later(REFUSAL_WINDOW, self._close_window, key, peer, limits)

    def _close_window(self, key: tuple[str, str], peer: tuple[str, int], limits: ConnectionLimits) -> None:
        more = self.refusals.close(key)
        if more:
            sandbox_id, limit = key
            detail = f"{more} more connections reset in {REFUSAL_WINDOW:g} s; {_limit_detail(limit, limits)}"
            self.state.metrics.security_events[limit] -= 1  # each was counted as it happened
            security_event(self.state, sandbox_id, peer, limit, detail)


def _limit_detail(limit: str, limits: ConnectionLimits) -> str:
    if limit == TOO_FAST:
        return f"over {limits.accept_rate:g} new connections/s (burst {limits.accept_burst})"
    return f"over {limits.max_connections} open connections"
