"""Minted tokens (`oauth2` bindings), against a real authorization server (Authlib's server side,
tests/adversarial/oauth_server.py) in a namespace of its own: client-credentials, refresh-token,
JWT-bearer (RFC 7523) and GitHub-App installation tokens reach a protected API from inside a
sandbox; a forced expiry and a revocation (401) mint new generations; a token endpoint that
fails, hangs, answers garbage, grants too little or refuses an expired refresh token gives the
sandbox a 502 with the reason, and the operator an audit record `sandgate logs` shows.

The other side says what happened: the server's log has every token it issued and every API
call with the token it carried; the sandbox never sees a long-lived secret nor a minted token
(every command's output is checked for all of them; the API echoes the Authorization header,
which arrives redacted)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from opensandbox import SandboxSync
from opensandbox.models.execd import RunCommandOpts

from tests.adversarial.conftest import (
    LONG_LIVED_AND_MINTED,
    REBIND_ZONE,
    ZONE,
    reach_from_the_node,
    sandbox_with_policy,
    vault_put,
)
from tests.adversarial.test_no_secret_reaches_a_sandbox import SCANNER, XOR, Canaries
from tests.support.audit import audit_records
from tests.support.internet import Internet, stop
from tests.support.netns import netns, veth_to_host
from tests.support.server import SANDGATE, SandgateServer

pytestmark = pytest.mark.root

AUTH_HOST = "auth.example.com"  # the token endpoint: control-plane egress, not in the sandbox's policy
API_HOST = "apis.example.com"
HOST_V4 = "198.18.8.1"
SERVER_V4 = "198.18.8.20"
TOKEN_URL = f"https://{AUTH_HOST}/token"
SERVER = Path(__file__).with_name("oauth_server.py")
REDACTED = "[REDACTED]"


def pem_pair() -> tuple[str, str]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    return private, public


@dataclass
class Secrets:
    """Every long-lived secret the vault holds here, by vault name."""

    values: dict[str, str] = field(default_factory=dict)


@dataclass
class AuthServer:
    workdir: Path
    secrets: Secrets

    def log(self) -> list[dict[str, Any]]:
        path = self.workdir / "log.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def issued(self) -> list[str]:
        return [entry["token"] for entry in self.log() if entry["event"] == "issued"]


@pytest.fixture(scope="module")
def auth_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, internet: Internet
) -> Iterator[AuthServer]:
    workdir = tmp_path_factory.mktemp("oauth")
    for name in ("leaf.pem", "leaf-key.pem"):
        (workdir / name).write_bytes((internet.workdir / name).read_bytes())
    sa_private, sa_public = pem_pair()
    gh_private, gh_public = pem_pair()
    vault = Secrets(
        {
            "cc-secret": f"ccs-{secrets.token_hex(16)}",
            "rt-secret": f"rts-{secrets.token_hex(16)}",
            "rt-token": f"rtv-{secrets.token_hex(16)}",
            "rt-expired": f"rte-{secrets.token_hex(16)}",
            "sa-key": sa_private.strip(),
            "gh-key": gh_private.strip(),
        }
    )
    v = vault.values
    config = {
        "token_url": TOKEN_URL,
        "clients": {
            "cc-client": {"secret": v["cc-secret"], "scopes": ["read"], "grants": ["client_credentials"]},
            "rt-client": {"secret": v["rt-secret"], "scopes": ["read"], "grants": ["refresh_token"]},
            "sa@example.com": {
                "public_key": sa_public,
                "grants": ["urn:ietf:params:oauth:grant-type:jwt-bearer"],
            },
        },
        "refresh_tokens": {
            v["rt-token"]: {"client": "rt-client", "scope": "read"},
            v["rt-expired"]: {"client": "rt-client", "scope": "read", "expired": True},
        },
        "github_app": {"app_id": "12345", "public_key": gh_public},
    }
    (workdir / "config.json").write_text(json.dumps(config))
    process = None
    with netns("sgo") as ns:
        try:
            veth_to_host(ns, HOST_V4, SERVER_V4, 24)
            reach_from_the_node(request, ns.name, HOST_V4, SERVER_V4)
            internet.set_names({**ZONE, AUTH_HOST: [SERVER_V4], API_HOST: [SERVER_V4]})
            log = (workdir / "server.log").open("wb")
            process = ns.popen([sys.executable, str(SERVER), str(workdir), SERVER_V4], stdout=log, stderr=log)
            deadline = time.monotonic() + 30
            while not (workdir / "ready").exists():
                assert process.poll() is None and time.monotonic() < deadline, (
                    workdir / "server.log"
                ).read_text()
                time.sleep(0.1)
            yield AuthServer(workdir, vault)
        finally:
            if process is not None:
                stop(process)
            internet.set_names(ZONE)
            LONG_LIVED_AND_MINTED.extend(vault.values.values())
            LONG_LIVED_AND_MINTED.extend(AuthServer(workdir, vault).issued())


def oauth2(path: str, **auth: Any) -> dict[str, Any]:
    return {
        "name": path,
        "match": {"hosts": [API_HOST], "paths": [f"/{path}/*"], "methods": ["GET", "POST"]},
        "auth": {"type": "oauth2", **auth},
    }


CC = {
    "grant": "client_credentials",
    "tokenUrl": TOKEN_URL,
    "clientId": "cc-client",
    "clientSecret": "cc-secret",
}
RT = {"grant": "refresh_token", "tokenUrl": TOKEN_URL, "clientId": "rt-client", "clientSecret": "rt-secret"}
POLICY = {
    "version": 1,
    "defaultAction": "deny",
    "egress": [{"action": "allow", "target": API_HOST}],
    "bindings": [
        oauth2("cc", **CC, scopes=["read"]),
        oauth2("rt", **RT, refreshToken="rt-token"),
        oauth2(
            "sa",
            grant="jwt_bearer",
            tokenUrl=TOKEN_URL,
            issuer="sa@example.com",
            subject="agent@example.com",
            privateKey="sa-key",
            scopes=["read"],
        ),
        oauth2(
            "gh",
            grant="github_app",
            tokenUrl=f"https://{AUTH_HOST}/app/installations/99/access_tokens",
            issuer="12345",
            privateKey="gh-key",
        ),
        oauth2("short-cc", **CC),
        oauth2(
            "short-sa",
            grant="jwt_bearer",
            tokenUrl=TOKEN_URL,
            issuer="sa@example.com",
            privateKey="sa-key",
        ),
        oauth2("fail", **{**CC, "tokenUrl": f"https://{AUTH_HOST}/token-500"}),
        oauth2("slow", **{**CC, "tokenUrl": f"https://{AUTH_HOST}/token-slow"}, timeout=1),
        oauth2("garbage", **{**CC, "tokenUrl": f"https://{AUTH_HOST}/token-garbage"}),
        oauth2("scope", **CC, scopes=["read", "admin"]),
        oauth2("rtexpired", **RT, refreshToken="rt-expired"),
        # a token endpoint whose name resolves to the metadata address (the canary listens there)
        oauth2("meta", **{**CC, "tokenUrl": f"https://meta.{REBIND_ZONE}/token"}),
    ],
}


@dataclass
class Agent:
    sandbox: SandboxSync
    server: SandgateServer
    auth: AuthServer

    def forbidden(self) -> list[str]:
        """Everything that must never reach the sandbox: the vault's values, every token issued."""
        values = list(self.auth.secrets.values.values()) + self.auth.issued()
        # a PEM key is also hunted by one of its base64 lines (a partial key is a leak)
        values += [
            value.splitlines()[3] for value in self.auth.secrets.values.values() if "PRIVATE KEY" in value
        ]
        return values

    def sh(self, command: str) -> str:
        execution = self.sandbox.commands.run(command, opts=RunCommandOpts(timeout=timedelta(seconds=60)))
        text = "".join(m.text for m in execution.logs.stdout) + "".join(m.text for m in execution.logs.stderr)
        leaked = [value[:8] + "..." for value in self.forbidden() if value in text]
        assert not leaked, f"a secret or minted token reached the sandbox ({leaked}): {command}"
        return text

    def get(self, path: str, host: str = API_HOST) -> tuple[int, dict[str, Any]]:
        started = time.time()
        out = self.sh(f"curl -sS --max-time 20 -w '\\n%{{http_code}}' https://{host}{path}")
        body, status = out.rsplit("\n", 1)
        if not status.isdigit():  # curl failed: what the proxy's resolver did, and does now, says why
            ended = time.time()
            answered = [
                f"{r['ts']} {r['detail']}" for r in self.audit() if r["kind"] == "dns" and r["host"] == host
            ]
            again = self.sh(f"getent ahostsv4 {host}; echo $?")
            raise AssertionError(
                f"curl {host}{path} from {started:.3f} to {ended:.3f}: {out!r}; the proxy's dns records:"
                f" {answered[-6:]}; a lookup after it: {again!r}"
            )
        return int(status), json.loads(body)

    def audit(self) -> list[dict[str, Any]]:
        return audit_records(self.server.state_dir, self.sandbox.id)

    def mints(self, binding: str, at_least: int = 1, timeout: float = 10.0) -> list[dict[str, Any]]:
        """The binding's token-mint records, once `at_least` are in the audit file: the record of
        a mint that failed is written after the sandbox got its 502."""
        deadline = time.monotonic() + timeout
        while True:
            found = [r for r in self.audit() if r.get("event") == "token-mint" and r["binding"] == binding]
            if len(found) >= at_least or time.monotonic() > deadline:
                return found
            time.sleep(0.1)


