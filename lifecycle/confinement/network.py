"""Sandbox networks: one netns, one veth pair and one /30 per sandbox; one nft table for all.

Rules:
1. A sandbox's only route is the host end of its veth (the gateway). What the host does with
   its packets is decided by ONE nftables table that matches every sandbox veth by its name
   prefix (`iifname "<prefix>*"`), so creating or removing a sandbox never changes a rule.
2. Fail closed: every TCP connect is redirected to the proxy's transparent port (refused when no
   proxy listens there, never routed on), DNS (UDP and TCP port 53) to the proxy's resolver, the
   explicit proxy port on the gateway is open; everything else from a sandbox is rejected:
   other UDP (QUIC too), ICMP, IPv6 (also disabled inside), the host's other ports, forwarding
   to anywhere (other sandboxes included), and source addresses that are not the sandbox's own.
3. The kernel is the state. A sandbox's names encode its allocation: the netns is
   `sg-<instance>-<n>-<sandbox id>` (netns names are global, so every server has its own random
   instance tag) and the host veth is `<prefix><n>`, n being the index of its /30 in the pool.
   After a restart `cleanup_leftovers` reads the allocations back from those names.

Theory of operation: `create` runs in a short-lived thread that unshares a new network namespace
(a netns is per thread), pins it with a bind mount under /run/netns, and configures both ends
over two netlink sockets (one opened before the unshare, so bound to the host namespace).
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from sandgate.lifecycle.confinement.contract import SandboxNet
from sandgate.lifecycle.kernel import (
    MS_BIND,
    MS_REC,
    MS_SHARED,
    in_fresh_thread,
    mount,
    mount_points,
    umount,
)

RUN_NETNS = Path("/run/netns")
SANDBOX_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
SANDBOX_IFACE = "eth0"
_ENODEV = 19
_ESRCH = 3


class NetworkError(Exception):
    """A sandbox network could not be built or removed; the message says which and why."""


@dataclass(frozen=True)
class ProxyPorts:
    """Where the proxy listens on the host (every gateway address)."""

    transparent: int = 15001
    dns: int = 15053
    explicit: int = 15002


def ruleset(table: str, iface_prefix: str, ports: ProxyPorts) -> str:
    """The nft script that (re)defines the one table for all sandboxes, atomically."""
    sandbox = f'iifname "{iface_prefix}*"'
    reject = "reject with icmpx admin-prohibited"
    return f"""\
