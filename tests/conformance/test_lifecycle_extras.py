"""Lifecycle features beyond the SDK's main flow, against the real server and real sandboxes:
renew-expiration and the expiry reaper, diagnostics descriptors (SDK), POST /metrics/events,
`/sandboxes/{id}/networkpolicy` (SDK's control-plane policy adapter), and the WebSocket relay
of `/sandboxes/{id}/proxy/{port}/...` to a server inside the sandbox."""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from opensandbox import SandboxSync
from opensandbox.models.sandboxes import NetworkRule
from opensandbox.sync.adapters.network_policy_adapter import NetworkPolicyAdapterSync
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect

from tests.conformance.conftest import API_HOST
from tests.conformance.test_sdk import connection
from tests.support.server import SandgateServer

pytestmark = pytest.mark.root
WS_PORT = 8765
# A WebSocket echo server with the `websockets` package the sandbox sees read-only (the venv).
WS_SERVER = f"""
import asyncio, websockets
async def echo(ws):
    async for message in ws:
        await ws.send(message)
async def main():
    async with websockets.serve(echo, "0.0.0.0", {WS_PORT}, subprotocols=["sg.echo"]):
        await asyncio.Future()
asyncio.run(main())
"""


def netns_of(sandbox_id: str) -> list[Path]:
    return list(Path("/run/netns").glob(f"*-{sandbox_id}"))


def test_renew_expiration_and_the_reaper_deletes_the_sandbox(server: SandgateServer) -> None:
    sandbox_id = server.create_sandbox(timeout=60)["id"]
    assert netns_of(sandbox_id)
    with server.client() as client:
        renew = f"/v1/sandboxes/{sandbox_id}/renew-expiration"
        past = client.post(renew, json={"expiresAt": "2000-01-01T00:00:00Z"})
        assert past.status_code == 400 and "not in the future" in past.json()["message"]
        naive = client.post(renew, json={"expiresAt": "2999-01-01T00:00:00"})
        assert naive.status_code == 400 and "time zone" in naive.json()["message"]

        later = datetime.now(UTC) + timedelta(hours=1)
        answer = client.post(renew, json={"expiresAt": later.isoformat()})
        assert answer.status_code == 200
        assert datetime.fromisoformat(answer.json()["expiresAt"]) == later
        shown = client.get(f"/v1/sandboxes/{sandbox_id}").json()["expiresAt"]
        assert datetime.fromisoformat(shown.replace("Z", "+00:00")) == later

        soon = datetime.now(UTC) + timedelta(seconds=2)
        assert client.post(renew, json={"expiresAt": soon.isoformat()}).status_code == 200
        deadline = time.monotonic() + 20
        while (gone := client.get(f"/v1/sandboxes/{sandbox_id}")).status_code != 404:
            assert time.monotonic() < deadline, "the reaper did not delete the expired sandbox"
            time.sleep(0.2)
        # An expired sandbox reads differently from one that never existed (a tombstone).
        expired = f"sandbox '{sandbox_id}' expired at {soon.isoformat()} and was deleted"
        assert gone.json()["message"].startswith(expired)
        egress = client.get(f"/v1/sandboxes/{sandbox_id}/egress/policy")
        assert egress.status_code == 404 and expired in egress.text  # the egress API answers text
        never = client.get("/v1/sandboxes/never-existed")
        assert never.status_code == 404 and "does not exist" in never.json()["message"]
    assert datetime.now(UTC) >= soon
    assert netns_of(sandbox_id) == [], "the expired sandbox's netns is still there"


def test_diagnostics_descriptors_through_the_sdk(server: SandgateServer) -> None:
    created = server.create_sandbox(
        networkPolicy={"defaultAction": "deny", "egress": [{"action": "allow", "target": API_HOST}]}
    )
    sandbox = SandboxSync.connect(created["id"], connection_config=connection(server))
    try:
        ran = server.run(created["id"], "curl -sS -o /dev/null --max-time 10 http://denied.example.com/")
        assert ran.exit_code != 0  # refused at DNS or by the proxy: either way an audit record
        deadline = time.monotonic() + 10
        while "denied.example.com" not in (logs := sandbox.get_diagnostic_logs("all")).content:
            assert time.monotonic() < deadline, f"no record of the denied request in {logs.content!r}"
            time.sleep(0.2)
        assert (logs.sandbox_id, logs.kind, logs.scope, logs.delivery) == (
            created["id"],
            "logs",
            "all",
            "inline",
        )
        records = [json.loads(line) for line in logs.content.splitlines()]
        assert {r["sandbox"] for r in records} == {created["id"]}
        assert all(r["kind"] != "policy_change" for r in records)

        events = sandbox.get_diagnostic_events("all")
        assert (events.kind, events.scope) == ("events", "all")
        lines = [json.loads(line) for line in events.content.splitlines()]
        assert lines[0]["kind"] == "policy_change" and lines[0]["reason"] == "create"
        assert lines[-1] == {"state": "Running", "reason": "SANDBOX_READY"}
        with server.client() as client:
            plain = client.get(f"/v1/sandboxes/{created['id']}/diagnostics/events")
        assert plain.headers["content-type"].startswith("text/plain") and "SANDBOX_READY" in plain.text
    finally:
        sandbox.kill()
        sandbox.close()


