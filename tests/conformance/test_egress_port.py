"""The egress API at the sandbox's proxied egress port, `/v1/sandboxes/{id}/proxy/18080/...`.

OpenSandbox's clients in server-proxy mode ask for the 18080 endpoint, get the server's proxy
route for that port, and speak the egress API there. sandgate serves that API outside the
sandbox (`/v1/sandboxes/{id}/egress`); the proxied port is answered by the same routes, with the
same checks, and nothing of it reaches the sandbox (a server listening on 18080 inside it sees
no request). Proven from the other side: the audit log's policy_change records (who changed
what, through which credential) and the sandbox's own listener's log.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from opensandbox import SandboxSync
from opensandbox.models.sandboxes import NetworkPolicy, NetworkRule
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.conformance.conftest import API_HOST
from tests.conformance.test_sdk import connection
from tests.support.audit import audit_records
from tests.support.server import SandgateServer

pytestmark = pytest.mark.root
BLOCKED = "blocked.example.com"
LISTENER_LOG = "/tmp/listener-18080.log"


def policy_changes(server: SandgateServer, sandbox_id: str) -> list[dict[str, Any]]:
    """(reason, actor) of the sandbox's policy_change records, oldest first."""
    return [
        {"reason": r["reason"], **json.loads(r["detail"])}
        for r in audit_records(server.state_dir, sandbox_id)
        if r["kind"] == "policy_change"
    ]


@pytest.mark.parametrize("mode", ["direct", "server_proxy"])
def test_sdk_egress_and_vault_through_the_18080_endpoint(server: SandgateServer, mode: str) -> None:
    proxied = mode == "server_proxy"
    sandbox = SandboxSync.create(
        "sandgate/host",
        entrypoint=["sleep", "infinity"],
        network_policy=NetworkPolicy(
            defaultAction="deny", egress=[NetworkRule(action="allow", target=API_HOST)]
        ),
        connection_config=connection(server, use_server_proxy=proxied),
        ready_timeout=timedelta(seconds=30),
    )
    try:
        path = f"/v1/sandboxes/{sandbox.id}/" + ("proxy/18080" if proxied else "egress")
        assert sandbox.get_endpoint(18080).endpoint == f"{server.domain}{path}"
        sandbox.patch_egress_rules([NetworkRule(action="deny", target=BLOCKED)])
        rules = [(r.action, r.target) for r in sandbox.get_egress_policy().egress]
        assert rules == [("deny", BLOCKED), ("allow", API_HOST)]
        sandbox.delete_egress_rules([BLOCKED])
        created = sandbox.credential_vault.create(
            credentials=[{"name": "token", "source": {"type": "inline", "value": "s3cr3t-0123456789"}}],
            bindings=[
                {
                    "name": "api",
                    "match": {"hosts": [API_HOST]},
                    "auth": {"type": "bearer", "credential": "token"},
                }
            ],
        )
        assert created.revision == 1
        assert [c.name for c in sandbox.credential_vault.list_credentials()] == ["token"]

        with server.client() as client:  # the policy itself, read through the lifecycle API
            stored = client.get(f"/v1/sandboxes/{sandbox.id}/networkpolicy").json()["policy"]
        assert stored == {"defaultAction": "deny", "egress": [{"action": "allow", "target": API_HOST}]}
        # server-proxy mode: the SDK sends the API key there, and the egress routes take it
        actor = "api-key" if proxied else "egress-token"
        changes = [(c["reason"], c["actor"]) for c in policy_changes(server, sandbox.id)]
        assert changes == [
            ("create", "api"),
            ("policy patch", actor),
            ("policy delete", actor),
            ("credential-vault create", actor),
        ]
    finally:
        sandbox.kill()
        sandbox.close()


