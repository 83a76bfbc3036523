"""The proxy process: an embedded mitmproxy Master with a curated addon list, and the control API.

Rules: only the addons the proxy needs are loaded (mitmproxy's default list costs about a third
of the throughput in hook dispatch); connections to upstream are made lazily, after the policy
has passed; bodies are streamed by our StreamingAddon. Three listeners share one process and one
decision path: transparent (nft-redirected sandbox TCP; original destination by SO_ORIGINAL_DST),
regular (explicit HTTP proxy: CONNECT and absolute-form) and dns (the sandboxes' resolver). The two
TCP listeners belong to the front door (proxy/frontdoor.py: per-sandbox limits at accept), which
hands admitted connections to mitmproxy's server instances; mitmproxy binds only the DNS one.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import signal

from mitmproxy import options
from mitmproxy.addons import core, disable_h2c, errorcheck, next_layer, proxyserver, tlsconfig
from mitmproxy.addons.proxyserver import Proxyserver
from mitmproxy.master import Master

from sandgate.proxy import errorpages, lean, websocket
from sandgate.proxy.audit import AuditLog
from sandgate.proxy.auditing import AuditAddon
from sandgate.proxy.budgets import Budgets
from sandgate.proxy.chaining import UpstreamProxyAddon
from sandgate.proxy.contract.ca import ensure_ca, upstream_trust_bundle
from sandgate.proxy.contract.config import ProxyConfig
from sandgate.proxy.contract.names import UPSTREAM_BUNDLE
from sandgate.proxy.control import ControlServer, control_app
from sandgate.proxy.deadline import HeaderDeadlineAddon
from sandgate.proxy.dnsguard import DnsAddon
from sandgate.proxy.enforcement import EnforcementAddon
from sandgate.proxy.frontdoor import FrontDoor
from sandgate.proxy.identity import IdentityAddon
from sandgate.proxy.injection import InjectionAddon
from sandgate.proxy.metrics import Metrics
from sandgate.proxy.minting import TokenMinter
from sandgate.proxy.pooldns import dns_mode, outlast_mitmproxy_rs_udp_peers
from sandgate.proxy.resolver import NameMemory, Resolver
from sandgate.proxy.revocation import Revoker
from sandgate.proxy.state import ProxyState, SandboxTable, proxy_store
from sandgate.proxy.streaming import StreamingAddon
from sandgate.proxy.template import WorkerSlot
from sandgate.proxy.upstreamproxy import UpstreamProxies
from sandgate.proxy.workers import PeerNames, worker_socket

log = logging.getLogger(__name__)


def run_proxy(config: ProxyConfig, slot: WorkerSlot | None = None) -> None:
    """Run until SIGTERM/SIGINT; the child-process entry point (`python -m sandgate.proxy`), as
    the one proxy process or (`slot`) as one worker of the pool (proxy/workers.py)."""
    _raise_file_limit()
    asyncio.run(serve(config, slot))


def _raise_file_limit() -> None:
    """Every connection costs one descriptor, two with its upstream: the soft limit (often
    1024) would refuse sandboxes long before the per-sandbox limits do, so take the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def build_state(config: ProxyConfig, slot: WorkerSlot | None = None) -> ProxyState:
    """A worker starts empty (the pool replays every entry before it serves), writes its audit
    lines to the pool, and asks the pool, which serves DNS, for the names sandboxes resolved."""
    table = SandboxTable(proxy_store(config))
    for entry in config.sandboxes if slot is None else ():
        table.put(entry)
    resolver = Resolver(config.upstream_dns)
    upstream_proxies = UpstreamProxies(config.upstream_proxies, table.values)
    upstream_proxies.load()  # before the loop runs: the logins are read once here, then refreshed
    return ProxyState(
        table=table,
        resolver=resolver,
        names=PeerNames(config.socket_path) if slot else NameMemory(),
        audit=AuditLog(
            config.audit_path,
            config.audit_max_bytes,
            config.audit_backups,
            table.values.redact_text,
            slot.audit_fd if slot else None,
            config.audit_fsync,
        ),
        metrics=Metrics(),
        upstream_proxies=upstream_proxies,
        budgets=Budgets(slot.count if slot else 1),  # each worker its share (budgets.py rule 3)
        # Token endpoints are verified like any upstream (the bundle mitmproxy_options writes).
        minter=TokenMinter(table.values, resolver, config.state_dir / UPSTREAM_BUNDLE),
    )


