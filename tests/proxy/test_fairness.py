"""Fairness between sandboxes: a sandbox over its connection limits is reset at accept and
audited (a few records, not one per refusal), while another sandbox's requests all succeed."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

from sandgate.proxy import SandboxEntry
from sandgate.proxy.contract.config import ConnectionLimits
from tests.proxy.conftest import CLIENT_ADDR, Client, RunningProxy, client_netns, start_proxy, stop_proxy
from tests.support.internet import ORIGIN_V4, Internet

pytestmark = pytest.mark.root

POLICY = {"defaultAction": "deny", "egress": [{"action": "allow", "target": "plain.example.com"}]}
NOISY_GATEWAY, NOISY_ADDR = "10.213.0.5", "10.213.0.6"
HELD = 5  # the noisy sandbox's max_connections in the first test
ATTEMPTS = 200

# Open ATTEMPTS keep-alive connections one after another, each asking for one response and then
# held open; report how many got their response and how many were cut, then hold until stdin.
FLOOD = """
import http.client, json, sys
held, refused = [], 0
for _ in range(ATTEMPTS):
    conn = http.client.HTTPConnection(ORIGIN, 80, timeout=30)
    try:
        conn.request("GET", "/", headers={"Host": "plain.example.com"})
        response = conn.getresponse()
        assert response.status == 200 and response.read() == b"hello from origin\\n"
        if not KEEP:
            conn.close()
        held.append(conn)
    except (OSError, http.client.HTTPException):
        refused += 1
print(json.dumps({"ok": len(held), "refused": refused}), flush=True)
sys.stdin.readline()
"""


def noisy_entry(limits: ConnectionLimits) -> SandboxEntry:
    return SandboxEntry(sandbox_id="sbx-noisy", address=NOISY_ADDR, policy=POLICY, limits=limits)


@pytest.fixture(scope="module")
def proxy(net: Internet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    net.set_names({"plain.example.com": [ORIGIN_V4]})
    quiet = SandboxEntry(sandbox_id="sbx-quiet", address=CLIENT_ADDR, policy=POLICY)
    # The limit under test is the concurrent one: a generous accept rate.
    noisy = noisy_entry(ConnectionLimits(max_connections=HELD, accept_rate=1000, accept_burst=1000))
    running = start_proxy(tmp_path_factory.mktemp("proxy"), net, [quiet, noisy])
    try:
        yield running
    finally:
        stop_proxy(running)


@pytest.fixture(scope="module")
def noisy() -> Iterator[Client]:
    with client_netns(NOISY_GATEWAY, NOISY_ADDR) as running:
        yield running


def flood(client: Client, attempts: int, keep: bool) -> subprocess.Popen[str]:
    code = f"ORIGIN, ATTEMPTS, KEEP = {ORIGIN_V4!r}, {attempts}, {keep}\n" + FLOOD
    return client.ns.popen(  # type: ignore[return-value]
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )


def finish(process: subprocess.Popen[str]) -> dict[str, int]:
    try:
        outcome = json.loads(process.stdout.readline())  # type: ignore[union-attr]
    finally:
        process.kill()
        process.wait()
    return outcome  # type: ignore[no-any-return]


def refusals_counted(proxy: RunningProxy, event: str) -> int:
    found = re.search(
        rf'sandgate_proxy_security_events_total{{event="{event}"}} (\d+)', proxy.control.metrics()
    )
    return int(found.group(1)) if found else 0


def test_a_sandbox_over_its_connection_limit_is_reset_and_the_other_is_served(
    proxy: RunningProxy, client: Client, noisy: Client
) -> None:
    attacker = flood(noisy, ATTEMPTS, keep=True)
    try:
        quiet = client.run(
            ["curl", "-sS", "--max-time", "20", "-Z", "-w", "%{http_code}\\n"]
            + [arg for n in range(20) for arg in ("-o", "/dev/null", f"http://plain.example.com/?n={n}")],
            timeout=60,
        )
        outcome = finish(attacker)
    finally:
        attacker.kill()
    assert quiet.stdout.split() == ["200"] * 20, quiet.stderr
    assert outcome == {"ok": HELD, "refused": ATTEMPTS - HELD}
    records = proxy.wait_audit(1, kind="security_event", reason="connection-limit")
    assert records and {r["sandbox"] for r in records} == {"sbx-noisy"}
    assert len(records) <= 2  # the first refusal, and at most one summary of its window
    assert "over 5 open connections" in records[0]["detail"]
    assert refusals_counted(proxy, "connection-limit") == ATTEMPTS - HELD
    assert not [r for r in proxy.audit() if r["kind"] == "security_event" and r["sandbox"] == "sbx-quiet"]


def test_a_sandbox_over_its_accept_rate_is_reset(proxy: RunningProxy, noisy: Client) -> None:
    # Three at once, then one per 1000 s: of ten quick connections, three are served.
    proxy.control.put_sandbox(noisy_entry(ConnectionLimits(accept_rate=0.001, accept_burst=3)))
    outcome = finish(flood(noisy, 10, keep=False))
    assert outcome == {"ok": 3, "refused": 7}
    [record] = proxy.wait_audit(1, kind="security_event", reason="accept-rate")
    assert record["sandbox"] == "sbx-noisy" and "over 0.001 new connections/s (burst 3)" in record["detail"]
