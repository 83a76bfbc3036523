"""Who a request claims to be for: IP literals, forged destinations, SNI/Host/:authority
mismatches, domain fronting, HTTP/2 coalescing, the explicit proxy's CONNECT and absolute-form,
WebSocket upgrades, and what it is for: the canonical path (encoded dot segments, `..;`) and
absolute-form targets naming another authority. One decision function must see through every one
of them; each refusal is proved from the origin's raw log and the sandbox's own output."""

from __future__ import annotations

import json
from collections.abc import Iterator
from urllib.parse import unquote

import pytest

from tests.adversarial.conftest import (
    BOUND_HOST,
    DENIED_HOST,
    IN_SANDBOX_TEST_CA,
    OPEN_HOST,
    ZONE,
    Attacker,
)
from tests.support.internet import ORIGIN_V4, ORIGIN_V4_ALT, ORIGIN_V6

pytestmark = pytest.mark.root
FRONTED_PATH = "/echo/fronted"  # the one request for the denied host that reaches an origin, by design


def http_get(host_header: str, path: str = "/echo", extra: str = "") -> str:
    return f"GET {path} HTTP/1.1\r\nHost: {host_header}\r\n{extra}Connection: close\r\n\r\n"


def status(reply: str) -> int | None:
    parts = reply.split(" ", 2)
    return int(parts[1]) if reply.startswith("HTTP/") and len(parts) > 1 and parts[1].isdigit() else None


def deny_reason(reply: str) -> str | None:
    body = reply.split("\r\n\r\n", 1)[-1]
    try:
        return json.loads(body)["reason"]  # type: ignore[no-any-return]
    except (ValueError, KeyError):
        return None


@pytest.mark.parametrize(
    "url",
    [
        f"http://{ORIGIN_V4}/echo",
        f"https://{ORIGIN_V4}/echo",
        "http://3325256714/echo",  # 198.51.100.10 as one decimal number
        "http://0306.0143.0144.012/echo",  # ... in octal
        "http://0xc6.0x33.0x64.0x0a/echo",  # ... in hex
    ],
)
def test_ip_literal_urls_are_refused(attacker: Attacker, url: str) -> None:
    # TLS to an address carries no SNI: the connection is attributed to the name this sandbox last
    # resolved to that address (see test_tls_without_sni...). Make that the intercepted host.
    attacker.attack("resolve", name=BOUND_HOST)
    mark = len(attacker.internet.origin_requests())
    result = attacker.curl("-k", "-o /dev/null", "-w '%{http_code}'", f"'{url}'")
    assert result.stdout in ("403", "000"), result  # 403 in plain HTTP; TLS is closed before any certificate
    assert attacker.origin_requests_since(mark) == []
    records = attacker.wait_audit(
        lambda r: (
            r["host"] == ORIGIN_V4 and r["decision"] == "deny" and r["kind"] in ("request", "connection")
        )
    )
    assert records and {r["reason"] for r in records} == {"ip_literal_needs_cidr_rule"}


def test_ipv6_has_no_route_and_v4_mapped_literals_are_ip_literals(attacker: Attacker) -> None:
    v6 = attacker.attack("raw", host=ORIGIN_V6, port=80, family="inet6", payload=http_get(BOUND_HOST))
    assert v6["connected"] is False, v6  # IPv6 is disabled inside the sandbox and dropped at the host
    assert attacker.curl("-6", f"https://{BOUND_HOST}/echo", timeout=5).exit_code != 0
    # An AF_INET6 socket to ::ffff:a.b.c.d sends IPv4: it lands at the proxy like any IPv4 connect,
    # and the mapped literal in the Host header is judged as the IPv4 literal it carries.
    mapped = f"::ffff:{ORIGIN_V4}"
    outcome = attacker.attack("raw", host=mapped, port=80, family="inet6", payload=http_get(f"[{mapped}]"))
    assert status(outcome["reply"]) == 403 and deny_reason(outcome["reply"]) == "ip_literal_needs_cidr_rule"
    rebound = attacker.attack("resolve", name="mapped.rebind.example.com")
    assert rebound["addresses"] == []  # ::ffff:169.254.169.254 from DNS is dropped, never handed over


