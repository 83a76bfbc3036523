"""A held request (`action: ask`) whose client leaves before anyone answers: its hold ends at
once in its request record (`approval-client-gone`, naming the approval), a reviewer's later
answer is a 404 (nothing is held any more, nothing changes), and its askTimeout passing adds
nothing; the origin never sees it, over plain HTTP and intercepted HTTPS. Proven from the audit
file and the origin's log."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sandgate.proxy import SandboxEntry
from tests.proxy.conftest import CLIENT_ADDR, Client, RunningProxy, start_proxy, stop_proxy
from tests.support.internet import ORIGIN_V4, Internet

pytestmark = pytest.mark.root

ASK_TIMEOUT = 4
HOST = "ask.example.com"
POLICY = {"defaultAction": "ask", "askTimeout": ASK_TIMEOUT, "egress": []}
# Send one request, then wait for a line on stdin (the test's "the proxy holds it"), then leave.
LEAVER = f"""
import socket, sys
sock = socket.create_connection(({ORIGIN_V4!r}, 80), timeout=30)
sock.sendall(b"GET " + sys.argv[1].encode() + b" HTTP/1.1\\r\\nHost: {HOST}\\r\\n\\r\\n")
sys.stdin.readline()
sock.close()
"""


@pytest.fixture(scope="module")
def proxy(net: Internet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    net.set_names({HOST: [ORIGIN_V4]})
    entry = SandboxEntry(sandbox_id="sbx-leaver", address=CLIENT_ADDR, policy=POLICY)
    running = start_proxy(tmp_path_factory.mktemp("proxy"), net, [entry])
    yield running  # pytest runs the rest at teardown, whether the tests passed or not
    stop_proxy(running)


def until[T](probe: Callable[[], T | None], what: str, timeout: float = 30) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (found := probe()) is not None:
            return found
        time.sleep(0.1)
    raise AssertionError(f"no {what} within {timeout} s")


def held(proxy: RunningProxy, path: str) -> dict[str, Any]:
    return until(
        lambda: next((h for h in proxy.control.approvals() if h["path"] == path), None),
        f"held request {path}",
    )


def held_then_left(proxy: RunningProxy, client: Client, path: str) -> str:
    """Send a request that gets held, close its connection; the approval id."""
    leaver = client.ns.popen([sys.executable, "-c", LEAVER, path], stdin=subprocess.PIPE)
    try:
        approval_id = str(held(proxy, path)["id"])
        assert leaver.stdin is not None
        leaver.stdin.write(b"go\n")
        leaver.stdin.close()
        assert leaver.wait(20) == 0
    finally:
        if leaver.poll() is None:
            leaver.kill()
            leaver.wait(5)
    return approval_id


def final_record(proxy: RunningProxy, path: str, timeout: float = 30) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        ended = [r for r in proxy.audit() if r["kind"] == "request" and r.get("path") == path]
        return ended[0] if ended else None

    return until(probe, f"final record of {path}", timeout)


def assert_client_gone(record: dict[str, Any], approval_id: str) -> None:
    assert (record["sandbox"], record["decision"], record["reason"]) == (
        "sbx-leaver",
        "deny",
        "approval-client-gone",
    )
    assert record["detail"] == f"approval {approval_id}: the client went away before an answer", record


def records_of(proxy: RunningProxy, path: str, approval_id: str) -> list[dict[str, Any]]:
    """The `ask` security_event and every request record of `path`, as written (no line merged)."""
    return [
        r
        for r in proxy.audit_lines()
        if (r["kind"] == "request" and r.get("path") == path) or approval_id in str(r.get("detail"))
    ]


def test_a_reviewers_later_answer_finds_nothing_held(
    proxy: RunningProxy, client: Client, net: Internet
) -> None:
    path = "/echo/left-before-allow"
    approval_id = held_then_left(proxy, client, path)
    assert_client_gone(final_record(proxy, path, timeout=ASK_TIMEOUT - 1), approval_id)  # before the timeout
    assert approval_id not in [h["id"] for h in proxy.control.approvals()]
    assert proxy.control.answer_approval(approval_id, True, "reviewer-1") is False  # 404: not held
    assert not any(r["path"] == path for r in net.origin_requests())
    written = records_of(proxy, path, approval_id)
    assert [(r["kind"], r["reason"]) for r in written] == [
        ("security_event", "ask"),
        ("request", "approval-client-gone"),
    ]


def test_over_https_the_timeout_adds_nothing(proxy: RunningProxy, client: Client, net: Internet) -> None:
    path = "/echo/left-https"
    curl = client.ns.popen(["curl", "-sS", "--cacert", str(proxy.ca_cert), f"https://{HOST}{path}"])
    try:
        waiting = held(proxy, path)
    finally:
        curl.kill()  # the agent gives up while its request is held
        curl.wait(5)
    assert_client_gone(final_record(proxy, path, timeout=ASK_TIMEOUT - 1), waiting["id"])
    until(lambda: True if time.time() > waiting["expires_at"] + 2 else None, "askTimeout to pass")
    assert not any(r["path"] == path for r in net.origin_requests())
    written = records_of(proxy, path, waiting["id"])
    assert [(r["kind"], r["reason"]) for r in written] == [
        ("security_event", "ask"),
        ("request", "approval-client-gone"),
    ]
