"""The front door's pass-through: a TLS connection decided at its ClientHello is relayed by
splice(2) (no mitmproxy, no Python copying bytes), with the origin's own certificate, every byte,
and its decision and closing records."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

from sandgate.proxy import SandboxEntry
from tests.proxy.conftest import CLIENT_ADDR, Client, RunningProxy, start_proxy, stop_proxy
from tests.support.internet import ORIGIN_V4, Internet

pytestmark = pytest.mark.root

POLICY = {
    "defaultAction": "deny",
    "egress": [
        {"action": "allow", "target": "pass.example.com"},
        {"action": "allow", "target": "seen.example.com", "inspect": "always"},
    ],
}
SIZE = 3_000_000

# One verified TLS connection to pass.example.com, held open until stdin says go, then one
# request for SIZE bytes; prints the bytes received.
HOLD_THEN_FETCH = """
import socket, ssl, sys
ctx = ssl.create_default_context(cafile=CA)
raw = socket.create_connection(("pass.example.com", 443))
with ctx.wrap_socket(raw, server_hostname="pass.example.com") as s:
    print("open", flush=True)
    sys.stdin.readline()
    s.sendall(b"GET /bytes?n=%d HTTP/1.1\\r\\nHost: pass.example.com\\r\\n" % SIZE)
    s.sendall(b"Connection: close\\r\\n\\r\\n")
    got = 0
    while data := s.recv(1 << 16):
        got += len(data)
    print(got, flush=True)
"""


@pytest.fixture(scope="module")
def proxy(net: Internet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    net.set_names({"pass.example.com": [ORIGIN_V4], "seen.example.com": [ORIGIN_V4]})
    entry = SandboxEntry(sandbox_id="sbx-splice", address=CLIENT_ADDR, policy=POLICY)
    running = start_proxy(tmp_path_factory.mktemp("proxy"), net, [entry], splice_passthrough=True)
    try:
        yield running
    finally:
        stop_proxy(running)


def spliced(proxy: RunningProxy) -> tuple[int, int]:
    """(spliced so far, spliced now) from the proxy's metrics."""
    text = proxy.control.metrics()
    total = re.search(r"^sandgate_proxy_spliced_connections_total (\d+)$", text, re.M)
    open_now = re.search(r"^sandgate_proxy_spliced_connections_open (\d+)$", text, re.M)
    assert total and open_now, text
    return int(total.group(1)), int(open_now.group(1))


def test_a_passed_through_connection_is_spliced_with_every_byte_and_its_records(
    proxy: RunningProxy, client: Client, net: Internet
) -> None:
    code = f"CA, SIZE = {str(net.ca_cert)!r}, {SIZE}\n" + HOLD_THEN_FETCH
    process = client.ns.popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout.readline().strip() == "open"  # the origin's certificate verified
        [decision] = proxy.wait_audit(1, kind="connection", host="pass.example.com", event=None)
        assert spliced(proxy) == (1, 1)
        process.stdin.write("\n")
        process.stdin.flush()
        received = int(process.stdout.readline())
    finally:
        process.kill()
        process.wait()
    assert received > SIZE  # the body and its headers
    [closed] = proxy.wait_audit(1, id=f"{decision['id']}-closed")
    assert (decision["decision"], decision["inspect"], decision["upstream"]) == (
        "allow",
        False,
        f"{ORIGIN_V4}:443",
    )
    assert SIZE < closed["bytes_in"] < SIZE + 20_000 and 300 < closed["bytes_out"] < 5_000
    assert closed["event"] == "closed" and closed["duration_ms"] > 0
    assert spliced(proxy)[1] == 0


def test_intercepted_hosts_and_plain_http_still_go_to_mitmproxy(
    proxy: RunningProxy, client: Client, net: Internet
) -> None:
    before = spliced(proxy)[0]
    # seen.example.com is intercepted: the deployment CA verifies it, the origin's does not
    intercepted = client.curl("--cacert", str(proxy.ca_cert), "https://seen.example.com/")
    assert intercepted.stdout == "hello from origin\n", intercepted.stderr
    assert client.curl("--cacert", str(net.ca_cert), "https://seen.example.com/").returncode == 60
    assert proxy.wait_audit(1, kind="request", host="seen.example.com")
    plain = client.curl("http://pass.example.com/")  # not TLS: mitmproxy's, decided by Host
    assert plain.stdout == "hello from origin\n", plain.stderr
    resolve = f"denied.example.com:443:{ORIGIN_V4}"  # the proxy's DNS would say NXDOMAIN
    denied = client.curl("--resolve", resolve, "--cacert", str(net.ca_cert), "https://denied.example.com/")
    assert denied.returncode == 35, denied  # closed at the ClientHello, no certificate shown
    [record] = proxy.wait_audit(1, kind="connection", sni="denied.example.com")
    assert record["decision"] == "deny"
    assert spliced(proxy)[0] == before
