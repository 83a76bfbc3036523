"""`sandgate serve` with two proxy workers (`proxy_workers = 2`), seen from inside a real sandbox:
its connections spread over both workers, and when one worker is killed mid-load nothing its
policy denies gets through, every answered request has exactly one audit record, and the pool
(not the supervisor) brings the worker back with the sandbox's entry."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandgate.proxy import ProxyControl
from tests.conformance.conftest import API_HOST, PATCHED_HOST
from tests.conformance.test_proxy_restart import NO_ANSWER, audit_lines, wait_until
from tests.support.internet import DNS_ADDR, ORIGIN_V4, Internet
from tests.support.server import CommandResult, SandgateServer, sandgate_server

pytestmark = pytest.mark.root
REQUESTS, RATE_PER_S, BUDGET_S = 160, 20.0, 40.0
KILL_AFTER_S = 3.0
# Inside the sandbox: one new connection per request, paced and bounded, alternating an allowed
# and a denied host; prints {index: "host status" or "host ErrorClass"}.
LOAD = """
import http.client, json, sys, time
hosts, address, run, count, rate, budget = sys.argv[1].split(","), *sys.argv[2:7]
count, rate, budget = int(count), float(rate), float(budget)
start, outcome = time.monotonic(), {}
for i in range(count):
    time.sleep(max(0.0, start + i / rate - time.monotonic()))
    if time.monotonic() - start > budget:
        break
    host = hosts[i % len(hosts)]
    conn = http.client.HTTPConnection(address, 80, timeout=5)
    try:
        conn.request("GET", f"/echo/{run}/{i}", headers={"Host": host})
        response = conn.getresponse()
        response.read()
        outcome[i] = f"{host} {response.status}"
    except OSError as exc:
        outcome[i] = f"{host} {type(exc).__name__}"
    finally:
        conn.close()
print(json.dumps(outcome))
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, internet: Internet) -> Iterator[SandgateServer]:
    extra = {
        "SANDGATE_UPSTREAM_DNS": json.dumps([DNS_ADDR]),
        "SANDGATE_UPSTREAM_CA": str(internet.ca_cert),
        "SANDGATE_PROXY_WORKERS": "2",
    }
    with sandgate_server(Path(tmp_path_factory.mktemp("sandgate-workers")), extra) as running:
        yield running


def workers(server: SandgateServer) -> list[dict[str, object]]:
    with ProxyControl(server.state_dir / "proxy.sock") as control:
        return control.health()["workers"]  # type: ignore[no-any-return]


def allowed_per_worker(server: SandgateServer) -> list[int]:
    counts = []
    for index in range(2):
        with ProxyControl(server.state_dir / f"proxy-worker-{index}.sock") as control:
            found = re.findall(
                r'decisions_total\{kind="request",action="allow",[^}]*\} (\d+)', control.metrics()
            )
            counts.append(sum(map(int, found)))
    return counts


def run_load(server: SandgateServer, sandbox_id: str, run: str, hosts: str, count: int) -> CommandResult:
    script = base64.b64encode(LOAD.encode()).decode()
    command = (
        f"echo {script} | base64 -d > /tmp/load.py && "
        f"{sys.executable} /tmp/load.py {hosts} {ORIGIN_V4} {run} {count} {RATE_PER_S} {BUDGET_S}"
    )
    return server.run(sandbox_id, command, BUDGET_S + 30)


def test_two_workers_spread_a_sandbox_and_fail_closed_when_one_dies(
    server: SandgateServer, internet: Internet
) -> None:
    sandbox_id = server.create_sandbox(
        networkPolicy={"defaultAction": "deny", "egress": [{"action": "allow", "target": API_HOST}]}
    )["id"]
    try:
        warmup = run_load(server, sandbox_id, uuid.uuid4().hex[:12], API_HOST, 30)
        assert set(json.loads(warmup.stdout).values()) == {f"{API_HOST} 200"}, warmup.stdout
        assert min(allowed_per_worker(server)) > 0, "one worker served every connection"

        pool, before = server.proxy_pid(), workers(server)
        run = uuid.uuid4().hex[:12]
        result: list[CommandResult] = []
        hosts = f"{API_HOST},{PATCHED_HOST}"
        load = threading.Thread(
            target=lambda: result.append(run_load(server, sandbox_id, run, hosts, REQUESTS))
        )
        load.start()
        time.sleep(KILL_AFTER_S)
        os.kill(int(str(before[1]["pid"])), signal.SIGKILL)
        load.join(BUDGET_S + 40)
        assert not load.is_alive() and result and result[0].exit_code == 0, result
        outcome: dict[str, str] = json.loads(result[0].stdout)
        assert len(outcome) == REQUESTS
        assert f"{PATCHED_HOST} 200" not in outcome.values(), outcome
        unanswered = {s.split(" ", 1)[1] for s in outcome.values() if not s.endswith(("200", "403"))}
        assert unanswered <= NO_ANSWER, unanswered
        reached = {
            str(r["path"]).rsplit("/", 1)[1] for r in internet.origin_requests() if run in str(r["path"])
        }
        assert reached and reached <= {i for i, s in outcome.items() if s.startswith(API_HOST)}

        after = wait_until(
            lambda: (w := workers(server))[1]["serving"] and w[1]["pid"] != before[1]["pid"] and w,
            30,
            "worker 1 did not come back",
        )
        assert after[1]["restarts"] == 1 and after[0]["pid"] == before[0]["pid"]
        assert server.proxy_pid() == pool, "the supervisor restarted the whole proxy"

        answered = {f"/echo/{run}/{i}" for i, s in outcome.items() if s.endswith(("200", "403"))}

        def recorded() -> Counter[str] | None:
            paths: dict[str, str] = {}  # one record per id: a write-ahead line and its whole one
            for line in audit_lines(server.state_dir):
                if run in line and (record := json.loads(line))["kind"] == "request":
                    paths[record["id"]] = record["path"]
            found = Counter(paths.values())
            return found if answered <= set(found) else None

        in_log = wait_until(recorded, 15, "answered requests are missing from the audit log")
        assert all(in_log[path] == 1 for path in answered), "a request recorded twice"
        print(f"\nworker {before[1]['pid']} killed -> {after[1]['pid']}: {dict(Counter(outcome.values()))}")
    finally:
        with server.client() as client:
            client.delete(f"/v1/sandboxes/{sandbox_id}")
