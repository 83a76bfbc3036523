"""What of an upstream DNS answer may reach a sandbox: addresses judged, SVCB/HTTPS records screened.

Rules:
1. Every record that carries an address a client would dial is judged by the same function that
   judges A/AAAA answers (`decide.check_upstream` on the sandbox's policy: always-denied ranges,
   CIDR rules that allow private ranges), wherever it stands in a forwarded answer (answer,
   authority or additional section, an ANY answer, glue): A and AAAA records whose address is
   refused are dropped, and so are the refused addresses of an SVCB/HTTPS record's `ipv4hint`
   and `ipv6hint` (a hint left empty is removed).
2. SVCB and HTTPS records (RFC 9460, types 64 and 65: one wire format) are a closed world. Kept:
   `alpn`, `no-default-alpn`, `port`, `dohpath`, the screened hints, and `mandatory` naming
   what is left. Removed: `ech` (a config lets a client hide its real destination inside an
   encrypted ClientHello, where the proxy judges only the outer public name), and every key
   sandgate does not know (`ohttp`, `keyNNNNN`...: nothing unread reaches a sandbox).
3. A record is dropped whole when its TargetName (an alias or a service endpoint other than the
   owner itself) is a name the sandbox's policy would not resolve (`decide.decide_name`): the
   client would be sent to a name the policy did not allow. Dropped whole too: a record whose
   `mandatory` names a key removed here (the server said it is unusable without it), and any
   record RFC 9460 calls malformed or that does not parse (keys not in strictly increasing order,
   hence no key twice; a compressed or over-long target; a hint or port of the wrong length).
4. Parsing is dnslib's (`dnslib.HTTPS`) over exactly the record's RDATA, and never raises: what
   cannot be read is malformed (rule 3). A record nothing was removed from is passed on as
   upstream sent it, byte for byte.
5. Pure: records and two judges in, records and what was removed out (the audit detail).
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Callable

from dnslib import HTTPS, DNSError
from dnslib.buffer import Buffer, BufferError
from mitmproxy import dns

MANDATORY, ALPN, NO_DEFAULT_ALPN, PORT, IPV4HINT, ECH, IPV6HINT, DOHPATH = range(8)
KEPT_AS_IS = frozenset({ALPN, NO_DEFAULT_ALPN, PORT, DOHPATH})  # carry no address and no name
HINTS = {IPV4HINT: 4, IPV6HINT: 16}  # key -> bytes per address
KEY_NAMES = {MANDATORY: "mandatory", ALPN: "alpn", NO_DEFAULT_ALPN: "no-default-alpn", PORT: "port",
             IPV4HINT: "ipv4hint", ECH: "ech", IPV6HINT: "ipv6hint", DOHPATH: "dohpath"}  # fmt: skip
SERVICE_BINDING = frozenset({dns.types.SVCB, dns.types.HTTPS})
ADDRESS_SIZE = {dns.types.A: 4, dns.types.AAAA: 16}
MAX_NAME = 255

AddressJudge = Callable[[str], bool]  # may a sandbox be handed this address?
NameJudge = Callable[[str], bool]  # may a sandbox resolve (and so be sent to) this name?


@dataclasses.dataclass(frozen=True)
class ServiceBinding:
    """One SVCB/HTTPS RDATA: priority 0 is AliasMode; target "" is the owner name itself (".")."""

    priority: int
    target: str
    params: tuple[tuple[int, bytes], ...]


def key_name(key: int) -> str:
    return KEY_NAMES.get(key, f"key{key}")


def parse_service_binding(rdata: bytes) -> ServiceBinding | None:
    """The record, or None if it is malformed (rule 3) or unreadable; never raises."""
    try:
        record = HTTPS.parse(Buffer(rdata), len(rdata))
    except (DNSError, BufferError, ValueError):
        return None
    labels = [bytes(label) for label in record.target]
    if any(len(label) > 63 for label in labels) or sum(len(label) + 1 for label in labels) + 1 > MAX_NAME:
        return None  # a length byte over 63 is a compression pointer, which RFC 9460 forbids here
    keys = [key for key, _ in record.params]
    if keys != sorted(set(keys)):
        return None
    params = tuple((key, bytes(value)) for key, value in record.params)
    if not all(_well_formed(key, value, keys) for key, value in params):
        return None
    try:
        target = ".".join(label.decode("ascii") for label in labels)
    except UnicodeDecodeError:
        return None
    return ServiceBinding(record.priority, target, params)


def _well_formed(key: int, value: bytes, keys: list[int]) -> bool:
    if key in HINTS:
        return bool(value) and len(value) % HINTS[key] == 0
    if key == PORT:
        return len(value) == 2
    if key == NO_DEFAULT_ALPN:
        return value == b""
    if key == MANDATORY:
        named = [int.from_bytes(value[i : i + 2], "big") for i in range(0, len(value), 2)]
        return (
            bool(value)
            and len(value) % 2 == 0
            and MANDATORY not in named
            and len(set(named)) == len(named)
            and set(named) <= set(keys)
        )
    return True


def pack_service_binding(record: ServiceBinding) -> bytes:
    labels = [bytearray(label.encode("ascii")) for label in record.target.split(".") if label]
    buffer = Buffer()
    HTTPS(record.priority, labels, [(key, bytearray(value)) for key, value in record.params]).pack(buffer)
    return bytes(buffer.data)


def screen_service_binding(
    rdata: bytes, address_allowed: AddressJudge, name_allowed: NameJudge
) -> tuple[bytes | None, list[str]]:
    """(the RDATA a sandbox may get, None to drop the record; what was removed and why)."""
    record = parse_service_binding(rdata)
    if record is None:
        return None, ["malformed SVCB/HTTPS record dropped"]
    if record.target and not name_allowed(record.target.lower()):
        return None, [f"SVCB/HTTPS record for target {record.target} (not allowed) dropped"]
    removed: list[str] = []
    kept: dict[int, bytes] = {}
    for key, value in record.params:
        if record.priority == 0:  # AliasMode: parameters mean nothing (RFC 9460 2.4.2)
            removed.append(key_name(key))
        elif key in HINTS:
            size = HINTS[key]
            addresses = [value[i : i + size] for i in range(0, len(value), size)]
            allowed = [a for a in addresses if address_allowed(str(ipaddress.ip_address(a)))]
            removed += [f"{key_name(key)} {ipaddress.ip_address(a)}" for a in addresses if a not in allowed]
            if allowed:
                kept[key] = b"".join(allowed)
        elif key in KEPT_AS_IS or key == MANDATORY:
            kept[key] = value
        else:
            removed.append(key_name(key))
    if not removed:
        return rdata, []
    if MANDATORY in kept:
        named = {int.from_bytes(kept[MANDATORY][i : i + 2], "big") for i in range(0, len(kept[MANDATORY]), 2)}
        if not named <= kept.keys():
            lost = ", ".join(key_name(key) for key in sorted(named - kept.keys()))
            return None, [*removed, f"SVCB/HTTPS record dropped: mandatory {lost} removed"]
    screened = dataclasses.replace(record, params=tuple(sorted(kept.items())))
    return pack_service_binding(screened), removed


def screen_records(
    records: list[dns.ResourceRecord], address_allowed: AddressJudge, name_allowed: NameJudge
) -> tuple[list[dns.ResourceRecord], list[str]]:
    """`records` as a sandbox may get them (rules 1-3), and what was removed from them."""
    kept: list[dns.ResourceRecord] = []
    removed: list[str] = []
    for rr in records:
        if rr.type in ADDRESS_SIZE:
            if len(rr.data) != ADDRESS_SIZE[rr.type]:
                removed.append(f"malformed {dns.types.to_str(rr.type)} record dropped")
                continue
            address = str(ipaddress.ip_address(rr.data))
            if not address_allowed(address):
                removed.append(f"{dns.types.to_str(rr.type)} {address}")
                continue
        elif rr.type in SERVICE_BINDING:
            data, notes = screen_service_binding(rr.data, address_allowed, name_allowed)
            removed += notes
            if data is None:
                continue
            rr = dataclasses.replace(rr, data=data) if data is not rr.data else rr
        kept.append(rr)
    return kept, removed
