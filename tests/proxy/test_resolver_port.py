"""A resolver on a port other than 53 (`upstream_dns = ["ip:port"]`): the proxy's own lookups
(which pin the addresses it dials) and the questions it forwards for the sandboxes both go to
that port. The resolver here is a UDP relay on 127.0.0.1 in front of the test internet's DNS
server; it counts what it relays."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from sandgate.proxy import SandboxEntry
from tests.proxy.conftest import CLIENT_ADDR, GATEWAY, Client, RunningProxy, start_proxy, stop_proxy
from tests.support.internet import DNS_ADDR, ORIGIN_V4, Internet
from tests.support.loopback_resolver import LoopbackResolver

pytestmark = pytest.mark.root

POLICY = {"defaultAction": "deny", "egress": [{"action": "allow", "target": "svc.example.com"}]}


class Relay(LoopbackResolver):
    """Relays each question to DNS_ADDR:53, one at a time; `relayed` counts the answers relayed."""

    def __init__(self) -> None:
        super().__init__()
        self.relayed = 0

    def answer(self, query: bytes, client: tuple[str, int]) -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as upstream:
            upstream.settimeout(3)
            upstream.sendto(query, (DNS_ADDR, 53))
            try:
                self.sock.sendto(upstream.recv(4096), client)
            except TimeoutError:
                return
        self.relayed += 1


@pytest.fixture(scope="module")
def relay() -> Iterator[Relay]:
    with Relay() as running:
        yield running


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
