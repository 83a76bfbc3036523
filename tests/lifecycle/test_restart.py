"""State survives: a restarted server re-adopts live sandboxes with their policy and vault, and
a crashed proxy is restarted and re-fed while sandboxes fail closed in between."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.server import SandgateServer, sandgate_server

pytestmark = pytest.mark.root


@pytest.fixture
def server(tmp_path: Path) -> Iterator[SandgateServer]:
    with sandgate_server(tmp_path) as running:
        yield running


def egress(server: SandgateServer, sandbox_id: str) -> tuple[str, dict[str, str]]:
    with server.client() as client:
        found = client.get(f"/v1/sandboxes/{sandbox_id}/endpoints/18080").json()
    return f"http://{found['endpoint']}", found["headers"]


def proxy_entries(server: SandgateServer) -> list[str]:
    from sandgate.proxy import ProxyControl

    with ProxyControl(server.state_dir / "proxy.sock") as control:
        return [entry.sandbox_id for entry in control.list()]


def test_restart_readopts_sandboxes_policy_and_vault(server: SandgateServer) -> None:
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
    assert "restart-secret" not in (server.state_dir / "sandgate.db").read_bytes().decode(errors="replace")


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
