"""The reviewer's console against the REAL server with REAL traffic, in headless Chromium.

A sandbox is created through the API with a policy and a credential vault; from inside it, curl
makes allowed, injected and denied requests to the test internet; its egress policy is patched.
Then the console must show what a reviewer looks for: the sandbox with its live policy, the
requests with decisions and reasons, the per-sandbox summary (top hosts, denials by reason,
injections by binding) and the diff of the patch. Screenshots go to $SANDGATE_SCREENSHOTS.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.audit.browser import chromium, log_in, needs_chromium, new_page, screenshot_dir
from tests.conformance.conftest import API_HOST, PATCHED_HOST
from tests.support.internet import ORIGIN_V4
from tests.support.server import SandgateServer

pytestmark = [pytest.mark.root, needs_chromium]
POLICY = {
    "defaultAction": "deny",
    "egress": [{"action": "allow", "target": API_HOST}, {"action": "deny", "target": "ads.example.com"}],
}
VAULT = {
    "credentials": [{"name": "api-token", "source": {"type": "inline", "value": "console-secret-42"}}],
    "bindings": [
        {"name": "api", "match": {"hosts": [API_HOST]}, "auth": {"type": "bearer", "credential": "api-token"}}
    ],
}


def curl(url: str, resolve: str | None = None) -> str:
    """A curl that prints only the status code (000 when no HTTP answer came)."""
    pin = f"--resolve {resolve}:80:{ORIGIN_V4} " if resolve else ""
    return f"curl -sS --http1.1 --max-time 10 -o /dev/null -w '%{{http_code}}\\n' {pin}{url}"


def statuses(server: SandgateServer, sandbox_id: str, *commands: str) -> list[str]:
    result = server.run(sandbox_id, " ; ".join(commands))
    return result.stdout.split()


EXPECTED = {  # (host, decision, status) of the fixture's requests
    (API_HOST, "allow", 200),
    ("blocked.example.com", "deny", 403),
    ("ads.example.com", "deny", 403),
    (PATCHED_HOST, "deny", 403),
    (PATCHED_HOST, "allow", 200),
}


def outcomes(records: list[dict[str, Any]]) -> set[tuple[str, str, int | None]]:
    return {(r["host"], r["decision"], r["status"]) for r in records if r["kind"] == "request"}


def wait_for_records(server: SandgateServer, sandbox_id: str, done: Any, timeout: float = 15.0) -> list[Any]:
    deadline = time.monotonic() + timeout
    records: list[dict[str, Any]] = []
    with server.client() as client:
        while time.monotonic() < deadline:
            records = client.get("/v1/audit", params={"sandbox": sandbox_id, "limit": 1000}).json()["records"]
            if done(records):
                return records
            time.sleep(0.2)
    raise AssertionError(f"the audit index did not get the expected records in {timeout}s: {records}")


@pytest.fixture(scope="module")
def traffic(server: SandgateServer) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A sandbox that made real requests and had its policy patched; yields (id, its records)."""
    sandbox_id = server.create_sandbox(networkPolicy=POLICY)["id"]
    try:
        with server.client() as client:
            egress = client.get(f"/v1/sandboxes/{sandbox_id}/endpoints/18080").json()
        base, headers = f"http://{egress['endpoint']}", egress["headers"]
        assert httpx.post(f"{base}/credential-vault", json=VAULT, headers=headers).status_code == 201
        before = statuses(
            server,
            sandbox_id,
            curl(f"http://{API_HOST}/"),
            curl(f"https://{API_HOST}/echo"),
            curl("http://blocked.example.com/", resolve="blocked.example.com"),
            curl("http://ads.example.com/", resolve="ads.example.com"),
            curl(f"http://{PATCHED_HOST}/", resolve=PATCHED_HOST),
        )
        assert before == ["200", "200", "403", "403", "403"]
        patch = [{"action": "allow", "target": PATCHED_HOST}]
        assert httpx.patch(f"{base}/policy", json=patch, headers=headers).status_code == 200
        after = statuses(server, sandbox_id, curl(f"http://{PATCHED_HOST}/", resolve=PATCHED_HOST))
        assert after == ["200"]

        def complete(records: list[dict[str, Any]]) -> bool:
            # each request's finished record, not a count: a forwarded request's row is its
            # write-ahead line (`incomplete`, no status) until its whole line is indexed
            changes = [r for r in records if r["kind"] == "policy_change"]
            return outcomes(records) >= EXPECTED and any(r["reason"] == "policy patch" for r in changes)

        yield sandbox_id, wait_for_records(server, sandbox_id, complete)
    finally:
        with server.client() as client:
            client.delete(f"/v1/sandboxes/{sandbox_id}")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as instance:
        yield instance


