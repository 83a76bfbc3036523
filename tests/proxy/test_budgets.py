"""Budgets under a bounded load: two sandboxes hammer the test internet at once, one under a
requests-per-second budget (for the sandbox, and a tighter one for a rule's host), the other
without. Proven from the origins' log: what reached them from the budgeted sandbox is the
bucket's burst plus its rate over the load's duration, within TOLERANCE; the other sandbox's
requests all arrived. The refusals are 429s with reason `budget`, audited, and counted in the
metrics per sandbox."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from sandgate.proxy import SandboxEntry
from tests.proxy.conftest import CLIENT_ADDR, Client, RunningProxy, client_netns, start_proxy, stop_proxy
from tests.support.internet import ORIGIN_V4, Internet

pytestmark = pytest.mark.root

OTHER_GATEWAY, OTHER_ADDR = "10.213.0.5", "10.213.0.6"
RATE, BURST = 10, 10  # the budgeted sandbox's budget
RULE_RATE, RULE_BURST = 2, 2  # its rule for slow.example.com
BYTE_RATE = 50_000  # bytes/s in, for ratehttp.example.com (ratepass.example.com: twice that)
SECONDS = 4.0  # each load's duration (bounded also in count: MAX_REQUESTS)
MAX_REQUESTS = 3000
TOLERANCE = 0.15  # of the expected count, plus 2 requests: timer and scheduling slack
BUDGETED = {
    "defaultAction": "deny",
    "budgets": {"requestsPerSecond": RATE, "burst": BURST},
    "egress": [
        {"action": "allow", "target": "fast.example.com"},
        {
            "action": "allow",
            "target": "slow.example.com",
            "budgets": {"requestsPerSecond": RULE_RATE, "burst": RULE_BURST},
        },
        {"action": "allow", "target": "bulk.example.com", "budgets": {"totalBytes": {"in": "100k"}}},
        {"action": "allow", "target": "passbulk.example.com", "budgets": {"totalBytes": {"in": 50_000}}},
        {
            "action": "allow",
            "target": "ratehttp.example.com",
            "budgets": {"bytesPerSecond": {"in": BYTE_RATE}},
        },
        {
            "action": "allow",
            "target": "ratepass.example.com",
            "budgets": {"bytesPerSecond": {"in": 2 * BYTE_RATE}},
        },
    ],
}
FREE = {"defaultAction": "deny", "egress": [{"action": "allow", "target": "free.example.com"}]}
# Sequential keep-alive requests for SECONDS (at most MAX_REQUESTS); prints the statuses, the
# duration, and one 429 body.
LOAD = """
import http.client, json, sys, time
host, seconds, most, path = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
conn, statuses, refused, started = None, {}, None, time.monotonic()
while time.monotonic() - started < seconds and sum(statuses.values()) < most:
    conn = conn or http.client.HTTPConnection(host, 80, timeout=10)
    conn.request("GET", path)
    answer = conn.getresponse()
    body = answer.read()
    statuses[answer.status] = statuses.get(answer.status, 0) + 1
    if answer.status == 429:
        refused = refused or {"body": json.loads(body), "retry_after": answer.getheader("retry-after")}
    if answer.getheader("connection") == "close":
        conn.close(); conn = None
