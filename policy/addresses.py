"""Addresses the proxy never dials unless an explicit CIDR allow rule opens them.

Rules of this module:
1. `ALWAYS_DENIED` is the whole list, a table, in the order docs/policy.md shows it.
2. IPv6 forms that carry an IPv4 address (v4-mapped, NAT64, 6to4, Teredo) are decoded and the
   IPv4 address is checked against the same table, so `::ffff:127.0.0.1` or `64:ff9b::a9fe:a9fe`
   cannot smuggle loopback or the metadata address past it.
3. Lookups cost O(number of distinct prefix lengths), never O(ranges or rules): `PrefixTable`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from dataclasses import dataclass

from sandgate.policy.names import IPAddress, IPNetwork, canonical_address


@dataclass(frozen=True, slots=True)
class DeniedRange:
    network: IPNetwork
    label: str


def _ranges(*entries: tuple[str, str]) -> tuple[DeniedRange, ...]:
    return tuple(DeniedRange(ipaddress.ip_network(net), label) for net, label in entries)


ALWAYS_DENIED: tuple[DeniedRange, ...] = _ranges(
    ("0.0.0.0/8", "this-network (includes unspecified 0.0.0.0)"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local (includes cloud metadata 169.254.169.254)"),
    ("10.0.0.0/8", "private (RFC 1918)"),
    ("172.16.0.0/12", "private (RFC 1918)"),
    ("192.168.0.0/16", "private (RFC 1918)"),
    ("100.64.0.0/10", "carrier-grade NAT (RFC 6598)"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved (includes broadcast 255.255.255.255)"),
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "site-local (deprecated)"),
    ("fc00::/7", "unique-local (includes fd00:ec2::254 metadata)"),
    ("ff00::/8", "multicast"),
)

# IPv6 prefixes whose addresses carry an IPv4 address; the IPv4 address is what gets checked.
EMBEDDING_PREFIXES: tuple[tuple[str, str], ...] = (
    ("::ffff:0:0/96", "IPv4-mapped"),
    ("64:ff9b::/96", "NAT64 well-known prefix"),
    ("64:ff9b:1::/48", "NAT64 local-use prefix"),
    ("2002::/16", "6to4"),
    ("2001::/32", "Teredo"),
)

_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))


class PrefixTable[T]:
    """Networks -> values; `lookup(address)` returns values of every network containing it."""

    def __init__(self) -> None:
        self._tables: dict[int, dict[int, dict[int, list[T]]]] = {4: {}, 6: {}}
        self._lengths: dict[int, list[tuple[int, int, dict[int, list[T]]]]] = {4: [], 6: []}

    def add(self, network: IPNetwork, value: T) -> None:
        tables = self._tables[network.version]
        by_length = tables.get(network.prefixlen)
        if by_length is None:
            by_length = tables[network.prefixlen] = {}
            bits = network.max_prefixlen
            self._lengths[network.version] = sorted(
                ((bits - length, length, table) for length, table in tables.items()), key=lambda item: item[1]
            )
        key = int(network.network_address) >> (network.max_prefixlen - network.prefixlen)
        by_length.setdefault(key, []).append(value)

    def lookup(self, address: IPAddress) -> Iterator[tuple[int, T]]:
        """(prefix length, value) for every network containing `address`, shortest prefix first."""
        value = int(address)
        for shift, length, table in self._lengths[address.version]:
            hit = table.get(value >> shift)
            if hit:
                for item in hit:
                    yield length, item

    def __bool__(self) -> bool:
        return any(self._lengths.values())


def embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries (v4-mapped, NAT64, 6to4, Teredo client), if any."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if any(address in prefix for prefix in _NAT64):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


_DENIED = PrefixTable[DeniedRange]()
for _entry in ALWAYS_DENIED:
    _DENIED.add(_entry.network, _entry)


def address_to_check(address: IPAddress) -> IPAddress:
    """The address whose ranges and rules decide a dial: embedded IPv4 if it is in a denied range."""
    address = canonical_address(address)
    if isinstance(address, ipaddress.IPv6Address):
        inner = embedded_ipv4(address)
        if inner is not None and denied_range(inner) is not None:
            return inner
    return address


def denied_range(address: IPAddress) -> DeniedRange | None:
    """The always-denied range containing this address (after decoding embeddings), or None."""
    address = canonical_address(address)
    for _length, entry in _DENIED.lookup(address):
        return entry
    if isinstance(address, ipaddress.IPv6Address):
        inner = embedded_ipv4(address)
        if inner is not None:
            return denied_range(inner)
    return None
