"""A sandbox's budgets through the whole server: the policy a client puts is the one the proxy
enforces (the sandbox-wide budget was once lost between the two: `to_document` left it out, and
only the proxy's own tests, which hand it a dict, saw budgets work). Proven from the origin's log
and the audit file, not from the server's answer."""

from __future__ import annotations

import math
import secrets
import time

from tests.conformance.conftest import API_HOST, set_policy
from tests.support.audit import audit_records
from tests.support.internet import Internet
from tests.support.server import SandgateServer

RATE, BURST, TRIES = 0.5, 3, 10


def test_a_sandbox_budget_put_through_the_api_holds_at_the_proxy(
    server: SandgateServer, internet: Internet
) -> None:
    sandbox_id = server.create_sandbox()["id"]
    path = f"/budget-{secrets.token_hex(4)}"
    try:
        egress = [{"action": "allow", "target": API_HOST}]
        budgets = {"requestsPerSecond": RATE, "burst": BURST}
        set_policy(
            server, sandbox_id, {"version": 1, "defaultAction": "deny", "budgets": budgets, "egress": egress}
        )
        curl = f"curl -s -o /dev/null -w '%{{http_code}} ' --max-time 10 http://{API_HOST}{path}"
        loop = f"for i in $(seq {TRIES}); do {curl}; done"
        started = time.monotonic()
        statuses = server.run(sandbox_id, loop, timeout=180).stdout.split()
        elapsed = time.monotonic() - started
        reached = [r for r in internet.origin_requests() if r["path"] == path]
        answered = [status for status in statuses if status != "429"]  # the origin's answer: 404
        assert len(statuses) == TRIES and "000" not in statuses, statuses
        assert len(answered) == len(reached)  # every answer not a 429 came from the origin
        assert BURST <= len(reached) <= BURST + math.ceil(RATE * elapsed), (statuses, elapsed)
        records = audit_records(server.state_dir, sandbox_id)
        refused = [
            r
            for r in records
            if r["sandbox"] == sandbox_id and r.get("path") == path and r["reason"] == "budget"
        ]
        assert len(refused) == statuses.count("429") > 0
    finally:
        with server.client() as api:
            api.delete(f"/v1/sandboxes/{sandbox_id}")
