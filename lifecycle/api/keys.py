"""`/keys`: managed API keys (admin only, api/access.py), the `sandgate keys` command's API.

Rules: rotate and revoke run on the event loop (async), where the streams they cut off run.
A key is shown once, in the answer of `POST /keys` and `POST /keys/{id}/rotate`; a list
shows ids, tenants, roles, expiry and state, never a key. Revoking (or rotating, which revokes
the old key) cuts off at once what the key has open: its follow streams, WebSockets and long
answers (api/auth.py `Streams`); console sessions check their key at every page. Each call is
recorded as an `api` audit record with the key id it acted on (`detail.key`).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from sandgate.lifecycle.api.calls import ERRORS, call
from sandgate.lifecycle.api.errors import ApiError
from sandgate.lifecycle.keys import KeyBook, ManagedKey, check_tenant, parse_lifetime
from sandgate.lifecycle.principals import Role

router = APIRouter(prefix="/keys", tags=["Keys"], responses=ERRORS)


class CreateKeyRequest(BaseModel):
    tenant: str
    role: Role
    name: str = Field(default="", max_length=200)
    expires_in: Annotated[str | None, Field(alias="expiresIn", description="e.g. 90d, 12h; none: never")] = (
        None
    )


def book_of(request: Request) -> KeyBook:
    book: KeyBook | None = request.app.state.gate.keys
    if book is None:
        raise ApiError(400, "UNSUPPORTED", "this server has no managed keys (no state database)")
    return book


def noted(request: Request, row: ManagedKey) -> None:
    """The key acted on, for the call's `api` audit record."""
    request.scope["state"]["audit_detail"] = {"key": row.id, "tenant": row.tenant, "role": row.role}


def shown(row: ManagedKey, secret: str) -> dict[str, Any]:
    return {**row.to_json(), "key": secret}


@router.post("", status_code=201)
def create_key(request: Request, body: CreateKeyRequest) -> dict[str, Any]:
    ttl = call(parse_lifetime, body.expires_in) if body.expires_in else None
    row, secret = call(book_of(request).create, call(check_tenant, body.tenant), body.role, body.name, ttl)
    noted(request, row)
    return shown(row, secret)


@router.get("")
def list_keys(request: Request) -> list[dict[str, Any]]:
    return [row.to_json() for row in book_of(request).list()]


@router.post("/{key_id}/rotate", status_code=201)
async def rotate_key(request: Request, key_id: str) -> dict[str, Any]:
    row, secret = call(book_of(request).rotate, key_id)
    request.app.state.gate.streams.close(key_id)
    noted(request, row)
    request.scope["state"]["audit_detail"]["replaces"] = key_id
    return shown(row, secret)


@router.delete("/{key_id}")
async def revoke_key(request: Request, key_id: str) -> dict[str, Any]:
    row = call(book_of(request).revoke, key_id)
    request.app.state.gate.streams.close(key_id)
    noted(request, row)
    return row.to_json()
