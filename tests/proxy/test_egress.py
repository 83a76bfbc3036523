"""The egress proxy end to end: a real proxy process, a client namespace redirected to it by
nftables, and the test internet. Each test states one behaviour of docs/proxy.md."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from sandgate.proxy import SandboxEntry
from sandgate.vault import generate_master_key, open_store
from tests.proxy.conftest import (
    CLIENT_ADDR,
    Client,
    RunningProxy,
    start_proxy,
    stop_proxy,
)
from tests.support.internet import ORIGIN_V4, Internet

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


@pytest.fixture(scope="module")
def proxy(net: Internet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    net.set_names({f"{n}.example.com": [ORIGIN_V4] for n in NAMES})
    vault_dir = tmp_path_factory.mktemp("vault")
    key = generate_master_key()
    open_store("local", vault_dir, key).put("api-token", TOKEN)
    entry = SandboxEntry(sandbox_id="sbx-1", address=CLIENT_ADDR, policy=POLICY)
    running = start_proxy(
        tmp_path_factory.mktemp("proxy"),
        net,
        [entry],
        vault={"backend": "local", "state_dir": str(vault_dir), "vault_key": key},
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
    [record] = proxy.wait_audit(1, kind="connection", host="pass.example.com")
    assert record["decision"] == "allow" and record["inspect"] is False
    assert record["sni"] == "pass.example.com" and record["upstream"] == f"{ORIGIN_V4}:443"


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
