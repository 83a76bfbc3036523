"""The worker pool (proxy/workers.py) with two real workers: a sandbox's connections spread over
both, a policy push reaches both, the one audit stream has a whole line for every request under
concurrent load, `/metrics` is their sum, and a worker killed mid-run lets nothing through that
its policy denies and comes back holding every entry."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandgate.proxy import INCOMPLETE, ProxyControl, SandboxEntry
from sandgate.proxy.contract.config import ConnectionLimits
from sandgate.proxy.workers import worker_socket
from tests.proxy.conftest import CLIENT_ADDR, Client, RunningProxy, start_proxy, stop_proxy
from tests.proxy.test_dns import SAME_PORT
from tests.support.internet import ORIGIN_V4, Internet

pytestmark = pytest.mark.root

ALLOWED, DENIED = "plain.example.com", "other.example.com"
POLICY = {"defaultAction": "deny", "egress": [{"action": "allow", "target": ALLOWED}]}
SANDBOX = "sbx-workers"
AUDIT_MAX_BYTES = 16_384  # small: the concurrent-load test rotates the file many times

# REQUESTS requests for the HOSTS in turn, each on a new connection to the origin's address
# (nftables sends it to the proxy); stops early after SECONDS. Prints {"host status": count}.
LOAD = """
import http.client, json, time
tally, started = {}, time.monotonic()
for i in range(REQUESTS):
    if time.monotonic() - started > SECONDS:
        break
    host = HOSTS[i % len(HOSTS)]
    conn = http.client.HTTPConnection(ORIGIN, 80, timeout=TIMEOUT)
    try:
        conn.request("GET", "/", headers={"Host": host, "Connection": "close"})
        key = f"{host} {conn.getresponse().status}"
    except (OSError, http.client.HTTPException):
        key = f"{host} error"
    finally:
        conn.close()
    tally[key] = tally.get(key, 0) + 1
print(json.dumps(tally), flush=True)
"""


# The load here is 4 clients opening connections back to back, faster than the default accept
# rate (divided among the workers) on an idle machine: fairness would reset some of them, which
# is tests/proxy/test_fairness.py's subject, not this file's.
UNLIMITED = ConnectionLimits(max_connections=10_000, accept_rate=100_000, accept_burst=100_000)


def entry(policy: dict[str, Any] = POLICY) -> SandboxEntry:
    return SandboxEntry(sandbox_id=SANDBOX, address=CLIENT_ADDR, policy=policy, limits=UNLIMITED)


@pytest.fixture(scope="module")
def proxy(net: Internet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    net.set_names({ALLOWED: [ORIGIN_V4], DENIED: [ORIGIN_V4]})
    state_dir = tmp_path_factory.mktemp("proxy")
    running = start_proxy(
        state_dir, net, [entry()], workers=2, audit_max_bytes=AUDIT_MAX_BYTES, audit_backups=1000
    )
    try:
        yield running
    finally:
        pids = worker_pids(running)
        stop_proxy(running)
        for pid in pids:  # they die with the pool; make sure
            assert not Path(f"/proc/{pid}").exists() or _zombie(pid), f"worker {pid} outlived the pool"


def _zombie(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


def worker_pids(proxy: RunningProxy) -> list[int]:
    return [w["pid"] for w in proxy.control.health()["workers"]]


def load(
    client: Client, requests: int, hosts: tuple[str, ...], seconds: float = 60, timeout: float = 10
) -> subprocess.Popen[str]:
    """`timeout` per request: a request cut short by the client may still be recorded later."""
    values = f"{ORIGIN_V4!r}, {requests}, {hosts!r}, {seconds}, {timeout}"
    code = f"ORIGIN, REQUESTS, HOSTS, SECONDS, TIMEOUT = {values}\n" + LOAD
    return client.ns.popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)  # type: ignore[return-value]


def tally(process: subprocess.Popen[str], timeout: float = 60) -> dict[str, int]:
    out, _ = process.communicate(timeout=timeout)
    return json.loads(out)  # type: ignore[no-any-return]


def request_decisions(proxy: RunningProxy, index: int) -> dict[str, int]:
    """Worker `index`'s own request decisions by action, from its own control socket."""
    with ProxyControl(worker_socket(proxy.config, index)) as control:
        return decisions(control.metrics())


def decisions(metrics: str) -> dict[str, int]:
    found: dict[str, int] = {}
    for action, count in re.findall(r'decisions_total\{kind="request",action="(\w+)",[^}]*\} (\d+)', metrics):
        found[action] = found.get(action, 0) + int(count)
    return found


def audit_lines(proxy: RunningProxy) -> list[str]:
    files = proxy.config.state_dir.glob("audit.jsonl*")
    return [line for path in files for line in path.read_text().splitlines()]


def request_records(proxy: RunningProxy, event: str | None = None) -> list[dict[str, Any]]:
    """Whole request records (`event` None), or the write-ahead lines (`INCOMPLETE`)."""
    lines = map(json.loads, audit_lines(proxy))
    return [r for r in lines if r["kind"] == "request" and r.get("event") == event]


def wait_records(proxy: RunningProxy, count: int, timeout: float = 10) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while len(found := request_records(proxy)) < count and time.monotonic() < deadline:
        time.sleep(0.1)
    return found