@pytest.fixture(scope="module")
def agent(server: SandgateServer, auth_server: AuthServer) -> Iterator[Agent]:
    for name, value in auth_server.secrets.values.items():
        vault_put(server, name, value)
    with sandbox_with_policy(server, POLICY) as sandbox:
        yield Agent(sandbox, server, auth_server)


@pytest.mark.parametrize(
    ("binding", "client"),
    [("cc", "cc-client"), ("rt", "rt-client"), ("sa", "sa@example.com"), ("gh", "app-99")],
)
def test_each_grant_mints_a_token_that_reaches_the_api(agent: Agent, binding: str, client: str) -> None:
    status, answer = agent.get(f"/{binding}/whoami")
    assert status == 200, answer
    assert answer["client"] == client
    assert answer["authorization"] == f"Bearer {REDACTED}"  # the API echoed the minted token: scrubbed
    [call] = [e for e in agent.auth.log() if e["event"] == "api" and e["path"] == f"/{binding}/whoami"][-1:]
    assert call["valid"] and call["token"] in agent.auth.issued()  # it carried a token the server issued
    [mint] = agent.mints(binding)
    assert (
        mint["decision"] == "allow" and mint["detail"] == "token generation 1" and mint["host"] == AUTH_HOST
    )
    # Cached per proxy worker: six more requests (new connections, spread over the workers) mint
    # at most once per worker, never once per request.
    again = [agent.get(f"/{binding}/again")[0] for _ in range(6)]
    assert again == [200] * 6 and len(agent.mints(binding)) <= max(os.cpu_count() or 1, 1)


