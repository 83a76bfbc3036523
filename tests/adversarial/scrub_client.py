"""What a client inside a sandbox receives, in full: `python scrub_client.py 'JSON LIST OF REQUESTS'`.

Rules: runs INSIDE the sandbox and only observes. Each request is {"kind": "h1"|"h2"|"ws", "host",
"path", "range": "bytes=a-b" (optional), "deflate": bool (ws)}; each result holds everything
the sandbox got: status, reason, header names and values, trailers, the raw bytes (HTTP/1.1)
and the body decoded as a real client would (every Content-Encoding it names undone), or the
WebSocket messages, ping payloads and close reason. One JSON line on stdout, bytes as latin-1.
Bounded: every socket has a timeout, every read a size limit.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import socket
import ssl
import sys
import time
import zlib
from typing import Any

TIMEOUT = 8.0
LIMIT = 1024 * 1024
ACCEPT = "gzip, deflate, br, zstd"


def text(data: bytes) -> str:
    return data.decode("latin-1")


def connect(host: str, alpn: list[str]) -> ssl.SSLSocket:
    context = ssl.create_default_context()
    context.set_alpn_protocols(alpn)
    return context.wrap_socket(socket.create_connection((host, 443), TIMEOUT), server_hostname=host)


def read_all(sock: socket.socket) -> tuple[bytes, float | None]:
    """Everything until EOF, and how long until the first SSE event (`data:`) arrived."""
    data, first_event = b"", None
    started = time.monotonic()
    deadline = started + TIMEOUT
    while len(data) < LIMIT and time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except (OSError, ssl.SSLError):
            break
        if not chunk:
            break
        data += chunk
        if first_event is None and b"data:" in data:
            first_event = time.monotonic() - started
    return data, first_event


def decode(body: bytes, coding: str) -> bytes:
    for name in reversed([c.strip().lower() for c in coding.split(",") if c.strip()]):
        if name in ("gzip", "x-gzip"):
            body = gzip.decompress(body)
        elif name == "deflate":
            body = zlib.decompress(body)
        elif name == "br":
            import brotli

            body = brotli.decompress(body)
        elif name == "zstd":
            try:
                from compression import zstd  # type: ignore[import-not-found,unused-ignore]
            except ImportError:
                from backports import zstd  # type: ignore[no-redef,import-not-found,unused-ignore]
            body = zstd.decompress(body)
    return body


def unchunk(data: bytes) -> tuple[bytes, list[list[str]]]:
    body, trailers = b"", []
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            for line in data.split(b"\r\n"):
                if b":" in line:
                    name, _, value = line.partition(b":")
                    trailers.append([text(name), text(value.strip())])
            break
        body, data = body + data[:size], data[size + 2 :]
    return body, trailers


def h1(host: str, path: str, range: str | None = None) -> dict[str, Any]:
    sock = connect(host, ["http/1.1"])
    extra = f"Range: bytes={range}\r\n" if range else ""
    head = f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept-Encoding: {ACCEPT}\r\n{extra}"
    request = head + "Connection: close\r\n\r\n"
    with sock:
        sock.sendall(request.encode())
        raw, first_event = read_all(sock)
    head, _, rest = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.split(b"\r\n")
    parts = status_line.split(b" ", 2)
    headers = [[text(k), text(v.strip())] for k, _, v in (line.partition(b":") for line in lines)]
    named = {k.lower(): v for k, v in headers}
    body, trailers = unchunk(rest) if "chunked" in named.get("transfer-encoding", "") else (rest, [])
    return {
        "status": int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None,
        "reason": text(parts[2]) if len(parts) > 2 else "",
        "headers": headers,
        "trailers": trailers,
        "raw": text(raw),
        "first_event": first_event,
        "body": text(decode(body, named.get("content-encoding", ""))),
    }


def h2(host: str, path: str, range: str | None = None) -> dict[str, Any]:
    import h2.config
    import h2.connection
    import h2.events

    sock = connect(host, ["h2"])
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="latin-1"))
    conn.initiate_connection()
    headers = [(":method", "GET"), (":path", path), (":scheme", "https"), (":authority", host)]
    headers += [("accept-encoding", ACCEPT)] + ([("range", f"bytes={range}")] if range else [])
    conn.send_headers(1, headers, end_stream=True)
    sock.sendall(conn.data_to_send())
    result: dict[str, Any] = {"status": None, "headers": [], "trailers": [], "reset": None}
    body = b""
    done, deadline = False, time.monotonic() + TIMEOUT
    while not done and time.monotonic() < deadline:
        try:
            data = sock.recv(65536)
        except (OSError, ssl.SSLError):
            break
        if not data:
            break
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.ResponseReceived):
                result["headers"] = [[k, v] for k, v in event.headers]
                result["status"] = int(dict(event.headers)[":status"])
            elif isinstance(event, h2.events.TrailersReceived):
                result["trailers"] = [[k, v] for k, v in event.headers]
            elif isinstance(event, h2.events.DataReceived):
                body += event.data
                conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, (h2.events.StreamEnded, h2.events.ConnectionTerminated)):
                done = True
            elif isinstance(event, h2.events.StreamReset):
                result["reset"], done = int(event.error_code), True
        sock.sendall(conn.data_to_send())
    sock.close()
    coding = dict((k.lower(), v) for k, v in result["headers"]).get("content-encoding", "")
    result["body"] = text(decode(body, coding))
    return result


def ws(host: str, path: str, deflate: bool = False) -> dict[str, Any]:
    import wsproto
    import wsproto.events as ev
    from wsproto.extensions import PerMessageDeflate

    sock = connect(host, ["http/1.1"])
    conn = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
    extensions = [PerMessageDeflate()] if deflate else []
    sock.sendall(conn.send(ev.Request(host=host, target=path, extensions=extensions)))
    result: dict[str, Any] = {"accepted": False, "messages": [], "pings": [], "close": None, "extensions": []}
    partial = b""
    deadline = time.monotonic() + TIMEOUT
    while result["close"] is None and time.monotonic() < deadline:
        try:
            data = sock.recv(65536)
        except (OSError, ssl.SSLError):
            break
        if not data:
            break
        conn.receive_data(data)
        for event in conn.events():
            if isinstance(event, ev.AcceptConnection):
                result["accepted"] = True
                result["extensions"] = [e.name for e in event.extensions]
            elif isinstance(event, ev.RejectConnection):
                result["rejected"] = event.status_code
            elif isinstance(event, ev.Message):
                partial += event.data.encode() if isinstance(event.data, str) else event.data
                if event.message_finished:
                    result["messages"].append(text(partial))
                    partial = b""
            elif isinstance(event, ev.Ping):
                result["pings"].append(text(bytes(event.payload)))
                sock.sendall(conn.send(event.response()))
            elif isinstance(event, ev.CloseConnection):
                result["close"] = {"code": event.code, "reason": event.reason}
                with contextlib.suppress(Exception):  # the peer may be gone already
                    sock.sendall(conn.send(event.response()))
    sock.close()
    return result


KINDS = {"h1": h1, "h2": h2, "ws": ws}


def run(request: dict[str, Any]) -> dict[str, Any]:
    kind = request.pop("kind")
    try:
        return {"kind": kind, **request, **KINDS[kind](**request)}
    except Exception as exc:  # report, never crash: the test decides what a failure means
        return {"kind": kind, **request, "error": f"{type(exc).__name__}: {exc}"[:300]}


if __name__ == "__main__":
    print(json.dumps([run(request) for request in json.loads(sys.argv[1])]))
