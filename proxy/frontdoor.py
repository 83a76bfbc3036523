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
   released when mitmproxy (or the splice) is done with it.
4. With `ProxyConfig.splice_passthrough`, a transparent connection from a registered sandbox is
   looked at first: its ClientHello is read with MSG_PEEK (nothing consumed; SO_RCVLOWAT makes
   the kernel wake us only when more of a split ClientHello has arrived) and judged by the
   enforcement addon's own `judge_clienthello`, the function mitmproxy's hook calls. A
   pass-through verdict is recorded (`settle_clienthello`, the same record), the proxy dials the
   checked address and `splice.splice` relays the two sockets in the kernel, ClientHello
   included; at the end a closing record with bytes and duration. A denial is recorded and the
   connection closed (unread bytes: the kernel sends an RST; no certificate is ever shown).
   Anything else (plain HTTP, a verdict to intercept, an unknown source, bytes that are no
   complete ClientHello within 64 KiB) goes to mitmproxy untouched, which decides again. A
   ClientHello that does not arrive within `header_timeout` is the header deadline's
   `security_event`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket
import time
from dataclasses import dataclass

from mitmproxy import platform
from mitmproxy.addons.proxyserver import Proxyserver
from mitmproxy.proxy import mode_specs
from mitmproxy.proxy.layers.tls import parse_client_hello
from mitmproxy.proxy.mode_servers import ServerInstance
from mitmproxy.tls import ClientHello

from sandgate.policy import Reason
from sandgate.proxy.auditing import closed, security_event
from sandgate.proxy.contract.audit import REFUSAL_WINDOW, RefusalWindows
from sandgate.proxy.contract.config import ConnectionLimits, ProxyConfig, UpstreamProxy
from sandgate.proxy.enforcement import EnforcementAddon
from sandgate.proxy.fairness import Admission
from sandgate.proxy.resolver import normalise_ip
from sandgate.proxy.revocation import revoke_if_stale
from sandgate.proxy.splice import RESET_ON_CLOSE, Splice, Throttle
from sandgate.proxy.state import ConnState, ProxyState, Sandbox
from sandgate.proxy.upstreamproxy import UpstreamProxyError, open_tunnel

log = logging.getLogger(__name__)

ACCEPTS_PER_WAKEUP = 64  # then the loop runs other work before draining the queue further
CLIENTHELLO_MAX = 64 * 1024  # a ClientHello longer than this is mitmproxy's to judge
TLS_HANDSHAKE = 0x16  # first byte of a TLS handshake record
UPSTREAM_CONNECT_TIMEOUT = 30.0


@dataclass
class Listener:
    sock: socket.socket
    instance: ServerInstance  # mitmproxy's server for this mode; never started, only handed streams


class ListenError(RuntimeError):
    """A listener could not be bound; the message names the address and the reason."""


def listen_socket(config: ProxyConfig, port: int, reuse_port: bool = False) -> socket.socket:
    """A TCP listener on `config.listen_host`:`port` with the configured accept queue (the worker
    pool binds one per worker with SO_REUSEPORT); raises ListenError saying why it cannot."""
    host = config.listen_host
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        sock = socket.create_server(
            (host, port), family=family, backlog=config.listen_backlog, reuse_port=reuse_port
        )
    except OSError as exc:
        raise ListenError(
            f"cannot listen on {host}:{port}: {os.strerror(exc.errno).lower() if exc.errno else exc}; "
            "is another sandgate serve using it? (settings proxy_transparent_port / proxy_explicit_port)"
        ) from None
    sock.setblocking(False)
    return sock


