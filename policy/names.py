"""Names, targets and paths: one normal form shared by rules and requests.

Rules of this module:
1. A rule target and a request host are normalised the same way (lower case, no trailing dot,
   IDNA to punycode), so matching is plain string equality on labels.
2. A target is exactly one of: a host name, a wildcard `*.suffix` (subdomains only, never the
   apex), an IP address, or a CIDR. Anything else is an error that says how to write it.
3. A request host that is an IP literal in any spelling (dotted quad, `[v6]`, v4-mapped v6, the
   `inet_aton` short forms such as `127.1`) becomes an address: it can only match IP/CIDR rules.
4. Path patterns: `x*` is a prefix match, anything else exact (as OpenSandbox's credential proxy);
   both sides are canonical paths (sandgate.policy.canonical).
"""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass
from typing import Literal

import idna

from sandgate.policy.errors import HintedValueError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_LABEL = r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
_HOSTNAME = re.compile(rf"^(?:{_LABEL}\.)*{_LABEL}$")
_NUMERIC_LABEL = re.compile(r"^(?:0x[0-9a-f]*|[0-9]+)$")
_MAX_NAME = 253

WILDCARD_HINT = "a wildcard is a whole leftmost label: `*.example.com` matches subdomains, not example.com"


@dataclass(frozen=True, slots=True)
class Target:
    """A parsed rule target; `text` is its canonical spelling (the key for patch and delete)."""

    kind: Literal["name", "wildcard", "network"]
    text: str
    network: IPNetwork | None = None

    @property
    def suffix(self) -> str:
        """For a wildcard, the name its subdomains end in."""
        return self.text[2:]


def to_ascii_name(raw: str) -> str:
    """Lower case, trailing dot removed, IDNA to punycode; raises HintedValueError if not a name."""
    name = raw.strip().lower()
    if name.endswith("."):
        name = name[:-1]
    if not name:
        raise HintedValueError("empty host name")
    if not name.isascii():
        try:
            name = idna.encode(name, uts46=True).decode("ascii")
        except idna.IDNAError as exc:
            raise HintedValueError(f"{raw!r} is not a valid internationalised name: {exc}") from exc
    if len(name) > _MAX_NAME or not _HOSTNAME.match(name):
        raise HintedValueError(
            f"{raw!r} is not a valid host name",
            "labels are letters, digits, '-' or '_', 1-63 characters, separated by dots",
        )
    return name


def parse_target(raw: str) -> Target:
    """Parse a rule target (host name, `*.suffix`, IP or CIDR) into its canonical form."""
    text = raw.strip()
    if not text:
        raise HintedValueError("target is empty", "write a host name, `*.example.com`, an IP or a CIDR")
    if "://" in text or ("/" in text and not _looks_like_cidr(text)):
        raise HintedValueError(
            f"target {raw!r} is a URL, not a host",
            "write only the host (e.g. `api.example.com`); restrict paths with `paths:`, ports with `ports:`",
        )
    network = _parse_network(text)
    if network is not None:
        return Target("network", _network_text(network), network)
    if "*" in text:
        return _parse_wildcard(raw, text)
    if text.rsplit(":", 1)[-1].isdigit() and ":" in text:
        raise HintedValueError(f"target {raw!r} includes a port", "put the port in `ports: [...]`")
    name = to_ascii_name(text)
    if _is_numeric_name(name):
        raise HintedValueError(f"target {raw!r} is not a valid IP address or host name")
    return Target("name", name)


def canonical_target(text: str) -> Target:
    """The Target of a target already in canonical form (as `EgressRule.target` holds it), without
    validating it again: canonical names never contain ':' or '/' nor end in a numeric label."""
    if text.startswith("*."):
        return Target("wildcard", text)
    if ":" in text or "/" in text or _is_numeric_name(text):
        return Target("network", text, ipaddress.ip_network(text))
    return Target("name", text)


def _parse_wildcard(raw: str, text: str) -> Target:
    if text == "*":
        raise HintedValueError(
            "target '*' matches nothing", "to allow every destination set `defaultAction: allow`"
        )
    if not text.startswith("*.") or "*" in text[2:]:
        raise HintedValueError(f"misplaced wildcard in target {raw!r}", WILDCARD_HINT)
    suffix = to_ascii_name(text[2:])
    if _parse_network(suffix) is not None or _is_numeric_name(suffix):
        raise HintedValueError(
            f"wildcard target {raw!r} names an IP address", "use a CIDR such as 203.0.113.0/24"
        )
    return Target("wildcard", "*." + suffix)


def _looks_like_cidr(text: str) -> bool:
    address, _, length = text.partition("/")
    return length.isdigit() and (":" in address or address.replace(".", "").isdigit())


def _parse_network(text: str) -> IPNetwork | None:
    candidate = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    if not (":" in candidate or candidate[:1].isdigit()):
        return None
    try:
        network = ipaddress.ip_network(candidate, strict=False)
    except ValueError:
        if "/" in candidate:
            raise HintedValueError(
                f"{text!r} is not a valid CIDR", "write address/prefix, e.g. 203.0.113.0/24 or 2001:db8::/32"
            ) from None
        return None
    if isinstance(network, ipaddress.IPv6Network) and network.network_address.ipv4_mapped is not None:
        raise HintedValueError(f"target {text!r} is an IPv4-mapped IPv6 address", "write the IPv4 form")
    return network


def _network_text(network: IPNetwork) -> str:
    if network.prefixlen == network.max_prefixlen:
        return str(network.network_address)
    return str(network)


def _is_numeric_name(name: str) -> bool:
    last = name.rpartition(".")[2]
    return last.isdigit() or (last.startswith("0x") and bool(_NUMERIC_LABEL.match(last)))


def canonical_address(address: IPAddress) -> IPAddress:
    """The address as rules see it: a v4-mapped IPv6 address is its IPv4 address."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def request_host(raw: str) -> str | IPAddress | None:
    """A request's host as a canonical name or an address; None if it is neither."""
    host = raw.lower()
    if host.endswith("."):
        host = host[:-1]
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if ":" in host:
        return _address_or_none(host)
    if host.isascii() and _HOSTNAME.match(host) and len(host) <= _MAX_NAME:
        if _is_numeric_name(host):
            return _inet_aton_or_none(host)
        return host
    try:
        name = to_ascii_name(host)
    except HintedValueError:
        return None
    return _inet_aton_or_none(name) if _is_numeric_name(name) else name


def _address_or_none(text: str) -> IPAddress | None:
    try:
        return canonical_address(ipaddress.ip_address(text.split("%", 1)[0]))
    except ValueError:
        return None


def _inet_aton_or_none(text: str) -> IPAddress | None:
    """Names ending in a numeric label are IPv4 in the spellings libc accepts (127.1, 0x7f.1, ...)."""
    try:
        return ipaddress.IPv4Address(socket.inet_aton(text))
    except OSError:
        return None


def path_matches(pattern: str, path: str) -> bool:
    """`x*` is a prefix match, anything else exact."""
    if pattern.endswith("*"):
        return path.startswith(pattern[:-1])
    return path == pattern
