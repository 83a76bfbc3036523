"""The overview (every live sandbox with its traffic in a window), one sandbox's page (its
summary, policy, changes, denials, and a timeline where its commands, file operations and
requests are interleaved) and one process's page (its execs and the requests it made)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response

from sandgate.lifecycle.audit import AuditFilter
from sandgate.lifecycle.console.pages import Console, filter_or_400
from sandgate.lifecycle.console.views import policy_yaml

WINDOWS = ("1h", "24h", "today", "7d", "30d")
TIMELINE_ROWS = 100  # a sandbox page's latest records of every kind (the feed has the rest)
PROCESS_ROWS = 200  # a process page's latest records


def add_sandbox_pages(router: APIRouter, console: Console, authed: Any) -> None:
    index = console.store.index

    @router.get("", dependencies=[authed])
    def overview(window: str = "24h") -> Response:
        query = filter_or_400(since=window)
        counts = index.counts_by_sandbox(query)
        rows = []
        for sandbox in console.live_sandboxes():
            total, denied = counts.get(sandbox.id, (0, 0))
            rows.append(
                {
                    "id": sandbox.id,
                    "status": sandbox.status,
                    "address": sandbox.address,
                    "rule_count": sandbox.rule_count,
                    "binding_names": sandbox.binding_names,
                    "total": total,
                    "denied": denied,
                }
            )
        summary = index.summary(query, top=10)
        return console.page("overview.html", nav="overview", sandboxes=rows, window=window, summary=summary)

    @router.get("/sandboxes/{sandbox_id}", dependencies=[authed])
    def sandbox_page(sandbox_id: str, since: str = "24h") -> Response:
        query = filter_or_400(sandbox=sandbox_id, since=since)
        live = next((s for s in console.live_sandboxes() if s.id == sandbox_id), None)
        changes = index.page(AuditFilter(sandbox=sandbox_id, kind="policy_change"), 20).records
        denials = index.page(AuditFilter(sandbox=sandbox_id, decision="deny", since=query.since), 25)
        timeline = index.page(AuditFilter(sandbox=sandbox_id, since=query.since), TIMELINE_ROWS)
        return console.page(
            "sandbox.html",
            nav="overview",
            sandbox_id=sandbox_id,
            sandbox=live,
            since=since,
            windows=WINDOWS,
            summary=index.summary(query),
            changes=changes,
            denials=denials.records,
            timeline=timeline.records,
            policy_yaml=policy_yaml(live.policy) if live else "",
        )

    @router.get("/sandboxes/{sandbox_id}/processes/{pid}", dependencies=[authed])
    def process_page(sandbox_id: str, pid: int) -> Response:
        """One process of a sandbox: what the kernel saw it run and the requests it made (a
        request row of the timeline links here)."""
        records = index.of_process(sandbox_id, pid, PROCESS_ROWS)
        return console.page("process.html", nav="overview", sandbox_id=sandbox_id, pid=pid, records=records)
