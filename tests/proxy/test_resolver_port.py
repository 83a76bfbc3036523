"""A resolver on a port other than 53 (`upstream_dns = ["ip:port"]`): the proxy's own lookups
(which pin the addresses it dials) and the questions it forwards for the sandboxes both go to
that port. The resolver here is a UDP relay on 127.0.0.1 in front of the test internet's DNS
server; it counts what it relays."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from sandgate.proxy import SandboxEntry
from tests.proxy.conftest import CLIENT_ADDR, GATEWAY, Client, RunningProxy, start_proxy, stop_proxy
from tests.support.internet import DNS_ADDR, ORIGIN_V4, Internet

pytestmark = pytest.mark.root

POLICY = {"defaultAction": "deny", "egress": [{"action": "allow", "target": "svc.example.com"}]}


class Relay:
    """UDP 127.0.0.1:<port> -> DNS_ADDR:53, one question at a time; `names` is what it relayed."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.relayed = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                query, client = self.sock.recvfrom(4096)
            except TimeoutError:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as upstream:
                upstream.settimeout(3)
                upstream.sendto(query, (DNS_ADDR, 53))
                try:
                    self.sock.sendto(upstream.recv(4096), client)
                except TimeoutError:
                    continue
            self.relayed += 1

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


@pytest.fixture(scope="module")
def relay() -> Iterator[Relay]:
    running = Relay()
    try:
        yield running
    finally:
        running.close()


@pytest.fixture(scope="module")
def proxy(net: Internet, relay: Relay, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    net.set_names({"svc.example.com": [ORIGIN_V4]})
    net.set_records(['svc.example.com. 5 IN TXT "via the port"'])
    entry = SandboxEntry(sandbox_id="sbx-port", address=CLIENT_ADDR, policy=POLICY)
    running = start_proxy(
        tmp_path_factory.mktemp("proxy"), net, [entry], upstream_dns=[f"127.0.0.1:{relay.port}"]
    )
    try:
        yield running
    finally:
        stop_proxy(running)


def test_the_proxy_resolves_and_forwards_through_a_resolver_port(
    proxy: RunningProxy, client: Client, relay: Relay
) -> None:
    assert proxy.config.upstream_dns == [f"127.0.0.1:{relay.port}"]
    before = relay.relayed
    # Pass-through TLS: dialled at the address the proxy resolved itself, through the port.
    fetched = client.curl("-k", "https://svc.example.com/")
    assert fetched.stdout == "hello from origin\n", fetched.stderr
    # The sandbox's own questions: A from the proxy's lookup, TXT forwarded, both via the port.
    answer = client.run(["dig", f"@{GATEWAY}", "+short", "+tries=1", "+time=5", "A", "svc.example.com"])
    assert answer.stdout.strip() == ORIGIN_V4, answer
    txt = client.run(["dig", f"@{GATEWAY}", "+short", "+tries=1", "+time=5", "TXT", "svc.example.com"])
    assert txt.stdout.strip() == '"via the port"', txt
    assert relay.relayed - before >= 3  # A and AAAA for the pin (reused for the dig's A), the TXT
    records = proxy.wait_audit(2, kind="dns", host="svc.example.com", decision="allow")
    assert any(r["detail"].startswith("qtype=A ") and ORIGIN_V4 in r["detail"] for r in records), records
