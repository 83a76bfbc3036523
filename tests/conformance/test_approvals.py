"""Approvals end to end (policy `ask`), proven from the origin's side and the audit log.

A sandbox whose policy says `ask` for unknown names runs curl against the test internet: the
request waits (the origin has not seen it) and appears at once as pending; a reviewer approves
it for the sandbox in the console, in real Chromium, and the request completes; the next request
to that host needs no approval (the policy changed, with its own revision). A denied answer and
a timeout give the agent the usual 403 and the origin never sees the request. Answering an
approval that is no longer pending is a 404 that changes nothing.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.audit.browser import chromium, log_in, needs_chromium, new_page
from tests.conformance.conftest import API_HOST, PATCHED_HOST
from tests.support.audit import audit_records as every_record
from tests.support.cli import sandgate
from tests.support.internet import ORIGIN_V4, Internet
from tests.support.server import SandgateServer

pytestmark = [pytest.mark.root, needs_chromium]
ASKED = ["ask-one.example.com", "ask-two.example.com", "ask-three.example.com"]


def asking(timeout: int = 60) -> dict[str, Any]:
    return {
        "defaultAction": "ask",
        "askTimeout": timeout,
        "egress": [{"action": "allow", "target": API_HOST}],
    }


@pytest.fixture(scope="module")
def names(internet: Internet) -> Iterator[None]:
    internet.set_names({name: [ORIGIN_V4] for name in [API_HOST, PATCHED_HOST, *ASKED]})
    yield
    internet.set_names({API_HOST: [ORIGIN_V4], PATCHED_HOST: [ORIGIN_V4]})


def asking_sandbox(server: SandgateServer, timeout: int = 60) -> str:
    sandbox_id = server.create_sandbox()["id"]
    with server.client() as client:
        put = client.put(
            f"/v1/sandboxes/{sandbox_id}/egress/sandgate-policy", json={"policy": asking(timeout)}
        )
    assert put.status_code == 200, put.text
    return str(sandbox_id)


class Curl:
    """curl in the sandbox, in a thread: the call blocks while the proxy holds the request."""

    def __init__(self, server: SandgateServer, sandbox_id: str, url: str, insecure: bool = False) -> None:
        self.status: str | None = None
        command = f"curl -sS {'-k ' if insecure else ''}--max-time 90 -o /dev/null -w '%{{http_code}}' {url}"
        self.thread = threading.Thread(target=self._run, args=(server, sandbox_id, command), daemon=True)
        self.thread.start()

    def _run(self, server: SandgateServer, sandbox_id: str, command: str) -> None:
        self.status = server.run(sandbox_id, command, timeout=120).stdout.strip()

    def result(self, timeout: float = 60) -> str | None:
        self.thread.join(timeout)
        return self.status


def until[T](probe: Callable[[], T | None], what: str, timeout: float = 30) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (found := probe()) is not None:
            return found
        time.sleep(0.2)
    raise AssertionError(f"no {what} within {timeout} s")


def pending_for(server: SandgateServer, sandbox_id: str, path: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        with server.client() as client:
            held = client.get("/v1/approvals").json()
        return next((h for h in held if h["sandbox"] == sandbox_id and h["path"] == path), None)

    return until(probe, f"pending approval of {path}")


def origin_saw(internet: Internet, path: str) -> bool:
    return any(request["path"] == path for request in internet.origin_requests())


def request_record(server: SandgateServer, sandbox_id: str, path: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        for record in every_record(server.state_dir):
            if record["sandbox"] == sandbox_id and record["kind"] == "request" and record["path"] == path:
                return dict(record)
        return None

    return until(probe, f"request record of {path}")


def test_approved_in_the_console_for_the_sandbox(
    server: SandgateServer, internet: Internet, names: None
) -> None:
    sandbox_id = asking_sandbox(server)
    curl = Curl(server, sandbox_id, f"https://{ASKED[0]}/echo/approve-me")
    held = pending_for(server, sandbox_id, "/echo/approve-me")
    assert not origin_saw(internet, "/echo/approve-me")  # held before anything went upstream
    with chromium() as browser, new_page(browser) as page:
        log_in(page, server.base_url, server.api_key)
        page.goto(f"{server.base_url}/console/approvals")
        row = page.locator(f"tr[data-approval='{held['id']}']")
        assert ASKED[0] in row.inner_text()
        row.locator("button[value='allow-sandbox']").click()
        page.wait_for_url("**/console/approvals?done=*")
    assert curl.result() == "200"
    assert origin_saw(internet, "/echo/approve-me")
    record = request_record(server, sandbox_id, "/echo/approve-me")
    assert (record["decision"], record["reason"], record["detail"]) == (
        "allow",
        "approved",
        "approved by console",
    )
    # No approval needed now: the host is in the policy, passed through untouched (so curl meets
    # the origin's own certificate, from the test CA the sandbox does not hold: -k).
    second = Curl(server, sandbox_id, f"https://{ASKED[0]}/echo/second", insecure=True)
    assert second.result() == "200" and origin_saw(internet, "/echo/second")
    with server.client() as client:
        policy = client.get(f"/v1/sandboxes/{sandbox_id}/egress/sandgate-policy").json()
    assert policy["policy"]["egress"][0] == {"action": "allow", "target": ASKED[0]}


def test_denied_and_timed_out_requests_get_the_usual_refusal(
    server: SandgateServer, internet: Internet, names: None
) -> None:
    sandbox_id = asking_sandbox(server, timeout=3)
    denied = Curl(server, sandbox_id, f"https://{ASKED[1]}/echo/deny-me")
    held = pending_for(server, sandbox_id, "/echo/deny-me")
    with server.client() as client:
        answered = client.post(f"/v1/approvals/{held['id']}", json={"decision": "deny"})
    assert answered.status_code == 200, answered.text
    assert denied.result() == "403"
    assert request_record(server, sandbox_id, "/echo/deny-me")["reason"] == "approval-denied"
    timed_out = Curl(server, sandbox_id, f"https://{ASKED[1]}/echo/nobody-answers")
    assert timed_out.result() == "403"
    assert request_record(server, sandbox_id, "/echo/nobody-answers")["reason"] == "approval-timeout"
    assert not origin_saw(internet, "/echo/deny-me") and not origin_saw(internet, "/echo/nobody-answers")
    with server.client() as client:
        before = client.get(f"/v1/sandboxes/{sandbox_id}/egress/sandgate-policy").json()["revision"]
        late = client.post(f"/v1/approvals/{held['id']}", json={"decision": "allow-sandbox"})
        after = client.get(f"/v1/sandboxes/{sandbox_id}/egress/sandgate-policy").json()["revision"]
    assert late.status_code == 404 and "not pending" in late.text and before == after


def test_allow_once_from_the_cli_lets_one_request_through(
    server: SandgateServer, internet: Internet, names: None
) -> None:
    sandbox_id = asking_sandbox(server)
    once = Curl(server, sandbox_id, f"https://{ASKED[2]}/echo/once")
    held = pending_for(server, sandbox_id, "/echo/once")
    listed = sandgate("approvals", "list", "-o", "json", env=server.env())
    assert held["id"] in [item["id"] for item in json.loads(listed.stdout)], listed
    table = sandgate("approvals", env=server.env()).stdout
    assert held["id"] in table and f"GET https://{ASKED[2]}/echo/once" in table
    assert sandgate("approvals", "allow", held["id"], env=server.env()).returncode == 0
    assert once.result() == "200" and origin_saw(internet, "/echo/once")
    again = Curl(server, sandbox_id, f"https://{ASKED[2]}/echo/again")
    held_again = pending_for(server, sandbox_id, "/echo/again")  # asked again: allow-once changed no policy
    assert sandgate("approvals", "deny", held_again["id"], env=server.env()).returncode == 0
    assert again.result() == "403"
    gone = sandgate("approvals", "deny", held_again["id"], env=server.env())
    assert gone.returncode == 1 and "not pending" in gone.stderr
    events = [
        r for r in audit_records(server) if r["kind"] == "security_event" and r["sandbox"] == sandbox_id
    ]
    assert {held["id"], held_again["id"]} <= {r["detail"].split()[1] for r in events if r["event"] == "ask"}


def test_the_console_refuses_an_answer_without_the_sessions_csrf_token(
    server: SandgateServer, internet: Internet, names: None
) -> None:
    sandbox_id = asking_sandbox(server, timeout=5)
    waiting = Curl(server, sandbox_id, f"https://{ASKED[1]}/echo/forged")
    held = pending_for(server, sandbox_id, "/echo/forged")
    with httpx.Client(base_url=server.base_url) as browser:
        assert browser.post("/console/login", data={"key": server.api_key, "next": ""}).status_code == 303
        for csrf in ("", "0" * 64):
            forged = browser.post(
                f"/console/approvals/{held['id']}", data={"decision": "allow-sandbox", "csrf": csrf}
            )
            assert forged.status_code in (403, 422), forged.text
    assert pending_for(server, sandbox_id, "/echo/forged")["id"] == held["id"]  # still waiting, unanswered
    assert waiting.result() == "403" and not origin_saw(internet, "/echo/forged")  # then it timed out


def audit_records(server: SandgateServer) -> list[dict[str, Any]]:
    return every_record(server.state_dir)
