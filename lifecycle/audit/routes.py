"""`audit_router(store, auth)`: the audit API under /v1/audit.

Rules: every route depends on the app's API-key dependency, passed in by the app, so this module
knows nothing of how keys are checked. Query words are the same as the CLI's and the console's
(`AuditFilter`); a bad filter, time or cursor is a 400 whose message says how to fix it.

  GET /v1/audit            one page, newest first (`limit`, `cursor`), `format=ocsf` for OCSF
  GET /v1/audit/follow     Server-Sent Events: `id: <seq>`, `data: <record JSON>`; resumes after
                           `Last-Event-ID` (or `?after=`), otherwise starts with new records
  GET /v1/audit/summary    top hosts, denials by reason, injections by binding
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import ValidationError

from sandgate.lifecycle.audit.audit_store import AuditStore
from sandgate.lifecycle.audit.ocsf import to_ocsf
from sandgate.lifecycle.audit.query import AuditFilter, IngestStats, Page, QueryError, Summary
from sandgate.lifecycle.audit.record import RecordJSON

Format = Literal["native", "ocsf"]
HEARTBEAT_S = 15.0


def audit_filter(
    sandbox: str | None = None,
    kind: str | None = None,
    decision: str | None = None,
    host: str | None = None,
    binding: str | None = None,
    reason: str | None = None,
    status: int | None = None,
    since: Annotated[str | None, Query(description="1h, 30m, 2d, today, or RFC 3339")] = None,
    until: Annotated[str | None, Query(description="same forms as since")] = None,
) -> AuditFilter:
    """The filter from query parameters (a FastAPI dependency; the console uses it too)."""
    try:
        return AuditFilter.model_validate(
            {
                "sandbox": sandbox,
                "kind": kind,
                "decision": decision,
                "host": host,
                "binding": binding,
                "reason": reason,
                "status": status,
                "since": since,
                "until": until,
            }
        )
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise HTTPException(400, f"bad audit filter: {problems}") from None
    except QueryError as exc:
        raise HTTPException(400, str(exc)) from None


Filter = Annotated[AuditFilter, Depends(audit_filter)]


def _native(record: RecordJSON) -> RecordJSON:
    return record


async def sse_events(
    store: AuditStore,
    query: AuditFilter,
    after: int | None,
    shape: Callable[[RecordJSON], dict[str, Any]],
    request: Request,
) -> AsyncIterator[bytes]:
    """The follow feed as SSE frames (each record through `shape`), with a comment line as
    heartbeat so proxies keep it open."""
    yield b": following\n\n"
    feed = store.follow(query, after).__aiter__()
    pending: asyncio.Task[tuple[int, RecordJSON]] | None = None
    try:
        while not await request.is_disconnected():
            pending = pending or asyncio.ensure_future(feed.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=HEARTBEAT_S)
            if not done:
                yield b": heartbeat\n\n"
                continue
            try:
                seq, record = pending.result()
            except StopAsyncIteration:
                return
            pending = None
            yield f"id: {seq}\nevent: record\ndata: {json.dumps(shape(record))}\n\n".encode()
    finally:
        if pending is not None:
            pending.cancel()


def audit_router(store: AuditStore, auth: Callable[..., Any]) -> APIRouter:
    """The /v1/audit routes over `store`, each guarded by the dependency `auth`."""
    router = APIRouter(prefix="/v1/audit", tags=["audit"], dependencies=[Depends(auth)])

    @router.get("", response_model=Page)
    def list_records(
        query: Filter,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        cursor: str | None = None,
        format: Format = "native",
    ) -> Page:
        try:
            page = store.index.page(query, limit, cursor)
        except QueryError as exc:
            raise HTTPException(400, str(exc)) from None
        if format == "ocsf":
            page.records = [to_ocsf(record) for record in page.records]
        return page

    @router.get("/follow")
    def follow(
        request: Request,
        query: Filter,
        after: Annotated[int | None, Query(ge=0, description="resume after this event id")] = None,
        last_event_id: Annotated[str | None, Header()] = None,
        format: Format = "native",
    ) -> StreamingResponse:
        if after is None and last_event_id and last_event_id.isdigit():
            after = int(last_event_id)
        return StreamingResponse(
            sse_events(store, query, after, to_ocsf if format == "ocsf" else _native, request),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    @router.get("/summary", response_model=Summary)
    def summary(query: Filter, top: Annotated[int, Query(ge=1, le=100)] = 15) -> Summary:
        return store.index.summary(query, top)

    @router.get("/index", response_model=IngestStats)
    def index_health() -> IngestStats:
        return store.index.ingest_stats()

    return router
