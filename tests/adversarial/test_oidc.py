"""OIDC bearer tokens as principals, against a real issuer the test starts (discovery and JWKS
served over the network, tokens signed with Authlib's JOSE library): a token's claims are its
tenant and role on every route, the OpenSandbox SDK works with the token as its API key, forged,
expired, foreign and claim-less tokens are refused, a rotated signing key is fetched, and an
expiring token ends the stream it opened. Proven from the server's answers and its audit file."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from joserfc import jwt
from joserfc.jwk import OctKey, RSAKey
from opensandbox import SandboxSync
from opensandbox.config.connection_sync import ConnectionConfigSync
from opensandbox.models.sandboxes import NetworkPolicy

from tests.adversarial.conftest import SANDBOX_IMAGE, SANDBOX_LIFETIME
from tests.support.audit import audit_records
from tests.support.oidc_issuer import AUDIENCE, Issuer, oidc_issuer
from tests.support.server import SandgateServer, sandgate_server

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def issuer() -> Iterator[Issuer]:
    with oidc_issuer() as running:
        yield running


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, issuer: Issuer, server_settings: dict[str, str]
) -> Iterator[SandgateServer]:
    """A server of its own (OIDC on) on the suite's runtime, where SANDBOX_IMAGE is."""
    env = {**server_settings, "SANDGATE_OIDC_ISSUER": issuer.url, "SANDGATE_OIDC_AUDIENCE": AUDIENCE}
    with sandgate_server(Path(tmp_path_factory.mktemp("oidc")), env) as running:
        yield running


def http(server: SandgateServer, token: str, bearer: bool = False) -> httpx.Client:
    header = {"Authorization": f"Bearer {token}"} if bearer else {"OPEN-SANDBOX-API-KEY": token}
    return httpx.Client(base_url=server.base_url, headers=header, timeout=60, trust_env=False)


def test_a_tokens_claims_are_its_tenant_and_role(server: SandgateServer, issuer: Issuer) -> None:
    operator = issuer.token(sub="ci-pipeline", tenant="gamma", role="operator")
    sandbox = SandboxSync.create(
        SANDBOX_IMAGE, entrypoint=["sleep", "infinity"], network_policy=NetworkPolicy(defaultAction="deny"),
        connection_config=ConnectionConfigSync(domain=server.domain, api_key=operator, protocol="http",
                                               request_timeout=timedelta(seconds=90), disable_metrics=True),
        timeout=SANDBOX_LIFETIME, ready_timeout=timedelta(seconds=30),
    )  # fmt: skip
    try:
        assert (
            "".join(m.text for m in sandbox.commands.run("echo via-oidc").logs.stdout).strip() == "via-oidc"
        )
        other = issuer.token(sub="someone", tenant="delta", role="admin" if False else "operator")
        with http(server, other) as client:
            assert client.get(f"/v1/sandboxes/{sandbox.id}").status_code == 404
            assert client.delete(f"/v1/sandboxes/{sandbox.id}").status_code == 404
        reviewer = issuer.token(sub="auditor", tenant="gamma", role="reviewer")
        with http(server, reviewer, bearer=True) as client:
            assert client.get(f"/v1/sandboxes/{sandbox.id}").status_code == 200
            assert (
                client.post(
                    f"/v1/sandboxes/{sandbox.id}/proxy/44772/command", json={"command": "id"}
                ).status_code
                == 403
            )
            ids = {s["id"] for s in client.get("/v1/sandboxes").json()["items"]}
            assert ids == {sandbox.id}
    finally:
        sandbox.kill()
    mine = {"id": "ci-pipeline", "tenant": "gamma", "role": "operator", "via": "oidc"}
    records = audit_records(server.state_dir, sandbox.id)
    assert [r["principal"] for r in records if r["kind"] == "policy_change" and r["event"] == "create"] == [
        mine
    ]
    assert {json.dumps(r["principal"]) for r in records if r["kind"] == "command"} == {json.dumps(mine)}
    refused = [r for r in records if r["kind"] == "api" and r["status"] == 404]
    assert {r["principal"]["id"] for r in refused} == {"someone"}


def test_forged_expired_foreign_and_claimless_tokens_are_refused(
    server: SandgateServer, issuer: Issuer
) -> None:
    stranger = RSAKey.generate_key(2048, parameters={"kid": issuer.keys[-1].kid})  # same kid, other key
    secret = OctKey.import_key(
        json.dumps(issuer.jwks()["keys"][0]).encode()
    )  # HS256 keyed with the public key
    now = int(time.time())
    claims = {
        "sub": "x",
        "tenant": "gamma",
        "role": "admin",
        "iss": issuer.url,
        "aud": AUDIENCE,
        "exp": now + 600,
    }
    refused = {
        "a key the issuer does not list": issuer.token(key=stranger, sub="x", tenant="gamma", role="admin"),
        "HS256 with the public key": jwt.encode({"alg": "HS256", "kid": issuer.keys[-1].kid}, claims, secret),
        "expired": issuer.token(lifetime=-120, sub="x", tenant="gamma", role="admin"),
        "another audience": issuer.token(aud="other-service", sub="x", tenant="gamma", role="admin"),
        "another issuer": issuer.token(
            iss="http://issuer.example.test", sub="x", tenant="gamma", role="admin"
        ),
        "no tenant": issuer.token(sub="x", role="admin"),
        "a role sandgate has not": issuer.token(sub="x", tenant="gamma", role="root"),
        "no subject": issuer.token(tenant="gamma", role="admin"),
        "not a token": "a.b.c",
    }
    for why, token in refused.items():
        for bearer in (False, True):
            with http(server, token, bearer) as client:
                answer = client.get("/v1/sandboxes")
            assert answer.status_code == 401, (why, bearer, answer.text)


