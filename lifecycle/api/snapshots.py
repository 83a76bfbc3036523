"""The OpenSandbox snapshot routes: take one of a sandbox, list, get, delete (lifecycle/snapshots.py
does the work; a create with `snapshotId` is in api/sandboxes.py).

Rules: a snapshot answers in the spec's `Snapshot` shape; taking one answers 202 with it already
`Ready`; a runtime that cannot take snapshots answers 400 `UNSUPPORTED` saying which can. The list
takes the spec's filters (`sandboxId`, `name`, `state`, all must match) and pages (`page`,
`pageSize`, newest first); `state` is an open set, as for sandboxes: one no snapshot is in
(`Creating`, `Failed`, one a later spec adds) matches nothing, never a 400.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from pydantic import Field

from sandgate.lifecycle.api.calls import ERRORS, call, service_of
from sandgate.lifecycle.api.models import PaginationInfo, WireModel, in_states, paginate
from sandgate.lifecycle.images import Image
from sandgate.lifecycle.principals import caller_sees
from sandgate.lifecycle.snapshots import Snapshots

router = APIRouter(tags=["Snapshots"], responses=ERRORS)


class CreateSnapshotRequest(WireModel):
    name: str | None = Field(None, min_length=1, description="Optional human-readable snapshot name")


class SnapshotStatus(WireModel):
    state: str = Field(description="Creating, Deleting, Ready or Failed (sandgate answers when Ready)")
    reason: str | None = None
    message: str | None = None
    last_transition_at: datetime | None = None


class Snapshot(WireModel):
    id: str
    sandbox_id: str
    name: str | None = None
    status: SnapshotStatus
    created_at: datetime


class ListSnapshotsResponse(WireModel):
    items: list[Snapshot]
    pagination: PaginationInfo


def to_snapshot(image: Image) -> Snapshot:
    assert image.snapshot is not None
    created = datetime.fromtimestamp(image.created, UTC)
    return Snapshot(
        id=image.snapshot.id,
        sandbox_id=image.snapshot.sandbox_id,
        name=image.snapshot.name,
        status=SnapshotStatus(
            state="Ready", reason="SNAPSHOT_READY", message=image.source, last_transition_at=created
        ),
        created_at=created,
    )


def snapshots_of(request: Request) -> Snapshots:
    return Snapshots(service_of(request))


@router.post("/sandboxes/{sandbox_id}/snapshots", status_code=202, response_model=Snapshot)
def create_snapshot(request: Request, sandbox_id: str, body: CreateSnapshotRequest | None = None) -> Snapshot:
    image = call(snapshots_of(request).create, sandbox_id, body.name if body else None)
    return to_snapshot(image)


@router.get("/snapshots", response_model=ListSnapshotsResponse)
def list_snapshots(
    request: Request,
    sandbox_id: Annotated[str | None, Query(alias="sandboxId", description="only this sandbox's")] = None,
    name: Annotated[str | None, Query(description="only snapshots of exactly this name")] = None,
    state: Annotated[
        list[str] | None,
        Query(description="keep only these states (repeatable, any case); one none is in matches none"),
    ] = None,
    page: Annotated[int, Query(ge=1, le=1_000_000)] = 1,
    page_size: Annotated[int, Query(alias="pageSize", ge=1, le=200)] = 20,
) -> ListSnapshotsResponse:
    tenant_of = service_of(request).store.tenant_of
    snapshots = [
        to_snapshot(i)
        for i in call(snapshots_of(request).list)
        if i.snapshot and caller_sees(tenant_of(i.snapshot.sandbox_id) or "")
    ]
    kept = [
        s
        for s in snapshots
        if sandbox_id in (None, s.sandbox_id) and name in (None, s.name) and in_states(s.status.state, state)
    ]
    kept.sort(key=lambda snapshot: snapshot.created_at, reverse=True)
    shown, pagination = paginate(kept, page, page_size)
    return ListSnapshotsResponse(items=shown, pagination=pagination)


@router.get("/snapshots/{snapshot_id}", response_model=Snapshot)
def get_snapshot(request: Request, snapshot_id: str) -> Snapshot:
    return to_snapshot(call(snapshots_of(request).get, snapshot_id))


@router.delete("/snapshots/{snapshot_id}", status_code=204, response_class=Response)
def delete_snapshot(request: Request, snapshot_id: str) -> Response:
    call(snapshots_of(request).delete, snapshot_id)
    return Response(status_code=204)
