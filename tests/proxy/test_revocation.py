"""Revocation: a policy change closes the open connections it no longer allows, by the time the
control API answers the push. Held connections from a client namespace: intercepted HTTP/1.1
(keep-alive), intercepted HTTP/2 with a server-sent-event stream in flight, pass-through TLS
spliced by the front door, and pass-through TLS inside an explicit CONNECT tunnel (mitmproxy's
relay). Proven from the origin's log (no request on them after the push), from the client (its
connection closed) and from the audit file (`event: "revoked"`)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandgate.proxy import SandboxEntry
from tests.proxy.conftest import (
    CLIENT_ADDR,
    EXPLICIT_PORT,
    GATEWAY,
    Client,
    RunningProxy,
    start_proxy,
    stop_proxy,
)
from tests.support.internet import ORIGIN_V4, Internet

pytestmark = pytest.mark.root

SANDBOX = "sbx-revoke"
ALLOWED = [
    {"action": "allow", "target": "pass.example.com"},
    {"action": "allow", "target": "seen.example.com", "inspect": "always"},
]
POLICY = {"defaultAction": "deny", "egress": ALLOWED}
WIDER = {"defaultAction": "deny", "egress": [*ALLOWED, {"action": "allow", "target": "more.example.com"}]}
NARROWER = {"defaultAction": "deny", "egress": [{"action": "allow", "target": "more.example.com"}]}
HOLD_TIMEOUT = 90  # the client script's whole life, bounded
HOLD = Path(__file__).parents[1] / "support" / "hold_connections.py"


@pytest.fixture(scope="module", params=[1, 2], ids=["one-process", "two-workers"])
def proxy(
    net: Internet, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[RunningProxy]:
    """One proxy process, then a pool of two workers (the kernel spreads the four connections
    over them; the pool answers a push once every worker has revoked its own)."""
    net.set_names(
        {name: [ORIGIN_V4] for name in ("pass.example.com", "seen.example.com", "more.example.com")}
    )
    entry = SandboxEntry(sandbox_id=SANDBOX, address=CLIENT_ADDR, policy=POLICY)
    running = start_proxy(tmp_path_factory.mktemp("proxy"), net, [entry], workers=request.param)
    try:
        yield running
    finally:
        stop_proxy(running)


def hold_and_change(proxy: RunningProxy, client: Client, net: Internet, change: Any) -> dict[str, Any]:
    """Open the four connections with POLICY in force, call `change()` (a push), then let the
    client look at its connections; returns what it saw."""
    proxy.control.put_sandbox(SandboxEntry(sandbox_id=SANDBOX, address=CLIENT_ADDR, policy=POLICY))
    argv = [sys.executable, str(HOLD), str(proxy.ca_cert), str(net.ca_cert), GATEWAY, str(EXPLICIT_PORT)]
    argv += ["seen.example.com", "pass.example.com"]
    process = client.ns.popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout.readline().strip() == "open", process.communicate(timeout=HOLD_TIMEOUT)
        change()
        out, err = process.communicate("go\n", timeout=HOLD_TIMEOUT)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(5)
    assert process.returncode == 0, err
    return json.loads(out.splitlines()[-1])


def revoked(proxy: RunningProxy) -> list[dict[str, Any]]:
    return [r for r in proxy.audit() if r.get("event") == "revoked"]


def test_a_push_that_removes_the_hosts_closes_every_held_connection(
    proxy: RunningProxy, client: Client, net: Internet
) -> None:
    mark, before = len(net.origin_requests()), len(revoked(proxy))
    narrowed = SandboxEntry(sandbox_id=SANDBOX, address=CLIENT_ADDR, policy=NARROWER)
    seen = hold_and_change(proxy, client, net, lambda: proxy.control.put_sandbox(narrowed))
    assert {name: seen[name]["closed"] for name in ("h1", "spliced", "tunnel", "h2")} == dict.fromkeys(
        ("h1", "spliced", "tunnel", "h2"), True
    ), seen
    assert not seen["h2"]["stream_ended"] and seen["h2"]["events"] < 100, seen  # the stream was cut
    after = [r for r in net.origin_requests()[mark:] if "after=" in str(r["path"])]
    assert after == []  # nothing reached the origin over them after the push answered
    records = revoked(proxy)[before:]
    assert sorted(r["host"] for r in records) == ["pass.example.com"] * 2 + ["seen.example.com"] * 2, records
    assert {(r["kind"], r["decision"], r["reason"], r["sandbox"]) for r in records} == {
        ("connection", "deny", "default", SANDBOX)
    }
    spliced = [r for r in records if r["host"] == "pass.example.com" and r["id"].endswith("-revoked")]
    assert len(spliced) == 2  # each tied to its pass-through decision record
    decisions = {r["id"] for r in proxy.audit() if r["kind"] == "connection" and r["event"] is None}
    assert {r["id"].removesuffix("-revoked") for r in spliced} <= decisions
    assert 'sandgate_proxy_revoked_connections_total{reason="default"}' in proxy.control.metrics()


def test_removing_the_sandbox_closes_its_connections(
    proxy: RunningProxy, client: Client, net: Internet
) -> None:
    before = len(revoked(proxy))
    seen = hold_and_change(proxy, client, net, lambda: proxy.control.drop_sandbox(CLIENT_ADDR))
    assert all(seen[name]["closed"] for name in ("h1", "spliced", "tunnel", "h2")), seen
    records = revoked(proxy)[before:]
    assert len(records) == 4 and {r["reason"] for r in records} == {"unknown-sandbox"}, records


def test_a_push_that_still_allows_them_closes_nothing(
    proxy: RunningProxy, client: Client, net: Internet
) -> None:
    mark, before = len(net.origin_requests()), len(revoked(proxy))
    wider = SandboxEntry(sandbox_id=SANDBOX, address=CLIENT_ADDR, policy=WIDER)
    seen = hold_and_change(proxy, client, net, lambda: proxy.control.put_sandbox(wider))
    for name in ("h1", "spliced", "tunnel"):
        assert seen[name] == {"closed": False, "after": 200}, seen
    assert not seen["h2"]["closed"] or seen["h2"]["stream_ended"], seen
    after = sorted(str(r["path"]) for r in net.origin_requests()[mark:] if "after=" in str(r["path"]))
    assert after == ["/echo?after=h1", "/echo?after=spliced", "/echo?after=tunnel"]
    assert revoked(proxy)[before:] == []


def test_a_pass_through_host_that_now_needs_inspection_is_closed_and_only_it(
    proxy: RunningProxy, client: Client, net: Internet
) -> None:
    before = len(revoked(proxy))
    inspected = [{**rule, "inspect": "always"} for rule in ALLOWED]  # pass.example.com now intercepted
    entry = SandboxEntry(sandbox_id=SANDBOX, address=CLIENT_ADDR, policy={**POLICY, "egress": inspected})
    seen = hold_and_change(proxy, client, net, lambda: proxy.control.put_sandbox(entry))
    assert seen["spliced"]["closed"] and seen["tunnel"]["closed"], seen  # relayed unread: cannot stay
    assert seen["h1"] == {"closed": False, "after": 200}, seen  # already intercepted: judged per request
    records = revoked(proxy)[before:]
    assert [(r["host"], r["reason"]) for r in records] == [("pass.example.com", "inspection-required")] * 2
