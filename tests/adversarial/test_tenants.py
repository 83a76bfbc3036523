"""Two tenants on one real `sandgate serve` (issue 38): an operator and a reviewer of `alpha`, an
operator of `beta`, their keys made by `sandgate keys create` with the bootstrap admin key, their
sandboxes made through the OpenSandbox SDK with their own key in `OPEN-SANDBOX-API-KEY`.

Proven from the other side: every route the access table lists for a sandbox answers 404 to the
other tenant (the app's own route list drives the walk), and afterwards the victim sandbox is
still running, its file and policy unchanged, the origin's log holds nothing it was not allowed
to send, and the audit file holds each refused call with the caller's key id; a reviewer reads
but never execs or reads files; revoking a key ends its open follow stream, its execd stream, its
PTY WebSocket and its console session at once; and each action has its record with the principal
who did it."""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import secrets
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
import pytest
from opensandbox import SandboxSync
from opensandbox.config.connection_sync import ConnectionConfigSync
from opensandbox.models.sandboxes import NetworkPolicy
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect as ws_connect

from sandgate.lifecycle.api.access import ACCESS
from tests.adversarial.conftest import DENIED_HOST, OPEN_HOST, SANDBOX_IMAGE, SANDBOX_LIFETIME, TEST_RUNTIME
from tests.conformance.conftest import API_HOST
from tests.conformance.scenarios import NOT_ON_RUNTIME
from tests.conformance.test_js_sdk import RUN_TIMEOUT_S, node
from tests.conformance.test_mcp_scenarios import run_mcp
from tests.conformance.test_osb_scenarios import OsbClient
from tests.conformance.test_sdk_scenarios import PythonSdkClient
from tests.execd.test_pty import next_json
from tests.support.audit import audit_records
from tests.support.internet import Internet
from tests.support.server import SANDGATE, SandgateServer

pytestmark = pytest.mark.root

MARKER = "/workspace/tenant-marker"
WAIT = 20.0  # bound for a stream to end after its key's revocation


@dataclass
class Key:
    id: str
    key: str
    tenant: str
    role: str

    @property
    def principal(self) -> dict[str, str]:
        return {"id": self.id, "tenant": self.tenant, "role": self.role, "via": "key"}