def test_forged_destination_is_ignored_the_proxy_dials_its_own_resolution(attacker: Attacker) -> None:
    """curl --resolve / a forged Host on another address: the connection went to the attacker's
    address, but the proxy dials what it resolved for the name itself (CubeSandbox#1410)."""
    mark = len(attacker.internet.origin_requests())
    forged = attacker.curl(f"--resolve {BOUND_HOST}:443:{ORIGIN_V4_ALT}", f"https://{BOUND_HOST}/echo")
    assert forged.exit_code == 0, forged
    cleartext = attacker.attack("raw", host=ORIGIN_V4_ALT, port=80, payload=http_get(BOUND_HOST))
    assert status(cleartext["reply"]) == 200
    seen = attacker.origin_requests_since(mark)
    assert len(seen) == 2 and all(r["server"].startswith(f"{ORIGIN_V4}:") for r in seen), seen
    [tls_request] = [r for r in seen if r["server"].endswith(":443")]
    [plain_request] = [r for r in seen if r["server"].endswith(":80")]
    assert tls_request["headers"]["authorization"].startswith("Bearer ")  # the real origin, verified by SNI
    assert "authorization" not in plain_request["headers"]  # never a credential on cleartext


def test_sni_host_mismatch_on_the_intercepted_host_is_421(attacker: Attacker) -> None:
    mark = len(attacker.internet.origin_requests())
    for host_header in (DENIED_HOST, OPEN_HOST, f"{BOUND_HOST}.{DENIED_HOST}", ORIGIN_V4):
        outcome = attacker.attack(
            "raw", host=BOUND_HOST, port=443, sni=BOUND_HOST, payload=http_get(host_header)
        )
        assert status(outcome["reply"]) == 421, (host_header, outcome)
        assert deny_reason(outcome["reply"]) == "identity-mismatch"
    assert attacker.origin_requests_since(mark) == []
    records = attacker.wait_audit(lambda r: r["reason"] == "identity-mismatch" and r["host"] == DENIED_HOST)
    assert records and records[-1]["status"] == 421 and "sni=api.example.com" in records[-1]["detail"]


def test_a_port_in_the_authority_must_be_the_connections(attacker: Attacker) -> None:
    """`api.example.com:8443` on a connection to 443 would be served, and judged, as port 443."""
    mark = len(attacker.internet.origin_requests())
    outcome = attacker.attack("h2_streams", host=BOUND_HOST, authorities=[f"{BOUND_HOST}:8443", BOUND_HOST])
    assert [stream["status"] for stream in outcome["streams"]] == [421, 200], outcome
    http1 = attacker.attack(
        "raw", host=BOUND_HOST, port=443, sni=BOUND_HOST, payload=http_get(f"{BOUND_HOST}:8443")
    )
    assert status(http1["reply"]) == 421 and deny_reason(http1["reply"]) == "identity-mismatch", http1
    assert len(attacker.origin_requests_since(mark)) == 1  # only the stream for the connection's port
    assert attacker.wait_audit(lambda r: r["reason"] == "identity-mismatch" and "8443" in (r["detail"] or ""))


def test_tls_to_a_denied_name_is_closed_before_any_certificate(attacker: Attacker) -> None:
    for sni in (DENIED_HOST, "localhost", "metadata.google.internal"):
        outcome = attacker.attack(
            "raw", host=ORIGIN_V4, port=443, sni=sni, verify=False, payload=http_get(sni)
        )
        assert outcome.get("reply", "") == "" and "error" in outcome, (sni, outcome)
    assert attacker.wait_audit(
        lambda r: r["kind"] == "connection" and r["sni"] == DENIED_HOST and r["decision"] == "deny"
    )


