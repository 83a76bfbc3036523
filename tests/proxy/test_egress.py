"""The egress proxy end to end: a real proxy process, a client namespace redirected to it by
nftables, and the test internet. Each test states one behaviour of docs/proxy.md."""

from __future__ import annotations

import json
import select
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator

import pytest

from sandgate.proxy import SandboxEntry
from sandgate.vault import StoreSecrets, StoreSettings, generate_master_key, open_store
from tests.proxy.conftest import (
    CLIENT_ADDR,
    EXPLICIT_PORT,
    GATEWAY,
    Client,
    RunningProxy,
    start_proxy,
    stop_proxy,
)
from tests.support.internet import ORIGIN_V4, Internet
from tests.support.netns import ip

pytestmark = pytest.mark.root

TOKEN = "sk-test-4f9d2c7a1b8e6f3d"
POLICY = {
    "defaultAction": "deny",
    "egress": [
        {"action": "allow", "target": "pass.example.com"},
        {"action": "allow", "target": "api.example.com"},
        {"action": "allow", "target": "ro.example.com", "methods": ["GET"]},
        {"action": "allow", "target": "plain.example.com"},
        {"action": "allow", "target": "stream.example.com", "inspect": "always"},
        {"action": "allow", "target": "*.rebind.example.com"},
    ],
    "bindings": [
        {
            "name": "api",
            "credential": "api-token",
            "match": {"hosts": ["api.example.com"]},
            "auth": {"type": "bearer"},
        },
    ],
}
NAMES = ["pass", "api", "ro", "plain", "stream", "denied", "other"]
# Allowed names whose DNS answer is an always-denied address (DNS rebinding).
REBOUND = {"loopback": "127.0.0.1", "metadata": "169.254.169.254", "private": "10.99.0.9"}