def make_key(server: SandgateServer, tenant: str, role: str, *extra: str) -> Key:
    """`sandgate keys create` with the bootstrap admin key from the environment, as an admin does."""
    made = subprocess.run(
        [*SANDGATE, "keys", "create", "--tenant", tenant, "--role", role, "-o", "json", *extra],
        capture_output=True, text=True, env=server.env(), timeout=60,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    row = json.loads(made.stdout)
    assert not row["key"].startswith("-") and row["state"] == "active"
    return Key(row["id"], row["key"], tenant, role)


def revoke(server: SandgateServer, key: Key) -> None:
    done = subprocess.run(
        [*SANDGATE, "keys", "revoke", key.id], capture_output=True, text=True, env=server.env(), timeout=60
    )
    assert done.returncode == 0, done.stderr


def client(server: SandgateServer, key: Key) -> httpx.Client:
    return httpx.Client(
        base_url=server.base_url, headers={"OPEN-SANDBOX-API-KEY": key.key}, timeout=60, trust_env=False
    )


def sdk(server: SandgateServer, key: Key) -> ConnectionConfigSync:
    return ConnectionConfigSync(
        domain=server.domain, api_key=key.key, protocol="http",
        request_timeout=timedelta(seconds=90), disable_metrics=True,
    )  # fmt: skip


def create(server: SandgateServer, key: Key) -> SandboxSync:
    return SandboxSync.create(
        SANDBOX_IMAGE,
        entrypoint=["sleep", "infinity"],
        network_policy=NetworkPolicy(defaultAction="deny"),
        connection_config=sdk(server, key),
        timeout=SANDBOX_LIFETIME,
        ready_timeout=timedelta(seconds=30),
    )


@dataclass
class Tenants:
    server: SandgateServer
    op_a: Key
    rev_a: Key
    op_b: Key
    a: SandboxSync  # alpha's, made by op_a
    b: SandboxSync  # beta's, made by op_b


@pytest.fixture(scope="module")
def tenants(server: SandgateServer) -> Iterator[Tenants]:
    op_a, rev_a = make_key(server, "alpha", "operator"), make_key(server, "alpha", "reviewer")
    op_b = make_key(server, "beta", "operator", "--expires-in", "1d")
    a = create(server, op_a)
    try:
        b = create(server, op_b)
        try:
            a.files.write_file(MARKER, "alpha's own")
            b.files.write_file(MARKER, "beta's own")
            yield Tenants(server, op_a, rev_a, op_b, a, b)
        finally:
            b.kill()
    finally:
        a.kill()


def concrete(template: str, sandbox_id: str) -> str:
    path = template.replace("{sandbox_id}", sandbox_id).replace("{port}", "44772").replace("{name}", "n")
    return "/v1" + path.replace("{path:path}", "files/download")


def sandbox_rows() -> list[tuple[str, str]]:
    """Every HTTP route the access table lists for one sandbox (each method of a `*` row)."""
    rows = []
    for (method, template), rule in ACCESS.items():
        if rule.owner != "sandbox_id" or template.startswith("/console") or method == "WS":
            continue
        rows += [
            (m, template) for m in (["GET", "POST", "PUT", "PATCH", "DELETE"] if method == "*" else [method])
        ]
    return rows


def other_tenants_calls(tenants: Tenants, key: Key, victim: SandboxSync) -> list[tuple[str, str, int]]:
    """Every sandbox route against `victim` with `key`: (method, path, status)."""
    answers = []
    with client(tenants.server, key) as http:
        for method, template in sandbox_rows():
            path = concrete(template, victim.id)
            body = {"egress": [{"action": "allow", "target": OPEN_HOST}]} if method != "GET" else None
            answer = http.request(method, path, params={"path": MARKER}, json=body)
            answers.append((method, path, answer.status_code))
        # the egress API at the sandbox's egress port, and at the OpenSandbox name
        for path in (
            f"/v1/sandboxes/{victim.id}/proxy/18080/policy",
            f"/v1/sandboxes/{victim.id}/networkpolicy",
        ):
            answer = http.patch(path, json=[{"action": "allow", "target": OPEN_HOST}])
            answers.append(("PATCH", path, answer.status_code))
    return answers


def test_no_route_reaches_another_tenants_sandbox(tenants: Tenants, internet: Internet) -> None:
    a, server = tenants.a, tenants.server
    with client(server, tenants.op_a) as http:
        policy_before = http.get(f"/v1/sandboxes/{a.id}/egress/sandgate-policy").json()
    seen_before = len(internet.origin_requests())

    answers = other_tenants_calls(tenants, tenants.op_b, a) + other_tenants_calls(
        tenants, tenants.rev_a, tenants.b
    )
    assert len(answers) > 50
    wrong = [(m, p, s) for m, p, s in answers if s != 404]
    assert not wrong, f"another tenant's sandbox answered other than 404: {wrong}"
    # the SDK of the other tenant cannot even connect (the endpoint is a 404)
    with pytest.raises(Exception, match=r"404|not exist|NOT_FOUND"):
        SandboxSync.connect(a.id, connection_config=sdk(server, tenants.op_b))
    # the WebSocket (PTY) of the reverse proxy: the handshake is refused, never relayed
    url = f"ws://{server.domain}/v1/sandboxes/{a.id}/proxy/44772/pty/any/ws"
    with pytest.raises(InvalidStatus) as refused:
        ws_connect(url, additional_headers={"OPEN-SANDBOX-API-KEY": tenants.op_b.key})
    assert refused.value.response.status_code == 403  # uvicorn answers a close before accept so

    # the other side: the victim is untouched
    with client(server, tenants.op_a) as http:
        assert http.get(f"/v1/sandboxes/{a.id}").json()["status"]["state"] == "Running"
        assert http.get(f"/v1/sandboxes/{a.id}/egress/sandgate-policy").json() == policy_before
        listed = {s["id"] for s in http.get("/v1/sandboxes", params={"pageSize": 200}).json()["items"]}
    assert a.id in listed and tenants.b.id not in listed
    with client(server, tenants.op_b) as http:
        listed = {s["id"] for s in http.get("/v1/sandboxes", params={"pageSize": 200}).json()["items"]}
    assert tenants.b.id in listed and a.id not in listed
    assert a.files.read_file(MARKER) == "alpha's own"
    assert tenants.b.files.read_file(MARKER) == "beta's own"
    reached = a.commands.run(
        f"curl -sS -o /dev/null -w '%{{http_code}}' --max-time 10 http://{OPEN_HOST}/tenants"
    )
    assert "".join(m.text for m in reached.logs.stdout) != "200"
    assert not [r for r in internet.origin_requests()[seen_before:] if "/tenants" in json.dumps(r)]
    # ...and the audit file holds every refused call, with the caller's key
    refused_records = [
        r for r in audit_records(server.state_dir)
        if r["kind"] == "api" and r["decision"] == "deny" and r["status"] == 404
        and r["principal"] in (tenants.op_b.principal, tenants.rev_a.principal)
    ]  # fmt: skip
    assert len(refused_records) >= len(answers)
    assert {r["sandbox"] for r in refused_records} >= {a.id, tenants.b.id}


def test_a_reviewer_reads_but_never_execs_or_reads_files(tenants: Tenants) -> None:
    a, server = tenants.a, tenants.server
    with client(server, tenants.rev_a) as http:
        assert http.get(f"/v1/sandboxes/{a.id}").status_code == 200
        assert http.get(f"/v1/sandboxes/{a.id}/egress/policy").status_code == 200
        for method, path, body in (
            ("GET", f"/v1/sandboxes/{a.id}/endpoints/44772", None),
            ("POST", f"/v1/sandboxes/{a.id}/proxy/44772/command", {"command": f"echo pwned > {MARKER}"}),
            ("GET", f"/v1/sandboxes/{a.id}/proxy/44772/files/download?path={MARKER}", None),
            ("PATCH", f"/v1/sandboxes/{a.id}/egress/policy", [{"action": "allow", "target": OPEN_HOST}]),
            ("DELETE", f"/v1/sandboxes/{a.id}", None),
            ("POST", "/v1/keys", {"tenant": "alpha", "role": "admin"}),
        ):
            answer = http.request(method, path, json=body)
            assert answer.status_code == 403, (method, path, answer.text)
            assert "reviewer" in answer.text  # the egress API answers in plain text
        records = http.get("/v1/audit", params={"limit": 1000}).json()["records"]
        sandboxes = {r["sandbox"] for r in records}
        assert a.id in sandboxes and tenants.b.id not in sandboxes and "-" not in sandboxes  # alpha's only
    with pytest.raises(Exception, match=r"403|FORBIDDEN|may not"):
        SandboxSync.connect(a.id, connection_config=sdk(server, tenants.rev_a))
    assert a.files.read_file(MARKER) == "alpha's own"
    assert not [
        r for r in audit_records(server.state_dir, a.id)
        if r["kind"] in ("command", "file") and r.get("principal") == tenants.rev_a.principal
    ]  # fmt: skip


def follow(response_lines: Iterator[str], seen: list[str]) -> None:
    with contextlib.suppress(httpx.HTTPError):
        for line in response_lines:
            seen.append(line)


@contextlib.contextmanager
def streaming(
    http: httpx.Client, method: str, path: str, **kwargs: Any
) -> Iterator[tuple[threading.Thread, list[str]]]:
    """A streamed answer read by a thread until it ends; (thread, lines read)."""
    seen: list[str] = []
    with http.stream(method, path, timeout=httpx.Timeout(60, read=None), **kwargs) as response:
        assert response.status_code == 200, response.read()
        reader = threading.Thread(target=follow, args=(response.iter_lines(), seen), daemon=True)
        reader.start()
        yield reader, seen


def wait_for(predicate: Any, what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_revoked_key_stops_on_every_open_stream(tenants: Tenants) -> None:
    server, a = tenants.server, tenants.a
    reviewer, operator = make_key(server, "alpha", "reviewer"), make_key(server, "alpha", "operator")
    endpoint = SandboxSync.connect(a.id, connection_config=sdk(server, operator))  # SDK: bound tokens
    execd = endpoint.get_endpoint(44772)
    assert execd.headers and all(v.startswith("sgx_") for v in execd.headers.values())
    pty = httpx.post(f"http://{execd.endpoint}/pty", json={"cwd": "/tmp"}, headers=execd.headers, timeout=30)
    assert pty.status_code == 201, pty.text
    console = httpx.Client(base_url=server.base_url, timeout=30, trust_env=False, follow_redirects=False)
    assert console.post("/console/login", data={"key": reviewer.key, "next": "/console"}).status_code == 303
    assert console.get("/console").status_code == 200
    shell_url = f"ws://{execd.endpoint}/pty/{pty.json()['session_id']}/ws"
    long_command = {"command": "echo started; sleep 300"}
    with (
        client(server, reviewer) as rev,
        httpx.Client(base_url=f"http://{execd.endpoint}", headers=execd.headers, trust_env=False) as op,
        streaming(rev, "GET", "/v1/audit/follow") as (audit_follow, audit_lines),
        streaming(console, "GET", "/console/feed/stream") as (console_feed, console_lines),
        streaming(op, "POST", "/command", json=long_command) as (command, command_lines),
        ws_connect(shell_url, additional_headers=execd.headers) as shell,
    ):
        assert next_json(shell)["type"] == "connected"
        wait_for(lambda: any("started" in line for line in command_lines), "the command never started")
        wait_for(lambda: audit_lines and console_lines, "the follow streams never began")
        revoke(server, reviewer)
        revoke(server, operator)
        for stream, name in (
            (audit_follow, "audit follow"),
            (console_feed, "console feed"),
            (command, "command"),
        ):
            stream.join(WAIT)
            assert not stream.is_alive(), f"the {name} stream outlived its key"
        with pytest.raises(ConnectionClosed) as closed:
            deadline = time.monotonic() + WAIT
            while time.monotonic() < deadline:
                shell.recv(timeout=max(0.01, deadline - time.monotonic()))
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4401
    # nothing of either key works any more: API, execd endpoint, console
    with client(server, reviewer) as rev:
        assert rev.get("/v1/audit").status_code == 401
    assert httpx.get(f"http://{execd.endpoint}/ping", headers=execd.headers).status_code == 401
    after = console.get("/console")
    assert after.status_code == 303 and "/console/login" in after.headers["location"]
    console.close()
    revoked = [
        r for r in audit_records(server.state_dir) if r["kind"] == "api" and r["reason"] == "key.revoke"
    ]
    assert {json.loads(r["detail"])["key"] for r in revoked} >= {reviewer.id, operator.id}
    assert all(r["principal"]["via"] == "bootstrap" and r["principal"]["role"] == "admin" for r in revoked)


def test_every_action_has_its_record_with_its_principal(tenants: Tenants) -> None:
    server, op = tenants.server, tenants.op_a
    sandbox = create(server, op)
    try:
        sandbox.commands.run("echo recorded")
        sandbox.files.write_file("/workspace/recorded.txt", "x")
        with client(server, op) as http:
            patched = http.patch(
                f"/v1/sandboxes/{sandbox.id}/egress/policy",
                json=[{"action": "allow", "target": "one.example.com"}],
            )
            assert patched.status_code == 200, patched.text
            renewed = http.post(
                f"/v1/sandboxes/{sandbox.id}/renew-expiration", json={"expiresAt": "2099-01-01T00:00:00Z"}
            )
            assert renewed.status_code == 200, renewed.text
    finally:
        sandbox.kill()
    records = audit_records(server.state_dir, sandbox.id)

    def by(kind: str, **fields: Any) -> list[dict[str, Any]]:
        return [r for r in records if r["kind"] == kind and all(r.get(k) == v for k, v in fields.items())]

    mine = op.principal
    assert [r["principal"] for r in by("policy_change", event="create")] == [mine]
    assert [r["principal"] for r in by("policy_change", event="policy patch")] == [mine]
    assert [r["principal"] for r in by("lifecycle", event="renew")] == [mine]
    assert {r["principal"]["id"] for r in by("command")} == {op.id}  # through the bound execd token
    assert {r["principal"]["id"] for r in by("file")} == {op.id}
    actions = {r["reason"]: r for r in by("api") if r["principal"] == mine and r["decision"] == "allow"}
    assert {"sandbox.create", "policy.patch", "sandbox.renew", "sandbox.delete"} <= set(actions)
    assert actions["sandbox.delete"]["status"] == 204


BETA_CEILING = """\
version: 1
defaultAction: deny
egress:
  - {action: allow, target: one.example.com}
"""


def tenants_cli(
    server: SandgateServer, *args: str, key: Key | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**server.env(), **({"OPEN_SANDBOX_API_KEY": key.key} if key else {})}
    return subprocess.run([*SANDGATE, "tenants", *args], capture_output=True, text=True, env=env, timeout=60)


def test_no_sandbox_policy_exceeds_its_tenants_ceiling(
    tenants: Tenants, internet: Internet, tmp_path: Any
) -> None:
    server, b = tenants.server, tenants.b
    ceiling = tmp_path / "beta-ceiling.yaml"
    ceiling.write_text(BETA_CEILING)
    # only an admin sets a ceiling; another tenant's is not even there for an operator
    refused = tenants_cli(server, "ceiling", "set", "beta", str(ceiling), key=tenants.op_b)
    assert refused.returncode == 1 and "403" in refused.stderr and "operator" in refused.stderr
    hidden = tenants_cli(server, "ceiling", "set", "beta", str(ceiling), key=tenants.op_a)
    assert hidden.returncode == 1 and "404" in hidden.stderr
    made = tenants_cli(server, "ceiling", "set", "beta", str(ceiling), "-o", "json")
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["beyond"] == []  # beta's sandbox denies everything: within it
    try:
        seen_before = len(internet.origin_requests())
        with client(server, tenants.op_b) as http:
            for method, path, body in (
                ("PATCH", f"/v1/sandboxes/{b.id}/egress/policy", [{"action": "allow", "target": OPEN_HOST}]),
                ("PATCH", f"/v1/sandboxes/{b.id}/networkpolicy", [{"action": "allow", "target": OPEN_HOST}]),
                ("PUT", f"/v1/sandboxes/{b.id}/egress/sandgate-policy",
                 {"policy": {"version": 1, "egress": [{"action": "allow", "target": OPEN_HOST}]}}),
            ):  # fmt: skip
                answer = http.request(method, path, json=body)
                assert answer.status_code == 403, (path, answer.text)
                assert "ceiling of tenant beta" in answer.text and "nothing changed" in answer.text
            within = http.patch(
                f"/v1/sandboxes/{b.id}/egress/policy", json=[{"action": "allow", "target": "one.example.com"}]
            )
            assert within.status_code == 200, within.text
            vault = {  # a credential for a host its policy allows, but a binding the ceiling has not
                "credentials": [{"name": "t", "source": {"type": "inline", "value": "sk-ceiling-test"}}],
                "bindings": [{"name": "one", "match": {"hosts": ["one.example.com"]},
                              "auth": {"type": "bearer", "credential": "t"}}],
            }  # fmt: skip
            bound = http.post(f"/v1/sandboxes/{b.id}/egress/credential-vault", json=vault)
            assert bound.status_code == 403 and "ceiling of tenant beta" in bound.text, bound.text
            assert http.get(f"/v1/sandboxes/{b.id}/egress/credential-vault").status_code == 404  # none made
        with pytest.raises(Exception, match=r"403|ceiling"):
            SandboxSync.create(
                SANDBOX_IMAGE,
                entrypoint=["sleep", "infinity"],
                network_policy=NetworkPolicy(defaultAction="allow"),
                connection_config=sdk(server, tenants.op_b),
                timeout=SANDBOX_LIFETIME,
                ready_timeout=timedelta(seconds=30),
            )
        # the other side: beta's sandbox still cannot reach the host, the origin saw nothing
        reached = b.commands.run(
            f"curl -sS -o /dev/null -w '%{{http_code}}' --max-time 10 http://{OPEN_HOST}/ceiling"
        )
        assert "".join(m.text for m in reached.logs.stdout) != "200"
        assert not [r for r in internet.origin_requests()[seen_before:] if "/ceiling" in json.dumps(r)]
        # alpha has no ceiling: its operator widens its own sandbox as before
        with client(server, tenants.op_a) as http:
            widened = http.patch(
                f"/v1/sandboxes/{tenants.a.id}/egress/policy", json=[{"action": "allow", "target": OPEN_HOST}]
            )
            assert widened.status_code == 200, widened.text
        shown = tenants_cli(server, "ceiling", "show", "beta", "-o", "json", key=tenants.op_b)
        assert (
            shown.returncode == 0
            and json.loads(shown.stdout)["policy"]["egress"][0]["target"] == "one.example.com"
        )
    finally:
        assert tenants_cli(server, "ceiling", "clear", "beta").returncode == 0
    records = audit_records(server.state_dir)
    set_by = [
        r
        for r in records
        if r["kind"] == "api" and r["reason"] == "tenant.ceiling-set" and r["decision"] == "allow"
    ]
    assert set_by and set_by[-1]["principal"]["via"] == "bootstrap"
    refusals = [r for r in records if r["kind"] == "api" and r["sandbox"] == b.id and r["status"] == 403]
    assert len(refusals) >= 3 and all(r["principal"] == tenants.op_b.principal for r in refusals)


@pytest.mark.skipif(TEST_RUNTIME == "kubernetes", reason="Kubernetes offers no snapshots")
def test_snapshots_stay_in_their_tenant(tenants: Tenants) -> None:
    server, a = tenants.server, tenants.a
    snapshot = a.create_snapshot("alpha-snap")
    try:
        with client(server, tenants.op_b) as http:
            assert snapshot.id not in {s["id"] for s in http.get("/v1/snapshots").json()["items"]}
            assert http.get(f"/v1/snapshots/{snapshot.id}").status_code == 404
            assert http.delete(f"/v1/snapshots/{snapshot.id}").status_code == 404
            taken = http.post("/v1/sandboxes", json={"snapshotId": snapshot.id, "entrypoint": ["sleep", "1"]})
            assert taken.status_code == 404, taken.text
        with client(server, tenants.op_a) as http:
            assert http.get(f"/v1/snapshots/{snapshot.id}").status_code == 200  # still there, its own
    finally:
        with client(server, tenants.op_a) as http:
            assert http.delete(f"/v1/snapshots/{snapshot.id}").status_code == 204


def test_held_requests_stay_in_their_tenant(tenants: Tenants, internet: Internet) -> None:
    """On Kubernetes the request is held by the node agent's proxy, and listed and answered
    through the server all the same (lifecycle/node_client.py rule 7)."""
    server, a = tenants.server, tenants.a
    rev_b = make_key(server, "beta", "reviewer")
    asking = {"version": 1, "defaultAction": "ask", "askTimeout": 60, "egress": []}
    with client(server, tenants.op_a) as http:
        put = http.put(f"/v1/sandboxes/{a.id}/egress/sandgate-policy", json={"policy": asking})
        assert put.status_code == 200, put.text
    seen_before = len(internet.origin_requests())
    outcome: list[str] = []
    command = f"curl -sS --max-time 90 -o /dev/null -w '%{{http_code}}' http://{DENIED_HOST}/held-for-review"
    curl = threading.Thread(
        target=lambda: outcome.append("".join(m.text for m in a.commands.run(command).logs.stdout)),
        daemon=True,
    )
    curl.start()
    with client(server, tenants.rev_a) as rev:
        deadline = time.monotonic() + 30
        while not (held := [h for h in rev.get("/v1/approvals").json() if h["sandbox"] == a.id]):
            assert time.monotonic() < deadline, "the request was never held"
            time.sleep(0.1)
    approval = held[0]["id"]
    with client(server, rev_b) as other:
        assert approval not in {h["id"] for h in other.get("/v1/approvals").json()}
        answered = other.post(f"/v1/approvals/{approval}", json={"decision": "allow-sandbox"})
        assert answered.status_code == 404, answered.text
    console = httpx.Client(base_url=server.base_url, timeout=30, trust_env=False, follow_redirects=False)
    assert console.post("/console/login", data={"key": rev_b.key, "next": "/console"}).status_code == 303
    assert approval not in console.get("/console/approvals").text
    forged = console.post(f"/console/approvals/{approval}", data={"decision": "allow-once", "csrf": "x"})
    assert forged.status_code == 404
    console.close()
    with client(server, tenants.op_a) as http:  # the operator of the sandbox does not review itself
        assert http.post(f"/v1/approvals/{approval}", json={"decision": "allow-once"}).status_code == 403
    with client(server, tenants.rev_a) as rev:
        assert rev.post(f"/v1/approvals/{approval}", json={"decision": "deny"}).status_code == 200
    curl.join(60)
    assert outcome == ["403"]
    assert not [r for r in internet.origin_requests()[seen_before:] if "held-for-review" in json.dumps(r)]
    with client(server, tenants.op_a) as http:  # nothing was added to the sandbox's policy
        assert http.get(f"/v1/sandboxes/{a.id}/egress/sandgate-policy").json()["policy"]["egress"] == []
    answers = [
        r for r in audit_records(server.state_dir) if r["kind"] == "api" and r["reason"] == "approval.answer"
    ]
    by_whom = {(r["principal"]["id"], r["status"]) for r in answers}
    assert {(rev_b.id, 404), (tenants.op_a.id, 403), (tenants.rev_a.id, 200)} <= by_whom


def jwt_shaped(subject: str) -> str:
    """A token as an OIDC issuer writes one (header, claims, signature; base64url)."""
    part = lambda data: base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")  # noqa: E731
    return f"{part({'alg': 'RS256', 'kid': 'k1'})}.{part({'sub': subject})}.{secrets.token_urlsafe(64)}"


def test_keys_and_tokens_a_client_writes_never_reach_the_trail(tenants: Tenants) -> None:
    """A command line and a file path holding managed keys (the caller's and another's), a
    key-bound endpoint token and an OIDC-shaped token; a command through the server proxy with
    the base64 of the caller's own key. The audit file holds none of them, in any record."""
    server, op, a = tenants.server, tenants.op_a, tenants.a
    token = jwt_shaped("someone@example.com")
    with client(server, op) as http:
        bound_token = http.get(f"/v1/sandboxes/{a.id}/endpoints/44772").json()["headers"]
        bound_token = next(iter(bound_token.values()))
        assert bound_token.startswith("sgx_")
        own_b64 = base64.b64encode(op.key.encode()).decode()
        proxied = http.post(
            f"/v1/sandboxes/{a.id}/proxy/44772/command", json={"command": f"echo {own_b64} | base64 -d"}
        )
        assert proxied.status_code == 200 and op.key in proxied.text, proxied.text  # it ran
    written = [op.key, tenants.op_b.key, bound_token, token]
    ran = a.commands.run("echo " + " ".join(written))
    assert "".join(m.text for m in ran.logs.stdout).split() == written  # the command ran as written
    a.files.write_file(f"/workspace/{tenants.op_b.key}.txt", token)

    def redacted() -> list[dict[str, Any]]:
        trail = audit_records(server.state_dir, a.id)
        return [r for r in trail if r["kind"] in ("command", "file") and "[REDACTED]" in r["detail"]]

    # the proxied command, the SDK's command, the file write (its path is known once it ended)
    wait_for(lambda: len(redacted()) >= 3, "three redacted exec records")
    text = "".join(path.read_text() for path in server.state_dir.glob("audit.jsonl*"))
    for secret in (*written, own_b64, op.key[4:]):
        assert secret not in text


FLOOD_SOURCE = "127.0.0.7"  # a loopback address of this test's own: no other test's window
FLOOD = 40


def test_a_bad_key_flood_costs_a_record_and_a_count(tenants: Tenants) -> None:
    """40 wrong keys and one forged endpoint token from one address: the audit file holds the
    first of each kind at once, then one record counting the other 39 when the window closes."""
    server = tenants.server
    transport = httpx.HTTPTransport(local_address=FLOOD_SOURCE)
    with httpx.Client(base_url=server.base_url, transport=transport, timeout=30, trust_env=False) as http:
        for _ in range(FLOOD):
            wrong = f"sgk_{secrets.token_hex(6)}_{secrets.token_urlsafe(32)}"
            assert http.get("/v1/sandboxes", headers={"OPEN-SANDBOX-API-KEY": wrong}).status_code == 401
        forged = {"X-EXECD-ACCESS-TOKEN": "sgx_e30.0" + "0" * 63}
        execd = f"/v1/sandboxes/{tenants.a.id}/proxy/44772/command"
        assert http.post(execd, headers=forged).status_code == 401

    def flood_records() -> list[dict[str, Any]]:
        found = [r for r in audit_records(server.state_dir) if r["kind"] == "api"]
        return [r for r in found if json.loads(r["detail"] or "{}").get("source") == FLOOD_SOURCE]

    wait_for(lambda: any("refused_more" in r["detail"] for r in flood_records()), "the window's count", 40)
    details = [json.loads(r["detail"]) for r in flood_records()]
    assert all(r["decision"] == "deny" and r["status"] == 401 for r in flood_records())
    firsts = sorted(d["code"] for d in details if "refused_more" not in d)
    assert firsts == ["INVALID_API_KEY", "INVALID_TOKEN"]
    assert [(d["code"], d["refused_more"]) for d in details if "refused_more" in d] == [
        ("INVALID_API_KEY", FLOOD - 1)
    ]


CLIENT_STEPS = ("create", "command_stream", "files_write_read", "egress", "kill")


class ManagedKeySdk(PythonSdkClient):
    """The conformance scenarios' Python SDK client with a managed key instead of the server's."""

    def __init__(self, server: SandgateServer, mode: str, key: Key) -> None:
        super().__init__(server, mode)
        self.key = key

    def _connection(self) -> Any:
        return super()._connection().model_copy(update={"api_key": self.key.key})


def run_client(server: SandgateServer, name: str, mode: str, key: Key, workdir: Any) -> str:
    """The steps of the shared scenarios, through `name` with `key`; the sandbox's id."""
    if name == "python":
        sdk_client = ManagedKeySdk(server, mode, key)
        try:
            for step in CLIENT_STEPS:
                getattr(sdk_client, step)()
        finally:
            sdk_client._close()
        assert sdk_client.sandbox is not None
        return str(sdk_client.sandbox.id)
    osb = OsbClient(server, mode, workdir)
    osb.env["OPEN_SANDBOX_API_KEY"] = key.key
    try:
        for step in CLIENT_STEPS:
            getattr(osb, step)()
    finally:
        osb._close()
    return osb.id


@pytest.mark.parametrize("mode", ["direct", "server_proxy"])
@pytest.mark.parametrize("name", ["python", "osb"])
def test_the_opensandbox_clients_work_with_a_managed_operator_key(
    tenants: Tenants, name: str, mode: str, tmp_path: Any
) -> None:
    """Create, exec, files, egress and delete through the unchanged Python SDK and osb (both of
    their modes) with an operator's managed key: every record of the sandbox names that key."""
    server, op = tenants.server, tenants.op_a
    sandbox_id = run_client(server, name, mode, op, tmp_path)
    records = audit_records(server.state_dir, sandbox_id)
    kinds = {r["kind"] for r in records if r.get("principal") == op.principal}
    assert {"command", "file", "policy_change", "api"} <= kinds, kinds
    actions = ("command", "file", "policy_change", "api")
    named = [r for r in records if r.get("principal") and r["kind"] in actions]
    assert {r["principal"]["id"] for r in named} == {op.id}  # never the bootstrap admin's
    deleted = [r for r in records if r["kind"] == "api" and r["reason"] == "sandbox.delete"]
    assert [(r["principal"]["id"], r["status"]) for r in deleted] == [(op.id, 204)]


def whole_scenario_list(server: SandgateServer, name: str, key: Key) -> dict[str, Any]:
    """Every scenario `name` offers (direct mode) with `key`; each one's result."""
    if name == "js":
        env = {
            **server.env(),
            "OPEN_SANDBOX_API_KEY": key.key,
            "SANDGATE_TEST_API_HOST": API_HOST,
            "SANDGATE_TEST_IMAGE": server.sandbox_image,
        }
        lines = node("direct", env=env, timeout=RUN_TIMEOUT_S).splitlines()
        return {item["scenario"]: item for item in map(json.loads, lines)}
    keyed = copy.copy(server)  # the same server, as the MCP server's launcher reads it, another key
    keyed.api_key = key.key
    return dict(run_mcp(keyed, "direct"))


@pytest.mark.parametrize("name", ["js", "mcp"])
def test_the_js_sdk_and_mcp_work_with_a_managed_operator_key(tenants: Tenants, name: str) -> None:
    """Every scenario the JS SDK (tests/js/scenarios.mjs) or the MCP server offers, with an
    operator's managed key: each passes, and each record of the sandboxes made names that key."""
    server, op = tenants.server, tenants.op_a

    def made_by_op() -> set[str]:
        creates = [r for r in audit_records(server.state_dir) if r.get("reason") == "sandbox.create"]
        return {r["sandbox"] for r in creates if r["kind"] == "api" and r["principal"] == op.principal}

    before = made_by_op()
    results = whole_scenario_list(server, name, op)
    offered = [s for s in results if s not in NOT_ON_RUNTIME.get(TEST_RUNTIME, {})]  # pause on a Pod
    failed = {scenario: results[scenario].get("error") for scenario in offered if not results[scenario]["ok"]}
    assert results and not failed, failed
    made = made_by_op() - before
    named = [r for r in audit_records(server.state_dir) if r["sandbox"] in made and r.get("principal")]
    assert {"command", "file", "api"} <= {r["kind"] for r in named}
    assert {r["principal"]["id"] for r in named} == {op.id}
