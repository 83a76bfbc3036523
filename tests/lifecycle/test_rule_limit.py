"""`policy_max_rules` is one limit end to end, checked once where a policy enters (the proxy
used to check its own 4096 again, so a create of 5,000 rules under a 10,000 limit answered 503
and a change 500; now it loads the validated document without a limit of its own). At the limit
a create and a change are accepted and enforced; one rule over it is a 400 naming the limit, and
the policy in force stays as it was."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.audit import dns_decision
from tests.support.server import SandgateServer, sandgate_server

pytestmark = pytest.mark.root
LIMIT = 10_000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandgateServer]:
    with sandgate_server(
        tmp_path_factory.mktemp("limit"), {"SANDGATE_POLICY_MAX_RULES": str(LIMIT)}
    ) as running:
        yield running


def rules(count: int, start: int = 0) -> list[dict[str, str]]:
    return [{"action": "allow", "target": f"h{n}.example.test"} for n in range(start, start + count)]


def proxy_rule_count(server: SandgateServer, sandbox_id: str) -> int:
    from sandgate.proxy import ProxyControl

    with ProxyControl(server.state_dir / "proxy.sock") as control:
        [entry] = [entry for entry in control.list() if entry.sandbox_id == sandbox_id]
    return len(entry.policy.egress)


def test_a_policy_at_the_limit_is_in_force_at_the_proxy(server: SandgateServer) -> None:
    sandbox_id = server.create_sandbox(networkPolicy={"defaultAction": "deny", "egress": rules(LIMIT)})["id"]
    assert proxy_rule_count(server, sandbox_id) == LIMIT
    server.run(sandbox_id, f"getent hosts h{LIMIT - 1}.example.test h{LIMIT}.example.test")
    assert (
        dns_decision(server.state_dir, sandbox_id, f"h{LIMIT - 1}.example.test") == "allow"
    )  # the last rule
    assert dns_decision(server.state_dir, sandbox_id, f"h{LIMIT}.example.test") == "deny"


def test_one_rule_over_the_limit_is_a_400_naming_it(server: SandgateServer) -> None:
    with server.client() as client:
        response = client.post(
            "/v1/sandboxes",
            json={
                "image": {"uri": "sandgate/host"},
                "entrypoint": ["sleep", "infinity"],
                "resourceLimits": {},
                "networkPolicy": {"defaultAction": "deny", "egress": rules(LIMIT + 1)},
            },
        )
    assert response.status_code == 400, response.text
    assert f"the limit is {LIMIT}" in response.text and "policy_max_rules" in response.text


def test_a_change_up_to_the_limit_is_accepted_and_one_over_it_refused(server: SandgateServer) -> None:
    sandbox_id = server.create_sandbox(networkPolicy={"defaultAction": "deny", "egress": rules(5_000)})["id"]
    assert proxy_rule_count(server, sandbox_id) == 5_000
    with server.client() as client:
        patched = client.patch(f"/v1/sandboxes/{sandbox_id}/egress/policy", json=rules(LIMIT - 5_000, 5_000))
        assert patched.status_code == 200, patched.text
        assert proxy_rule_count(server, sandbox_id) == LIMIT
        over = client.patch(f"/v1/sandboxes/{sandbox_id}/egress/policy", json=rules(1, LIMIT))
    assert over.status_code == 400, over.text
    assert f"the limit is {LIMIT}" in over.text
    assert proxy_rule_count(server, sandbox_id) == LIMIT  # the policy in force is untouched
