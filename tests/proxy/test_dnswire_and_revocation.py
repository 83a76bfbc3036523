"""The DNS wire helpers and revocation's judgement alone, no sockets: what a question-only query
holds, how answers get their OPT, EDE and truncation, and which connections a new entry
refuses."""

from __future__ import annotations

import asyncio
import socket
import struct
import time

import pytest
from dnslib import EDNS0, QTYPE, RR, TXT, DNSRecord, EDNSOption
from mitmproxy import dns

from sandgate.policy import Reason
from sandgate.proxy import SandboxEntry, dnswire
from sandgate.proxy.credentials import SecretValues
from sandgate.proxy.dnswire import (
    EDE_BLOCKED,
    EDE_OPTION,
    MAX_UDP_ANSWER,
    fit_udp,
    question_only_query,
    relay_answer,
    with_edns,
)
from sandgate.proxy.revocation import GONE, stale
from sandgate.proxy.state import ConnState, Sandbox

ADDRESS = "10.213.0.2"


def client_query(name: str, qtype: str, edns: bool) -> dns.DNSMessage:
    query = DNSRecord.question(name, qtype)
    query.add_ar(RR("smuggled.example.test", QTYPE.TXT, rdata=TXT("payload")))
    if edns:
        query.add_ar(EDNS0(udp_len=4096, opts=[EDNSOption(10, b"cookie!!")]))
    return dns.DNSMessage.unpack(query.pack())


def test_a_question_only_query_holds_the_question_and_nothing_else() -> None:
    query_id, wire = question_only_query("SvC.Example.COM", dns.types.SRV)
    parsed = DNSRecord.parse(wire)
    assert parsed.header.id == query_id and parsed.header.rd == 1
    assert (parsed.header.q, parsed.header.a, parsed.header.auth, parsed.header.ar) == (1, 0, 0, 0)
    assert (str(parsed.q.qname), parsed.q.qtype, parsed.q.qclass) == ("svc.example.com.", QTYPE.SRV, 1)
    assert len(wire) == 12 + len(b"\x03svc\x07example\x03com\x00") + 4


def test_edns_answers_carry_an_opt_and_the_extended_error_only_when_asked_with_edns() -> None:
    request = client_query("denied.example.com", "TXT", edns=True)
    answer = DNSRecord.parse(with_edns(request, request.fail(3), (EDE_BLOCKED, "sandgate: no")).packed)
    [opt] = [rr for rr in answer.ar if rr.rtype == QTYPE.OPT]
    assert opt.rclass == MAX_UDP_ANSWER
    [option] = opt.rdata
    assert option.code == EDE_OPTION and option.data == struct.pack("!H", EDE_BLOCKED) + b"sandgate: no"
    plain = client_query("denied.example.com", "TXT", edns=False)
    assert with_edns(plain, plain.fail(3), (EDE_BLOCKED, "x")).additionals == []


def test_upstream_answers_are_relayed_under_the_clients_id_and_case_and_cut_for_udp() -> None:
    request = client_query("Big.Example.COM", "TXT", edns=False)
    upstream = DNSRecord.question("big.example.com", "TXT").reply()
    upstream.add_answer(*RR.fromZone("big.example.com. 5 IN TXT " + " ".join(['"' + "x" * 200 + '"'] * 3)))
    upstream.add_ar(EDNS0(udp_len=512))  # the upstream's own OPT is not the sandbox's business
    relayed = relay_answer(request, dns.DNSMessage.unpack(upstream.pack()))
    assert relayed.id == request.id and relayed.questions == request.questions
    assert [rr.name for rr in relayed.answers] == ["Big.Example.COM"] and relayed.additionals == []
    assert fit_udp(request, relayed).truncation and fit_udp(request, relayed).answers == []
    with_opt = client_query("Big.Example.COM", "TXT", edns=True)  # offers 4096, gets up to 1232
    assert not fit_udp(with_opt, relay_answer(with_opt, dns.DNSMessage.unpack(upstream.pack()))).truncation