def accept(listener: socket.socket) -> tuple[socket.socket, tuple[str, int]]:
    """One queued connection, non-blocking and with TCP_NODELAY. asyncio sets NODELAY only on
    sockets whose proto is IPPROTO_TCP, and create_server's are 0: without it mitmproxy's
    head-then-body writes wait out the client's delayed ACK, 40 ms per keep-alive request."""
    sock, peer = listener.accept()
    sock.setblocking(False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock, peer


class FrontDoor:
    def __init__(
        self,
        state: ProxyState,
        config: ProxyConfig,
        proxyserver: Proxyserver,
        enforcement: EnforcementAddon,
        sockets: tuple[socket.socket, socket.socket] | None = None,
        share: int = 1,
    ) -> None:
        """`sockets`: a worker's (transparent, explicit) listeners, bound by the pool; `share`:
        how many workers divide the per-sandbox limits (fairness rule 4)."""
        self.state = state
        self.config = config
        self.proxyserver = proxyserver
        self.enforcement = enforcement
        self.sockets = sockets
        self.admission = Admission(share)
        self.refusals = RefusalWindows()
        self._listeners: list[Listener] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._spliced = itertools.count()

    @property
    def serving(self) -> bool:
        return bool(self._listeners)

    def start(self) -> None:
        """Bind both listeners (or take the pool's); raises ListenError if one cannot be bound."""
        host = self.config.listen_host
        specs = (
            f"transparent@{host}:{self.config.transparent_port}",
            f"regular@{host}:{self.config.explicit_port}",
        )
        for index, spec in enumerate(specs):
            instance: ServerInstance = ServerInstance.make(spec, self.proxyserver)
            port = instance.mode.listen_port()
            assert port is not None
            sock = self.sockets[index] if self.sockets else listen_socket(self.config, port)
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
                sock, peer = accept(listener.sock)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and friends: leave it queued, say so
                log.warning("accept on %s failed: %s", listener.instance.mode.description, exc)
                return
            source = normalise_ip(peer[0])
            sandbox = self.state.table.get(source)
            limits = (sandbox.entry.limits if sandbox else None) or self.config.limits
            refused = self.admission.admit(source, limits, time.monotonic())
            if refused is not None:
                self._refuse(sock, peer, sandbox.id if sandbox else "-", refused, limits)
                continue
            if sandbox is not None:
                entry = sandbox.entry
                self.state.processes.start(peer, sandbox_destination(sock), entry.netns, entry.process_lists)
            task = asyncio.create_task(self._serve(listener, sock, peer, source, limits))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _serve(
        self,
        listener: Listener,
        sock: socket.socket,
        peer: tuple[str, int],
        source: str,
        limits: ConnectionLimits,
    ) -> None:
        try:
            transparent = isinstance(listener.instance.mode, mode_specs.TransparentMode)
            if (
                transparent
                and self.config.splice_passthrough
                and await self._decided_here(sock, peer, source)
            ):
                return
            reader, writer = await asyncio.open_connection(sock=sock)
            await listener.instance.handle_stream(reader, writer)
        finally:
            self.admission.release(source, limits, time.monotonic())
            self.state.processes.forget(peer)

    # ------------------------------------------------------------------ pass-through (rule 4)

    async def _decided_here(self, sock: socket.socket, peer: tuple[str, int], source: str) -> bool:
        """True if the connection was denied or passed through here; False: mitmproxy's."""
        accepted = time.monotonic()
        sandbox = self.state.table.get(source)
        if sandbox is None:
            return False
        try:
            hello = await self._peek_clienthello(sock)
        except TimeoutError:
            detail = f"no ClientHello within {self.config.header_timeout:g} s; connection closed"
            security_event(self.state, sandbox.id, peer, Reason.HEADER_TIMEOUT, detail)
            sock.close()
            return True
        if hello is None:
            return False
        destination = platform.original_addr(sock)  # type: ignore[misc]
        conn = ConnState(sandbox_address=source, sandbox_id=sandbox.id, client=peer)
        judged = await self.enforcement.judge_clienthello(conn, sandbox, hello, destination)
        if judged.verdict.allowed and judged.verdict.inspect:
            return False
        self.enforcement.settle_clienthello(conn, sandbox, peer, hello.sni, destination[1], judged)
        if not judged.verdict.allowed or judged.upstream is None or conn.revoked:
            sock.close()
            return True
        target = (judged.name or judged.upstream, judged.upstream, destination[1])
        await self.state.processes.settled(peer)
        bytes_in, bytes_out, failure = await self._pass_through(sock, conn, sandbox, target, judged.via)
        if conn.decision_record is not None:
            duration = round((time.monotonic() - accepted) * 1000, 3)
            record = closed(conn.decision_record, bytes_in, bytes_out, duration)
            if failure is not None:
                record = record.model_copy(update={"reason": Reason.UPSTREAM_ERROR, "detail": failure})
            self.state.processes.write_when_known(peer, record, self.state.audit.write)
            self.state.spend_budgets(sandbox, record.rule, record.host, bytes_in, bytes_out, request=False)
        return True

    async def _peek_clienthello(self, sock: socket.socket) -> ClientHello | None:
        """The complete ClientHello at the head of the socket, not consumed; None if the bytes
        are anything else. Raises TimeoutError past the header deadline."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.header_timeout
        try:
            while True:
                await _readable(sock, deadline - loop.time())
                data = sock.recv(CLIENTHELLO_MAX, socket.MSG_PEEK)
                if not data or data[0] != TLS_HANDSHAKE:
                    return None
                try:
                    hello = parse_client_hello(data)
                except ValueError:
                    return None
                if hello is not None:
                    return hello
                if len(data) >= CLIENTHELLO_MAX:
                    return None
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, len(data) + 1)
        finally:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)

    async def _pass_through(
        self,
        sock: socket.socket,
        conn: ConnState,
        sandbox: Sandbox,
        target: tuple[str, str, int],
        via: UpstreamProxy | None,
    ) -> tuple[int, int, str | None]:
        """Dial the checked address (name, address, port), or CONNECT to the name through `via`,
        and splice; (bytes upstream -> client, client -> upstream, why the upstream proxy failed).
        While it runs the connection is in `ProxyState.connections`, where revocation finds it."""
        name, address, port = target
        if via is not None:
            try:
                headers = self.state.upstream_proxies.connect_headers(via, sandbox.entry)
                upstream = await open_tunnel(via, headers, name, port)
            except UpstreamProxyError as exc:
                log.info("pass-through to %s:%s: %s", name, port, exc)
                sock.close()  # never a direct dial instead (upstreamproxy.py rule 4)
                return 0, 0, str(exc)
        else:
            dialled = await _dial(address, port)
            if dialled is None:
                sock.close()
                return 0, 0, None
            upstream = dialled
        relay = Splice(sock, upstream, self._throttles(sandbox, conn, name))
        key = f"splice-{next(self._spliced)}"
        conn.close = relay.abort
        self.state.connections[key] = conn
        if self.state.table.get(conn.sandbox_address) is not sandbox:  # changed while dialling
            revoke_if_stale(self.state, conn)
        metrics = self.state.metrics
        metrics.spliced_total += 1
        metrics.spliced_open += 1
        try:
            return (*await relay.run(), None)
        finally:
            metrics.spliced_open -= 1
            self.state.connections.pop(key, None)

    def _throttles(
        self, sandbox: Sandbox, conn: ConnState, name: str
    ) -> tuple[Throttle | None, Throttle | None]:
        """The `bytesPerSecond` budgets a pass-through connection is slowed by, (in, out)."""
        record = conn.decision_record
        subject = sandbox.budget_subject(record.rule if record else None, name)
        if subject is None or sandbox.reporting:
            return None, None
        return self.state.budgets.throttle(subject, "in"), self.state.budgets.throttle(subject, "out")

    # ------------------------------------------------------------------ refusals

    def _refuse(
        self,
        sock: socket.socket,
        peer: tuple[str, int],
        sandbox_id: str,
        limit: Reason,
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

    def _close_window(self, key: tuple[str, Reason], peer: tuple[str, int], limits: ConnectionLimits) -> None:
        more = self.refusals.close(key)
        if more:
            sandbox_id, limit = key
            detail = f"{more} more connections reset in {REFUSAL_WINDOW:g} s; {_limit_detail(limit, limits)}"
            self.state.metrics.security_events[limit] -= 1  # each was counted as it happened
            security_event(self.state, sandbox_id, peer, limit, detail)


def sandbox_destination(sock: socket.socket) -> tuple[str, int]:
    """Where the sandbox connected: the original destination of a redirected connection (the
    transparent listener), else the listener's own address (the explicit one)."""
    try:
        return platform.original_addr(sock)  # type: ignore[misc]
    except OSError:  # no conntrack entry for it (ENOENT): it was not redirected
        host, port = sock.getsockname()[:2]
        return host, port


async def _dial(address: str, port: int) -> socket.socket | None:
    upstream = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM)
    upstream.setblocking(False)
    upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        await asyncio.wait_for(
            asyncio.get_running_loop().sock_connect(upstream, (address, port)), UPSTREAM_CONNECT_TIMEOUT
        )
    except (OSError, TimeoutError) as exc:
        log.info("pass-through to %s:%s failed: %r", address, port, exc)
        upstream.close()
        return None
    return upstream


async def _readable(sock: socket.socket, timeout: float) -> None:
    """Until `sock` has data (at least SO_RCVLOWAT bytes) or EOF; TimeoutError after `timeout`."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(sock.fileno(), wake)
    try:
        await asyncio.wait_for(ready, max(0.0, timeout))
    finally:
        loop.remove_reader(sock.fileno())


def _limit_detail(limit: Reason, limits: ConnectionLimits) -> str:
    if limit == Reason.TOO_FAST:
        return f"over {limits.accept_rate:g} new connections/s (burst {limits.accept_burst})"
    return f"over {limits.max_connections} open connections"
