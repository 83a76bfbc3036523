"""The `osb` CLI and `opensandbox-mcp` (1.1.1, unchanged) against a real `sandgate serve`."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conformance.conftest import API_HOST
from tests.support.server import SandgateServer

pytestmark = pytest.mark.root
VENV_BIN = Path(__file__).resolve().parents[2] / ".venv" / "bin"
MCP_TIMEOUT_S = 120


def osb(server: SandgateServer, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(VENV_BIN / "osb"), *args], env=server.env(), capture_output=True, text=True, timeout=60
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"osb {' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
        )
    return result


def osb_json(server: SandgateServer, *args: str) -> object:
    return json.loads(osb(server, *args, "-o", "json").stdout)


@pytest.fixture
def sandbox_id(server: SandgateServer, tmp_path: Path) -> Iterator[str]:
    policy = tmp_path / "policy.json"
    policy.write_text(
        json.dumps({"defaultAction": "deny", "egress": [{"action": "allow", "target": API_HOST}]})
    )
    created = osb_json(
        server, "sandbox", "create", "-i", "sandgate/host", "--entrypoint", "sleep",
        "--entrypoint", "infinity", "--resource", "cpu=1", "--network-policy-file", str(policy),
        "--credential-proxy", "-m", "via=osb",
    )  # fmt: skip
    assert isinstance(created, dict)
    yield created["id"]
    osb(server, "sandbox", "kill", created["id"], check=False)


def test_osb_sandbox_command_file_egress_vault(
    server: SandgateServer, sandbox_id: str, tmp_path: Path
) -> None:
    listed = osb_json(server, "sandbox", "list")
    assert sandbox_id in json.dumps(listed)

    ran = osb(server, "command", "run", sandbox_id, "--", "echo", "from-osb")
    assert "from-osb" in ran.stdout
    failed = osb(server, "command", "run", sandbox_id, "--", "sh", "-c", "exit 3", check=False)
    assert failed.returncode == 1

    osb(server, "file", "write", sandbox_id, "/tmp/osb.txt", "-c", "osb wrote this")
    assert osb(server, "file", "cat", sandbox_id, "/tmp/osb.txt").stdout.strip() == "osb wrote this"

    osb(server, "egress", "patch", sandbox_id, "--rule", "allow=pypi.example.com")
    policy = json.dumps(osb_json(server, "egress", "get", sandbox_id))
    assert policy.index("pypi.example.com") < policy.index(API_HOST)

    payload = tmp_path / "vault.yaml"
    payload.write_text(
        "credentials:\n  - name: tok\n    source: {type: inline, value: osb-secret-value}\n"
        f"bindings:\n  - name: api\n    match: {{hosts: [{API_HOST}]}}\n"
        "    auth: {type: apiKey, name: X-Api-Key, credential: tok}\n"
    )
    osb(server, "credential-vault", "create", sandbox_id, "--file", str(payload))
    state = osb_json(server, "credential-vault", "get", sandbox_id)
    assert "osb-secret-value" not in json.dumps(state)
    assert isinstance(state, dict) and state["revision"] == 1
    credentials = osb(server, "credential-vault", "credential", "list", sandbox_id, "-o", "json").stdout
    assert "tok" in credentials and "osb-secret-value" not in credentials


def test_osb_snapshot_create_list_delete(server: SandgateServer, sandbox_id: str) -> None:
    taken = osb_json(server, "snapshot", "create", sandbox_id, "--name", "via-osb")
    assert isinstance(taken, dict)

    def listed() -> list[str]:
        items = osb_json(server, "snapshot", "list")
        return [item["id"] for item in (items["items"] if isinstance(items, dict) else items)]  # type: ignore[index]

    assert taken["id"] in listed()
    osb(server, "snapshot", "delete", taken["id"])
    assert taken["id"] not in listed()


def test_osb_kill_removes_the_sandbox(server: SandgateServer, sandbox_id: str) -> None:
    osb(server, "sandbox", "kill", sandbox_id)
    with server.client() as client:
        assert client.get(f"/v1/sandboxes/{sandbox_id}").status_code == 404