def test_metrics_events_answer_204(server: SandgateServer) -> None:
    event = {"eventType": "sandbox.create", "sandboxId": "x", "createDurationMs": 120, "success": True}
    with server.client() as client:
        assert client.post("/v1/metrics/events", json=event).status_code == 204
        assert client.post("/metrics/events", json=event).status_code == 204
        wrong = client.post("/v1/metrics/events", json={**event, "createDurationMs": -1})
        assert wrong.status_code == 422 and wrong.json()["code"] == "INVALID_REQUEST"
    bare = httpx.post(f"{server.base_url}/v1/metrics/events", json=event, trust_env=False)
    assert bare.status_code == 401


def test_networkpolicy_route_with_the_sdk_adapter(server: SandgateServer) -> None:
    """The SDK routes template sandboxes' egress calls to /sandboxes/{id}/networkpolicy."""
    sandbox_id = server.create_sandbox(
        networkPolicy={"defaultAction": "deny", "egress": [{"action": "allow", "target": API_HOST}]}
    )["id"]
    adapter = NetworkPolicyAdapterSync(connection(server), sandbox_id)
    try:
        assert [(r.action, r.target) for r in adapter.get_policy().egress] == [("allow", API_HOST)]
        adapter.patch_rules([NetworkRule(action="deny", target="blocked.example.com")])
        assert [r.target for r in adapter.get_policy().egress] == ["blocked.example.com", API_HOST]
        adapter.delete_rules(["blocked.example.com", "never-there.example.com"])
        assert [r.target for r in adapter.get_policy().egress] == [API_HOST]
        with server.client() as client:
            url = f"/v1/sandboxes/{sandbox_id}/networkpolicy"
            wanted = {"defaultAction": "deny", "egress": [{"action": "allow", "target": "*.example.test"}]}
            replaced = client.put(url, json=wanted)
            assert replaced.status_code == 200
            assert replaced.json()["policy"]["egress"] == [{"action": "allow", "target": "*.example.test"}]
            assert replaced.json()["mode"] == "enforcing"
            egress = client.get(f"/v1/sandboxes/{sandbox_id}/endpoints/18080").json()
            via_sidecar_api = httpx.get(f"http://{egress['endpoint']}/policy", headers=egress["headers"])
            assert via_sidecar_api.json()["policy"] == replaced.json()["policy"]  # one policy, two routes
            invalid = client.patch(url, json=[{"action": "allow", "target": "*"}])
            assert invalid.status_code == 400 and set(invalid.json()) == {"code", "message"}
            assert client.get(url.replace(sandbox_id, "no-such-sandbox")).status_code == 404
            changes = client.get("/v1/audit", params={"sandbox": sandbox_id, "kind": "policy_change"})
        bare = httpx.get(f"{server.base_url}/v1/sandboxes/{sandbox_id}/networkpolicy", trust_env=False)
        assert bare.status_code == 401
        deadline = time.monotonic() + 10
        reasons: list[str] = []
        while "networkpolicy replace" not in reasons and time.monotonic() < deadline:
            time.sleep(0.2)
            with server.client() as client:
                changes = client.get("/v1/audit", params={"sandbox": sandbox_id, "kind": "policy_change"})
            reasons = [r["reason"] for r in changes.json()["records"]]
        assert {"networkpolicy patch", "networkpolicy delete", "networkpolicy replace"} <= set(reasons)
    finally:
        adapter._httpx_client.close()
        with server.client() as client:
            client.delete(f"/v1/sandboxes/{sandbox_id}")


def test_websocket_relay_to_a_server_in_the_sandbox(server: SandgateServer) -> None:
    sandbox_id = server.create_sandbox()["id"]
    try:
        started = server.run(sandbox_id, f"{sys.executable} -c '{WS_SERVER}'", background=True)
        assert started.exit_code == 0
        url = f"ws://{server.domain}/v1/sandboxes/{sandbox_id}/proxy/{WS_PORT}/echo?x=1"
        headers = {"OPEN-SANDBOX-API-KEY": server.api_key}
        deadline = time.monotonic() + 20
        while True:
            try:
                ws = ws_connect(url, additional_headers=headers, subprotocols=["sg.echo"], open_timeout=5)  # type: ignore[list-item]
                break
            except (OSError, InvalidStatus) as exc:  # the server inside may not listen yet
                assert time.monotonic() < deadline, f"the relay never reached the sandbox's server: {exc!r}"
                time.sleep(0.3)
        with ws:
            assert ws.subprotocol == "sg.echo"
            ws.send("ping-1")
            assert ws.recv(timeout=5) == "ping-1"
            ws.send(b"\x00\x01binary")
            assert ws.recv(timeout=5) == b"\x00\x01binary"
            for n in range(20):
                ws.send(f"message {n}")
            assert [ws.recv(timeout=5) for _ in range(20)] == [f"message {n}" for n in range(20)]
        with pytest.raises(InvalidStatus):
            ws_connect(url, open_timeout=5)  # no API key: refused before the upgrade
    finally:
        with server.client() as client:
            client.delete(f"/v1/sandboxes/{sandbox_id}")
