"""Holds four connections through the proxy and reports what became of them after a policy
change: run inside a sandbox (or a test's client namespace) as

    python hold_connections.py PROXY_CA ORIGIN_CA PROXY_ADDRESS EXPLICIT_PORT INTERCEPTED PASSED [GO_FILE]

It opens, and uses once: intercepted HTTP/1.1 keep-alive to INTERCEPTED (verified with the
proxy's CA), intercepted HTTP/2 to INTERCEPTED with a server-sent-event stream left in flight,
TLS to PASSED (verified with the origin's CA: pass-through), and TLS to PASSED inside a CONNECT
tunnel through the explicit proxy. Then it prints "open" and waits for a line on stdin (or for
GO_FILE to exist, at most 60 s). Then it watches all four for the proxy closing them (2 s at
most), asks each HTTP/1.1 connection still open for `/echo?after=NAME`, and prints one JSON line:
{"h1"|"spliced"|"tunnel": {"closed", "after": status or error}, "h2": {"closed",
"stream_ended", "events"}}. Standard library and h2 only; every wait is bounded.
"""

import http.client
import json
import os
import select
import socket
import ssl
import sys
import time

from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import DataReceived, StreamEnded

PROXY_CA, ORIGIN_CA, PROXY_ADDRESS, EXPLICIT, INTERCEPTED, PASSED = sys.argv[1:7]
GO_FILE = sys.argv[7] if len(sys.argv) > 7 else None
proxy_ctx = ssl.create_default_context(cafile=PROXY_CA)
origin_ctx = ssl.create_default_context(cafile=ORIGIN_CA)


def h1(host, ctx, tunnel=False):
    if tunnel:
        conn = http.client.HTTPSConnection(PROXY_ADDRESS, int(EXPLICIT), context=ctx, timeout=10)
        conn.set_tunnel(host, 443)
    else:
        conn = http.client.HTTPSConnection(host, 443, context=ctx, timeout=10)
    conn.request("GET", "/echo?before=1")
    conn.getresponse().read()
    return conn


held = {
    "h1": h1(INTERCEPTED, proxy_ctx),
    "spliced": h1(PASSED, origin_ctx),
    "tunnel": h1(PASSED, origin_ctx, True),
}

h2_ctx = ssl.create_default_context(cafile=PROXY_CA)
h2_ctx.set_alpn_protocols(["h2"])
h2_sock = h2_ctx.wrap_socket(
    socket.create_connection((INTERCEPTED, 443), timeout=10), server_hostname=INTERCEPTED
)
assert h2_sock.selected_alpn_protocol() == "h2"
h2 = H2Connection(H2Configuration(client_side=True))
h2.initiate_connection()
request = [
    (":method", "GET"),
    (":path", "/sse?n=100&gap=0.2"),
    (":scheme", "https"),
    (":authority", INTERCEPTED),
]
h2.send_headers(1, request, end_stream=True)
h2_sock.sendall(h2.data_to_send())
seen = {"events": 0, "stream_ended": False}


def pump_h2(data):
    for event in h2.receive_data(data):
        if isinstance(event, DataReceived):
            seen["events"] += event.data.count(b"data: ")
            h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, StreamEnded):
            seen["stream_ended"] = True
    h2_sock.sendall(h2.data_to_send())


while not seen["events"]:
    pump_h2(h2_sock.recv(65536))
print("open", flush=True)

if GO_FILE:
    waited = time.monotonic() + 60
    while not os.path.exists(GO_FILE) and time.monotonic() < waited:
        time.sleep(0.05)
else:
    sys.stdin.readline()
socks = {name: conn.sock for name, conn in held.items()} | {"h2": h2_sock}
closed = dict.fromkeys(socks, False)
deadline = time.monotonic() + 2.0  # watch every connection at once for the proxy closing it
while not all(closed.values()) and (left := deadline - time.monotonic()) > 0:
    watched = [sock for name, sock in socks.items() if not closed[name]]
    ready = set(select.select(watched, [], [], left)[0]) | {sock for sock in watched if sock.pending()}
    for name, sock in socks.items():
        if sock in ready:
            try:
                data = sock.recv(65536)
            except (OSError, ssl.SSLError):
                data = b""
            closed[name] = not data
            if data and name == "h2":
                pump_h2(data)
result = {"h2": {"closed": closed["h2"], **seen}}
for name, conn in held.items():
    after = None
    if not closed[name]:
        try:
            conn.request("GET", f"/echo?after={name}")
            after = conn.getresponse().status
        except (OSError, http.client.HTTPException) as exc:
            after = type(exc).__name__
    result[name] = {"closed": closed[name], "after": after}
print(json.dumps(result), flush=True)
