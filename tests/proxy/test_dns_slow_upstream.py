"""A resolver that never answers: a sandbox's A and AAAA, sent together from one socket as a stub
resolver sends them, are both answered SERVFAIL within one upstream timeout, not one after the
other (proxy/resolver.py, `PairedLookups`). mitmproxy answers one socket's queries in turn; before
the pairing, the AAAA's own lookup started only once the A's had timed out, and its SERVFAIL came
after 4 s, past the sandbox stub's 3 s per try. The resolver here is a UDP socket on 127.0.0.1
that records when each question arrived and answers none."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from dnslib import QTYPE, DNSRecord

from sandgate.proxy import SandboxEntry
from sandgate.proxy.dnswire import UPSTREAM_TIMEOUT
from tests.proxy.conftest import CLIENT_ADDR, GATEWAY, Client, RunningProxy, start_proxy, stop_proxy
from tests.support.internet import Internet
from tests.support.loopback_resolver import LoopbackResolver

pytestmark = pytest.mark.root

NAME = "svc.example.com"
POLICY = {"defaultAction": "deny", "egress": [{"action": "allow", "target": NAME}]}
SERVFAIL = 2


class SilentResolver(LoopbackResolver):
    """`asked` is (CLOCK_MONOTONIC time, qtype) of every question received; none is answered."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[tuple[float, str]] = []

    def answer(self, query: bytes, client: tuple[str, int]) -> None:
        self.asked.append((time.monotonic(), QTYPE[DNSRecord.parse(query).q.qtype]))


@pytest.fixture(scope="module")
def silent() -> Iterator[SilentResolver]:
    with SilentResolver() as running:
        yield running


@pytest.fixture(scope="module")
def proxy(
    net: Internet, silent: SilentResolver, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningProxy]:
    entry = SandboxEntry(sandbox_id="sbx-silent", address=CLIENT_ADDR, policy=POLICY)
    running = start_proxy(
        tmp_path_factory.mktemp("proxy"), net, [entry], upstream_dns=[f"127.0.0.1:{silent.port}"]
    )
    try:
        yield running
    finally:
        stop_proxy(running)


# In the client namespace: A and AAAA from one socket at once (as glibc's stub sends them); prints
# [CLOCK_MONOTONIC time, qtype, rcode] of each answer (the clock is the machine's, as the resolver's).
PAIR = f"""
import json, socket, time
from dnslib import QTYPE, DNSRecord
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.settimeout(15)
sock.connect(("{GATEWAY}", 53))
for qtype in ("A", "AAAA"):
    sock.send(DNSRecord.question("{NAME}", qtype).pack())
answers = []
for _ in range(2):
    reply = DNSRecord.parse(sock.recv(4096))
    answers.append([time.monotonic(), QTYPE[reply.q.qtype], reply.header.rcode])
print(json.dumps(answers))
"""


def test_a_and_aaaa_from_one_socket_are_looked_up_together(
    proxy: RunningProxy, client: Client, silent: SilentResolver
) -> None:
    result = client.python(PAIR, timeout=30)
    assert result.returncode == 0, result.stderr
    answers = json.loads(result.stdout)
    assert sorted((qtype, rcode) for _, qtype, rcode in answers) == [("A", SERVFAIL), ("AAAA", SERVFAIL)]
    # The resolver's side: both questions left the proxy together, within one upstream timeout
    # (one after the other, the second left only when the first's timeout had run out).
    first = {qtype: min(at for at, asked in silent.asked if asked == qtype) for qtype in ("A", "AAAA")}
    assert abs(first["AAAA"] - first["A"]) < UPSTREAM_TIMEOUT, (silent.asked, answers)
    records = proxy.wait_audit(2, kind="dns", host=NAME)
    assert sorted(r["detail"].split()[0] for r in records) == ["qtype=A", "qtype=AAAA"], records
    assert all("failed: cannot resolve" in r["detail"] for r in records), records
