"""Every record a real run writes, exported as OCSF, is valid against the OCSF schema (issue 45).

A real `sandgate serve` and a real sandbox: policy changes (create, a sandgate policy, a
credential vault, a reviewer's allow-sandbox), a renewal (a `lifecycle` record), DNS queries
(allowed, and denied by name), requests through the proxy (intercepted with a credential
injected, a PATCH, a path the policy refuses, one held for approval until it times out, one a
reviewer allows), pass-through TLS (its decision and closing records), a connection refused at
the address, and security events (a placeholder sent to a host it is not bound to, the approval
requests). The export is `sandgate logs -o ocsf` and `/v1/audit?format=ocsf`, as a data lake
would receive it; each event is checked by tests/support/ocsf.py against the schema of the
version it names.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandgate.lifecycle.audit import KINDS, OCSF_VERSION, AuditFilter, AuditIndex
from tests.support.internet import DNS_ADDR, ORIGIN_V4, Internet, start_internet
from tests.support.ocsf import ocsf_errors
from tests.support.server import SANDGATE, SandgateServer, sandgate_server

pytestmark = pytest.mark.root

BOUND_HOST = "api.example.com"  # intercepted; a credential is injected on /echo
OPEN_HOST = "open.example.com"  # TLS passes through
ASKED_HOST = "ask.example.com"  # held for a reviewer nobody is
APPROVED_HOST = "approve.example.com"  # held, then allowed for the sandbox by a reviewer
DENIED_HOST = "denied.example.com"  # resolvable upstream, denied by the policy
PLACEHOLDER = "SANDGATE_PLACEHOLDER_TOKEN"
POLICY = {
    "version": 1,
    "defaultAction": "deny",
    "askTimeout": 2,
    "egress": [
        {"action": "allow", "target": BOUND_HOST, "inspect": "always", "paths": ["/echo", "/echo/*", "/"]},
        {"action": "allow", "target": OPEN_HOST},
        {"action": "ask", "target": ASKED_HOST},
        {"action": "ask", "target": APPROVED_HOST},
    ],
}
VAULT = {
    "credentials": [{"name": "token", "source": {"type": "inline", "value": "ocsf-run-secret-value"}}],
    "bindings": [
        {
            "name": "api",
            "match": {"hosts": [BOUND_HOST], "paths": ["/echo"]},
            "auth": {"type": "bearer", "credential": "token"},
        },
        {
            "name": "api-placeholder",
            "match": {"hosts": [BOUND_HOST], "paths": ["/echo/placeholder"]},
            "auth": {
                "type": "passthrough",
                "substitutions": [{"credential": "token", "placeholder": PLACEHOLDER, "in": ["header"]}],
            },
        },
    ],
}
# Inside the sandbox: every kind of traffic the run's records are made of (-k: the proxy's CA
# is not what this test is about).
WORKLOAD = [
    f"getent hosts {BOUND_HOST}",
    f"getent hosts {DENIED_HOST}",
    f"curl -sSk --max-time 10 https://{BOUND_HOST}/echo",
    f"curl -sSk --max-time 10 -X PATCH https://{BOUND_HOST}/echo/patched -d x=1",
    f"curl -sSk --max-time 10 https://{BOUND_HOST}/refused-path",
    f"curl -sSk --max-time 10 https://{OPEN_HOST}/",
    f"curl -sSk --max-time 10 --resolve {DENIED_HOST}:443:{ORIGIN_V4} https://{DENIED_HOST}/",
    f"curl -sS --max-time 10 -H 'X-Token: {PLACEHOLDER}' http://{OPEN_HOST}/",
    f"curl -sSk --max-time 20 https://{ASKED_HOST}/",
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandgateServer]:
    with start_internet(tmp_path_factory.mktemp("internet")) as internet:
        hosts = (BOUND_HOST, OPEN_HOST, ASKED_HOST, APPROVED_HOST, DENIED_HOST)
        internet.set_names({name: [ORIGIN_V4] for name in hosts})
        extra = {
            "SANDGATE_UPSTREAM_DNS": json.dumps([DNS_ADDR]),
            "SANDGATE_UPSTREAM_CA": str(internet.ca_cert),
            "SANDGATE_EXEC_AUDIT": "processes",  # every program the workload runs: `process` records
            "SANDGATE_PROCESS_EVENTS_NETNS": os.environ["SANDGATE_TEST_HOST_NETNS"],
        }
        with sandgate_server(Path(tmp_path_factory.mktemp("sandgate")), extra) as running:
            run_workload(running, internet)
            yield running


def run_workload(server: SandgateServer, internet: Internet) -> None:
    sandbox_id = server.create_sandbox()["id"]
    with server.client() as client:
        put = client.put(f"/v1/sandboxes/{sandbox_id}/egress/sandgate-policy", json={"policy": POLICY})
        assert put.status_code == 200, put.text
        egress = client.get(f"/v1/sandboxes/{sandbox_id}/endpoints/18080").json()
        later = (datetime.now(UTC) + timedelta(hours=2)).isoformat()  # a `lifecycle` record
        renew = client.post(f"/v1/sandboxes/{sandbox_id}/renew-expiration", json={"expiresAt": later})
        assert renew.status_code == 200, renew.text
    vault = httpx.post(f"http://{egress['endpoint']}/credential-vault", json=VAULT, headers=egress["headers"])
    assert vault.status_code == 201, vault.text
    for command in WORKLOAD:
        server.run(sandbox_id, command, timeout=60)
    with server.client() as client:  # a file operation through execd: a `file` record
        written = client.post(
            f"/v1/sandboxes/{sandbox_id}/proxy/44772/directories", json={"/tmp/ocsf-run": {"mode": 755}}
        )
        assert written.status_code == 200, written.text
    approve_for_the_sandbox(server, sandbox_id)
    # The other side: the allowed requests reached the origin, the refused ones did not.
    reached = {
        (r["method"], r["headers"]["host"], r["path"])  # type: ignore[index]
        for r in internet.origin_requests()
    }
    assert ("GET", BOUND_HOST, "/echo") in reached and ("PATCH", BOUND_HOST, "/echo/patched") in reached
    assert not {("GET", BOUND_HOST, "/refused-path"), ("GET", ASKED_HOST, "/")} & reached
    with server.client() as client:
        assert client.delete(f"/v1/sandboxes/{sandbox_id}").status_code == 204


def approve_for_the_sandbox(server: SandgateServer, sandbox_id: str) -> None:
    """A request held until a reviewer allows its host for the sandbox (a policy change too)."""
    server.run(sandbox_id, f"curl -sSk --max-time 60 https://{APPROVED_HOST}/", background=True)
    with server.client() as client:
        held = until(lambda: client.get("/v1/approvals").json(), "the request to be held")
        answer = client.post(f"/v1/approvals/{held[0]['id']}", json={"decision": "allow-sandbox"})
        assert answer.status_code == 200, answer.text
    until(
        lambda: any(r["reason"] == "approved" for r in native_records(server) if r["kind"] == "request"),
        "the approved request's record",
    )


def until(probe: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := probe()):
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
        time.sleep(0.1)
    return found


def native_records(server: SandgateServer) -> list[dict[str, Any]]:
    index = AuditIndex(server.state_dir / "audit-index.db", server.state_dir / "audit.jsonl")
    try:
        index.ingest()
        return index.page(AuditFilter(), 1000).records
    finally:
        index.close()


def exported(server: SandgateServer) -> list[dict[str, Any]]:
    """`sandgate logs -o ocsf`, as a reviewer ships it to a data lake."""
    done = subprocess.run(
        [*SANDGATE, "--state-dir", str(server.state_dir), "logs", "-o", "ocsf", "--limit", "1000"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_every_exported_record_is_valid_ocsf(server: SandgateServer) -> None:
    records = native_records(server)
    events = exported(server)
    assert len(events) == len(records) > 20
    invalid = {
        f"{event['unmapped']['kind']} {event['metadata']['uid']}": errors
        for event in events
        if (errors := ocsf_errors(event))
    }
    assert not invalid, json.dumps(invalid, indent=1)
    assert {event["metadata"]["version"] for event in events} == {OCSF_VERSION}


def test_the_run_has_every_kind_and_every_optional_field(server: SandgateServer) -> None:
    records = native_records(server)
    assert {r["kind"] for r in records} == set(KINDS)
    # each kind's required fields are in every record of it (the writers keep the table's word)
    missing = [
        (r["kind"], name) for r in records for name in KINDS[r["kind"]].required if r.get(name) is None
    ]
    assert not missing
    # every optional field sandgate fills is filled in some record: the export covered it
    # (`via` only: this run has no company proxy; test_ocsf_schema.py's synthetic record has it)
    empty = [
        name for name in records[0] if all(r.get(name) in (None, False) for r in records) and name != "via"
    ]
    assert not empty, f"no record of the run fills {empty}"
    reasons = {(r["kind"], r["decision"], r["reason"]) for r in records}
    assert {("request", "deny", "path_not_allowed"), ("request", "deny", "approval-timeout")} <= reasons
    assert ("request", "allow", "approved") in reasons
    assert ("dns", "deny", "default") in reasons and ("connection", "deny", "default") in reasons
    events = {r["event"] for r in records if r["kind"] == "security_event"}
    assert {"placeholder-outside-binding", "ask"} <= events
    changes = {r["event"] for r in records if r["kind"] == "policy_change"}
    assert {
        "create",
        "sandgate-policy replace",
        "credential-vault create",
        "approval allow-sandbox",
    } <= changes


def test_the_api_exports_the_same_events(server: SandgateServer) -> None:
    with server.client() as client:
        answer = client.get("/v1/audit", params={"format": "ocsf", "limit": "1000"})
    assert answer.status_code == 200, answer.text
    from_api = sorted(answer.json()["records"], key=lambda event: event["metadata"]["uid"])
    assert from_api == sorted(exported(server), key=lambda event: event["metadata"]["uid"])
    assert all(not ocsf_errors(event) for event in from_api)
