"""Revocation from a real sandbox: connections held open inside it (intercepted HTTP/1.1,
HTTP/2 with a stream in flight, pass-through spliced by the front door, pass-through inside a
CONNECT tunnel) are closed when the policy change through the lifecycle API returns; the
origin's log shows nothing on them afterwards and the audit file one `revoked` record each."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from opensandbox import SandboxSync
from opensandbox.models.execd import RunCommandOpts
from opensandbox.models.sandboxes import NetworkPolicy, NetworkRule

from tests.adversarial.conftest import (
    BOUND_HOST,
    IN_SANDBOX_TEST_CA,
    OPEN_HOST,
    SANDBOX_IMAGE,
    SANDBOX_LIFETIME,
    SANDBOX_PYTHON,
    TEST_RUNTIME,
    Attacker,
    ProxyPorts,
    connection,
    sandbox_net,
    sandbox_with_policy,
    vault_put,
    vault_rm,
)
from tests.support.internet import Internet
from tests.support.server import SandgateServer

pytestmark = pytest.mark.root

HOLD = Path(__file__).parents[1] / "support" / "hold_connections.py"
IN_SANDBOX_HOLD = "/workspace/hold_connections.py"
GO, OUT = "/workspace/go", "/workspace/hold.out"
# Where a sandbox finds the deployment CA: a file of its own on the local runtime, in the image's
# bundle on Docker, the file execd's launcher writes into the Pod on Kubernetes.
PROXY_CA = {
    "local": "/etc/ssl/certs/sandgate-proxy.crt",
    "docker": "/etc/ssl/certs/ca-certificates.crt",
    "kubernetes": "/run/sandgate/proxy-ca.crt",
}[TEST_RUNTIME]
HELD = {
    "defaultAction": "deny",
    "egress": [
        {"action": "allow", "target": OPEN_HOST},  # pass-through
        {"action": "allow", "target": BOUND_HOST, "inspect": "always"},  # intercepted
    ],
}
NARROWED = {"defaultAction": "deny", "egress": [{"action": "allow", "target": "other.example.com"}]}
WAIT = 30.0


@pytest.fixture(scope="module")
def holder(server: SandgateServer, internet: Internet, proxy_ports: ProxyPorts) -> Iterator[Attacker]:
    """A sandbox of its own (the attacker's policy stays untouched), with the hold script."""
    sandbox = SandboxSync.create(
        SANDBOX_IMAGE,
        entrypoint=["sleep", "infinity"],
        network_policy=NetworkPolicy(
            defaultAction="deny",
            egress=[
                NetworkRule(action="allow", target=OPEN_HOST),
                NetworkRule(action="allow", target=BOUND_HOST),
            ],
        ),
        connection_config=connection(server),
        timeout=SANDBOX_LIFETIME,
        ready_timeout=timedelta(seconds=30),
    )
    try:
        sandbox.files.write_file(IN_SANDBOX_HOLD, HOLD.read_text())
        sandbox.files.write_file(IN_SANDBOX_TEST_CA, internet.ca_cert.read_text())
        address, gateway = sandbox_net(server, sandbox.id)
        yield Attacker(sandbox, server, internet, proxy_ports, gateway, address)
    finally:
        sandbox.kill()
        sandbox.close()


def set_policy(holder: Attacker, policy: dict[str, Any]) -> None:
    with holder.server.client() as client:
        answer = client.put(
            f"/v1/sandboxes/{holder.sandbox.id}/egress/sandgate-policy", json={"policy": policy}
        )
    assert answer.status_code == 200, answer.text


def output_lines(holder: Attacker, count: int) -> list[str]:
    """The hold script's output once it has `count` lines (bounded wait)."""
    deadline = time.monotonic() + WAIT
    while True:
        try:
            lines = holder.sandbox.files.read_file(OUT).splitlines()
        except Exception:  # not written yet
            lines = []
        if len(lines) >= count or time.monotonic() > deadline:
            return lines
        time.sleep(0.1)


def test_a_policy_change_closes_held_connections_inside_a_real_sandbox(holder: Attacker) -> None:
    set_policy(holder, HELD)
    args = [
        PROXY_CA,
        IN_SANDBOX_TEST_CA,
        holder.gateway,
        str(holder.ports.explicit),
        BOUND_HOST,
        OPEN_HOST,
        GO,
    ]
    holder.sandbox.commands.run(
        f"{SANDBOX_PYTHON} {IN_SANDBOX_HOLD} {' '.join(args)} > {OUT} 2>&1",
        opts=RunCommandOpts(background=True, timeout=timedelta(seconds=120)),
    )
    assert output_lines(holder, 1)[:1] == ["open"], output_lines(holder, 1)
    mark = len(holder.internet.origin_requests())
    set_policy(holder, NARROWED)  # returns once the proxy has revoked what it no longer allows
    holder.sandbox.files.write_file(GO, "")
    lines = output_lines(holder, 2)
    assert len(lines) == 2, lines
    seen = json.loads(lines[1])
    assert all(seen[name]["closed"] for name in ("h1", "h2", "spliced", "tunnel")), seen
    assert not seen["h2"]["stream_ended"], seen  # the stream in flight was cut
    after = [r for r in holder.origin_requests_since(mark) if "after=" in str(r["path"])]
    assert after == []
    records = holder.wait_audit(lambda r: r["event"] == "revoked")  # written before the push answered
    assert sorted(r["host"] for r in records) == [BOUND_HOST] * 2 + [OPEN_HOST] * 2, records
    assert {(r["decision"], r["reason"]) for r in records} == {("deny", "default")}


def test_a_deployment_value_rotated_or_removed_acts_on_the_next_request(
    server: SandgateServer, internet: Internet
) -> None:
    """`sandgate vault put` of a new value and `sandgate vault rm` act before the command returns
    on the proxy that serves the sandbox (on Kubernetes its node's, which holds only the values
    the server pushed: the server pushes again at once, lifecycle/vault_notices.py): the next
    request carries the new value, and after the removal none leaves at all; seen at the origin."""
    name = f"rotated-{secrets.token_hex(3)}"
    first, second = f"first-{secrets.token_hex(8)}", f"second-{secrets.token_hex(8)}"
    vault_put(server, name, first)
    policy = {
        "version": 1,
        "defaultAction": "deny",
        "egress": [{"action": "allow", "target": BOUND_HOST}],
        "bindings": [
            {
                "name": "rotated",
                "credential": name,
                "match": {"hosts": [BOUND_HOST]},
                "auth": {"type": "bearer"},
            }
        ],
    }
    with sandbox_with_policy(server, policy) as sandbox:

        def status() -> str:
            command = f"curl -sS -o /dev/null -w '%{{http_code}}' --max-time 20 https://{BOUND_HOST}/echo"
            execution = sandbox.commands.run(command, opts=RunCommandOpts(timeout=timedelta(seconds=60)))
            return "".join(m.text for m in execution.logs.stdout)

        mark = len(internet.origin_requests())
        assert status() == "200"
        vault_put(server, name, second)
        assert status() == "200"
        vault_rm(server, name)
        assert status() == "502"  # credential-unavailable: refused by the proxy, never forwarded
        seen = [r["headers"].get("authorization") for r in internet.origin_requests()[mark:]]
        assert seen == [f"Bearer {first}", f"Bearer {second}"], seen