print(json.dumps({"statuses": statuses, "seconds": time.monotonic() - started, "refused": refused}))
"""


@pytest.fixture(scope="module")
def other() -> Iterator[Client]:
    with client_netns(OTHER_GATEWAY, OTHER_ADDR) as running:
        yield running


@pytest.fixture(scope="module")
def proxy(net: Internet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    names = ("fast", "slow", "free", "bulk", "passbulk", "ratehttp", "ratepass")
    net.set_names({f"{n}.example.com": [ORIGIN_V4] for n in names})
    entries = [
        SandboxEntry(sandbox_id="sbx-budgeted", address=CLIENT_ADDR, policy=BUDGETED),
        SandboxEntry(sandbox_id="sbx-free", address=OTHER_ADDR, policy=FREE),
    ]
    running = start_proxy(tmp_path_factory.mktemp("proxy"), net, entries)
    try:
        yield running
    finally:
        stop_proxy(running)


def load(client: Client, host: str, path: str = "/") -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-c", LOAD, host, str(SECONDS), str(MAX_REQUESTS), path]
    return client.ns.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def result(process: subprocess.Popen[bytes]) -> dict:
    out, err = process.communicate(timeout=SECONDS + 60)
    assert process.returncode == 0, err.decode()
    return json.loads(out)


def reached(net: Internet, mark: int, host: str) -> int:
    return sum(1 for r in net.origin_requests()[mark:] if r["headers"].get("host") == host)


def within(count: int, expected: float) -> bool:
    return abs(count - expected) <= expected * TOLERANCE + 2


def test_a_budget_holds_under_load_and_another_sandbox_is_unaffected(
    proxy: RunningProxy, client: Client, other: Client, net: Internet
) -> None:
    mark = len(net.origin_requests())
    budgeted, free = load(client, "fast.example.com"), load(other, "free.example.com")
    budgeted_result, free_result = result(budgeted), result(free)
    ok = budgeted_result["statuses"].get("200", 0)
    expected = BURST + RATE * budgeted_result["seconds"]
    assert within(reached(net, mark, "fast.example.com"), expected), (budgeted_result, expected)
    assert reached(net, mark, "fast.example.com") == ok  # every 200 reached the origin, no 429 did
    assert budgeted_result["statuses"].get("429", 0) > ok  # the load was well over the budget
    refused = budgeted_result["refused"]
    assert (
        refused["body"]["reason"] == "budget"
        and "the sandbox's budget: 10 requests/s" in refused["body"]["detail"]
    )
    assert int(refused["retry_after"]) >= 1
    # The other sandbox, at the same time: every request answered 200 and seen by the origin.
    assert set(free_result["statuses"]) == {"200"}
    assert reached(net, mark, "free.example.com") == free_result["statuses"]["200"]
    records = proxy.wait_audit(1, kind="request", host="fast.example.com", reason="budget")
    assert records and records[-1]["status"] == 429 and records[-1]["sandbox"] == "sbx-budgeted"
    assert not [r for r in proxy.audit() if r["sandbox"] == "sbx-free" and r["reason"] == "budget"]
    metrics = proxy.control.metrics()
    assert 'sandgate_proxy_budget_requests_total{sandbox="sbx-budgeted",outcome="refused"}' in metrics
    assert 'sandbox="sbx-free"' not in metrics


def test_a_rules_budget_holds_per_host(proxy: RunningProxy, client: Client, net: Internet) -> None:
    mark = len(net.origin_requests())
    slow = result(load(client, "slow.example.com"))
    expected = RULE_BURST + RULE_RATE * slow["seconds"]
    assert within(reached(net, mark, "slow.example.com"), expected), (slow, expected)
    assert "the budget of rule" in slow["refused"]["body"]["detail"]
    assert "for slow.example.com: 2 requests/s (burst 2) is spent" in slow["refused"]["body"]["detail"]


def test_total_bytes_hold_for_requests_and_passed_through_connections(
    proxy: RunningProxy, client: Client, net: Internet
) -> None:
    """100k in for bulk.example.com: the fourth 30,000-byte answer still fits (90,000 used before
    it), the fifth is a 429 that never reaches the origin; 50,000 in for a pass-through host:
    the second connection still fits, the third is closed at its ClientHello."""
    mark = len(net.origin_requests())
    statuses = [client.curl("-s", "-o", "/dev/null", "-w", "%{http_code}", "http://bulk.example.com/bytes?n=30000").stdout
                for _ in range(5)]  # fmt: skip
    assert statuses == ["200"] * 4 + ["429"]
    assert reached(net, mark, "bulk.example.com") == 4
    [spent] = proxy.wait_audit(1, kind="request", host="bulk.example.com", reason="budget")
    assert spent["status"] == 429 and "totalBytes in 100000 (used 120000) is spent" in spent["detail"]
    url = "https://passbulk.example.com/bytes?n=30000"
    for done in (1, 2):
        assert client.curl("-k", "-o", "/dev/null", url).returncode == 0
        proxy.wait_audit(done, kind="connection", host="passbulk.example.com", event="closed")
    refused = client.curl("-k", "-o", "/dev/null", url)
    assert refused.returncode != 0
    assert reached(net, mark, "passbulk.example.com") == 2
    [closed] = proxy.wait_audit(1, kind="connection", host="passbulk.example.com", reason="budget")
    assert closed["decision"] == "deny" and "totalBytes in 50000" in closed["detail"]
    used = re.search(
        r'sandgate_proxy_budget_bytes_total\{sandbox="sbx-budgeted",direction="in"\} (\d+)',
        proxy.control.metrics(),
    )
    assert used and int(used.group(1)) >= 4 * 30_000 + 2 * 30_000


def test_bytes_per_second_hold_for_requests_and_slow_a_passed_through_connection(
    proxy: RunningProxy, client: Client, net: Internet
) -> None:
    """HTTP: 20,000-byte answers under 50,000 bytes/s in; the origins' log shows one second's
    worth plus the rate over the load's duration (plus at most the one answer that went into
    debt). Pass-through: 400,000 bytes under 100,000 bytes/s take at least 3 s."""
    mark = len(net.origin_requests())
    rated = result(load(client, "ratehttp.example.com", "/bytes?n=20000"))
    delivered = 20_000 * reached(net, mark, "ratehttp.example.com")
    expected = BYTE_RATE + BYTE_RATE * rated["seconds"]
    assert abs(delivered - expected) <= expected * TOLERANCE + 20_000, (rated, delivered, expected)
    assert "bytesPerSecond in 50000/s is spent; retry in" in rated["refused"]["body"]["detail"]
    started = time.monotonic()
    fetched = client.curl(
        "-k", "-o", "/dev/null", "-w", "%{size_download}", "https://ratepass.example.com/bytes?n=400000"
    )
    took = time.monotonic() - started
    assert fetched.returncode == 0 and fetched.stdout == "400000", fetched.stderr
    assert took >= (400_000 - 2 * BYTE_RATE) / (2 * BYTE_RATE) * (1 - TOLERANCE), took