table inet {table} {{}}
delete table inet {table}
table inet {table} {{
  chain sandbox_guard {{
    type filter hook prerouting priority raw; policy accept;
    {sandbox} meta nfproto ipv6 drop
    {sandbox} fib saddr . iif oif missing drop
    {sandbox} fib saddr type local drop
  }}
  chain sandbox_nat {{
    type nat hook prerouting priority dstnat; policy accept;
    {sandbox} meta l4proto {{ tcp, udp }} th dport 53 redirect to :{ports.dns}
    {sandbox} fib daddr type local tcp dport {ports.explicit} accept
    {sandbox} meta l4proto tcp redirect to :{ports.transparent}
  }}
  chain sandbox_input {{
    type filter hook input priority filter; policy accept;
    {sandbox} ct state established,related accept
    {sandbox} ct status dnat tcp dport {{ {ports.transparent}, {ports.dns} }} accept
    {sandbox} ct status dnat udp dport {ports.dns} accept
    {sandbox} tcp dport {ports.explicit} accept
    {sandbox} {reject}
  }}
  chain sandbox_forward {{
    type filter hook forward priority filter; policy accept;
    {sandbox} {reject}
    oifname "{iface_prefix}*" {reject}
  }}
}}
"""


class SandboxNetworks:
    """Builds and removes sandbox networks in the calling process's (host) network namespace."""

    def __init__(
        self,
        *,
        table: str,
        iface_prefix: str,
        address_pool: IPv4Network,
        instance: str,
        ports: ProxyPorts | None = None,
    ) -> None:
        if not re.fullmatch(r"[a-z][a-z0-9]{0,5}", iface_prefix):
            raise ValueError(
                f"iface_prefix {iface_prefix!r}: use 1-6 lowercase letters/digits, a letter first"
            )
        if not re.fullmatch(r"[a-z0-9]{1,8}", instance):
            raise ValueError(f"instance tag {instance!r}: use 1-8 lowercase letters/digits")
        if address_pool.prefixlen > 30:
            raise ValueError(f"address_pool {address_pool} is smaller than one /30")
        self.table = table
        self.iface_prefix = iface_prefix
        self.address_pool = address_pool
        self.instance = instance
        self.ports = ports or ProxyPorts()
        self._netns_prefix = f"sg-{instance}-"
        self._lock = threading.Lock()
        self._nets: dict[str, SandboxNet] = {}
        self._index: dict[str, int] = {}
        self._used: set[int] = set()

    # -- the table --------------------------------------------------------------------------

    def ensure_table(self) -> None:
        """(Re)load the table; idempotent and atomic (one nft transaction)."""
        _nft(ruleset(self.table, self.iface_prefix, self.ports))

    def remove_table(self) -> None:
        _nft(f"table inet {self.table} {{}}\ndelete table inet {self.table}\n")

    # -- one sandbox ------------------------------------------------------------------------

    def get(self, sandbox_id: str) -> SandboxNet | None:
        return self._nets.get(sandbox_id)

    def create(self, sandbox_id: str) -> SandboxNet:
        """The sandbox's network, built now or earlier (idempotent)."""
        if not SANDBOX_ID.fullmatch(sandbox_id):
            raise ValueError(f"sandbox id {sandbox_id!r}: use 1-128 of A-Z a-z 0-9 _ . - (not first)")
        with self._lock:
            if sandbox_id in self._nets:
                return self._nets[sandbox_id]
            index = self._allocate()
        net = self._net_for(index, sandbox_id)
        try:
            in_fresh_thread(lambda: self._build(index, net))
        except BaseException as exc:
            self._teardown(index, net.netns)
            with self._lock:
                self._used.discard(index)
            if isinstance(exc, OSError | NetlinkError):
                raise NetworkError(f"building the network of sandbox {sandbox_id} failed: {exc}") from exc
            raise
        with self._lock:
            self._nets[sandbox_id] = net
            self._index[sandbox_id] = index
        return net

    def destroy(self, sandbox_id: str) -> None:
        """Remove the sandbox's netns, veth and address; no error if already gone."""
        with self._lock:
            net = self._nets.pop(sandbox_id, None)
            index = self._index.pop(sandbox_id, None)
        if net is None or index is None:
            found = self._scan_netns().get(sandbox_id)
            if found is None:
                return
            index, name = found
        else:
            name = net.netns
        self._teardown(index, name)
        with self._lock:
            self._used.discard(index)

    # -- restart ----------------------------------------------------------------------------

    def cleanup_leftovers(self, keep: set[str]) -> dict[str, SandboxNet]:
        """Adopt the networks of sandboxes in `keep` that are intact; remove everything else.

        Call once at server start, before `create`. Returns the adopted networks by sandbox id.
        """
        netns = self._scan_netns()
        host_links = self._host_links()
        adopted: dict[str, SandboxNet] = {}
        for sandbox_id, (index, name) in netns.items():
            if sandbox_id in keep and index in host_links:
                adopted[sandbox_id] = self._net_for(index, sandbox_id)
            else:
                self._teardown(index, name)
        adopted_indexes = {netns[sandbox_id][0] for sandbox_id in adopted}
        for index in host_links - adopted_indexes:
            self._teardown(index, None)
        with self._lock:
            self._nets = dict(adopted)
            self._index = {sandbox_id: netns[sandbox_id][0] for sandbox_id in adopted}
            self._used = set(adopted_indexes)
        return adopted

    # -- internals --------------------------------------------------------------------------

    def _allocate(self) -> int:
        capacity = self.address_pool.num_addresses // 4
        for index in range(capacity):
            if index not in self._used:
                self._used.add(index)
                return index
        raise NetworkError(
            f"address pool {self.address_pool} is exhausted ({capacity} sandboxes); "
            "set a larger address_pool or remove sandboxes"
        )

    def _net_for(self, index: int, sandbox_id: str) -> SandboxNet:
        base = int(self.address_pool.network_address) + 4 * index
        return SandboxNet(
            netns=f"{self._netns_prefix}{index}-{sandbox_id}",
            address=str(IPv4Address(base + 2)),
            gateway=str(IPv4Address(base + 1)),
            prefixlen=30,
        )

    def _host_iface(self, index: int) -> str:
        return f"{self.iface_prefix}{index}"

    def _build(self, index: int, net: SandboxNet) -> None:
        """Runs in a thread of its own: the unshare moves only this thread to the new netns."""
        host_iface = self._host_iface(index)
        host_ns = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            with IPRoute() as host:  # bound to the host namespace for its whole life
                _prepare_run_netns()
                os.unshare(os.CLONE_NEWNET)
                _pin_netns(net.netns_path)
                _sysctl("net/ipv6/conf/all/disable_ipv6", "1")
                _sysctl("net/ipv6/conf/default/disable_ipv6", "1")
                with IPRoute() as inside:
                    inside.link(
                        "add",
                        ifname=SANDBOX_IFACE,
                        kind="veth",
                        peer={"ifname": host_iface, "net_ns_fd": host_ns},
                    )
                    os.setns(host_ns, os.CLONE_NEWNET)
                    _sysctl(f"net/ipv6/conf/{host_iface}/disable_ipv6", "1")
                    (host_idx,) = host.link_lookup(ifname=host_iface)
                    host.addr("add", index=host_idx, address=net.gateway, prefixlen=net.prefixlen)
                    host.link("set", index=host_idx, state="up")
                    (lo_idx,) = inside.link_lookup(ifname="lo")
                    (eth_idx,) = inside.link_lookup(ifname=SANDBOX_IFACE)
                    inside.link("set", index=lo_idx, state="up")
                    inside.addr("add", index=eth_idx, address=net.address, prefixlen=net.prefixlen)
                    inside.link("set", index=eth_idx, state="up")
                    inside.route("add", dst="0.0.0.0/0", gateway=net.gateway, oif=eth_idx)
        finally:
            os.close(host_ns)

    def _teardown(self, index: int, netns_name: str | None) -> None:
        with IPRoute() as host:
            try:
                host.link("del", ifname=self._host_iface(index))
            except NetlinkError as exc:
                if exc.code != _ENODEV:
                    raise
        if netns_name is not None:
            path = RUN_NETNS / netns_name
            umount(path, lazy=True)
            path.unlink(missing_ok=True)

    def _scan_netns(self) -> dict[str, tuple[int, str]]:
        """This instance's netns in /run/netns: sandbox id -> (index, netns name)."""
        found: dict[str, tuple[int, str]] = {}
        if not RUN_NETNS.is_dir():
            return found
        pattern = re.compile(re.escape(self._netns_prefix) + r"(\d+)-(.+)")
        for entry in os.listdir(RUN_NETNS):
            match = pattern.fullmatch(entry)
            if match:
                found[match.group(2)] = (int(match.group(1)), entry)
        return found

    def _host_links(self) -> set[int]:
        pattern = re.compile(re.escape(self.iface_prefix) + r"(\d+)")
        with IPRoute() as host:
            names = [link.get("ifname") for link in host.get_links()]
        return {int(m.group(1)) for name in names if (m := pattern.fullmatch(name or ""))}


_run_netns_lock = threading.Lock()
_run_netns_ready = False


def _prepare_run_netns() -> None:
    """Make /run/netns a shared mount point once, as `ip netns add` does, so both tools agree."""
    global _run_netns_ready
    with _run_netns_lock:
        if _run_netns_ready:
            return
        RUN_NETNS.mkdir(parents=True, exist_ok=True)
        if str(RUN_NETNS) not in mount_points():
            mount(str(RUN_NETNS), RUN_NETNS, None, MS_BIND | MS_REC)
        mount("none", RUN_NETNS, None, MS_SHARED | MS_REC)
        _run_netns_ready = True


def _pin_netns(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0o444)
    os.close(fd)
    mount("/proc/thread-self/ns/net", path, None, MS_BIND)


def _sysctl(name: str, value: str) -> None:
    """Write a sysctl as seen from the calling thread's network namespace."""
    Path("/proc/sys", name).write_text(value, encoding="ascii")


def _nft(script: str) -> None:
    result = subprocess.run(["nft", "-f", "-"], input=script, capture_output=True, text=True)
    if result.returncode != 0:
        raise NetworkError(f"nft rejected the sandbox table: {result.stderr.strip()}")
