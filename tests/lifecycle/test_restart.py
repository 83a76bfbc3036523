"""State survives: a restarted server re-adopts live sandboxes with their policy and vault (and
honours its managed keys), and a crashed proxy is restarted and re-fed while sandboxes fail closed
in between; with the state database in SQLite and in PostgreSQL (tests/lifecycle/conftest.py)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.postgres import Postgres
from tests.support.server import SandgateServer, sandgate_server

pytestmark = pytest.mark.root


@pytest.fixture
def server(tmp_path: Path, database: Path | str) -> Iterator[SandgateServer]:
    env = {"SANDGATE_DATABASE_URL": database} if isinstance(database, str) else {}
    with sandgate_server(tmp_path, env) as running:
        yield running


def stored_text(server: SandgateServer, database: Path | str, request: pytest.FixtureRequest) -> str:
    """What the state database holds: the SQLite file, or every row of PostgreSQL's tables."""
    if isinstance(database, Path):
        return (server.state_dir / "sandgate.db").read_bytes().decode(errors="replace")
    postgres: Postgres = request.getfixturevalue("postgres")
    tables = ("sandboxes", "policies", "vaults", "api_keys")
    return repr([postgres.run(f"SELECT * FROM {table}") for table in tables])


def egress(server: SandgateServer, sandbox_id: str) -> tuple[str, dict[str, str]]:
    with server.client() as client:
        found = client.get(f"/v1/sandboxes/{sandbox_id}/endpoints/18080").json()
    return f"http://{found['endpoint']}", found["headers"]


def proxy_entries(server: SandgateServer) -> list[str]:
    from sandgate.proxy import ProxyControl

    with ProxyControl(server.state_dir / "proxy.sock") as control:
        return [entry.sandbox_id for entry in control.list()]


def test_restart_readopts_sandboxes_policy_and_vault(
    server: SandgateServer, database: Path | str, request: pytest.FixtureRequest
) -> None:
    with server.client() as client:
        made = client.post("/v1/keys", json={"tenant": "default", "role": "operator", "name": "ci"})
        assert made.status_code == 201, made.text
    managed_key = made.json()["key"]
    created = server.create_sandbox(
        networkPolicy={"egress": [{"action": "allow", "target": "api.example.com"}]}
    )
    sandbox_id = created["id"]
    base, headers = egress(server, sandbox_id)
    httpx.patch(f"{base}/policy", json=[{"action": "allow", "target": "b.example.com"}], headers=headers)
    vault = {
        "credentials": [{"name": "tok", "source": {"type": "inline", "value": "restart-secret"}}],
        "bindings": [
            {
                "name": "b",
                "match": {"hosts": ["api.example.com"]},
                "auth": {"type": "bearer", "credential": "tok"},
            }
        ],
    }
    assert httpx.post(f"{base}/credential-vault", json=vault, headers=headers).status_code == 201

    server.restart()

    with server.client() as client:
        assert client.get(f"/v1/sandboxes/{sandbox_id}").json()["status"]["state"] == "Running"
    assert proxy_entries(server) == [sandbox_id]  # re-pushed before the API answered
    base, headers = egress(server, sandbox_id)  # the token survived too
    policy = httpx.get(f"{base}/policy", headers=headers).json()["policy"]
    assert [rule["target"] for rule in policy["egress"]] == ["b.example.com", "api.example.com"]
    assert httpx.get(f"{base}/credential-vault", headers=headers).json()["revision"] == 1
    execd = f"http://{server.sandbox_address(sandbox_id)}:44772/ping"
    assert httpx.get(execd, trust_env=False).status_code == 200
    listed = httpx.get(
        f"{server.base_url}/v1/sandboxes", headers={"OPEN-SANDBOX-API-KEY": managed_key}, trust_env=False
    )
    assert [found["id"] for found in listed.json()["items"]] == [sandbox_id]  # the managed key still opens
    stored = stored_text(server, database, request)
    assert sandbox_id in stored and made.json()["id"] in stored  # the database the setting names
    assert "restart-secret" not in stored and managed_key not in stored
    assert (server.state_dir / "sandgate.db").exists() == isinstance(database, Path)


def test_crashed_proxy_is_restarted_and_refed(server: SandgateServer) -> None:
    sandbox_id = server.create_sandbox()["id"]
    pid = int(next(line.split()[3] for line in server.log().splitlines() if "sandgate: proxy pid" in line))
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if proxy_entries(server) == [sandbox_id]:
                return
        except Exception:
            pass
        time.sleep(0.1)
    pytest.fail(f"proxy not restarted with the sandbox's entry within 30s:\n{server.log()}")
