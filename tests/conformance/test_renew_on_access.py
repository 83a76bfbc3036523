"""Renew on access (`extensions["access.renew.extend.seconds"]`, OpenSandbox's OSEP-0009) with
the OpenSandbox SDK as the client: traffic through the server's proxy extends an opted-in
sandbox's expiry to now + the extension, at most once a minute, never past the server's maximum
(`renew_on_access_max_lifetime` after creation), each renewal one `lifecycle` audit record; a
malformed opt-in is a 400 at create. Proven from the stored sandbox (its expiresAt) and the
audit log, not from the client's word.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from opensandbox import SandboxSync

from tests.conformance.conftest import upstream
from tests.conformance.test_sdk import connection
from tests.support.audit import audit_records
from tests.support.internet import Internet
from tests.support.server import SandgateServer, sandgate_server

pytestmark = pytest.mark.root
EXTENSION = "access.renew.extend.seconds"
CAP = 200  # the capped server's renew_on_access_max_lifetime


def renewals(server: SandgateServer, sandbox_id: str) -> list[dict[str, Any]]:
    """The sandbox's lifecycle records: reason plus the detail's facts, oldest first."""
    return [
        {"reason": r["reason"], **json.loads(r["detail"])}
        for r in audit_records(server.state_dir, sandbox_id)
        if r["kind"] == "lifecycle"
    ]


def stored(server: SandgateServer, sandbox_id: str) -> tuple[datetime, datetime]:
    """(createdAt, expiresAt) as the server has them."""
    with server.client() as client:
        sandbox = client.get(f"/v1/sandboxes/{sandbox_id}").json()
    return datetime.fromisoformat(sandbox["createdAt"]), datetime.fromisoformat(sandbox["expiresAt"])


def first_renewal(server: SandgateServer, sandbox_id: str, timeout: float = 20.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while not (found := [r for r in renewals(server, sandbox_id) if r["reason"] == "renew on access"]):
        assert time.monotonic() < deadline, f"no renewal on access of {sandbox_id} in {timeout:g} s"
        time.sleep(0.1)
    return found[0]


def create(server: SandgateServer, proxied: bool, extensions: dict[str, str]) -> SandboxSync:
    """A sandbox expiring 120 s after its create, created through the API (the server waits for
    its execd by itself: no traffic through the proxy yet), then connected to with the SDK."""
    sandbox_id = server.create_sandbox(timeout=120, extensions=extensions)["id"]
    created_at, expires_at = stored(server, sandbox_id)
    assert expires_at - created_at == timedelta(seconds=120)
    assert renewals(server, sandbox_id) == []
    return SandboxSync.connect(sandbox_id, connection_config=connection(server, use_server_proxy=proxied))


def test_traffic_through_the_proxy_renews_once_a_minute_and_audits(server: SandgateServer) -> None:
    sandbox = create(server, proxied=True, extensions={EXTENSION: "300"})
    try:
        created_at = stored(server, sandbox.id)[0]
        expires_at = created_at + timedelta(seconds=120)
        assert sandbox.get_info().extensions == {EXTENSION: "300", "sandgate.isolation": "standard"}
        # the SDK's connect (execd's /ping) and commands go through /v1/sandboxes/{id}/proxy/44772
        assert sandbox.commands.run("true").exit_code == 0
        renewal = first_renewal(server, sandbox.id)
        _, renewed = stored(server, sandbox.id)
        assert renewed - created_at >= timedelta(seconds=300)  # now + 300 s, now being after create
        assert renewed - datetime.now(renewed.tzinfo) <= timedelta(seconds=300)
        assert renewal == {
            "reason": "renew on access",
            "actor": "access",
            "extend_seconds": 300,
            "old_expires_at": expires_at.isoformat(),
            "expires_at": renewed.isoformat(),
            "max_expires_at": (created_at + timedelta(days=7)).isoformat(),
        }

        for _ in range(5):  # within the minute: no further renewal, no further row
            assert sandbox.commands.run("true").exit_code == 0
        assert stored(server, sandbox.id)[1] == renewed
        sandbox.renew(timedelta(seconds=600))  # the API's renew: audited as well
        reasons = [(r["reason"], r["actor"]) for r in renewals(server, sandbox.id)]
        assert reasons == [("renew on access", "access"), ("renew", "api-key")]
    finally:
        sandbox.kill()
        sandbox.close()


def test_a_sandbox_that_did_not_opt_in_keeps_its_expiry(server: SandgateServer) -> None:
    sandbox = create(server, proxied=True, extensions={})
    try:
        before = stored(server, sandbox.id)[1]
        assert sandbox.commands.run("true").exit_code == 0
        sandbox.renew(timedelta(seconds=600))  # a record after the access: none came before it
        assert [r["reason"] for r in renewals(server, sandbox.id)] == ["renew"]
        assert stored(server, sandbox.id)[1] > before
    finally:
        sandbox.kill()
        sandbox.close()


@pytest.mark.parametrize("value", ["299", "86401", "five minutes", "", "+300"])
def test_a_malformed_opt_in_is_refused_at_create(server: SandgateServer, value: str) -> None:
    marker = {"renew-test": value or "empty"}
    with server.client() as client:
        body = {"image": {"uri": "sandgate/host"}, "resourceLimits": {}, "timeout": 120}
        answer = client.post(
            "/v1/sandboxes", json={**body, "metadata": marker, "extensions": {EXTENSION: value}}
        )
        assert answer.status_code == 400, answer.text
        assert EXTENSION in answer.json()["message"] and "300 to 86400" in answer.json()["message"]
        listed = client.get("/v1/sandboxes", params={"metadata": f"renew-test={marker['renew-test']}"})
    assert listed.json()["items"] == []  # nothing was created


@pytest.fixture(scope="module")
def capped_server(tmp_path_factory: pytest.TempPathFactory, internet: Internet) -> Iterator[SandgateServer]:
    settings = {"SANDGATE_RENEW_ON_ACCESS_MAX_LIFETIME": str(CAP), "SANDGATE_RENEW_ON_ACCESS_INTERVAL": "1"}
    state = Path(tmp_path_factory.mktemp("sandgate-capped"))
    with sandgate_server(state, {**upstream(internet), **settings}) as running:
        yield running


def test_renewal_never_goes_past_the_servers_maximum(capped_server: SandgateServer) -> None:
    server = capped_server
    sandbox = create(server, proxied=False, extensions={EXTENSION: "300"})  # execd's host endpoint
    # is the server's proxy too
    try:
        created_at, _ = stored(server, sandbox.id)
        assert sandbox.commands.run("true").exit_code == 0
        renewal = first_renewal(server, sandbox.id)
        cap = created_at + timedelta(seconds=CAP)
        assert stored(server, sandbox.id)[1] == cap  # not now + 300 s
        assert renewal["expires_at"] == renewal["max_expires_at"] == cap.isoformat()
        deadline = time.monotonic() + 1.5  # past the 1 s interval: accesses are due again
        while time.monotonic() < deadline:
            assert sandbox.commands.run("true").exit_code == 0
        sandbox.renew(timedelta(seconds=90))  # the API's renew is not capped: the operator's call
        assert [r["reason"] for r in renewals(server, sandbox.id)] == ["renew on access", "renew"]
    finally:
        sandbox.kill()
        sandbox.close()


def test_a_server_that_does_not_renew_refuses_the_opt_in(tmp_path: Path, internet: Internet) -> None:
    settings = {**upstream(internet), "SANDGATE_RENEW_ON_ACCESS_MAX_LIFETIME": "0"}
    with sandgate_server(tmp_path, settings) as server, server.client() as client:
        answer = client.post(
            "/v1/sandboxes",
            json={"image": {"uri": "sandgate/host"}, "resourceLimits": {}, "extensions": {EXTENSION: "300"}},
        )
    assert answer.status_code == 400
    assert "renew_on_access_max_lifetime = 0" in answer.json()["message"]
