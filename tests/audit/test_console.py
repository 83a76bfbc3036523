"""The console in real headless Chromium (Debian's package, driven by Playwright) against a
running uvicorn server: what a reviewer looks for, including that untrusted record text stays text.

Screenshots go to $SANDGATE_SCREENSHOTS (default: the test's temp dir) for a human to look at.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from sandgate.lifecycle.audit import LABELS
from tests.audit.browser import chromium, needs_chromium, new_page, screenshot_dir
from tests.audit.browser import log_in as login
from tests.audit.conftest import API_KEY, Served, generated, serve, wait_indexed, write_records

pytestmark = needs_chromium

OLD_POLICY = {
    "egress": [
        {"action": "allow", "target": "api0.example.com"},
        {"action": "allow", "target": "old.example.com"},
    ],
    "bindings": [{"name": "github-token", "hosts": ["github.example.com"]}],
}
NEW_POLICY = {
    "egress": [
        {"action": "allow", "target": "api0.example.com"},
        {"action": "allow", "target": "pypi.example.test", "methods": ["GET"]},
    ],
    "bindings": [
        {"name": "github-token", "hosts": ["github.example.com"]},
        {"name": "model-key", "hosts": ["api0.example.com"]},
    ],
}
XSS_PATH = '/<script>window.__xss=1</script><img src=x onerror="window.__xss=2">'
# A path with terminal and bidi controls: shown escaped, as `sandgate logs` shows it.
CONTROL_PATH = "/a\nb\x1b]0;t\x07\u202eexe.txt"
CONTROL_SHOWN = "/a\\nb\\x1b]0;t\\x07\\u202eexe.txt"


def special_records() -> list[dict[str, Any]]:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    base = generated(1, seed=99)[0] | {"ts": now, "sandbox": "sbx-0000"}
    change = base | {
        "id": "change-1",
        "kind": "policy_change",
        "decision": "allow",
        "reason": "policy replaced via API",
        "method": None,
        "path": None,
        "status": None,
        "binding": None,
        "rule": None,
        "detail": json.dumps(
            {
                "actor": "api-key",
                "revision": 2,
                "old_digest": "sha256:aaa111",
                "new_digest": "sha256:bbb222",
                "old": OLD_POLICY,
                "new": NEW_POLICY,
            }
        ),
    }
    hostile = base | {
        "id": "hostile-1",
        "kind": "request",
        "decision": "deny",
        "method": "GET",
        "host": "evil.example.com",
        "path": XSS_PATH,
        "reason": "no rule matched <b>bold</b>",
        "binding": None,
        "status": 403,
        "sandbox": "sbx-0001",
    }
    controls = hostile | {"id": "controls-1", "path": CONTROL_PATH}
    return [change, hostile, controls]


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, list[dict[str, Any]]]]:
    state = tmp_path_factory.mktemp("console-state")
    records = generated(500, sandboxes=4) + special_records()
    write_records(state, records)
    sandboxes = [
        {
            "id": f"sbx-000{n}",
            "status": "Running",
            "address": f"10.213.0.{4 * n + 2}",
            "policy": NEW_POLICY if n == 0 else OLD_POLICY,
        }
        for n in range(4)
    ]
    with serve(state, sandboxes) as running:
        wait_indexed(running.store, len(records))
        yield running, records


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as instance:
        yield instance


@pytest.fixture
def page(browser: Any, console: tuple[Served, list[dict[str, Any]]]) -> Iterator[Any]:
    with new_page(browser) as tab:
        yield tab


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return screenshot_dir(tmp_path_factory)


def log_in(page: Any, url: str, key: str = API_KEY) -> None:
    login(page, url, key)


def test_login_is_required_and_sets_an_httponly_cookie(
    page: Any, console: tuple[Served, Any], shots: Path
) -> None:
    served, _ = console
    page.goto(served.url + "/console/feed?decision=deny")
    assert "/console/login" in page.url
    page.screenshot(path=shots / "login.png")
    log_in(page, served.url, key="wrong-key")
    assert "not this server's API key" in page.inner_text(".error")
    page.fill("input[name=key]", API_KEY)
    page.click("button[type=submit]")
    page.wait_for_selector("h1:has-text('Sandboxes')")
    cookie = next(c for c in page.context.cookies() if c["name"] == "sandgate_console")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"


def test_overview_and_what_sandbox_x_reached(
    page: Any, console: tuple[Served, list[dict[str, Any]]], shots: Path
) -> None:
    served, records = console
    log_in(page, served.url)
    rows = page.locator("table.sandboxes tbody tr")
    assert rows.count() == 4
    day = [r for r in records if r["sandbox"] == "sbx-0001"]
    row = page.locator("table.sandboxes tbody tr", has_text="sbx-0001")
    cells = row.locator("td").all_inner_texts()
    assert cells[5] == str(len(day)) and cells[6] == str(sum(r["decision"] == "deny" for r in day))
    page.screenshot(path=shots / "overview.png", full_page=True)

    page.click("table.sandboxes >> text=sbx-0000")
    page.wait_for_selector("h1:has-text('Sandbox sbx-0000')")
    mine = [r for r in records if r["sandbox"] == "sbx-0000"]
    top_host, _ = Counter(r["host"] for r in mine if r["host"]).most_common(1)[0]
    assert page.locator(".hosts tbody tr").first.locator("td").first.inner_text() == top_host
    reasons = page.locator(".reasons").inner_text()
    for reason in {r["reason"] for r in mine if r["decision"] == "deny"}:
        assert reason in reasons
    bindings = page.locator(".bindings").inner_text()
    for binding in {r["binding"] for r in mine if r["binding"]}:
        assert binding in bindings
    assert "pypi.example.test" in page.inner_text("pre.policy-doc")
    page.screenshot(path=shots / "sandbox.png", full_page=True)


def test_feed_filters_denials_and_goes_live(
    page: Any, console: tuple[Served, list[dict[str, Any]]], shots: Path
) -> None:
    served, records = console
    log_in(page, served.url)
    page.click("nav >> text=Request feed")
    page.fill("input[name=sandbox]", "sbx-0002")
    page.select_option("select[name=decision]", "deny")
    page.click("form.filters button[type=submit]")
    page.wait_for_url("**decision=deny**")
    expected = [r for r in records if r["sandbox"] == "sbx-0002" and r["decision"] == "deny"]
    badges = page.locator("#feed tbody .badge").all_inner_texts()
    assert badges and set(badges) == {"deny"} and len(badges) == min(len(expected), 100)
    page.wait_for_selector("#feed-status[data-live=on]")
    fresh = generated(1, seed=5)[0] | {
        "id": "live-1",
        "sandbox": "sbx-0002",
        "decision": "deny",
        "kind": "request",
        "method": "POST",
        "host": "exfil.example.com",
        "path": "/upload",
        "reason": "no rule matched (default deny)",
        "ts": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "binding": None,
        "status": 403,
    }
    write_records(served.state_dir, [fresh])
    write_records(served.state_dir, [fresh | {"id": "live-2", "path": CONTROL_PATH}])
    new_row = page.wait_for_selector("#feed tbody tr[data-id=live-1]")
    assert "exfil.example.com" in new_row.inner_text()
    controls = page.wait_for_selector("#feed tbody tr[data-id=live-2]").inner_text()
    assert CONTROL_SHOWN in controls and "\u202e" not in controls
    assert page.locator("#feed tbody tr").first.get_attribute("data-id") == "live-2"
    # the kind column says the kinds table's label, live as on the page
    write_records(
        served.state_dir, [fresh | {"id": "live-3", "kind": "security_event", "event": "sni_mismatch"}]
    )
    live_kind = page.wait_for_selector("#feed tbody tr[data-id=live-3] td:nth-child(3)").inner_text()
    assert live_kind == LABELS["security_event"] == "security event"
    page.reload()
    assert page.locator("#feed tbody tr[data-id=live-3] td:nth-child(3)").inner_text() == "security event"
    page.screenshot(path=shots / "feed.png", full_page=False)


def test_policy_diff_view(page: Any, console: tuple[Served, Any], shots: Path) -> None:
    served, _ = console
    log_in(page, served.url)
    page.click("nav >> text=Policy changes")
    page.click("table.records a:text-is('policy change')")
    page.wait_for_selector("pre.diff")
    added = page.locator(".d-add").all_inner_texts()
    removed = page.locator(".d-del").all_inner_texts()
    assert any("pypi.example.test" in line for line in added)
    assert any("model-key" in line for line in added)
    assert any("old.example.com" in line for line in removed)
    assert "sha256:bbb222" in page.inner_text("dl.facts") and "api-key" in page.inner_text("dl.facts")
    page.screenshot(path=shots / "diff.png", full_page=True)


def test_record_text_from_sandboxes_is_never_markup(page: Any, console: tuple[Served, Any]) -> None:
    served, _ = console
    log_in(page, served.url)
    page.goto(served.url + "/console/feed?host=evil.example.com")
    row = page.locator("#feed tbody tr[data-id=hostile-1]")
    assert XSS_PATH in row.inner_text() and "<b>bold</b>" in row.inner_text()
    assert page.evaluate("window.__xss") is None
    assert page.locator("#feed img").count() == 0
    shown = page.locator("#feed tbody tr[data-id=controls-1]").inner_text()
    assert CONTROL_SHOWN in shown and "\u202e" not in shown and "\x1b" not in shown