def mitmproxy_options(config: ProxyConfig, slot: WorkerSlot | None = None) -> dict[str, object]:
    return {
        # The TCP listeners are the front door's; with workers, the pool serves DNS (proxy/pooldns.py).
        "mode": [dns_mode(config)] if slot is None else [],
        "confdir": str(config.state_dir),
        "connection_strategy": "lazy",
        "ssl_verify_upstream_trusted_ca": str(upstream_trust_bundle(config.state_dir, config.upstream_ca)),
        "rawtcp": False,  # non-HTTP, non-TLS bytes are refused, not relayed unseen
        "http3": False,
        "store_streamed_bodies": False,
        "validate_inbound_headers": True,
    }


def addons(state: ProxyState, config: ProxyConfig) -> list[object]:
    """Order matters: identity before enforcement, enforcement before injection, streaming last."""
    return [
        core.Core(),
        proxyserver.Proxyserver(),
        next_layer.NextLayer(),
        tlsconfig.TlsConfig(),
        disable_h2c.DisableH2C(),
        errorcheck.ErrorCheck(),
        IdentityAddon(state),
        HeaderDeadlineAddon(state, config.header_timeout),
        EnforcementAddon(state, config.ech),
        UpstreamProxyAddon(state),
        InjectionAddon(state),
        StreamingAddon(),
        DnsAddon(state),
        AuditAddon(state),
    ]


async def refresh_vault_values(state: ProxyState, interval: float) -> None:
    """Re-read every bound value now and then, off the loop: a value rotated behind the control
    plane's back (straight in OpenBao) is injected and scrubbed within `interval` seconds."""
    while interval > 0:
        await asyncio.sleep(interval)
        try:
            await asyncio.to_thread(state.table.values.refresh)
        except Exception:
            log.exception("re-reading the vault failed; the values in memory stay in use")


async def serve(config: ProxyConfig, slot: WorkerSlot | None = None) -> None:
    ensure_ca(config.state_dir)
    websocket.install()  # WebSocket control frames pass the scrubber too
    outlast_mitmproxy_rs_udp_peers()  # a DNS client asking again from a port it used is answered
    state = build_state(config, slot)
    errorpages.install(state.configured_upstream_proxies)  # error pages never quote upstream bytes
    state.audit.listen(asyncio.get_running_loop())
    state.table.on_change.append(Revoker(state, asyncio.get_running_loop()).table_changed)
    state.table.on_change.append(state.forget_budgets)
    master = Master(options.Options())
    master.addons.add(*addons(state, config))
    lean.install(master.addons)  # mitmproxy's per-event work that buys nothing here
    master.options.update(**mitmproxy_options(config, slot))
    proxyserver: Proxyserver = master.addons.get("proxyserver")
    front_door = FrontDoor(
        state,
        config,
        proxyserver,
        master.addons.get("enforcementaddon"),
        sockets=slot.listeners() if slot else None,
        share=slot.count if slot else 1,
    )

    async def start_serving() -> None:  # a worker's POST /serve: it holds every entry now
        if not front_door.serving:
            front_door.start()

    socket_path = worker_socket(config, slot.index) if slot else config.socket_path
    control = ControlServer(control_app(state, start_serving if slot else None), socket_path)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, master.shutdown)
    await control.start()
    log.info("sandgate proxy: control socket %s", socket_path)
    refresher = asyncio.create_task(
        refresh_vault_values(state, config.vault.cache_ttl if config.vault else 30.0)
    )
    if slot is None:
        front_door.start()
    try:
        await master.run()
    finally:
        refresher.cancel()
        await front_door.stop()
        await control.stop()
        state.audit.close()