@pytest.fixture
def listening_sandbox(server: SandgateServer) -> Iterator[dict[str, Any]]:
    """A sandbox with its own HTTP server on 18080, logging every request it gets."""
    sandbox = server.create_sandbox(networkPolicy={"defaultAction": "deny", "egress": []})
    try:
        serve = f"cd /tmp && python3 -m http.server 18080 > {LISTENER_LOG} 2>&1"
        server.run(sandbox["id"], serve, background=True)
        seen = (
            "for i in $(seq 100); do curl -sf -o /dev/null http://127.0.0.1:18080/ && exit 0; sleep 0.1; done"
        )
        assert server.run(sandbox["id"], seen).exit_code == 0, "the sandbox's listener did not start"
        yield sandbox
    finally:
        with server.client() as client:
            client.delete(f"/v1/sandboxes/{sandbox['id']}")


def test_proxied_egress_port_is_the_egress_api_with_its_checks(
    server: SandgateServer, listening_sandbox: dict[str, Any]
) -> None:
    sandbox_id = listening_sandbox["id"]
    with server.client() as client:
        token = client.get(f"/v1/sandboxes/{sandbox_id}/endpoints/18080").json()["headers"]
    key = {"OPEN-SANDBOX-API-KEY": server.api_key}
    base = f"{server.base_url}/v1/sandboxes/{sandbox_id}"
    bad_patch = [{"action": "allow", "target": "*"}]

    def both(method: str, path: str, **request: Any) -> tuple[httpx.Response, httpx.Response]:
        """The same request at the egress route and at the proxied egress port."""
        with httpx.Client(trust_env=False, timeout=30) as http:
            return (
                http.request(method, f"{base}/egress{path}", **request),
                http.request(method, f"{base}/proxy/18080{path}", **request),
            )

    for method, path, request, status in [
        ("GET", "/policy", {}, 401),  # neither the sandbox's token nor the API key
        ("GET", "/policy", {"headers": {"OPENSANDBOX-EGRESS-AUTH": "a guess"}}, 401),
        ("GET", "/policy", {"headers": {**key, "OPEN-SANDBOX-API-KEY": "wrong"}}, 401),
        ("GET", "/policy", {"headers": token}, 200),
        ("GET", "/policy", {"headers": key}, 200),
        ("PATCH", "/policy", {"headers": token, "json": bad_patch}, 400),  # validation: nothing changes
        ("PATCH", "/policy", {"headers": token, "json": [{"action": "allow", "target": API_HOST}]}, 200),
        ("DELETE", "/policy", {"headers": key, "json": [API_HOST]}, 200),
        ("GET", "/credential-vault", {"headers": token}, 404),  # none created yet
        ("GET", "/no-such-route", {"headers": token}, 404),
    ]:
        at_egress, at_port = both(method, path, **request)
        assert (at_egress.status_code, at_port.status_code) == (status, status), (method, path, request)
        assert at_port.headers["content-type"] == at_egress.headers["content-type"]
        if status != 200:
            assert at_port.text == at_egress.text
    with httpx.Client(trust_env=False) as http:
        missing = http.get(f"{server.base_url}/v1/sandboxes/no-such-sandbox/proxy/18080/policy", headers=key)
    assert missing.status_code == 404
    # a WebSocket there is no relay into the sandbox either, nor with the port spelt %-encoded
    # (the auth middleware reads the decoded path), with a made-up key or the real one
    for port in ("18080", "1808%30"):
        for headers in ({}, {"OPEN-SANDBOX-API-KEY": "made up"}, key):
            with pytest.raises(InvalidStatus) as refused:
                url = f"ws://{server.domain}/v1/sandboxes/{sandbox_id}/proxy/{port}/"
                connect(url, additional_headers=headers)
            assert refused.value.response.status_code == 403, (port, headers)

    changes = [(c["reason"], c["actor"]) for c in policy_changes(server, sandbox_id)]
    assert changes == [
        ("create", "api"),
        ("policy patch", "egress-token"),
        ("policy patch", "egress-token"),
        ("policy delete", "api-key"),
        ("policy delete", "api-key"),
    ]
    listener = server.run(sandbox_id, f"cat {LISTENER_LOG}").stdout
    assert listener.count('"GET / HTTP/1.1"') == 1 and "/policy" not in listener, listener
