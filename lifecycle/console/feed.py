"""The request feed (filtered pages and the live stream) and the policy changes with their diffs."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import Response, StreamingResponse

from sandgate.lifecycle.audit import AuditFilter, PolicyChange, QueryError
from sandgate.lifecycle.audit.routes import sse_events
from sandgate.lifecycle.console.pages import SECURITY_HEADERS, Console, filter_or_400
from sandgate.lifecycle.console.views import policy_diff
from sandgate.lifecycle.visible import visible_record


def _filters(request: Request) -> dict[str, str]:
    return {k: v for k, v in request.query_params.items() if k in AuditFilter.model_fields and v.strip()}


def add_feed_pages(router: APIRouter, console: Console, authed: Any) -> None:
    store, prefix = console.store, console.prefix

    @router.get("/feed", dependencies=[authed])
    def feed(
        request: Request, cursor: str | None = None, limit: Annotated[int, Query(ge=1, le=500)] = 100
    ) -> Response:
        raw = _filters(request)
        error = None
        try:
            query = AuditFilter.model_validate(raw)
            result = store.index.page(query, limit, cursor)
        except (QueryError, ValueError) as exc:
            query, result, error = AuditFilter(), store.index.page(AuditFilter(), limit), str(exc)
            raw = {}
        older = urlencode({**raw, "cursor": result.next_cursor or "", "limit": limit})
        nav = "denied" if raw == {"decision": "deny"} else "feed"
        return console.page(
            "feed.html",
            nav=nav,
            f=query,
            raw=raw,
            page=result,
            error=error,
            older_url=f"{prefix}/feed?{older}",
            live=cursor is None,
            stream_url=f"{prefix}/feed/stream?{urlencode(raw)}",
            sandbox_ids=[s.id for s in console.live_sandboxes()],
        )

    @router.get("/feed/stream", dependencies=[authed])
    def feed_stream(request: Request) -> StreamingResponse:
        query = filter_or_400(**_filters(request))
        return StreamingResponse(
            sse_events(store, query, None, visible_record, request),
            media_type="text/event-stream",
            headers={**SECURITY_HEADERS},
        )


def add_change_pages(router: APIRouter, console: Console, authed: Any) -> None:
    index = console.store.index

    @router.get("/changes", dependencies=[authed])
    def changes(cursor: str | None = None) -> Response:
        result = index.page(AuditFilter(kind="policy_change"), 50, cursor)
        older = f"{console.prefix}/changes?{urlencode({'cursor': result.next_cursor or ''})}"
        return console.page("changes.html", nav="changes", page=result, older_url=older)

    @router.get("/changes/{record_id}", dependencies=[authed])
    def change(record_id: str) -> Response:
        record = index.get(record_id)
        if record is None or record["kind"] != "policy_change":
            raise HTTPException(404, f"no policy_change record with id {record_id}")
        detail = PolicyChange.from_detail(record.get("detail"))
        return console.page(
            "diff.html", nav="changes", record=record, change=detail, diff=policy_diff(detail)
        )