def sandbox(sandbox_id: str, *rules: dict[str, object]) -> Sandbox:
    entry = SandboxEntry(
        sandbox_id=sandbox_id, address=ADDRESS, policy={"defaultAction": "deny", "egress": list(rules)}
    )
    return Sandbox.compile(entry, SecretValues(None))


def held(*targets: tuple[str, int, str], passthrough: bool = False) -> ConnState:
    conn = ConnState(sandbox_address=ADDRESS, sandbox_id="sbx", targets=set(targets), passthrough=passthrough)
    conn.pins = {name: "198.51.100.10" for name, _port, _scheme in targets}
    return conn


def test_revocation_judges_targets_pins_inspection_and_identity() -> None:
    both = sandbox(
        "sbx", {"action": "allow", "target": "a.example.com"}, {"action": "allow", "target": "b.example.com"}
    )
    only_b = sandbox("sbx", {"action": "allow", "target": "b.example.com"})
    inspected = sandbox("sbx", {"action": "allow", "target": "a.example.com", "inspect": "always"})
    conn = held(("a.example.com", 443, "https"), passthrough=True)
    assert stale(both, conn) is None
    verdict, target = stale(only_b, conn) or (None, None)
    assert verdict is not None and verdict.reason == "default" and target == ("a.example.com", 443, "https")
    assert (stale(inspected, conn) or (GONE,))[0].reason == Reason.NEEDS_INSPECTION
    assert stale(inspected, held(("a.example.com", 443, "https"))) is None  # intercepted already
    assert stale(None, conn) == (GONE, None)
    assert stale(sandbox("another", {"action": "allow", "target": "a.example.com"}), conn) == (GONE, None)
    rebound = held(("a.example.com", 443, "https"))
    rebound.pins["a.example.com"] = "169.254.169.254"  # dialled under a CIDR rule that is gone
    assert (stale(both, rebound) or (GONE,))[0].reason == "always_denied_range"


def test_an_answer_that_arrived_while_the_loop_was_busy_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """The resolver (loopback) answers at once, then the event loop is blocked past the query's
    timeout: the answer is already there when the loop wakes, and it must win (wait_for lost it)."""
    monkeypatch.setattr(dnswire, "UPSTREAM_TIMEOUT", 0.05)

    async def ask() -> dns.DNSMessage:
        server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        server.bind(("127.0.0.1", 0))
        server.setblocking(False)

        def answer_then_block() -> None:
            data, peer = server.recvfrom(512)
            server.sendto(data[:2] + b"\x81\x80" + data[4:], peer)  # QR+RD+RA, the question echoed
            time.sleep(0.2)  # the loop is busy (another hook, a slow parse) past the timeout

        loop = asyncio.get_running_loop()
        loop.add_reader(server.fileno(), answer_then_block)
        try:
            return await dnswire.forward([server.getsockname()], "svc.example.com", dns.types.TXT)
        finally:
            loop.remove_reader(server.fileno())
            server.close()

    reply = asyncio.run(ask())
    assert (
        reply.response_code == 0 and reply.question is not None and reply.question.name == "svc.example.com"
    )


def test_a_lost_upstream_datagram_is_sent_again_within_the_timeout() -> None:
    """The resolver ignores the first copy of each query (a lost datagram, or a resolver too busy
    to read it): the resend gets the answer, with the same id; a SERVFAIL would have been final."""

    async def ask() -> tuple[dns.DNSMessage, list[bytes]]:
        server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        server.bind(("127.0.0.1", 0))
        server.setblocking(False)
        received: list[bytes] = []

        def answer_the_second_copy() -> None:
            data, peer = server.recvfrom(512)
            received.append(data)
            if len(received) == 2:
                server.sendto(data[:2] + b"\x81\x80" + data[4:], peer)

        loop = asyncio.get_running_loop()
        loop.add_reader(server.fileno(), answer_the_second_copy)
        try:
            return await dnswire.forward([server.getsockname()], "svc.example.com", dns.types.A), received
        finally:
            loop.remove_reader(server.fileno())
            server.close()

    reply, received = asyncio.run(ask())
    assert reply.response_code == 0 and len(received) == 2 and received[0] == received[1]