def test_a_rotated_key_is_fetched(server: SandgateServer, issuer: Issuer) -> None:
    with http(server, issuer.token(sub="a", tenant="gamma", role="reviewer")) as client:
        assert client.get("/v1/sandboxes").status_code == 200
    fetched = issuer.served.count("/jwks")
    issuer.rotate()
    # a new key id refetches the key set, at most once per REFETCH_S: answered once it has
    with http(server, issuer.token(sub="a", tenant="gamma", role="reviewer")) as client:
        deadline = time.monotonic() + 30
        while (status := client.get("/v1/sandboxes").status_code) != 200 and time.monotonic() < deadline:
            time.sleep(0.2)
    assert status == 200
    assert fetched < issuer.served.count("/jwks") <= fetched + 7  # once per interval at most


def test_an_expiring_token_ends_its_stream(server: SandgateServer, issuer: Issuer) -> None:
    token = issuer.token(sub="watcher", tenant="gamma", role="reviewer", lifetime=4)
    lines: list[str] = []
    with (
        http(server, token) as client,
        client.stream("GET", "/v1/audit/follow", timeout=httpx.Timeout(60, read=None)) as stream,
    ):
        assert stream.status_code == 200
        reader = threading.Thread(target=lambda: lines.extend(stream.iter_lines()), daemon=True)
        started = time.monotonic()
        reader.start()
        reader.join(40)  # the token's 4 s plus the 30 s leeway a clock difference is allowed
        assert not reader.is_alive(), "the stream outlived its token"
    assert lines and time.monotonic() - started < 40
    with http(server, token) as client:
        assert client.get("/v1/sandboxes").status_code == 401


def test_an_issuer_over_tls_is_checked_with_oidc_ca(tmp_path: Path) -> None:
    """An HTTPS issuer whose certificate chains to a test CA: a server given that CA as
    `oidc_ca` fetches its key set and takes its tokens; one without it (certifi) never gets the
    key set (the TLS handshake fails: the issuer serves nothing) and refuses them."""
    with oidc_issuer(tls=tmp_path) as tls_issuer:
        assert tls_issuer.url.startswith("https://") and tls_issuer.ca is not None
        token = tls_issuer.token(sub="tls-ci", tenant="delta", role="operator")
        env = {"SANDGATE_OIDC_ISSUER": tls_issuer.url, "SANDGATE_OIDC_AUDIENCE": AUDIENCE}
        for name in ("untrusting", "trusting"):
            (tmp_path / name).mkdir()
        with sandgate_server(tmp_path / "untrusting", env) as untrusting, http(untrusting, token) as client:
            assert client.get("/v1/sandboxes").status_code == 401
        assert tls_issuer.served == []
        with (
            sandgate_server(
                tmp_path / "trusting", {**env, "SANDGATE_OIDC_CA": str(tls_issuer.ca)}
            ) as trusted,
            http(trusted, token, bearer=True) as client,
        ):
            listed = client.get("/v1/sandboxes")
            assert listed.status_code == 200, listed.text
            foreign = tls_issuer.token(sub="tls-ci", tenant="delta", role="operator", aud="another-service")
            refused = client.get("/v1/sandboxes", headers={"Authorization": f"Bearer {foreign}"})
            assert refused.status_code == 401
        assert tls_issuer.served[:2] == ["/.well-known/openid-configuration", "/jwks"]
        denied = [r for r in audit_records(untrusting.state_dir) if r["kind"] == "api" and r["status"] == 401]
        assert denied  # the refusal is recorded


def test_a_token_logs_into_the_console_until_its_expiry(server: SandgateServer, issuer: Issuer) -> None:
    """A reviewer's token at the console's login opens a session of that principal; its live
    feed and the session itself end at the token's `exp`; an expired token is refused there."""
    token = issuer.token(sub="console-reviewer", tenant="gamma", role="reviewer", lifetime=5)
    console = httpx.Client(base_url=server.base_url, timeout=30, trust_env=False, follow_redirects=False)
    with console:
        assert console.post("/console/login", data={"key": token, "next": "/console"}).status_code == 303
        assert console.get("/console").status_code == 200
        lines: list[str] = []
        with console.stream("GET", "/console/feed/stream", timeout=httpx.Timeout(30, read=None)) as feed:
            assert feed.status_code == 200
            reader = threading.Thread(target=lambda: lines.extend(feed.iter_lines()), daemon=True)
            reader.start()
            reader.join(30)
            assert not reader.is_alive(), "the console feed outlived its token"
        after = console.get("/console")
        assert after.status_code == 303 and "/console/login" in after.headers["location"]
        expired = issuer.token(sub="console-reviewer", tenant="gamma", role="reviewer", lifetime=-60)
        assert console.post("/console/login", data={"key": expired, "next": "/console"}).status_code == 401
