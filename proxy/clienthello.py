"""What a ClientHello must be before the proxy believes the name in it.

Rules:
1. A hello a conforming server must reject is refused before any policy is asked
   (`Reason.MALFORMED_CLIENTHELLO`): an extension type more than once (RFC 8446 4.2,
   RFC 5246 7.4.1.4); a server_name extension whose lengths do not add up, that holds no name,
   more than one name (RFC 6066 3 allows one per name type, and host_name is the only type there
   is), a name of another type, or a name that is not a valid host name. Each is a way to show
   the proxy one name and a lenient server another (mitmproxy reads the first valid
   server_name; a server may read the last).
2. An ECH-carrying hello (`encrypted_client_hello`, 0xfe0d, or the draft ESNI extension 0xffce)
   names its real destination only inside the encrypted inner hello: its SNI is the outer,
   public name of whoever terminates ECH. `EchMode` (the proxy setting `ech`) says what such a
   hello means: `refuse` (default; audited as `Reason.ECH_REFUSED`), `intercept` (the proxy
   terminates TLS itself, which ignores ECH, so the client talks to the outer name or gives up,
   and every request's Host is judged; GREASE ECH, as Chromium sends without a config, then works)
   or `passthrough` (the outer name is judged and trusted, as pass-through trusts SNI: the
   domain-fronting trade-off of docs/security.md, widened to every ECH service behind it).
3. Pure: the hello's (type, body) extension list in, a finding out.
"""

from __future__ import annotations

import struct
from collections import Counter

from mitmproxy.net import check

from sandgate.proxy.contract.config import EchMode

SERVER_NAME = 0x0000
HOST_NAME = 0
ENCRYPTED_HELLO = {0xFE0D: "encrypted_client_hello", 0xFFCE: "encrypted_server_name"}

__all__ = ["EchMode", "encrypted_hello", "hello_fault", "server_name_fault"]


def hello_fault(extensions: list[tuple[int, bytes]]) -> str | None:
    """What makes this hello one a conforming server must reject (rule 1), or None."""
    repeated = sorted(kind for kind, count in Counter(kind for kind, _ in extensions).items() if count > 1)
    if repeated:
        return "extension " + ", ".join(f"0x{kind:04x}" for kind in repeated) + " more than once"
    for kind, body in extensions:
        if kind == SERVER_NAME:
            return server_name_fault(body)
    return None


def server_name_fault(body: bytes) -> str | None:
    """What is wrong with a ClientHello's server_name extension body, or None."""
    if len(body) < 2 or struct.unpack_from("!H", body)[0] != len(body) - 2:
        return "server_name list length does not match its extension"
    names, offset = [], 2
    while offset < len(body):
        if offset + 3 > len(body):
            return "server_name entry cut short"
        name_type, length = body[offset], struct.unpack_from("!H", body, offset + 1)[0]
        offset += 3
        if length == 0 or offset + length > len(body):
            return "server_name entry length out of bounds"
        names.append((name_type, body[offset : offset + length]))
        offset += length
    if len(names) != 1:
        return f"server_name holds {len(names)} names; one is allowed"
    name_type, name = names[0]
    if name_type != HOST_NAME:
        return f"server_name of type {name_type}, not host_name"
    if not check.is_valid_host(name):  # the test mitmproxy's own `sni` applies (a final dot passes)
        return "server_name is not a valid host name"
    return None


def encrypted_hello(extensions: list[tuple[int, bytes]]) -> str | None:
    """The name of the extension that encrypts this hello's real destination (rule 2), or None."""
    return next((ENCRYPTED_HELLO[kind] for kind, _ in extensions if kind in ENCRYPTED_HELLO), None)
