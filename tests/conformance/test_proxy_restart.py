"""No audit record is lost when the proxy restarts mid-load, and egress fails closed meanwhile.

From inside a real sandbox, a bounded load (300 requests, paced, then on until 10 in a row are
answered, at most 90 s) goes through the real proxy while the test kills the proxy child by PID
part-way through; the supervisor restarts it. Then every request that got an HTTP answer must
have exactly one request record, in the JSONL and in the index, and every request that got none
must have failed with the connection refused or cut (never reached the origin by another way).
Every request the origin saw has a record (the write-ahead line, proxy/auditing.py), and a record
beyond the answered ones is only of a request that got no answer and was not refused: one cut by
the kill (`incomplete`), or one the client gave up on (its 5 s timeout) while the proxy still
finished it.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sandgate.proxy import INCOMPLETE
from tests.conformance.conftest import API_HOST
from tests.support.internet import HOST_V4, ORIGIN_V4, Internet
from tests.support.server import CommandResult, SandgateServer

pytestmark = pytest.mark.root
REQUESTS = 300
RATE_PER_S = 20.0
BUDGET_S = 90.0
KILL_AFTER = 100  # records of this run seen in the log before the proxy is killed
SETTLED = 10  # answered requests in a row that end the load once REQUESTS are sent
# Runs inside the sandbox (stdlib only): one new connection per request, paced, bounded in time;
# prints {index: status or error class}. It sends `count` requests, and goes on past them (same
# pace) until `settled` in a row were answered: on a loaded machine the restart can outlast the
# load's nominal 15 s, and what comes after it is what this test is about. It connects to the
# origin's address (resolved once before the load) so a proxy outage shows as a refused
# connection, not a failed DNS lookup.
LOAD = """
import http.client, json, sys, time
host, address, run, count, rate, budget, settled = sys.argv[1:8]
count, rate, budget, settled = int(count), float(rate), float(budget), int(settled)
start = time.monotonic()
outcome = {}
i = streak = 0
while i < count or streak < settled:
    due = start + i / rate
    time.sleep(max(0.0, due - time.monotonic()))
    if time.monotonic() - start > budget:
        break
    conn = http.client.HTTPConnection(address, 80, timeout=5)
    try:
        conn.request("GET", f"/echo/{run}/{i}", headers={"Host": host})
        response = conn.getresponse()
        response.read()
        outcome[i] = response.status
    except (OSError, http.client.HTTPException) as exc:  # IncompleteRead: cut between head and body
        outcome[i] = type(exc).__name__
    finally:
        conn.close()
    streak = streak + 1 if isinstance(outcome[i], int) else 0
    i += 1
