"""A ceiling through a real server (the deployment's `policy_ceiling`, the hook a tenant's ceiling
uses too): a create or change beyond it is a 403 naming the ceiling rule, and nothing changes,
proven at the proxy (its entry, its DNS audit records), not by the API's word alone. The rule
limit and the ceiling answer the same on every entry path (create, patch, a preset's include,
an approval's "allow for this sandbox")."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.audit import dns_decision
from tests.support.server import SandgateServer, sandgate_server

pytestmark = pytest.mark.root

CEILING = """\
egress:
  - {action: deny, target: secret.example.test}
  - {action: ask, target: review.example.test}
  - {action: allow, target: "*.example.test"}
"""
LIMIT = 4


def preset(*targets: str) -> str:
    return json.dumps(
        {"preset": {"version": 1, "description": "test", "risk": "none"}, "egress": allow(*targets)}
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandgateServer]:
    folder = tmp_path_factory.mktemp("ceiling")
    ceiling = folder / "ceiling.yaml"
    ceiling.write_text(CEILING)
    presets = folder / "presets"
    presets.mkdir()
    (presets / "many.yaml").write_text(preset("m1.example.test", "m2.example.test", "m3.example.test"))
    (presets / "wide.yaml").write_text(preset("api.example.org"))
    settings = {
        "SANDGATE_POLICY_CEILING": str(ceiling),
        "SANDGATE_POLICY_MAX_RULES": str(LIMIT),
        "SANDGATE_PRESET_DIRS": json.dumps([str(presets)]),
    }
    with sandgate_server(folder, settings) as running:
        yield running


def allow(*targets: str) -> list[dict[str, str]]:
    return [{"action": "allow", "target": target} for target in targets]


def proxy_targets(server: SandgateServer, sandbox_id: str) -> list[str]:
    from sandgate.proxy import ProxyControl

    with ProxyControl(server.state_dir / "proxy.sock") as control:
        [entry] = [entry for entry in control.list() if entry.sandbox_id == sandbox_id]
    return [rule.target for rule in entry.policy.egress]


def create(server: SandgateServer, policy: dict[str, Any]) -> Any:
    with server.client() as client:
        return client.post(
            "/v1/sandboxes",
            json={
                "image": {"uri": "sandgate/host"},
                "entrypoint": ["sleep", "infinity"],
                "resourceLimits": {},
                "networkPolicy": policy,
            },
        )


def test_a_create_beyond_the_ceiling_is_403_naming_its_rule_and_no_sandbox(server: SandgateServer) -> None:
    with server.client() as client:
        before = client.get("/v1/sandboxes").json()["items"]
    response = create(server, {"defaultAction": "deny", "egress": allow("*.example.test")})
    assert response.status_code == 403, response.text
    assert "ceiling rule" in response.text and "ceiling.yaml:2" in response.text  # deny secret.example.test
    with server.client() as client:
        assert client.get("/v1/sandboxes").json()["items"] == before
    outside = create(server, {"defaultAction": "deny", "egress": allow("api.example.org")})
    assert outside.status_code == 403 and "ceiling defaultAction deny" in outside.text


def test_changes_beyond_the_ceiling_are_refused_and_the_proxy_keeps_the_old_policy(
    server: SandgateServer,
) -> None:
    sandbox_id = server.create_sandbox(
        networkPolicy={"defaultAction": "deny", "egress": allow("a.example.test")}
    )["id"]
    base = f"/v1/sandboxes/{sandbox_id}"
    with server.client() as client:
        patched = client.patch(f"{base}/egress/policy", json=allow("b.example.test"))
        assert patched.status_code == 200, patched.text
        refusals = [
            client.patch(f"{base}/egress/policy", json=allow("secret.example.test")),
            client.patch(f"{base}/networkpolicy", json=allow("api.example.org")),
            client.put(f"{base}/egress/policy", json={"defaultAction": "allow", "egress": []}),
            client.put(
                f"{base}/egress/sandgate-policy",
                json={"policy": {"egress": [{"action": "allow", "target": "b.example.test", "ports": [443]}],
                                 "mode": "report"}},
            ),
        ]  # fmt: skip
    for refused in refusals:
        assert refused.status_code == 403, refused.text
        assert "ceiling" in refused.text and "nothing changed" in refused.text
    assert proxy_targets(server, sandbox_id) == ["b.example.test", "a.example.test"]
    server.run(sandbox_id, "getent hosts b.example.test secret.example.test api.example.org")
    assert dns_decision(server.state_dir, sandbox_id, "b.example.test") == "allow"
    assert dns_decision(server.state_dir, sandbox_id, "secret.example.test") == "deny"
    assert dns_decision(server.state_dir, sandbox_id, "api.example.org") == "deny"


def test_the_limit_and_the_ceiling_answer_the_same_on_every_entry_path(server: SandgateServer) -> None:
    """Create, egress PATCH, networkpolicy PATCH and a sandgate policy whose preset brings the
    rules in: one rule over the limit is the same 400, a rule beyond the ceiling the same 403."""
    five = allow(*(f"n{n}.example.test" for n in range(LIMIT + 1)))
    sandbox_id = server.create_sandbox(networkPolicy={"defaultAction": "deny", "egress": five[:LIMIT]})["id"]
    base = f"/v1/sandboxes/{sandbox_id}"
    with server.client() as client:
        over = {
            "create": create(server, {"defaultAction": "deny", "egress": five}),
            "patch": client.patch(f"{base}/egress/policy", json=allow("n9.example.test")),
            "networkpolicy": client.patch(f"{base}/networkpolicy", json=allow("n9.example.test")),
            "preset": client.put(
                f"{base}/egress/sandgate-policy",
                json={"policy": {"egress": five[:2], "include": ["preset:many"]}},
            ),
        }
        base = f"/v1/sandboxes/{server.create_sandbox()['id']}"  # deny all: room for a rule
        beyond = {
            "create": create(server, {"defaultAction": "deny", "egress": allow("api.example.org")}),
            "patch": client.patch(f"{base}/egress/policy", json=allow("api.example.org")),
            "networkpolicy": client.patch(f"{base}/networkpolicy", json=allow("api.example.org")),
            "preset": client.put(
                f"{base}/egress/sandgate-policy", json={"policy": {"include": ["preset:wide"]}}
            ),
        }
    for path, response in over.items():
        assert response.status_code == 400, (path, response.text)
        assert f"policy has {LIMIT + 1} egress rules; the limit is {LIMIT}" in response.text, path
    for path, response in beyond.items():
        assert response.status_code == 403, (path, response.text)
        assert (
            "ceiling defaultAction deny refuses" in response.text and "allow api.example.org" in response.text
        )
    assert proxy_targets(server, sandbox_id) == [rule["target"] for rule in five[:LIMIT]]


GATEWAY = (  # the sandbox's default route: where the proxy's explicit port listens
    "python3 -c \"import socket, struct; print([socket.inet_ntoa(struct.pack('<L', int(f[2], 16))) "
    "for f in map(str.split, open('/proc/net/route')) if f[1] == '00000000'][0])\""
)

ASK_HELD = {"action": "ask", "target": "*.held.example.test"}


def held_approval(server: SandgateServer, policy: dict[str, Any], url: str) -> tuple[str, str]:
    """A sandbox with `policy` whose request to `url` the proxy holds for a reviewer: (sandbox
    id, approval id). The request goes through the explicit proxy port (no DNS needed)."""
    sandbox_id = str(server.create_sandbox()["id"])
    with server.client() as client:
        put = client.put(f"/v1/sandboxes/{sandbox_id}/egress/sandgate-policy", json={"policy": policy})
        assert put.status_code == 200, put.text
    gateway = server.run(sandbox_id, GATEWAY).stdout.strip()
    port = server.proxy_ports["EXPLICIT"]
    server.run(sandbox_id, f"curl -s -m 120 -x http://{gateway}:{port} {url}", background=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with server.client() as client:
            held = [item for item in client.get("/v1/approvals").json() if item["sandbox"] == sandbox_id]
        if held:
            return sandbox_id, str(held[0]["id"])
        time.sleep(0.2)
    raise AssertionError(f"no approval held for {url} in 30 s")


def test_an_approval_answers_the_limit_and_the_ceiling_as_a_patch_does(server: SandgateServer) -> None:
    """ "Allow for this sandbox" is a patch: past the limit the same 400, past the ceiling (which
    only lets a reviewer decide review.example.test) the same 403; the request stays held and
    the proxy keeps the old policy."""
    cases = [
        (
            {"egress": [ASK_HELD, *allow("a.example.test", "b.example.test", "c.example.test")]},
            "http://x.held.example.test/",
            400,
            f"policy has {LIMIT + 1} egress rules; the limit is {LIMIT}",
        ),
        (
            {"egress": [{"action": "ask", "target": "review.example.test"}]},
            "http://review.example.test/",
            403,
            "ceiling.yaml:3 (ask review.example.test) refuses",
        ),
    ]  # fmt: skip
    for policy, url, status, message in cases:
        sandbox_id, approval = held_approval(server, policy, url)
        before = proxy_targets(server, sandbox_id)
        with server.client() as client:
            answer = client.post(f"/v1/approvals/{approval}", json={"decision": "allow-sandbox"})
            assert answer.status_code == status, answer.text
            assert message in answer.text
            assert approval in [item["id"] for item in client.get("/v1/approvals").json()]  # still held
            assert proxy_targets(server, sandbox_id) == before
            denied = client.post(f"/v1/approvals/{approval}", json={"decision": "deny"})
            assert denied.status_code == 200, denied.text