def test_tls_without_sni_gets_the_name_this_sandbox_resolved_and_the_request_is_still_judged(
    attacker: Attacker,
) -> None:
    """No SNI: the connection is attributed to the name this sandbox resolved to that address;
    the Host inside is then judged like any other request (here: denied, never sent)."""
    attacker.attack("resolve", name=BOUND_HOST)
    mark = len(attacker.internet.origin_requests())
    outcome = attacker.attack(
        "raw", host=ORIGIN_V4, port=443, sni="", verify=False, payload=http_get(DENIED_HOST)
    )
    assert status(outcome.get("reply", "")) in (403, 421, None), outcome
    assert attacker.origin_requests_since(mark) == []


def test_tls_without_sni_to_a_passthrough_host_is_intercepted_not_relayed(attacker: Attacker) -> None:
    """The name credited from DNS is a guess, not a claim: a pass-through host's TLS without SNI
    is intercepted, so the Host inside is judged (an address literal or a denied name is 403)."""
    attacker.attack("resolve", name=OPEN_HOST)
    mark = len(attacker.internet.origin_requests())
    literal = attacker.curl("-k", "-o /dev/null", "-w '%{http_code}'", f"https://{ORIGIN_V4}/echo")
    assert literal.stdout == "403", literal
    denied = attacker.attack(
        "raw", host=ORIGIN_V4, port=443, sni="", verify=False, payload=http_get(DENIED_HOST)
    )
    assert status(denied["reply"]) == 403, denied
    assert attacker.origin_requests_since(mark) == []
    allowed = attacker.attack(
        "raw", host=ORIGIN_V4, port=443, sni="", verify=False, payload=http_get(OPEN_HOST)
    )
    assert status(allowed["reply"]) == 200, allowed  # a legitimate SNI-less client still works
    records = attacker.wait_audit(
        lambda r: (
            r["kind"] == "connection"
            and r["host"] == OPEN_HOST
            and r["sni"] is None
            and r["method"] != "CONNECT"  # CONNECT records name the host, not an SNI
            and r["reason"] != "malformed-clienthello"  # test_clienthello's hellos without a readable SNI
        )
    )
    assert records and all(r["inspect"] is True and "credited" in r["detail"] for r in records), [
        (r["reason"], r["detail"]) for r in records
    ]


def test_tls_without_sni_to_an_intercepted_host_still_works(attacker: Attacker) -> None:
    attacker.attack("resolve", name=BOUND_HOST)
    mark = len(attacker.internet.origin_requests())
    outcome = attacker.attack(
        "raw", host=ORIGIN_V4, port=443, sni="", verify=False, payload=http_get(BOUND_HOST)
    )
    assert status(outcome["reply"]) == 200, outcome
    [seen] = attacker.origin_requests_since(mark)
    assert seen["headers"]["authorization"].startswith("Bearer ")  # injected: judged as api.example.com


def test_domain_fronting_through_a_passthrough_host_is_the_documented_tradeoff(attacker: Attacker) -> None:
    """open.example.com has no L7 rule and no credential, so its TLS passes through untouched:
    the proxy never sees the Host inside, and a shared front end routes by it. docs/security.md
    states this; `inspect: always` on the rule closes it (then it is the 421 case above)."""
    mark = len(attacker.internet.origin_requests())
    fronted = attacker.attack(
        "raw",
        host=OPEN_HOST,
        port=443,
        sni=OPEN_HOST,
        ca=IN_SANDBOX_TEST_CA,
        payload=http_get(DENIED_HOST, FRONTED_PATH),
    )
    assert status(fronted["reply"]) == 200
    [seen] = attacker.origin_requests_since(mark)
    assert seen["headers"]["host"] == DENIED_HOST and "authorization" not in seen["headers"]
    [record] = attacker.wait_audit(lambda r: r["kind"] == "connection" and r["sni"] == OPEN_HOST)[-1:]
    assert record["decision"] == "allow" and record["inspect"] is False


