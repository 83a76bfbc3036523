"""ClientHellos that show the proxy one name and a server another: an extension twice (two
server_name), a server_name list with two names, one whose lengths lie, a name of another type,
and an ECH-carrying hello, whose SNI is only the outer name. Sent from inside the sandbox on
every path in (transparent to a pass-through host, to an intercepted host, and inside an explicit
CONNECT); proven from the other side: the origin's namespace never receives a TCP SYN on port
443 for any of them (an nft counter there, which the valid control hello does move), and the
audit file has the refusal with its reason.

The hellos are OpenSSL's own (`attacks.openssl_hello`); only the variants are hand edits of its
extension list, each described in `attacks.HELLO_EDITS` (no TLS stack here sends them: OpenSSL
makes no ECH, and nothing conforming makes the malformed ones).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.adversarial.conftest import BOUND_HOST, DENIED_HOST, OPEN_HOST, Attacker
from tests.support import witness
from tests.support.internet import ORIGIN_V4
from tests.support.witness import SynCounter

pytestmark = pytest.mark.root

MALFORMED = [
    "two_server_name",
    "two_names",
    "bad_list_length",
    "other_name_type",
    "repeated_extension",
    "trailing_bytes",  # no parser reads it: mitmproxy closes it, the addon records it
]


@pytest.fixture(scope="module")
def origin_syns(attacker: Attacker) -> Iterator[SynCounter]:
    with witness.origin_syns(attacker.internet.netns_name) as counter:
        yield counter


def send(attacker: Attacker, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    results = attacker.attack("batch", calls=[["clienthello", call] for call in calls])["results"]
    return [dict(result, **call) for result, call in zip(results, calls, strict=True)]


def test_a_valid_hello_reaches_the_origin(attacker: Attacker, origin_syns: SynCounter) -> None:
    """The control: OpenSSL's hello as it is reaches the origin on each path (so the counter
    can tell), and the origin answers with its ServerHello."""
    before = origin_syns.count()
    results = send(
        attacker,
        [
            {"host": ORIGIN_V4, "port": 443, "sni": OPEN_HOST, "edit": "none"},
            {
                "host": OPEN_HOST,
                "port": 443,
                "sni": OPEN_HOST,
                "edit": "none",
                "connect_port": attacker.ports.explicit,
            },
        ],
    )
    assert [r["reply"] for r in results] == ["server_hello", "server_hello"], results
    assert origin_syns.count() - before >= 2  # one per path (more only if a SYN was retransmitted)


def test_hellos_a_server_must_reject_never_leave_the_proxy(
    attacker: Attacker, origin_syns: SynCounter
) -> None:
    before = origin_syns.count()
    calls = [
        {"host": ORIGIN_V4, "port": 443, "sni": sni, "edit": edit, "other": DENIED_HOST}
        for edit in MALFORMED
        for sni in (OPEN_HOST, BOUND_HOST)  # pass-through (spliced at the front door), intercepted
    ]
    calls += [
        {"host": OPEN_HOST, "port": 443, "sni": OPEN_HOST, "edit": edit, "other": DENIED_HOST,
         "connect_port": attacker.ports.explicit}
        for edit in MALFORMED
    ]  # fmt: skip
    results = send(attacker, calls)
    assert all(r["reply"] == "closed" for r in results), [r for r in results if r["reply"] != "closed"]
    assert origin_syns.count() == before  # not one reached the origin
    records = attacker.wait_audit(lambda r: r["reason"] == "malformed-clienthello", at_least=len(calls))
    refusals = [r for r in records if r["decision"] == "deny" and r["kind"] == "connection"]
    assert len(refusals) >= len(calls), records
    details = {r["detail"] for r in refusals}
    assert {
        "extension 0x0000 more than once",
        "server_name holds 2 names; one is allowed",
        "the ClientHello does not parse",
    } <= details


def test_an_ech_hello_is_answered_by_the_proxy_by_default_on_every_path(
    attacker: Attacker, origin_syns: SynCounter
) -> None:
    """By default (`proxy_ech = "intercept"`) the proxy terminates an ECH hello itself, so the outer
    name never stands for the destination: no SYN reaches the origin for a hello alone, and every
    request on it will be judged by its own Host (the refuse mode: tests/proxy/test_clienthello.py)."""
    before = origin_syns.count()
    calls = [
        {"host": ORIGIN_V4, "port": 443, "sni": OPEN_HOST, "edit": "ech"},
        {"host": ORIGIN_V4, "port": 443, "sni": BOUND_HOST, "edit": "ech"},
        {
            "host": OPEN_HOST,
            "port": 443,
            "sni": OPEN_HOST,
            "edit": "ech",
            "connect_port": attacker.ports.explicit,
        },
    ]
    results = send(attacker, calls)
    assert [r["reply"] for r in results] == ["server_hello"] * 3, results  # the proxy's own TLS
    assert origin_syns.count() == before
    ech = "encrypted_client_hello"
    records = attacker.wait_audit(
        lambda r: (r.get("detail") or "").startswith(ech) and r["kind"] == "connection", at_least=3
    )
    assert len(records) >= 3 and all(r["inspect"] for r in records), records
    assert {r["sni"] for r in records} >= {OPEN_HOST, BOUND_HOST}
    assert all(r["detail"].endswith("(ech=intercept)") for r in records), records