@pytest.fixture(scope="module")
def proxy(net: Internet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    net.set_names(
        {f"{n}.example.com": [ORIGIN_V4] for n in NAMES}
        | {f"{label}.rebind.example.com": [address] for label, address in REBOUND.items()}
    )
    vault_dir = tmp_path_factory.mktemp("vault")
    key = generate_master_key()
    open_store("local", vault_dir, key).put("api-token", TOKEN)
    entry = SandboxEntry(sandbox_id="sbx-1", address=CLIENT_ADDR, policy=POLICY)
    running = start_proxy(
        tmp_path_factory.mktemp("proxy"),
        net,
        [entry],
        vault=StoreSettings(state_dir=vault_dir),
        vault_secrets=StoreSecrets(vault_key=key),
    )
    try:
        yield running
    finally:
        stop_proxy(running)


def requests_for(proxy: RunningProxy, host: str) -> list[dict]:
    return [r for r in proxy.audit() if r["kind"] == "request" and r["host"] == host]


def test_passthrough_tls_is_not_decrypted(proxy: RunningProxy, client: Client, net: Internet) -> None:
    # Trusting only the test internet's CA proves the client saw the origin's own certificate.
    result = client.curl("--cacert", str(net.ca_cert), "https://pass.example.com/")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "hello from origin\n"
    [record] = proxy.wait_audit(1, kind="connection", host="pass.example.com", event=None)
    assert record["decision"] == "allow" and record["inspect"] is False
    assert record["sni"] == "pass.example.com" and record["upstream"] == f"{ORIGIN_V4}:443"


def test_passthrough_connection_is_closed_with_bytes_and_duration(
    proxy: RunningProxy, client: Client, net: Internet
) -> None:
    # A long-lived pass-through connection: its decision record is there while it is open...
    code = f"""
import socket, ssl, sys
ctx = ssl.create_default_context(cafile={str(net.ca_cert)!r})
raw = socket.create_connection(("pass.example.com", 443))
with ctx.wrap_socket(raw, server_hostname="pass.example.com") as s:
    print("open", flush=True)
    sys.stdin.readline()
    s.sendall(b"GET /bytes?n=200000 HTTP/1.1\\r\\nHost: pass.example.com\\r\\nConnection: close\\r\\n\\r\\n")
    got = 0
    while data := s.recv(65536):
        got += len(data)
    print(got, flush=True)
"""
    before = {r["id"] for r in proxy.audit()}
    process = client.ns.popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout.readline().strip() == "open"
        [decision] = [
            r
            for r in proxy.wait_audit(1, kind="connection", host="pass.example.com", event=None)
            if r["id"] not in before
        ]
        assert decision["event"] is None and decision["bytes_in"] == 0 and decision["duration_ms"] is None
        # ...and when it closes, a second record with the same id prefix counts bytes and time.
        process.stdin.write("\n")
        process.stdin.flush()
        received = int(process.stdout.readline())
    finally:
        process.kill()
        process.wait()
    assert received > 200_000
    [closed] = proxy.wait_audit(1, id=f"{decision['id']}-closed")
    assert (closed["kind"], closed["event"], closed["decision"], closed["inspect"]) == (
        "connection",
        "closed",
        "allow",
        False,
    )
    assert closed["sni"] == "pass.example.com" and closed["upstream"] == f"{ORIGIN_V4}:443"
    # TLS adds a little around the 200000 body bytes; the client sent a ClientHello and a request.
    assert 200_000 < closed["bytes_in"] < 220_000 and 300 < closed["bytes_out"] < 5_000
    assert closed["duration_ms"] > 0


def test_explicit_connect_passthrough_is_closed_under_the_connect_record(
    proxy: RunningProxy, client: Client, net: Internet
) -> None:
    before = {r["id"] for r in proxy.audit()}
    explicit = f"http://{GATEWAY}:{EXPLICIT_PORT}"
    result = client.curl(
        "-x", explicit, "--cacert", str(net.ca_cert), "https://pass.example.com/bytes?n=50000"
    )
    assert result.returncode == 0 and len(result.stdout) == 50_000, result.stderr
    connects = proxy.wait_audit(1, kind="connection", method="CONNECT", host="pass.example.com", event=None)
    [connect] = [r for r in connects if r["id"] not in before]  # one decision record, not two
    [closed] = proxy.wait_audit(1, id=f"{connect['id']}-closed")
    assert closed["sni"] == "pass.example.com" and closed["upstream"] == f"{ORIGIN_V4}:443"
    assert closed["bytes_in"] > 50_000 and closed["bytes_out"] > 0


def test_intercepted_tls_injects_and_client_never_sees_the_value(proxy: RunningProxy, client: Client) -> None:
    result = client.curl(
        "--cacert",
        str(proxy.ca_cert),
        "-H",
        "Authorization: Bearer sandbox-made-up",
        "https://api.example.com/echo?token=abc",
    )
    assert result.returncode == 0, result.stderr
    echoed = json.loads(result.stdout)
    # The origin got the real value (it echoes it back); the client's copy is scrubbed.
    assert echoed["headers"]["authorization"] == "Bearer [REDACTED]"
    assert TOKEN not in result.stdout
    [record] = proxy.wait_audit(1, kind="request", host="api.example.com", path="/echo?<redacted>")
    assert record["binding"] == "api" and record["status"] == 200 and record["decision"] == "allow"
    assert TOKEN not in proxy.config.audit_path.read_text()


def test_denied_host_gets_403_json_and_closed_tls(proxy: RunningProxy, client: Client, net: Internet) -> None:
    # The sandbox cannot resolve a denied name; --resolve makes it try the address anyway.
    plain = client.curl("--resolve", f"denied.example.com:80:{ORIGIN_V4}", "http://denied.example.com/")
    body = json.loads(plain.stdout)
    assert body["error"] == "egress denied" and body["host"] == "denied.example.com"
    assert body["reason"] == "default"
    tls = client.curl(
        "--cacert",
        str(net.ca_cert),
        "--resolve",
        f"denied.example.com:443:{ORIGIN_V4}",
        "https://denied.example.com/",
    )
    assert tls.returncode == 35, tls  # handshake failed: the connection closed, no certificate shown
    records = proxy.wait_audit(1, kind="connection", host="denied.example.com")
    assert [r["decision"] for r in records] == ["deny"]


def test_sse_arrives_before_the_origin_finishes(proxy: RunningProxy, client: Client) -> None:
    # stream.example.com is intercepted (inspect: always). The origin holds the stream open after
    # event 0 until the client, having read event 0, asks it to go on: a proxy that buffered the
    # stream would hand over nothing until the origin gave up (30 s, "not released").
    key = uuid.uuid4().hex
    code = f"""
import socket, ssl, urllib.request
ctx = ssl.create_default_context(cafile={str(proxy.ca_cert)!r})
raw = socket.create_connection(("stream.example.com", 443))
with ctx.wrap_socket(raw, server_hostname="stream.example.com") as s:
    s.sendall(b"GET /sse?n=3&hold={key} HTTP/1.1\\r\\nHost: stream.example.com\\r\\n\\r\\n")
    data = b""
    while b"event 0" not in data:
        data += s.recv(4096)
    assert b"event 1" not in data and b"not released" not in data, data
    urllib.request.urlopen("https://stream.example.com/release?key={key}", context=ctx).read()
    while b"event 2" not in data and b"not released" not in data:
        data += s.recv(4096)
    print(data.decode())
"""
    result = client.python(code)
    assert result.returncode == 0, result.stderr
    assert "data: event 2" in result.stdout and "not released" not in result.stdout


def test_explicit_proxy_gets_the_same_decisions(proxy: RunningProxy, client: Client, net: Internet) -> None:
    explicit = f"http://{GATEWAY}:{EXPLICIT_PORT}"
    # CONNECT to a pass-through host: the origin's own certificate comes through.
    tunnel = client.curl("-x", explicit, "--cacert", str(net.ca_cert), "https://pass.example.com/")
    assert tunnel.stdout == "hello from origin\n", tunnel.stderr
    # CONNECT to a denied host: 403 at CONNECT, nothing upstream.
    denied = client.curl("-x", explicit, "https://denied.example.com/")
    assert "403" in denied.stderr
    # Absolute-form plain HTTP: allowed and denied, same reasons as the transparent path.
    allowed = client.curl("-x", explicit, "http://plain.example.com/")
    assert allowed.stdout == "hello from origin\n"
    refused = json.loads(client.curl("-x", explicit, "http://denied.example.com/").stdout)
    assert refused["reason"] == "default"
    # Injection over CONNECT + interception.
    injected = client.curl("-x", explicit, "--cacert", str(proxy.ca_cert), "https://api.example.com/echo")
    assert json.loads(injected.stdout)["headers"]["authorization"] == "Bearer [REDACTED]"
    connects = proxy.wait_audit(1, kind="connection", method="CONNECT", host="denied.example.com")
    assert [r["decision"] for r in connects] == ["deny"]


def test_method_rule_and_one_record_per_request(proxy: RunningProxy, client: Client) -> None:
    before = len(requests_for(proxy, "ro.example.com"))
    get = client.curl("-w", "%{http_code}", "-o", "/dev/null", "http://ro.example.com/")
    post = client.curl("-w", "%{http_code}", "-o", "/dev/null", "-X", "POST", "http://ro.example.com/echo")
    assert (get.stdout, post.stdout) == ("200", "403")
    records = proxy.wait_audit(before + 2, kind="request", host="ro.example.com")[before:]
    assert [(r["method"], r["decision"], r["reason"], r["status"]) for r in records] == [
        ("GET", "allow", "rule", 200),
        ("POST", "deny", "method_not_allowed", 403),
    ]


def test_sni_host_mismatch_is_421(proxy: RunningProxy, client: Client) -> None:
    # TLS for api.example.com (a binding host), Host header for another allowed name: fronting.
    result = client.curl(
        "--cacert",
        str(proxy.ca_cert),
        "-H",
        "Host: plain.example.com",
        "-w",
        "%{http_code}",
        "https://api.example.com/echo",
    )
    assert result.stdout.endswith("421")
    assert "Bearer" not in result.stdout


def test_dns_allows_policy_names_and_never_asks_upstream_for_denied(
    proxy: RunningProxy, client: Client, net: Internet
) -> None:
    net.clear_dns_queries()
    code = f"""
from dnslib import DNSRecord, QTYPE
for name, qtype in [("plain.example.com", "A"), ("secret-data.denied.example.com", "A"),
                    ("secret-data.denied.example.com", "TXT"), ("plain.example.com", "TXT")]:
    reply = DNSRecord.parse(DNSRecord.question(name, qtype).send("{GATEWAY}", 53, timeout=3))
    print(name, qtype, QTYPE.get(reply.header.rcode, reply.header.rcode), [str(r.rdata) for r in reply.rr])
"""
    result = client.python(code)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"plain.example.com A 0 ['{ORIGIN_V4}']"
    assert lines[1].startswith("secret-data.denied.example.com A 3")  # NXDOMAIN
    assert lines[2].startswith("secret-data.denied.example.com TXT 3")
    asked = {q["name"] for q in net.dns_queries()}
    assert "plain.example.com" in asked
    assert not any("denied" in name for name in asked)


def test_redirects_are_not_followed_and_carry_no_credential(proxy: RunningProxy, client: Client) -> None:
    result = client.curl(
        "--cacert",
        str(proxy.ca_cert),
        "-D",
        "-",
        "https://api.example.com/redirect?to=http://other.example.com/echo",
    )
    assert "302" in result.stdout.splitlines()[0]
    assert TOKEN not in result.stdout


def test_placeholder_to_unbound_host_is_blocked(proxy: RunningProxy, client: Client, net: Internet) -> None:
    policy = {
        **POLICY,
        "bindings": [
            *POLICY["bindings"],
            {
                "name": "ph",
                "match": {"hosts": ["api.example.com"]},
                "auth": {
                    "type": "passthrough",
                    "substitutions": [{"credential": "api-token", "placeholder": "SG_PH_1"}],
                },
            },
        ],
    }
    # Two bindings for api.example.com would be ambiguous; give the placeholder binding its own path.
    policy["bindings"][0] = {
        **policy["bindings"][0],
        "match": {"hosts": ["api.example.com"], "paths": ["/echo"]},
    }
    policy["bindings"][1]["match"]["paths"] = ["/echo/ph"]
    proxy.control.put_sandbox(SandboxEntry(sandbox_id="sbx-1", address=CLIENT_ADDR, policy=policy))
    try:
        blocked = client.curl("-H", "X-Key: SG_PH_1", "http://plain.example.com/echo")
        assert json.loads(blocked.stdout)["reason"] == "placeholder-outside-binding"
        events = proxy.wait_audit(1, kind="security_event", event="placeholder-outside-binding")
        assert events and events[-1]["host"] == "plain.example.com"
        substituted = client.curl(
            "--cacert", str(proxy.ca_cert), "-H", "X-Key: SG_PH_1", "https://api.example.com/echo/ph"
        )
        assert json.loads(substituted.stdout)["headers"]["x-key"] == "[REDACTED]"
    finally:
        proxy.control.put_sandbox(SandboxEntry(sandbox_id="sbx-1", address=CLIENT_ADDR, policy=POLICY))


def test_the_audit_path_is_the_judged_one_never_the_substituted_placeholder(
    proxy: RunningProxy, client: Client
) -> None:
    """The record's method and path are the request's canonical identity, taken before injection:
    a placeholder substituted into the path (`in: [path]`) stays a placeholder in the audit log."""
    policy = {
        **POLICY,
        "bindings": [
            {**POLICY["bindings"][0], "match": {"hosts": ["api.example.com"], "paths": ["/echo"]}},
            {
                "name": "in-path",
                "match": {"hosts": ["api.example.com"], "paths": ["/echo/in-path/*"]},
                "auth": {
                    "type": "passthrough",
                    "substitutions": [
                        {"credential": "api-token", "placeholder": "SG_PH_PATH", "in": ["path"]}
                    ],
                },
            },
        ],
    }
    proxy.control.put_sandbox(SandboxEntry(sandbox_id="sbx-1", address=CLIENT_ADDR, policy=policy))
    try:
        echoed = client.curl(
            "--cacert", str(proxy.ca_cert), "https://api.example.com/echo/in-path/SG_PH_PATH/%61"
        )
        assert json.loads(echoed.stdout)["path"] == "/echo/in-path/[REDACTED]/a"  # the origin got the value
        [record] = proxy.wait_audit(1, kind="request", binding="in-path")
        assert (record["method"], record["path"]) == ("GET", "/echo/in-path/SG_PH_PATH/a")
        assert TOKEN not in proxy.config.audit_path.read_text()
    finally:
        proxy.control.put_sandbox(SandboxEntry(sandbox_id="sbx-1", address=CLIENT_ADDR, policy=POLICY))


def test_hot_update_applies_to_open_connections(proxy: RunningProxy, client: Client) -> None:
    """The held connection is closed at the push (tests/proxy/test_revocation.py has the rest);
    a new one is refused."""
    code = """
import http.client, json, sys, time, urllib.request
conn = http.client.HTTPConnection("plain.example.com", 80, timeout=5)
conn.request("GET", "/"); first = conn.getresponse(); first.read()
print(first.status, flush=True)
sys.stdin.readline()  # the test swaps the policy now
try:
    conn.request("GET", "/"); conn.getresponse().read()
    print("still open")
except (OSError, http.client.HTTPException):
    print("closed")
conn = http.client.HTTPConnection(ADDRESS, 80, timeout=5)  # the name no longer resolves here
conn.request("GET", "/", headers={"Host": "plain.example.com"})
second = conn.getresponse(); body = second.read()
print(second.status, json.loads(body)["reason"], flush=True)
"""
    process = client.ns.popen(
        [sys.executable, "-c", f"ADDRESS = {ORIGIN_V4!r}\n" + code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout.readline().strip() == "200"
        denying = {**POLICY, "egress": [r for r in POLICY["egress"] if r["target"] != "plain.example.com"]}
        proxy.control.put_sandbox(SandboxEntry(sandbox_id="sbx-1", address=CLIENT_ADDR, policy=denying))
        process.stdin.write("\n")
        process.stdin.flush()
        assert process.stdout.readline().strip() == "closed"
        assert process.stdout.readline().split() == ["403", "default"]
    finally:
        process.kill()
        process.wait()
        proxy.control.put_sandbox(SandboxEntry(sandbox_id="sbx-1", address=CLIENT_ADDR, policy=POLICY))


def test_bad_policy_is_rejected_whole_and_unknown_sources_refused(
    proxy: RunningProxy, client: Client
) -> None:
    assert proxy.put_raw("sbx-1", CLIENT_ADDR, {"egress": [{"action": "maybe", "target": "x"}]}) == 422
    assert client.curl("http://plain.example.com/").stdout == "hello from origin\n"  # old entry in force
    proxy.control.drop_sandbox(CLIENT_ADDR)
    try:
        refused = client.curl("http://plain.example.com/")
        assert refused.returncode != 0
        assert proxy.wait_audit(1, kind="security_event", event="unknown-source")
    finally:
        proxy.control.put_sandbox(SandboxEntry(sandbox_id="sbx-1", address=CLIENT_ADDR, policy=POLICY))
    metrics = proxy.control.metrics()
    assert 'sandgate_proxy_injections_total{binding="api"}' in metrics
    assert "sandgate_proxy_request_duration_seconds_count" in metrics


@pytest.mark.parametrize("version", ["--http1.1", "--http2"])
def test_an_authority_port_other_than_the_connections_is_421(
    proxy: RunningProxy, client: Client, version: str
) -> None:
    # A request for :8443 on a connection to :443 would be served (and judged) as :443.
    tls = ["--cacert", str(proxy.ca_cert), "-w", " %{http_code}", version]
    other_port = client.curl(*tls, "-H", "Host: api.example.com:8443", "https://api.example.com/echo")
    assert other_port.stdout.endswith(" 421"), other_port
    assert "Bearer" not in other_port.stdout
    default_port = client.curl(*tls, "-H", "Host: api.example.com:443", "https://api.example.com/echo")
    assert default_port.stdout.endswith(" 200"), default_port
    plain = client.curl(
        "-w", " %{http_code}", "-H", "Host: plain.example.com:8080", "http://plain.example.com/"
    )
    assert plain.stdout.endswith(" 421"), plain
    refused = proxy.wait_audit(1, kind="request", reason="identity-mismatch", host="plain.example.com")
    assert refused[-1]["port"] == 80 and "8080" in refused[-1]["detail"]


def test_http2_streams_websockets_and_ip_literals(proxy: RunningProxy, client: Client, net: Internet) -> None:
    # HTTP/2: :authority is checked per stream like Host.
    h2 = client.curl(
        "--http2",
        "--cacert",
        str(proxy.ca_cert),
        "-w",
        " %{http_version} %{http_code}",
        "-H",
        "Host: plain.example.com",
        "https://api.example.com/echo",
    )
    assert h2.stdout.endswith(" 2 421"), h2
    # WebSocket upgrade through interception: decided and injected like any request, messages echo.
    code = f"""
import asyncio, ssl, websockets
async def main():
    ctx = ssl.create_default_context(cafile={str(proxy.ca_cert)!r})
    async with websockets.connect("wss://api.example.com/ws", ssl=ctx) as ws:
        await ws.send("ping")
        print(await ws.recv())
asyncio.run(main())
"""
    ws = client.python(code)
    assert ws.stdout.strip() == "ping", ws.stderr
    upgrade = proxy.wait_audit(1, kind="request", host="api.example.com", path="/ws")
    assert upgrade[-1]["status"] == 101 and upgrade[-1]["binding"] == "api"
    # An address literal passes only an IP/CIDR rule.
    literal = json.loads(client.curl(f"http://{ORIGIN_V4}/").stdout)
    assert literal["reason"] == "ip_literal_needs_cidr_rule"


def split_response(output: str) -> tuple[dict[str, str], str]:
    """curl -D - output (newlines as text mode reads them): (lower-cased headers, body)."""
    head, _, body = output.partition("\n\n")
    lines = head.splitlines()[1:]
    return {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}, body


@pytest.mark.parametrize("version", ["--http1.0", "--http1.1", "--http2"])
@pytest.mark.parametrize("shape", ["whole", "chunked"])
def test_a_secret_in_any_response_is_scrubbed_and_reframed(
    proxy: RunningProxy, client: Client, version: str, shape: str
) -> None:
    # stream.example.com is intercepted and gets no credential; its origin leaks the secret anyway
    # (the test client hands it over to be reflected). "[REDACTED]" is shorter than the secret,
    # so a content-length kept from upstream would break the response (HTTP/2: PROTOCOL_ERROR).
    query = "reflect=x-leak" + ("&chunk=7&gap=0.01" if shape == "chunked" else "")
    result = client.curl(
        version,
        "--cacert",
        str(proxy.ca_cert),
        "-D",
        "-",
        "-H",
        f"X-Leak: {TOKEN}",
        "-w",
        "\n%{http_version}",
        f"https://stream.example.com/echo?{query}",
    )
    assert result.returncode == 0, result.stderr
    assert TOKEN not in result.stdout
    response, http_version = result.stdout.rsplit("\n", 1)
    headers, body = split_response(response)
    # The origin's status line (HTTP/1.1) comes through even to an HTTP/1.0 client.
    assert http_version == ("2" if version == "--http2" else "1.1")
    assert json.loads(body)["headers"]["x-leak"] == "[REDACTED]"
    assert headers["x-reflected"] == "[REDACTED]"
    assert "content-length" not in headers
    if version == "--http1.1":
        assert headers["transfer-encoding"] == "chunked"
    if version == "--http1.0":  # no chunked encoding in HTTP/1.0: the connection's end ends the body
        assert "transfer-encoding" not in headers and headers["connection"].lower() == "close"


def test_binary_bodies_are_scrubbed_too(proxy: RunningProxy, client: Client) -> None:
    """Closed world: every body of a sandbox holding a credential passes the scrubber, binary
    types too (an origin can reflect a secret in application/octet-stream as easily)."""
    result = client.curl("--cacert", str(proxy.ca_cert), "-D", "-", "https://stream.example.com/bytes?n=5000")
    headers, body = split_response(result.stdout)
    assert headers["content-type"] == "application/octet-stream"
    assert "content-length" not in headers and body == "x" * 5000  # scrubbed: reframed


def new_records(proxy: RunningProxy, seen: set[str], **match: object) -> list[dict]:
    return [r for r in proxy.wait_audit(1, **match) if r["id"] not in seen]


def test_a_denied_plain_request_has_exactly_one_record(proxy: RunningProxy, client: Client) -> None:
    seen = {r["id"] for r in proxy.audit()}
    result = client.curl(
        "-D", "-", "--resolve", f"denied.example.com:80:{ORIGIN_V4}", "http://denied.example.com/one"
    )
    headers, body = split_response(result.stdout)
    assert json.loads(body)["reason"] == "default"
    # The proxy's own answer is sent as made: whole, with its length (raw clients can read it).
    assert headers["content-length"] == str(len(body)) and "transfer-encoding" not in headers
    proxy.wait_audit(1, kind="request", host="denied.example.com", path="/one")
    records = [r for r in proxy.audit() if r["id"] not in seen and r["host"] == "denied.example.com"]
    assert [(r["kind"], r["decision"], r["status"]) for r in records] == [("request", "deny", 403)]


def test_a_denied_connect_has_exactly_one_record(proxy: RunningProxy, client: Client) -> None:
    seen = {r["id"] for r in proxy.audit()}
    result = client.curl("-x", f"http://{GATEWAY}:{EXPLICIT_PORT}", "https://denied.example.com/")
    assert "403" in result.stderr
    new_records(proxy, seen, kind="connection", method="CONNECT", host="denied.example.com")
    records = [r for r in proxy.audit() if r["id"] not in seen and r["host"] == "denied.example.com"]
    assert [(r["kind"], r["method"], r["decision"]) for r in records] == [("connection", "CONNECT", "deny")]


@pytest.fixture
def canaries() -> Iterator[list[str]]:
    """Listeners on port 80 of every rebinding target, in the proxy's own namespace (the pytest
    process's): any connection to one means the proxy dialled an always-denied address."""
    added = [address for address in REBOUND.values() if not address.startswith("127.")]
    hits: list[str] = []
    listeners: list[socket.socket] = []
    stop = threading.Event()
    try:
        for address in added:
            ip("addr", "add", f"{address}/32", "dev", "lo")
        for address in REBOUND.values():
            listener = socket.create_server((address, 80))
            listeners.append(listener)

        def watch() -> None:
            while not stop.is_set():
                ready, _, _ = select.select(listeners, [], [], 0.1)
                for listener in ready:
                    accepted, peer = listener.accept()
                    hits.append(f"{peer[0]} -> {listener.getsockname()[0]}")
                    accepted.close()

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        yield hits
        stop.set()
        watcher.join(2)
    finally:
        stop.set()
        for listener in listeners:
            listener.close()
        for address in added:
            subprocess.run(["ip", "addr", "del", f"{address}/32", "dev", "lo"], capture_output=True)


@pytest.mark.parametrize("label", sorted(REBOUND))
def test_dns_rebinding_is_403_and_never_dialled(
    proxy: RunningProxy, client: Client, canaries: list[str], label: str
) -> None:
    # The policy allows *.rebind.example.com, but the name resolves to an always-denied address.
    # The sandbox's own DNS would drop that answer; --resolve makes it send the request anyway.
    name = f"{label}.rebind.example.com"
    seen = {r["id"] for r in proxy.audit()}
    result = client.curl("-w", "\n%{http_code}", "--resolve", f"{name}:80:{ORIGIN_V4}", f"http://{name}/")
    body, status = result.stdout.rsplit("\n", 1)
    assert status == "403"
    reply = json.loads(body)
    assert (reply["error"], reply["host"], reply["reason"]) == ("egress denied", name, "always_denied_range")
    [record] = new_records(proxy, seen, kind="request", host=name)
    assert (record["decision"], record["reason"], record["upstream"]) == ("deny", "always_denied_range", None)
    assert canaries == []