def test_http2_coalescing_each_stream_is_judged_on_its_authority(attacker: Attacker) -> None:
    mark = len(attacker.internet.origin_requests())
    authorities = [BOUND_HOST, DENIED_HOST, OPEN_HOST, f"{DENIED_HOST}:443", BOUND_HOST]
    outcome = attacker.attack("h2_streams", host=BOUND_HOST, authorities=authorities)
    assert outcome["alpn"] == "h2", outcome
    statuses = [stream["status"] for stream in outcome["streams"]]
    assert statuses == [200, 421, 421, 421, 200], outcome
    seen = attacker.origin_requests_since(mark)
    assert [
        r["headers"][":authority"] if ":authority" in r["headers"] else r["headers"]["host"] for r in seen
    ] == [
        BOUND_HOST,
        BOUND_HOST,
    ]
    assert attacker.wait_audit(lambda r: r["reason"] == "identity-mismatch" and r["host"] == OPEN_HOST)


def test_explicit_proxy_connect_to_denied_targets_is_refused(attacker: Attacker) -> None:
    port = attacker.ports.explicit
    mark = len(attacker.internet.origin_requests())
    for target in (
        f"{DENIED_HOST}:443",
        f"{ORIGIN_V4}:443",
        f"[{ORIGIN_V6}]:443",
        f"127.0.0.1:{attacker.server.port}",
    ):
        outcome = attacker.attack(
            "via_proxy", target=target, then_sni=DENIED_HOST, payload=http_get(DENIED_HOST), port=port
        )
        assert outcome["connect_reply"].startswith("HTTP/1.1 403"), (target, outcome)
    # CONNECT to the allowed name, then a TLS ClientHello for another: the names disagree.
    smuggled = attacker.attack(
        "via_proxy",
        target=f"{BOUND_HOST}:443",
        then_sni=DENIED_HOST,
        payload=http_get(DENIED_HOST),
        port=port,
    )
    assert smuggled["connect_reply"].startswith("HTTP/1.1 200") and not smuggled.get("reply"), smuggled
    assert attacker.origin_requests_since(mark) == []
    assert attacker.wait_audit(
        lambda r: r["method"] == "CONNECT" and r["host"] == DENIED_HOST and r["decision"] == "deny"
    )
    assert attacker.wait_audit(lambda r: r["reason"] == "identity-mismatch" and r["sni"] == DENIED_HOST)


def test_explicit_proxy_absolute_form_is_the_same_decision(attacker: Attacker) -> None:
    port = attacker.ports.explicit
    mark = len(attacker.internet.origin_requests())
    cases = {
        f"GET http://{DENIED_HOST}/echo HTTP/1.1\r\nHost: {DENIED_HOST}\r\n\r\n": 403,
        f"GET http://{ORIGIN_V4}/echo HTTP/1.1\r\nHost: {ORIGIN_V4}\r\n\r\n": 403,
        f"GET http://{BOUND_HOST}/echo HTTP/1.1\r\nHost: {DENIED_HOST}\r\n\r\n": 421,
        f"GET http://{DENIED_HOST}/echo HTTP/1.1\r\nHost: {BOUND_HOST}\r\n\r\n": 421,
        f"GET http://127.0.0.1:{attacker.server.port}/v1/sandboxes HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{attacker.server.port}\r\n\r\n": 403,
        # A Host without the URL's port names port 80: not this request's port (case 6b).
        f"GET http://{BOUND_HOST}:8443/echo HTTP/1.1\r\nHost: {BOUND_HOST}\r\n\r\n": 421,
    }
    for request, expected in cases.items():
        outcome = attacker.attack("raw", host="GATEWAY", port=port, payload=request)
        assert status(outcome["reply"]) == expected, (request, outcome)
    assert attacker.origin_requests_since(mark) == []


