"""The worker pool's DNS server: the sandboxes' resolver lives in the pool, not in a worker.

Rules:
1. mitmproxy's UDP server can neither share a port (SO_REUSEPORT) nor take an inherited socket,
   so one process must own the DNS port; the pool is the one that never restarts while the
   proxy runs (a pool that dies takes every worker with it, and the supervisor restarts the
   whole). So DNS keeps answering while any worker restarts.
2. One decision function: the pool runs the same `DnsAddon` (proxy/dnsguard.py) in an embedded
   mitmproxy with the DNS mode only, over a `ProxyState` of its own: a `SandboxTable` fed with
   every change beside the workers (`put`, `drop`, `vault_changed`; put back when no worker
   took it), the proxy's resolver, and the one `NameMemory` of the proxy, which workers ask over
   the pool's control socket (`GET /names/...`, `workers.PeerNames`) for the name a sandbox
   resolved an address from.
3. Its `dns` records go to the pool's own `AuditFile` (the one writer), through an `AuditLog`
   that redacts with the values of the pool's table, as a worker's would; its metrics are
   summed into the pool's `GET /metrics`.
"""

from __future__ import annotations

import asyncio
import logging

from mitmproxy import options
from mitmproxy.addons import core, errorcheck, next_layer, proxyserver
from mitmproxy.addons.proxyserver import Proxyserver
from mitmproxy.master import Master
from mitmproxy.proxy import server as mitmproxy_server
from mitmproxy.proxy.mode_specs import ProxyMode

from sandgate.proxy.audit import AuditFile, AuditLog
from sandgate.proxy.contract.config import ProxyConfig, SandboxEntry
from sandgate.proxy.dnsguard import DnsAddon
from sandgate.proxy.frontdoor import ListenError
from sandgate.proxy.metrics import Metrics
from sandgate.proxy.resolver import NameMemory, Resolver
from sandgate.proxy.state import ProxyState, SandboxTable, proxy_store

log = logging.getLogger(__name__)


# mitmproxy ends a UDP peer's connection after `server.UDP_TIMEOUT` (20 s) idle, but mitmproxy_rs
# keeps the closed peer for 60 s after its last packet (each new packet restarts that) and drops
# whatever it sends: a client asking again from the same port (a resolver that keeps its socket,
# or glibc reusing a port by chance) got no answer for as long as it kept asking. Above
# mitmproxy_rs's 60 s and its 5 s sweep, mitmproxy_rs ends an idle peer first (its reader sees the
# end), and the peer's next packet opens a new connection.
UDP_PEER_TIMEOUT = 75


def dns_mode(config: ProxyConfig) -> str:
    return f"dns@{config.listen_host}:{config.dns_port}"


def outlast_mitmproxy_rs_udp_peers() -> None:
    """Call before serving DNS: mitmproxy's UDP idle timeout, above mitmproxy_rs's (see above)."""
    mitmproxy_server.UDP_TIMEOUT = UDP_PEER_TIMEOUT


class PoolDns:
    """The pool's resolver (rule 2): `start` in the pool's loop, then keep its table in step."""

    def __init__(self, config: ProxyConfig, audit: AuditFile) -> None:
        self.config = config
        table = SandboxTable(proxy_store(config))
        self.state = ProxyState(
            table=table,
            resolver=Resolver(config.upstream_dns),
            names=NameMemory(),
            audit=AuditLog(audit.path, 0, 0, table.values.redact_text, sink=audit),
            metrics=Metrics(),
        )
        self._master: Master | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self, entries: list[SandboxEntry]) -> None:
        """Hold `entries`, then serve the DNS port; raises ListenError if it cannot be bound."""
        for entry in entries:
            await self.put(entry)
        outlast_mitmproxy_rs_udp_peers()
        master = Master(options.Options())
        master.addons.add(
            core.Core(),
            proxyserver.Proxyserver(),
            next_layer.NextLayer(),
            errorcheck.ErrorCheck(),
            DnsAddon(self.state),
        )
        master.options.update(mode=[], confdir=str(self.config.state_dir))
        self._master = master
        self._task = asyncio.create_task(master.run())
        server: Proxyserver = master.addons.get("proxyserver")
        while not server.is_running:
            if self._task.done():
                raise ListenError("the pool's DNS server ended while starting (see the proxy's log)")
            await asyncio.sleep(0.01)
        if not await server.servers.update([ProxyMode.parse(dns_mode(self.config))]):
            raise ListenError(f"the worker pool cannot serve DNS on port {self.config.dns_port}; see its log")

    async def put(self, entry: SandboxEntry) -> None:
        """The entry every worker took; its vault values are read off the loop."""
        previous = self.state.table.get(entry.address)
        sandbox = await asyncio.to_thread(self.state.table.put, entry)
        if previous is not None and previous.id != sandbox.id:  # the address was reused
            self.state.names.forget(entry.address)

    def drop(self, address: str) -> None:
        self.state.table.drop(address)
        self.state.names.forget(address)

    async def vault_changed(self, names: list[str] | None) -> None:
        await asyncio.to_thread(self.state.table.values.refresh, names)

    def name_for(self, sandbox_address: str, address: str) -> str | None:
        return self.state.names.name_for(sandbox_address, address)

    async def stop(self) -> None:
        if self._master is not None and self._task is not None:
            self._master.shutdown()
            await asyncio.wait([self._task], timeout=5.0)