def api_calls(agent: Agent, prefix: str) -> list[dict[str, Any]]:
    return [e for e in agent.auth.log() if e["event"] == "api" and e["path"].startswith(prefix)]


@pytest.mark.parametrize("binding", ["short-cc", "short-sa"])
def test_a_token_is_minted_again_before_it_expires(agent: Agent, binding: str) -> None:
    """Bindings no other test used, so every proxy worker mints them under a 3-second lifetime."""
    (agent.auth.workdir / "expires_in").write_text("3")
    try:
        first = agent.get(f"/{binding}/first")
        time.sleep(3.2)  # past the token's lifetime
        second = agent.get(f"/{binding}/second")
    finally:
        (agent.auth.workdir / "expires_in").unlink()
    assert first[0] == second[0] == 200, (first, second)
    calls = api_calls(agent, f"/{binding}/")
    assert [c["valid"] for c in calls] == [True, True]  # an expired token was never sent
    assert calls[0]["token"] != calls[1]["token"]
    assert [r["decision"] for r in agent.mints(binding, at_least=2)] == ["allow", "allow"]


@pytest.mark.parametrize("binding", ["cc", "sa"])
def test_a_revoked_token_is_dropped_after_one_401(agent: Agent, binding: str) -> None:
    """The API revokes every token; each proxy worker passes one 401 on, drops its token and
    mints a new one for its next request: no revoked token is sent twice."""
    workers = max(os.cpu_count() or 1, 1)
    (agent.auth.workdir / "revoked").unlink(missing_ok=True)  # tokens revoked by an earlier case live again
    assert [agent.get(f"/{binding}/prime")[0] for _ in range(3)] == [200] * 3
    assert agent.get(f"/{binding}/admin-revoke")[0] == 200
    revoked = {c["token"] for c in api_calls(agent, f"/{binding}/")}
    statuses = [agent.get(f"/{binding}/after-revocation")[0] for _ in range(2 * workers + 2)]
    assert set(statuses) <= {200, 401} and 200 in statuses and statuses.count(401) <= workers, statuses
    after = api_calls(agent, f"/{binding}/after-revocation")
    stale = [c["token"] for c in after if c["token"] in revoked]
    assert len(stale) == len(set(stale)) == statuses.count(401), (stale, statuses)
    assert all(c["valid"] for c in after if c["token"] not in revoked)


