"""The proxy's own name resolution, and each sandbox's memory of the answers it was given.

Rules: the proxy never dials an address a sandbox chose for a name; it resolves the policy name
itself with these resolvers (`upstream_dns`, else the system's; each `ip` or `ip:port`) and
dials the answer. Lookups are question-only queries (`dnswire.forward`, the same path as the
sandboxes' forwarded questions), so a resolver on any port works (mitmproxy_rs' resolver takes
addresses only, port 53). Answers
handed to a sandbox by the DNS listener are remembered per sandbox (bounded LRU), so a later
connection to such an address without SNI or Host can be attributed to the name it came from.
The answer for a name is reused for at most ANSWER_REUSE_SECONDS (a busy keep-alive connection
would otherwise pay two resolver round trips per request), and requests arriving while a name is
being resolved share that one resolution; every use is still checked against the policy by the
caller, so reuse never lets an address through that the policy refuses. Failures are not kept.

A sandbox's A and AAAA queries are looked up in pairs (`PairedLookups`): a stub resolver sends
both at once from one socket, and mitmproxy answers one socket's queries one after the other, so
the second query's own upstream round trip would only start once the first was answered. With a
slow or silent upstream its answer (SERVFAIL after `dnswire.UPSTREAM_TIMEOUT`) came after two
timeouts, 4 s, past the sandbox stub's 3 s per try: the stub heard nothing and gave up. A query
for one family starts the other family's lookup beside its own; the other family's query, when it
comes, takes that lookup (once, within PAIR_KEPT_SECONDS, per sandbox), so both are answered
within one upstream timeout.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from collections import OrderedDict

from mitmproxy import dns

from sandgate.proxy.contract.config import resolver_address, system_servers
from sandgate.proxy.dnswire import ForwardError, forward

MEMORY_PER_SANDBOX = 4096
ANSWER_REUSE_SECONDS = 1.0
ANSWERS_KEPT = 4096  # names; the table starts over when full
PAIR_KEPT_SECONDS = 5.0  # a lookup started beside a query waits this long for its own query
OTHER_FAMILY: dict[int, int] = {socket.AF_INET: socket.AF_INET6, socket.AF_INET6: socket.AF_INET}


class ResolveError(Exception):
    """The name has no usable address; `nxdomain` tells "does not exist" from "failed"."""

    def __init__(self, name: str, message: str, nxdomain: bool) -> None:
        super().__init__(f"cannot resolve {name}: {message}")
        self.nxdomain = nxdomain


class Resolver:
    def __init__(self, name_servers: list[str]) -> None:
        # (address, port) of each resolver: asked in turn, with question-only queries (dnswire)
        self.servers = [resolver_address(server) for server in name_servers or system_servers()]
        self._recent: dict[str, tuple[float, list[str]]] = {}  # name -> (when, addresses)
        self._resolving: dict[str, asyncio.Future[list[str]]] = {}  # name -> the resolution under way

    async def lookup(self, name: str, family: int) -> list[str]:
        """A (AF_INET) or AAAA (AF_INET6) answers; [] when the name exists without that type."""
        qtype = dns.types.A if family == socket.AF_INET else dns.types.AAAA
        try:
            reply = await forward(self.servers, name, qtype)
        except ForwardError as exc:
            raise ResolveError(name, str(exc), nxdomain=False) from exc
        if reply.response_code != dns.response_codes.NOERROR:
            code = reply.response_code
            raise ResolveError(name, dns.response_codes.to_str(code), code == dns.response_codes.NXDOMAIN)
        # A recursive answer holds the CNAME chain too; the addresses are its records of this type.
        return [str(ipaddress.ip_address(rr.data)) for rr in reply.answers if rr.type == qtype]

    async def addresses(self, name: str) -> list[str]:
        """Every address of `name`, IPv4 first (sandboxes and most upstreams are IPv4)."""
        recent = self._recent.get(name)
        if recent is not None and time.monotonic() - recent[0] < ANSWER_REUSE_SECONDS:
            return list(recent[1])
        resolving = self._resolving.get(name)
        if resolving is None:
            resolving = self._resolving[name] = asyncio.ensure_future(self._resolve_both(name))
            resolving.add_done_callback(lambda done: self._resolved(name, done))
        return list(await asyncio.shield(resolving))  # one waiter going away cancels nothing shared

    def _resolved(self, name: str, done: asyncio.Future[list[str]]) -> None:
        self._resolving.pop(name, None)
        if done.cancelled() or done.exception() is not None:
            return
        if len(self._recent) >= ANSWERS_KEPT:
            self._recent.clear()
        self._recent[name] = (time.monotonic(), done.result())

    async def _resolve_both(self, name: str) -> list[str]:
        v4, v6 = await asyncio.gather(
            self.lookup(name, socket.AF_INET), self.lookup(name, socket.AF_INET6), return_exceptions=True
        )
        found = [*(v4 if isinstance(v4, list) else []), *(v6 if isinstance(v6, list) else [])]
        if found:
            return found
        error = v4 if isinstance(v4, ResolveError) else v6
        if isinstance(error, ResolveError):
            raise error
        raise ResolveError(name, "no A or AAAA records", nxdomain=False)


class PairedLookups:
    """`Resolver.lookup` for a sandbox's A and AAAA queries, each family's lookup started with the
    other's (see the module's docstring). Keyed by sandbox, so no sandbox takes another's lookup."""

    def __init__(self, resolver: Resolver) -> None:
        self.resolver = resolver
        self._started: dict[tuple[str, str, int], asyncio.Task[list[str]]] = {}

    async def lookup(self, sandbox_address: str, name: str, family: int) -> list[str]:
        """`Resolver.lookup(name, family)` (raises ResolveError), for a query of this sandbox."""
        lookup = self._started.pop((sandbox_address, name, family), None)
        if lookup is None:
            lookup = asyncio.ensure_future(self.resolver.lookup(name, family))
            sibling = (sandbox_address, name, OTHER_FAMILY[family])
            if sibling not in self._started:
                self._keep(sibling, asyncio.ensure_future(self.resolver.lookup(name, sibling[2])))
        return await lookup

    def _keep(self, key: tuple[str, str, int], lookup: asyncio.Task[list[str]]) -> None:
        self._started[key] = lookup
        lookup.add_done_callback(lambda done: done.cancelled() or done.exception())  # may go untaken
        asyncio.get_running_loop().call_later(PAIR_KEPT_SECONDS, self._forget, key, lookup)

    def _forget(self, key: tuple[str, str, int], lookup: asyncio.Task[list[str]]) -> None:
        if self._started.get(key) is lookup:  # untaken: its query never came
            del self._started[key]