print(json.dumps(outcome))
"""
# What a request that got no whole HTTP answer may have failed with: refused while the proxy was
# down, cut or timed out when it was killed mid-request (IncompleteRead: after the answer's head,
# before its body; a CI run met it).
NO_ANSWER = {"ConnectionRefusedError", "ConnectionResetError", "RemoteDisconnected", "TimeoutError",
             "BrokenPipeError", "IncompleteRead"}  # fmt: skip


def run_records(lines: list[str], run: str) -> dict[str, dict[str, Any]]:
    """Request records of this run in JSONL lines by id, the last line of each (a forwarded
    request's write-ahead line and its whole record are one record)."""
    records: dict[str, dict[str, Any]] = {}
    for line in lines:
        if run in line:
            record = json.loads(line)
            if record["kind"] == "request":
                records[record["id"]] = record
    return records


def run_paths(lines: list[str], run: str) -> Counter[str]:
    """Request records of this run counted by path: one per id."""
    return Counter(record["path"] for record in run_records(lines, run).values())


def audit_lines(state_dir: Path) -> list[str]:
    lines: list[str] = []
    for path in sorted(state_dir.glob("audit.jsonl*")):
        lines += path.read_text().split("\n")  # not splitlines(): a record may hold U+0085
    return lines


def index_paths(server: SandgateServer, sandbox_id: str, run: str) -> Counter[str]:
    found: Counter[str] = Counter()
    cursor: str | None = None
    with server.client() as client:
        while True:
            params: dict[str, Any] = {"sandbox": sandbox_id, "kind": "request", "limit": 1000}
            if cursor:
                params["cursor"] = cursor
            page = client.get("/v1/audit", params=params).json()
            found.update(r["path"] for r in page["records"] if run in (r["path"] or ""))
            cursor = page["next_cursor"]
            if not cursor:
                return found


def wait_until(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except (LookupError, OSError):
            pass
        time.sleep(0.05)
    raise AssertionError(f"{what} within {timeout}s")


def test_no_record_lost_when_the_proxy_restarts_mid_load(server: SandgateServer, internet: Internet) -> None:
    sandbox_id = server.create_sandbox(
        networkPolicy={"defaultAction": "deny", "egress": [{"action": "allow", "target": API_HOST}]}
    )["id"]
    run = uuid.uuid4().hex[:12]
    script = base64.b64encode(LOAD.encode()).decode()
    command = (
        f"echo {script} | base64 -d > /tmp/load.py && "
        f"{sys.executable} /tmp/load.py {API_HOST} {ORIGIN_V4} {run} "
        f"{REQUESTS} {RATE_PER_S} {BUDGET_S} {SETTLED}"
    )
    result: list[CommandResult] = []
    load = threading.Thread(target=lambda: result.append(server.run(sandbox_id, command, BUDGET_S + 30)))
    try:
        load.start()
        wait_until(
            lambda: sum(run_paths(audit_lines(server.state_dir), run).values()) >= KILL_AFTER,
            60,
            f"{KILL_AFTER} records of the load did not appear",
        )
        killed = server.proxy_pid()
        os.kill(killed, signal.SIGKILL)
        restarted = wait_until(
            lambda: (pid := server.proxy_pid()) != killed and pid, 60, "the proxy was not restarted"
        )
        load.join(BUDGET_S + 40)
        assert not load.is_alive() and result, "the load did not finish"
        assert result[0].exit_code == 0, result[0].stderr
        outcome: dict[str, int | str] = json.loads(result[0].stdout)

        answered = {f"/echo/{run}/{i}" for i, status in outcome.items() if isinstance(status, int)}
        unanswered = {i: error for i, error in outcome.items() if not isinstance(error, int)}
        assert len(outcome) >= REQUESTS, f"only {len(outcome)} requests within the time budget"
        assert set(unanswered.values()) <= NO_ANSWER, unanswered
        refused = sum(error == "ConnectionRefusedError" for error in unanswered.values())
        assert refused > 0, "no request was refused while the proxy was down: not fail-closed?"
        after_kill = [int(i) for i, s in outcome.items() if isinstance(s, int) and int(i) > KILL_AFTER + 5]
        assert after_kill, "no request was answered after the restart"

        def log_complete() -> Counter[str] | None:
            found = run_paths(audit_lines(server.state_dir), run)
            return found if answered <= set(found) else None

        in_log = wait_until(log_complete, 10, "answered requests are missing from the audit log")
        assert all(in_log[path] == 1 for path in answered), {p: in_log[p] for p in answered if in_log[p] != 1}
        assert max(in_log.values()) == 1, "a request was recorded twice"
        from_origin = [r for r in internet.origin_requests() if run in str(r.get("path"))]
        unrecorded = {str(r["path"]) for r in from_origin} - set(in_log)
        assert not unrecorded, f"the origin saw requests that have no audit record: {sorted(unrecorded)}"
        not_refused = {
            f"/echo/{run}/{i}" for i, error in unanswered.items() if error != "ConnectionRefusedError"
        }
        unexplained = set(in_log) - answered - not_refused
        assert not unexplained, f"records of requests that were answered by nobody or refused: {unexplained}"
        incomplete = {
            r["path"]
            for r in run_records(audit_lines(server.state_dir), run).values()
            if r["event"] == INCOMPLETE
        }

        def index_matches() -> Counter[str] | None:
            found = index_paths(server, sandbox_id, run)
            return found if found == in_log else None

        in_index = wait_until(index_matches, 15, "the index does not hold exactly the log's records")

        assert from_origin and {str(r["client"]).rsplit(":", 1)[0] for r in from_origin} == {HOST_V4}
        print(
            f"\nproxy {killed} killed after {KILL_AFTER} records, restarted as {restarted}: "
            f"{len(answered)} answered, {refused} refused, {len(unanswered) - refused} cut or timed out; "
            f"{sum(in_index.values())} records, {len(incomplete)} incomplete"
        )
    finally:
        load.join(BUDGET_S + 40)
        with server.client() as client:
            client.delete(f"/v1/sandboxes/{sandbox_id}")
