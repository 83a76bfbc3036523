"""The sandboxes' resolver against a DNS server that records every query it receives, raw:
every record type of an allowed name is answered through a question-only query, a denied name
never reaches it, and refusals carry an Extended DNS Error when the query had EDNS."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from dnslib import DNSRecord

from sandgate.proxy import SandboxEntry
from tests.proxy.conftest import CLIENT_ADDR, GATEWAY, Client, RunningProxy, start_proxy, stop_proxy
from tests.support.internet import ORIGIN_V4, Internet

pytestmark = pytest.mark.root

POLICY = {
    "defaultAction": "deny",
    "egress": [
        {"action": "allow", "target": "svc.example.com"},
        {"action": "allow", "target": "*.svc.example.com"},
    ],
}
BIG_TXT = " ".join(f'"{n:03d}-{"x" * 60}"' for n in range(10))  # about 650 bytes of answer
RECORDS = [
    'svc.example.com. 5 IN TXT "v=sandgate" "second string"',
    "svc.example.com. 5 IN MX 10 mail.svc.example.com.",
    "svc.example.com. 5 IN HTTPS 1 . alpn=h2 ipv4hint=198.51.100.10",
    "_api._tcp.svc.example.com. 5 IN SRV 0 5 8443 svc.example.com.",
    "alias.svc.example.com. 5 IN CNAME svc.example.com.",
    f"big.svc.example.com. 5 IN TXT {BIG_TXT}",
    'denied.example.com. 5 IN TXT "never asked"',
]
EXPECTED = {
    ("SvC.Example.COM", "TXT"): ['"v=sandgate" "second string"'],
    ("svc.example.com", "MX"): ["10 mail.svc.example.com."],
    ("svc.example.com", "HTTPS"): ["1 . alpn=h2 ipv4hint=198.51.100.10"],
    ("_api._tcp.svc.example.com", "SRV"): ["0 5 8443 svc.example.com."],
    ("alias.svc.example.com", "CNAME"): ["svc.example.com."],
}
EDE, ECS, COOKIE = 15, 8, 10

# In the client namespace: one query per argument line (JSON [name, qtype, edns, smuggle, tcp?]), sent
# with dnslib to the gateway (nft turns port 53 to the proxy); prints the reply's essentials.
ASK = f"""
import json, sys
from dnslib import DNSRecord, EDNS0, EDNSOption, RR, TXT, QTYPE
for line in sys.argv[1:]:
    name, qtype, edns, smuggle, *tcp = json.loads(line)
    query = DNSRecord.question(name, qtype)
    if smuggle:  # data a client could try to carry out in the parts of a query besides the name
        query.add_auth(RR("auth-payload.exfil.example.test", QTYPE.TXT, rdata=TXT("secret-auth")))
        query.add_ar(RR("ar-payload.exfil.example.test", QTYPE.TXT, rdata=TXT("secret-ar")))
    if edns:
        query.add_ar(EDNS0(udp_len=1232, opts=[EDNSOption({ECS}, bytes.fromhex("00012000c6336400")),
                                               EDNSOption({COOKIE}, b"secretco")]))
    reply = DNSRecord.parse(query.send("{GATEWAY}", 53, tcp=bool(tcp), timeout=5))
    opts = [[o.code, o.data.hex()] for rr in reply.ar if rr.rtype == 41 for o in rr.rdata]
    print(json.dumps({{"rcode": reply.header.rcode, "tc": reply.header.tc,
                      "names": [str(rr.rname) for rr in reply.rr],
                      "answers": [rr.rdata.toZone() for rr in reply.rr],
                      "opt": any(rr.rtype == 41 for rr in reply.ar), "options": opts}}))