class NameMemory:
    """address -> name, per sandbox: which name did this sandbox learn this address from."""

    def __init__(self, per_sandbox: int = MEMORY_PER_SANDBOX) -> None:
        self._per_sandbox = per_sandbox
        self._memory: dict[str, OrderedDict[str, str]] = {}

    def remember(self, sandbox_address: str, name: str, addresses: list[str]) -> None:
        memory = self._memory.setdefault(sandbox_address, OrderedDict())
        for address in addresses:
            memory[normalise_ip(address)] = name
            memory.move_to_end(normalise_ip(address))
        while len(memory) > self._per_sandbox:
            memory.popitem(last=False)

    def name_for(self, sandbox_address: str, address: str) -> str | None:
        memory = self._memory.get(sandbox_address)
        return memory.get(normalise_ip(address)) if memory else None

    async def lookup(self, sandbox_address: str, address: str) -> str | None:
        """`name_for`, as the hooks ask it: a worker without the DNS listener overrides this
        to ask the worker that has it (proxy/workers.py, `PeerNames`)."""
        return self.name_for(sandbox_address, address)

    def forget(self, sandbox_address: str) -> None:
        self._memory.pop(sandbox_address, None)


def normalise_ip(address: str) -> str:
    """Canonical text of an address; IPv4-mapped IPv6 (::ffff:a.b.c.d) becomes the IPv4 it is."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        return str(ip.ipv4_mapped)
    return str(ip)


def is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True