def test_a_sandboxs_connections_spread_over_both_workers_and_metrics_are_their_sum(
    proxy: RunningProxy, client: Client
) -> None:
    before = [request_decisions(proxy, i).get("allow", 0) for i in (0, 1)]
    assert tally(load(client, 40, (ALLOWED,))) == {f"{ALLOWED} 200": 40}
    served = [request_decisions(proxy, i).get("allow", 0) - before[i] for i in (0, 1)]
    assert sum(served) == 40
    assert min(served) > 0, f"one worker served every connection: {served}"
    total = decisions(proxy.control.metrics())  # the pool's /metrics
    assert total["allow"] == sum(request_decisions(proxy, i)["allow"] for i in (0, 1))
    assert 'sandgate_proxy_workers{state="serving"} 2' in proxy.control.metrics()


def test_a_policy_push_reaches_every_worker(proxy: RunningProxy, client: Client) -> None:
    denying = {"defaultAction": "deny", "egress": [{"action": "allow", "target": DENIED}]}
    try:
        proxy.control.put_sandbox(entry(denying))
        before = [request_decisions(proxy, i).get("deny", 0) for i in (0, 1)]
        assert tally(load(client, 30, (ALLOWED,))) == {f"{ALLOWED} 403": 30}
        denied = [request_decisions(proxy, i).get("deny", 0) - before[i] for i in (0, 1)]
        assert min(denied) > 0 and sum(denied) == 30, f"denials per worker: {denied}"
        for index in (0, 1):
            with ProxyControl(worker_socket(proxy.config, index)) as control:
                assert control.list() == [entry(denying)]
    finally:
        proxy.control.put_sandbox(entry())


def test_a_policy_every_worker_rejects_is_422_and_changes_nothing(proxy: RunningProxy) -> None:
    bad = {"defaultAction": "deny", "egress": [{"action": "allow"}]}
    assert proxy.put_raw(SANDBOX, CLIENT_ADDR, bad) == 422
    assert proxy.control.list() == [entry()]
    for index in (0, 1):
        socket = worker_socket(proxy.config, index)
        assert proxy.put_raw(SANDBOX, CLIENT_ADDR, bad, socket) == 422  # a worker refuses it alike
        with ProxyControl(socket) as control:
            assert control.list() == [entry()]


def test_one_audit_stream_has_a_whole_line_for_every_request_under_concurrent_load(
    proxy: RunningProxy, client: Client
) -> None:
    before = Counter((r["host"], r["decision"]) for r in request_records(proxy))
    clients = [load(client, 100, (ALLOWED, DENIED), seconds=120, timeout=60) for _ in range(4)]
    outcomes = [tally(process, timeout=180) for process in clients]
    made = sum(sum(outcome.values()) for outcome in outcomes)
    assert made == 400 and not [o for o in outcomes if any(key.endswith("error") for key in o)], outcomes
    records = wait_records(proxy, before.total() + made, timeout=30)
    assert len(records) == before.total() + made  # every line parsed (json.loads), none missing, none extra
    assert len(list(proxy.config.state_dir.glob("audit.jsonl.*"))) > 3  # it rotated under the load
    new = Counter((r["host"], r["decision"]) for r in records) - before
    assert new == {(ALLOWED, "allow"): 200, (DENIED, "deny"): 200}
    ahead = [r["id"] for r in request_records(proxy, INCOMPLETE)]
    forwarded = [r["id"] for r in records if r["decision"] == "allow"]
    assert sorted(ahead) == sorted(forwarded)  # each forwarded request written ahead once, refusals never


def test_a_killed_worker_lets_nothing_through_and_comes_back_with_every_entry(
    proxy: RunningProxy, client: Client
) -> None:
    pids = worker_pids(proxy)
    running = load(client, 400, (ALLOWED, DENIED), seconds=8)
    time.sleep(1.0)
    os.kill(pids[1], signal.SIGKILL)
    outcome = tally(running)
    assert outcome.get(f"{DENIED} 200", 0) == 0, outcome
    assert set(outcome) <= {f"{ALLOWED} 200", f"{ALLOWED} error", f"{DENIED} 403", f"{DENIED} error"}, outcome
    deadline = time.monotonic() + 30
    while True:
        workers = proxy.control.health()["workers"]
        if workers[1]["pid"] != pids[1] and workers[1]["serving"]:
            break
        assert time.monotonic() < deadline, f"worker 1 did not come back: {workers}"
        time.sleep(0.2)
    assert workers[1]["restarts"] == 1 and workers[0]["pid"] == pids[0]
    with ProxyControl(worker_socket(proxy.config, 1)) as control:
        assert control.list() == [entry()]  # replayed before it served
    before = request_decisions(proxy, 1)
    assert tally(load(client, 40, (ALLOWED, DENIED))) == {f"{ALLOWED} 200": 20, f"{DENIED} 403": 20}
    after = request_decisions(proxy, 1)
    assert after.get("allow", 0) > before.get("allow", 0) and after.get("deny", 0) > before.get("deny", 0)
    assert "sandgate_proxy_worker_restarts_total 1" in proxy.control.metrics()


def test_the_pools_dns_answers_a_client_that_asks_again_from_the_same_port(
    proxy: RunningProxy, client: Client
) -> None:
    """The pool serves DNS in a process of its own (proxy/pooldns.py): the same 21 s idle gap on
    one UDP socket as tests/proxy/test_dns.py's single-process case."""
    result = client.run([sys.executable, "-c", SAME_PORT, "21", ALLOWED], timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [[True, [ORIGIN_V4]], [True, [ORIGIN_V4]]]
