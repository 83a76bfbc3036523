"""The warm pool through a real `sandgate serve` (warm_pool_size=1): a create claims the pooled
sandbox (its id, env, limits, policy, entrypoint), the pool refills, requests the pool cannot
serve start cold, a restart discards unclaimed members, and a stop removes them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lifecycle.test_execd_token import check_execd_needs_the_sandboxs_token
from tests.support.server import SandgateServer, sandgate_server

pytestmark = pytest.mark.root
ENTRYPOINT = ["sh", "-c", 'echo "$GREETING|$SANDGATE_SANDBOX_ID" > /workspace/entry.txt; exec sleep infinity']


@pytest.fixture
def server(tmp_path: Path) -> Iterator[SandgateServer]:
    with sandgate_server(tmp_path, {"SANDGATE_WARM_POOL_SIZE": "1"}) as running:
        yield running


def runtime_ids(server: SandgateServer) -> set[str]:
    return {state.parent.name for state in (server.state_dir / "sandboxes").glob("*/state.json")}


def api_ids(server: SandgateServer) -> set[str]:
    with server.client() as client:
        return {item["id"] for item in client.get("/v1/sandboxes", params={"pageSize": 200}).json()["items"]}


def pool_ready(server: SandgateServer) -> int:
    with server.client() as client:
        return int(client.get("/health").json()["warmPool"]["ready"])


def wait_pool(server: SandgateServer, exclude: set[str] | None = None, timeout: float = 90) -> str:
    """The id of the (one) pool member that is not in `exclude`, once the server says it is ready
    to be claimed (its files exist well before its execd answers; a create in between starts cold)."""
    exclude = exclude or set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready = pool_ready(server)
        pooled = runtime_ids(server) - api_ids(server) - exclude
        if ready == 1 and len(pooled) == 1:
            return pooled.pop()
        time.sleep(0.1)
    raise AssertionError(f"no warm pool member within {timeout}s:\n{server.log()}")


def cgroup_value(server: SandgateServer, sandbox_id: str, controller: str, name: str) -> str:
    instance = (server.state_dir / "instance-tag").read_text().strip()
    return Path(f"/sys/fs/cgroup/{controller}/sandgate-{instance}-{sandbox_id}/{name}").read_text().strip()


def proxy_entries(server: SandgateServer) -> set[str]:
    from sandgate.proxy import ProxyControl

    with ProxyControl(server.state_dir / "proxy.sock") as control:
        return {entry.sandbox_id for entry in control.list()}


def wait_text(path: Path, timeout: float = 20) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().endswith("\n"):
            return path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{path} never written")


def test_claim_applies_env_limits_policy_and_entrypoint_then_refills(server: SandgateServer) -> None:
    member = wait_pool(server)
    assert member not in proxy_entries(server)  # unclaimed: the proxy refuses its traffic

    created = server.create_sandbox(
        entrypoint=ENTRYPOINT,
        env={"GREETING": 'hi "there"\nsecond line'},
        resourceLimits={"memory": "300Mi", "pids": "77"},
        networkPolicy={"egress": [{"action": "allow", "target": "api.example.com"}]},
    )

    assert created["id"] == member
    workspace = server.state_dir / "sandboxes" / member / "root" / "workspace"
    assert wait_text(workspace / "entry.txt") == f'hi "there"\nsecond line|{member}\n'
    assert server.run(member, 'printf %s "$GREETING"').stdout == 'hi "there"\nsecond line'
    assert cgroup_value(server, member, "memory", "memory.limit_in_bytes") == str(300 * 2**20)
    assert cgroup_value(server, member, "pids", "pids.max") == "77"
    assert member in proxy_entries(server)
    with server.client() as client:
        assert client.get(f"/v1/sandboxes/{member}").json()["status"]["state"] == "Running"
    check_execd_needs_the_sandboxs_token(server, member)  # the token made with the member, kept

    refilled = wait_pool(server, exclude={member})
    assert refilled != member and refilled not in proxy_entries(server)


def test_requests_the_pool_cannot_serve_start_cold(server: SandgateServer) -> None:
    member = wait_pool(server)
    cold = server.create_sandbox(entrypoint=["sleep", "infinity"], env={"EXECD_ENVS": "/tmp/elsewhere"})
    assert cold["id"] != member
    assert member in runtime_ids(server) - api_ids(server)  # still pooled, untouched
    assert server.run(cold["id"], 'printf %s "$EXECD_ENVS"').stdout == "/tmp/elsewhere"


def test_restart_discards_unclaimed_members_and_stop_removes_them(server: SandgateServer) -> None:
    member = wait_pool(server)
    claimed = server.create_sandbox()["id"]
    assert claimed == member
    old_member = wait_pool(server, exclude={claimed})

    server.restart()

    assert claimed in api_ids(server) and server.run(claimed, "echo alive").stdout == "alive"
    new_member = wait_pool(server, exclude={claimed, old_member})
    assert old_member not in runtime_ids(server)
    netns = {path.name for path in Path("/run/netns").iterdir()}
    assert not any(name.endswith(old_member) for name in netns)

    server.stop()

    assert new_member not in runtime_ids(server) and claimed in runtime_ids(server)
    netns = {path.name for path in Path("/run/netns").iterdir()}
    assert not any(name.endswith(new_member) for name in netns)
    instance = (server.state_dir / "instance-tag").read_text().strip()
    assert not Path(f"/sys/fs/cgroup/pids/sandgate-{instance}-{new_member}").exists()
