"""Abusing HTTP/1 and HTTP/2 framing and the proxy's patience: CL/TE smuggling, an HTTP/2
content-length that disagrees with its DATA, oversize headers, slowloris."""

from __future__ import annotations

import pytest

from tests.adversarial.conftest import BOUND_HOST, DENIED_HOST, SECRET, Attacker

pytestmark = pytest.mark.root

SMUGGLED = f"GET /echo HTTP/1.1\r\nHost: {DENIED_HOST}\r\n\r\n"
BODY = f"0\r\n\r\n{SMUGGLED}"
SMUGGLING = {
    "cl.te": f"POST /echo HTTP/1.1\r\nHost: {BOUND_HOST}\r\nContent-Length: {len(BODY)}\r\n"
    f"Transfer-Encoding: chunked\r\n\r\n{BODY}",
    "te.cl": f"POST /echo HTTP/1.1\r\nHost: {BOUND_HOST}\r\nTransfer-Encoding: chunked\r\n"
    f"Content-Length: 3\r\n\r\n{BODY}",
    "obfuscated-te": f"POST /echo HTTP/1.1\r\nHost: {BOUND_HOST}\r\nTransfer-Encoding: xchunked\r\n"
    f"Content-Length: {len(BODY)}\r\n\r\n{BODY}",
    "duplicate-cl": f"POST /echo HTTP/1.1\r\nHost: {BOUND_HOST}\r\nContent-Length: 0\r\n"
    f"Content-Length: {len(BODY)}\r\n\r\n{BODY}",
    "space-before-colon": f"POST /echo HTTP/1.1\r\nHost: {BOUND_HOST}\r\nTransfer-Encoding : chunked\r\n"
    f"Content-Length: {len(BODY)}\r\n\r\n{BODY}",
    "two-hosts": f"GET /echo HTTP/1.1\r\nHost: {BOUND_HOST}\r\nHost: {DENIED_HOST}\r\n\r\n",
}


@pytest.mark.parametrize("variant", sorted(SMUGGLING))
@pytest.mark.parametrize("port", [443, 80])
def test_request_smuggling_never_reaches_another_host(attacker: Attacker, variant: str, port: int) -> None:
    mark = len(attacker.internet.origin_requests())
    sni = BOUND_HOST if port == 443 else None
    outcome = attacker.attack("raw", host=BOUND_HOST, port=port, sni=sni, payload=SMUGGLING[variant])
    assert outcome["connected"], outcome
    seen = attacker.origin_requests_since(mark)
    assert {r["headers"]["host"] for r in seen} <= {BOUND_HOST}, seen
    assert all(r["path"] == "/echo" for r in seen), seen
    smuggled_answers = outcome.get("reply", "").count("HTTP/1.1 200")
    assert smuggled_answers <= 1, outcome  # never a second, smuggled response


@pytest.mark.parametrize(("declared", "sent"), [(100, 10), (5, 60), (0, 8)])
def test_an_http2_body_that_disagrees_with_its_content_length_never_leaves_with_the_credential(
    attacker: Attacker, declared: int, sent: int
) -> None:
    """Issue 27: a credentialed HTTP/2 POST whose DATA is shorter or longer than its
    content-length: the origin's log shows no such request at all (the proxy read the body
    whole and the protocol layer refused it before a byte went upstream). Positive control: the
    same POST with an honest length reaches the origin with the credential injected."""
    mark = len(attacker.internet.origin_requests())
    body = "x" * sent
    lying = attacker.attack(
        "h2_streams", host=BOUND_HOST, authorities=[BOUND_HOST], content_length=declared, body=body, pause=0.5
    )
    assert lying["alpn"] == "h2", lying
    [stream] = lying["streams"]
    assert stream["status"] != 200, lying
    assert attacker.origin_requests_since(mark) == [], "a request with invalid framing reached the origin"
    honest = attacker.attack(
        "h2_streams", host=BOUND_HOST, authorities=[BOUND_HOST], content_length=sent, body=body
    )
    assert honest["streams"][0]["status"] == 200, honest
    [seen] = attacker.origin_requests_since(mark)
    assert seen["method"] == "POST" and seen["headers"]["authorization"] == f"Bearer {SECRET}", seen


@pytest.mark.parametrize(("size", "count"), [(200_000, 1), (100, 5000)])
def test_oversize_headers_are_refused_and_the_proxy_lives_on(
    attacker: Attacker, size: int, count: int
) -> None:
    mark = len(attacker.internet.origin_requests())
    request = f"GET /echo HTTP/1.1\r\nHost: {BOUND_HOST}\r\nConnection: close\r\n\r\n"
    outcome = attacker.attack(
        "raw", host=BOUND_HOST, port=443, sni=BOUND_HOST, payload=request, pad_headers=[size, count]
    )
    assert not outcome.get("reply", "").startswith("HTTP/1.1 200"), outcome["reply"][:200]
    assert attacker.origin_requests_since(mark) == []
    assert attacker.curl(f"https://{BOUND_HOST}/").stdout.strip() == "hello from origin"


def test_slowloris_does_not_starve_other_requests(attacker: Attacker) -> None:
    """100 connections dribbling header bytes for 5 s (bounded); a normal request meanwhile is served."""
    outcome = attacker.attack(
        "slowloris", host=BOUND_HOST, port=80, connections=100, seconds=5, probe_url_host=BOUND_HOST
    )
    probe = outcome["probe"]
    assert probe["reply"].startswith("HTTP/1.1 200"), outcome
    assert probe["seconds"] < 5, outcome
    assert attacker.curl(f"https://{BOUND_HOST}/").stdout.strip() == "hello from origin"