@pytest.fixture
def page(browser: Any, server: SandgateServer) -> Iterator[Any]:
    with new_page(browser) as tab:
        log_in(tab, server.base_url, server.api_key)
        tab.wait_for_selector("h1:has-text('Sandboxes')")
        yield tab


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return screenshot_dir(tmp_path_factory)


def test_the_records_are_what_happened(traffic: tuple[str, list[dict[str, Any]]]) -> None:
    """The facts the console pages are checked against: one request record per curl."""
    _, records = traffic
    assert outcomes(records) >= EXPECTED
    injected = [r for r in records if r["kind"] == "request" and r["binding"]]
    assert [(r["host"], r["binding"], r["scheme"]) for r in injected] == [(API_HOST, "api", "https")]
    assert "console-secret-42" not in str(records)


def test_sandbox_page_shows_live_policy_and_summary(
    page: Any, traffic: tuple[str, list[dict[str, Any]]], shots: Path
) -> None:
    sandbox_id, records = traffic
    row = page.locator("table.sandboxes tbody tr", has_text=sandbox_id)
    assert "Running" in row.inner_text() and "api" in row.locator(".binding").all_inner_texts()
    page.screenshot(path=shots / "live-overview.png", full_page=True)

    row.locator(f"a:text-is('{sandbox_id}')").click()
    page.wait_for_selector(f"h1:has-text('Sandbox {sandbox_id}')")
    policy = page.inner_text("pre.policy-doc")
    for target in (API_HOST, "ads.example.com", PATCHED_HOST):
        assert target in policy
    hosts = page.locator(".hosts tbody tr td:first-child").all_inner_texts()
    assert hosts[0] == API_HOST and {"blocked.example.com", "ads.example.com"} <= set(hosts)
    reasons = page.locator(".reasons").inner_text()
    deny_reasons = {r["reason"] for r in records if r["kind"] == "request" and r["decision"] == "deny"}
    assert len(deny_reasons) >= 2  # the explicit deny rule and the default deny read differently
    for reason in deny_reasons:
        assert reason in reasons
    assert f"api -> {API_HOST}" in page.locator(".bindings").inner_text().replace("→", "->")
    denials = page.locator("table.records tbody tr").all_inner_texts()
    assert any("blocked.example.com" in line and "deny" in line for line in denials)
    page.screenshot(path=shots / "live-sandbox.png", full_page=True)


def test_feed_shows_requests_with_decisions_and_reasons(
    page: Any, server: SandgateServer, traffic: tuple[str, list[dict[str, Any]]], shots: Path
) -> None:
    sandbox_id, records = traffic
    page.goto(f"{server.base_url}/console/feed?sandbox={sandbox_id}&kind=request")
    for record in (r for r in records if r["kind"] == "request"):
        row = page.locator(f"#feed tbody tr[data-id='{record['id']}']")
        assert row.locator(".badge").inner_text() == record["decision"]
        assert row.locator(".reason").inner_text() == record["reason"]
        assert record["host"] in row.locator(".req").inner_text()
    page.screenshot(path=shots / "live-feed.png", full_page=True)


def test_diff_of_the_patch(
    page: Any, server: SandgateServer, traffic: tuple[str, list[dict[str, Any]]], shots: Path
) -> None:
    sandbox_id, _ = traffic
    page.goto(f"{server.base_url}/console/sandboxes/{sandbox_id}")
    page.click(".changes li:has-text('policy patch') a")
    page.wait_for_selector("pre.diff")
    added = page.locator(".d-add").all_inner_texts()
    removed = page.locator(".d-del").all_inner_texts()
    assert any(PATCHED_HOST in line for line in added), added
    assert not any("example.com" in line for line in removed), removed  # a patch only adds here
    facts = page.inner_text("dl.facts")
    assert "egress-token" in facts and "policy patch" in facts
    page.screenshot(path=shots / "live-diff.png", full_page=True)