def test_websocket_to_a_denied_host_is_refused_on_every_path(attacker: Attacker) -> None:
    upgrade = (
        "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    )
    request = f"GET /ws HTTP/1.1\r\nHost: {DENIED_HOST}\r\n{upgrade}\r\n"
    mark = len(attacker.internet.origin_requests())
    plain = attacker.attack("raw", host=DENIED_HOST, port=80, payload=request)
    assert plain["connected"] is False or status(plain.get("reply", "")) == 403, (
        plain
    )  # the name does not resolve
    literal = attacker.attack("raw", host=ORIGIN_V4, port=80, payload=request)
    assert status(literal["reply"]) == 403 and deny_reason(literal["reply"]) == "default"  # judged by Host
    on_allowed = attacker.attack("raw", host=BOUND_HOST, port=443, sni=BOUND_HOST, payload=request)
    assert status(on_allowed["reply"]) == 421
    allowed = attacker.attack(
        "raw", host=BOUND_HOST, port=443, sni=BOUND_HOST, payload=request.replace(DENIED_HOST, BOUND_HOST)
    )
    assert status(allowed["reply"]) == 101  # positive control: the same upgrade to the allowed host works
    websockets = [r for r in attacker.origin_requests_since(mark) if r["type"] == "websocket"]
    assert [r["headers"]["host"] for r in websockets] == [BOUND_HOST]


# ------------------------------------------------------------------------------ canonical identity

V1_HOST = "v1.example.com"  # allowed only for GET /v1/*; no credential
# Each is /admin to an nginx-style (decode, then resolve dot segments) or a Tomcat-style (strip
# `;params`, then resolve) origin; the policy must never judge them as /v1/... and let them through.
PATH_BYPASSES = ["/v1/%2E%2E%2Fadmin", "/v1/x/..%2f..%2fadmin", "/v1/..%2Fadmin", "/v1/..;/admin"]
V1_OK = "/v1/ok"  # the positive control: reaches the origin (which answers 404: no such route)


@pytest.fixture(scope="module")
def v1_only(attacker: Attacker) -> Iterator[str]:
    """The attacker's policy plus `allow GET /v1/*` for V1_HOST (first), restored afterwards."""
    attacker.internet.set_names({**ZONE, V1_HOST: [ORIGIN_V4]})
    url = f"/v1/sandboxes/{attacker.sandbox.id}/egress/sandgate-policy"
    rule = {"action": "allow", "target": V1_HOST, "methods": ["GET"], "paths": ["/v1/*"]}
    with attacker.server.client() as client:
        before = client.get(url).json()["policy"]
        answer = client.put(url, json={"policy": {**before, "egress": [rule, *before.get("egress", [])]}})
        assert answer.status_code == 200, answer.text
    try:
        yield V1_HOST
    finally:
        with attacker.server.client() as client:
            client.put(url, json={"policy": before}).raise_for_status()
        attacker.internet.set_names(ZONE)


def served_by_normalizing_origins(target: str) -> set[str]:
    """The paths an nginx-style origin (decode, then resolve dot segments) and a Tomcat-style one
    (strip `;params` from each segment, decode, resolve) serve for this target."""

    def resolved(segments: list[str]) -> str:
        out: list[str] = []
        for segment in segments:
            if segment == "..":
                out = out[:-1]
            elif segment not in (".", ""):
                out.append(segment)
        return "/" + "/".join(out)

    nginx = unquote(target).split("/")
    tomcat = [unquote(segment.split(";", 1)[0]) for segment in target.split("/")]
    return {resolved(nginx), resolved(tomcat)}


def test_encoded_dot_segments_never_reach_the_origin(attacker: Attacker, v1_only: str) -> None:
    """`GET /v1/*` only: the four spellings of /admin are 400 on HTTP/1.1 over TLS, in cleartext,
    through the explicit proxy and as HTTP/2 :path; the origin's raw log never sees them."""
    assert all("/admin" in served_by_normalizing_origins(path) for path in PATH_BYPASSES)  # the threat
    mark = len(attacker.internet.origin_requests())
    calls: list[list[object]] = []
    for path in [*PATH_BYPASSES, V1_OK]:
        request = http_get(v1_only, path)
        calls += [
            ["raw", {"host": v1_only, "port": 443, "sni": v1_only, "payload": request}],
            ["raw", {"host": v1_only, "port": 80, "payload": request}],
            [
                "raw",
                {
                    "host": "GATEWAY",
                    "port": attacker.ports.explicit,
                    "payload": request.replace(f"GET {path} ", f"GET http://{v1_only}{path} ", 1),
                },
            ],
        ]
    calls.append(
        ["h2_streams", {"host": v1_only, "authorities": [v1_only], "paths": [*PATH_BYPASSES, V1_OK]}]
    )
    *http1, h2 = attacker.attack("batch", calls=calls)["results"]
    statuses = [status(result.get("reply", "")) for result in http1]
    expected = [400] * 3 * len(PATH_BYPASSES) + [404] * 3
    assert statuses == expected, [(n, got) for n, got in enumerate(http1) if statuses[n] != expected[n]]
    assert {deny_reason(result["reply"]) for result in http1[: 3 * len(PATH_BYPASSES)]} == {
        "ambiguous_target"
    }
    assert h2["alpn"] == "h2", h2
    assert [stream["status"] for stream in h2["streams"]] == [400] * len(PATH_BYPASSES) + [404], h2
    seen = attacker.origin_requests_since(mark)
    assert [r["target"] for r in seen] == [V1_OK] * 4, seen  # only the controls, on all four paths in
    records = attacker.wait_audit(
        lambda r: r["reason"] == "ambiguous_target" and r["host"] == v1_only, at_least=len(PATH_BYPASSES)
    )
    assert len({r["path"] for r in records} & set(PATH_BYPASSES)) == len(PATH_BYPASSES), records
    assert all(r["status"] == 400 and r["kind"] == "request" for r in records)


ABSOLUTE_DENIED = "/echo/absolute-elsewhere"


def absolute_get(url: str, host_header: str = BOUND_HOST) -> str:
    return f"GET {url} HTTP/1.1\r\nHost: {host_header}\r\nConnection: close\r\n\r\n"


def test_an_absolute_form_target_for_another_authority_is_400_and_never_sent(attacker: Attacker) -> None:
    """On the credentialed host's intercepted connection (transparent TLS, cleartext, and inside
    an explicit CONNECT tunnel), `GET https://denied.example.com/...` with the allowed Host would be
    routed by the origin to the absolute target: refused, nothing leaves, least of all the credential."""
    mark = len(attacker.internet.origin_requests())
    elsewhere = f"https://{DENIED_HOST}{ABSOLUTE_DENIED}"
    other_port = f"https://{BOUND_HOST}:8443{ABSOLUTE_DENIED}"
    same = f"https://{BOUND_HOST}/echo?absolute-same"  # /echo: the bearer binding applies
    tls = {"host": BOUND_HOST, "port": 443, "sni": BOUND_HOST}
    calls = [
        ["raw", {**tls, "payload": absolute_get(elsewhere)}],
        ["raw", {**tls, "payload": absolute_get(other_port)}],
        [
            "raw",
            {
                "host": BOUND_HOST,
                "port": 80,
                "payload": absolute_get(f"http://{DENIED_HOST}{ABSOLUTE_DENIED}"),
            },
        ],
        [
            "via_proxy",
            {
                "target": f"{BOUND_HOST}:443",
                "then_sni": BOUND_HOST,
                "payload": absolute_get(elsewhere),
                "port": attacker.ports.explicit,
            },
        ],
        ["raw", {**tls, "payload": absolute_get(same)}],  # the positive control: the same authority
    ]
    *refused, control = attacker.attack("batch", calls=calls)["results"]
    assert [status(result.get("reply", "")) for result in refused] == [400] * 4, refused
    assert {deny_reason(result["reply"]) for result in refused} == {"ambiguous_target"}
    assert status(control["reply"]) == 200, control
    seen = attacker.origin_requests_since(mark)
    assert [r["target"] for r in seen] == ["/echo?absolute-same"], seen  # origin-form, as origins expect
    assert seen[0]["headers"]["authorization"].startswith("Bearer ")  # it would have been injected
    records = attacker.wait_audit(
        lambda r: r["reason"] == "ambiguous_target" and (r["path"] or "").startswith(ABSOLUTE_DENIED),
        at_least=4,
    )
    assert len(records) >= 4 and all(r["status"] == 400 and "absolute-form" in r["detail"] for r in records)
    assert all(r["binding"] is None for r in records)