"""


@pytest.fixture(scope="module")
def proxy(net: Internet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    net.set_names({"svc.example.com": [ORIGIN_V4], "denied.example.com": [ORIGIN_V4]})
    net.set_records(RECORDS)
    entry = SandboxEntry(sandbox_id="sbx-dns", address=CLIENT_ADDR, policy=POLICY)
    running = start_proxy(tmp_path_factory.mktemp("proxy"), net, [entry])
    try:
        yield running
    finally:
        stop_proxy(running)


def ask(
    client: Client, *queries: tuple[str, str, bool, bool] | tuple[str, str, bool, bool, bool]
) -> list[dict[str, Any]]:
    result = client.run([sys.executable, "-c", ASK, *(json.dumps(q) for q in queries)])
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def sent_upstream(net: Internet) -> list[dict[str, str]]:
    """The upstream's queries, each once: a UDP query resent while unanswered (dnswire rule 2)
    arrives again byte for byte, and is one question asked, not two."""
    return list({(q["transport"], q["raw"]): q for q in net.dns_queries()}.values())


def upstream_messages(net: Internet) -> list[DNSRecord]:
    return [DNSRecord.parse(bytes.fromhex(q["raw"])) for q in sent_upstream(net)]


def test_every_type_of_an_allowed_name_is_answered_through_a_question_only_query(
    proxy: RunningProxy, client: Client, net: Internet
) -> None:
    net.clear_dns_queries()
    queries = [(name, qtype, True, True) for name, qtype in EXPECTED]
    replies = ask(client, *queries)
    for (name, qtype), reply in zip(EXPECTED, replies, strict=True):
        assert reply["rcode"] == 0 and reply["answers"] == EXPECTED[(name, qtype)], (name, qtype, reply)
        assert reply["names"] == [f"{name}."]  # the owner name in the letter case asked
        assert reply["opt"] and reply["options"] == []  # an OPT of our own; no client option echoed
    asked = upstream_messages(net)
    assert sorted((str(m.q.qname), m.q.qtype) for m in asked) == sorted(
        (f"{name.lower()}.", DNSRecord.question(name, qtype).q.qtype) for name, qtype in EXPECTED
    )
    for message in asked:  # nothing but the question: no records, no EDNS, no client option
        assert (message.header.a, message.header.auth, message.header.ar) == (0, 0, 0), message
        assert message.ar == [] and message.auth == [] and message.rr == []
    raw = b"".join(bytes.fromhex(q["raw"]) for q in net.dns_queries())
    for smuggled in (b"secret-auth", b"secret-ar", b"secretco", b"payload", bytes.fromhex("c6336400")):
        assert smuggled not in raw
    records = proxy.wait_audit(len(EXPECTED), kind="dns", decision="allow")
    assert any(
        r["host"] == "_api._tcp.svc.example.com"
        and "qtype=SRV forwarded rcode=NOERROR answers=1" in r["detail"]
        for r in records
    ), records


def test_a_denied_name_is_nxdomain_without_an_upstream_query_and_says_why_with_edns(
    proxy: RunningProxy, client: Client, net: Internet
) -> None:
    net.clear_dns_queries()
    with_edns, plain, a_record = ask(
        client,
        ("denied.example.com", "TXT", True, False),
        ("denied.example.com", "SRV", False, False),
        ("data.denied.example.com", "A", True, True),
    )
    assert with_edns["rcode"] == 3 and with_edns["answers"] == []
    [[code, data]] = with_edns["options"]
    info, text = int(data[:4], 16), bytes.fromhex(data[4:]).decode()
    assert (code, info) == (EDE, 15), with_edns  # Extended DNS Error 15: Blocked
    assert text.startswith("sandgate: egress denied (default") and "denied.example.com" not in text
    assert plain["rcode"] == 3 and not plain["opt"]  # no EDNS asked, none answered (RFC 8914)
    assert a_record["rcode"] == 3 and a_record["options"][0][0] == EDE
    assert net.dns_queries() == []  # not one of them left the proxy
    denied = proxy.wait_audit(3, kind="dns", decision="deny")
    assert {r["host"] for r in denied} >= {"denied.example.com", "data.denied.example.com"}


def test_answers_that_do_not_fit_are_truncated_and_a_records_still_pin(
    proxy: RunningProxy, client: Client, net: Internet
) -> None:
    net.clear_dns_queries()
    small, large, over_tcp, address = ask(
        client,
        ("big.svc.example.com", "TXT", False, False),
        ("big.svc.example.com", "TXT", True, False),
        ("big.svc.example.com", "TXT", False, False, True),
        ("svc.example.com", "A", False, False),
    )
    assert small["tc"] == 1 and small["answers"] == []  # 512 bytes without EDNS: told to retry
    assert large["tc"] == 0 and len(large["answers"]) == 1 and "009-" in large["answers"][0]
    assert over_tcp == {**large, "opt": False}  # over TCP (port 53 reaches the proxy) it is whole
    assert address["answers"] == [ORIGIN_V4]
    big = [q["transport"] for q in sent_upstream(net) if q["name"] == "big.svc.example.com"]
    assert big == ["udp", "tcp"] * 3  # truncated upstream too: asked again over TCP
    fetched = client.curl("-k", "https://svc.example.com/")  # passes through to the pinned address
    assert fetched.stdout == "hello from origin\n", fetched.stderr


def test_dig_inside_the_sandbox_shows_records_and_the_block(proxy: RunningProxy, client: Client) -> None:
    answer = client.run(
        ["dig", f"@{GATEWAY}", "+short", "+tries=1", "+time=5", "SRV", "_api._tcp.svc.example.com"]
    )
    assert answer.stdout.strip() == "0 5 8443 svc.example.com.", answer
    blocked = client.run(["dig", f"@{GATEWAY}", "+tries=1", "+time=5", "TXT", "denied.example.com"])
    assert "status: NXDOMAIN" in blocked.stdout, blocked
    assert "; EDE: 15 (Blocked): (sandgate: egress denied (default" in blocked.stdout, blocked.stdout
    # Without EDNS the answer is truncated over UDP; dig asks again over TCP and gets it whole.
    big = client.run(["dig", f"@{GATEWAY}", "+noedns", "+tries=1", "+time=5", "TXT", "big.svc.example.com"])
    assert "Truncated, retrying in TCP mode" in big.stdout and "009-" in big.stdout, big.stdout


# In the client namespace: one UDP socket (one source port) asks, is idle for argv[1] seconds,
# and asks again, as a resolver that keeps its socket does (and glibc when it reuses a port).
SAME_PORT = f"""
import json, socket, sys, time
from dnslib import DNSRecord
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.settimeout(3)
sock.connect(("{GATEWAY}", 53))
answers = []
for pause in (0, float(sys.argv[1])):
    time.sleep(pause)
    query = DNSRecord.question(sys.argv[2], "A")
    sock.send(query.pack())
    try:
        reply = DNSRecord.parse(sock.recv(4096))
        answers.append([reply.header.id == query.header.id, [str(rr.rdata) for rr in reply.rr]])
    except TimeoutError:
        answers.append("no answer within 3 s")
print(json.dumps(answers))
"""


def test_a_client_that_asks_again_from_the_same_port_after_an_idle_gap_is_answered(
    proxy: RunningProxy, client: Client
) -> None:
    """mitmproxy closed an idle UDP peer after 20 s while mitmproxy_rs kept it, closed, for 60 s
    more and dropped what it sent (proxy/pooldns.py, `UDP_PEER_TIMEOUT`): a query 21 s after the
    last one from the same port was never answered (both tries of glibc's stub failed in the
    adversarial suite when a lookup reused a recent port)."""
    result = client.run([sys.executable, "-c", SAME_PORT, "21", "svc.example.com"], timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [[True, [ORIGIN_V4]], [True, [ORIGIN_V4]]]