@pytest.mark.parametrize(
    ("binding", "reason"),
    [
        ("fail", "HTTP 500"),
        ("slow", "did not answer within 1 s"),
        ("garbage", "not a JSON object"),
        ("scope", "without 'admin'"),
        ("rtexpired", "invalid_grant"),
        ("meta", "resolves only to always-denied addresses"),
    ],
)
def test_a_failing_token_endpoint_is_a_502_with_the_reason(agent: Agent, binding: str, reason: str) -> None:
    status, answer = agent.get(f"/{binding}/whoami")
    assert status == 502 and answer["reason"] == "token-unavailable" and reason in answer["detail"], answer
    [mint] = agent.mints(binding)[-1:]
    assert mint["decision"] == "deny" and mint["reason"] == "token-mint-failed" and reason in mint["detail"]
    shown = subprocess.run(
        [*SANDGATE, "logs", "--binding", binding, "--sandbox", agent.sandbox.id, "-o", "json"],
        capture_output=True, text=True, env=agent.server.server_env(), timeout=60,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert any(
        json.loads(line).get("reason") == "token-mint-failed" for line in shown.stdout.splitlines() if line
    )


def test_the_sandbox_cannot_reach_the_token_endpoint_itself(agent: Agent) -> None:
    """The proxy mints over its own egress; the sandbox's policy does not allow the endpoint."""
    out = agent.sh(f"curl -sS --max-time 10 -o /dev/null -w '%{{http_code}}' https://{AUTH_HOST}/token; true")
    assert out.startswith("000"), out  # its name does not even resolve in the sandbox

    def denied() -> list[dict[str, Any]]:
        return [r for r in agent.audit() if r.get("host") == AUTH_HOST and r.get("event") != "token-mint"]

    deadline = time.monotonic() + 10  # a node's records reach the server's log a shipper poll later
    while not denied() and time.monotonic() < deadline:
        time.sleep(0.1)
    records = denied()
    assert records and all(r["decision"] == "deny" for r in records), records


def test_no_secret_or_minted_token_anywhere_in_the_sandbox(agent: Agent) -> None:
    """Last in this module: the canary scanner of test_no_secret_reaches_a_sandbox (the whole
    visible filesystem, every /proc/*/environ, cmdline and readable mem, the kernel log), with
    every vault value and every token the server issued as its needles."""
    needles = Canaries(prefix=agent.forbidden()[0], others=agent.forbidden()[1:])
    agent.sandbox.files.write_file("/tmp/.scan/needles", needles.encoded())
    agent.sandbox.files.write_file("/tmp/.scan/scan.py", SCANNER)
    result = agent.server.run(
        agent.sandbox.id, f"python3 -I /tmp/.scan/scan.py /tmp/.scan/needles {XOR}", 900
    )
    assert result.exit_code == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.splitlines()[-1])
    control = len(needles.needles)
    assert {(where, n) for where, n in report["hits"] if n != control} == set()
    assert len(agent.auth.issued()) >= 8 and report["seen"]["files"] > 100, report["seen"]
    assert any(n == control for _, n in report["hits"])  # it found its own planted control
