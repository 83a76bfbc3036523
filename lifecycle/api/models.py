"""Wire models of the OpenSandbox lifecycle API (the shapes the 1.1.1 clients send and parse).

Rules:
1. Field names on the wire are camelCase (aliases); Python code uses snake_case (`WireModel`, with
   the policy shapes the policy book speaks, is in lifecycle/opensandbox_shapes.py).
2. Responses are serialised with `exclude_none`: the generated client crashes on explicit nulls
   (e.g. `isoparse(None)` for `expiresAt`), so a field without a value is left out.
3. Requests accept unknown fields (as the reference server does) but validate every known one;
   what sandgate cannot honour (snapshots, templates, volumes other than `host`) is refused with a
   clear message, not silently ignored.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field

from sandgate.lifecycle.opensandbox_shapes import NetworkPolicy, WireModel

SandboxState = Literal[
    "Pending", "Running", "Pausing", "Paused", "Resuming", "Stopping", "Terminated", "Failed"
]


class ErrorResponse(WireModel):
    """Every non-2xx answer of the lifecycle API."""

    code: str = Field(description="Machine-readable error code, e.g. NOT_FOUND, INVALID_REQUEST")
    message: str = Field(description="What was wrong and how to fix it")


class ImageAuth(WireModel):
    username: str
    password: str


class ImageSpec(WireModel):
    uri: str = Field(min_length=1, description="Image reference; the local runtime knows `sandgate/host`")
    auth: ImageAuth | None = None


class PlatformSpec(WireModel):
    os: str
    arch: str


class CredentialProxyConfig(WireModel):
    enabled: bool = False


class LifecycleHook(WireModel):
    command: list[str] = Field(min_length=1)
    timeout_seconds: int | None = Field(None, ge=1, le=10800)


class PeriodicLifecycleHook(WireModel):
    name: str = Field(min_length=1)
    schedule: str = Field(min_length=1)
    command: list[str] = Field(min_length=1)
    timeout_seconds: int | None = Field(None, ge=1, le=300)


class SandboxLifecycle(WireModel):
    pre_start: LifecycleHook | None = None
    periodic: list[PeriodicLifecycleHook] | None = None


class CreateSandboxRequest(WireModel):
    image: ImageSpec | None = None
    snapshot_id: str | None = None
    template_id: str | None = None
    platform: PlatformSpec | None = None
    timeout: int | None = Field(None, ge=60, description="Seconds until expiry; null never expires")
    resource_limits: dict[str, str] | None = None
    resource_requests: dict[str, str] | None = None
    env: dict[str, str | None] | None = None
    metadata: dict[str, str] | None = None
    lifecycle: SandboxLifecycle | None = None
    entrypoint: list[str] | None = Field(None, min_length=1)
    network_policy: NetworkPolicy | None = None
    credential_proxy: CredentialProxyConfig | None = None
    secure_access: bool = False
    volumes: list[dict[str, object]] | None = None
    extensions: dict[str, str] | None = None


class SandboxStatus(WireModel):
    state: SandboxState
    reason: str | None = None
    message: str | None = None
    last_transition_at: datetime | None = None


class CreateSandboxResponse(WireModel):
    id: str
    status: SandboxStatus
    metadata: dict[str, str] | None = None
    extensions: dict[str, str] | None = None
    platform: PlatformSpec | None = None
    expires_at: datetime | None = None
    created_at: datetime
    entrypoint: list[str]


class Sandbox(CreateSandboxResponse):
    image: ImageSpec | None = None


class PaginationInfo(WireModel):
    page: int = Field(ge=1)
    page_size: int = Field(ge=1)
    total_items: int = Field(ge=0)
    total_pages: int = Field(ge=0)
    has_next_page: bool


def paginate[T](items: Sequence[T], page: int, page_size: int) -> tuple[list[T], PaginationInfo]:
    """Page `page` (from 1) of `items`, `page_size` a page, and its pagination block."""
    start = (page - 1) * page_size
    total_pages = math.ceil(len(items) / page_size)
    pagination = PaginationInfo(
        page=page,
        page_size=page_size,
        total_items=len(items),
        total_pages=total_pages,
        has_next_page=page < total_pages,
    )
    return list(items[start : start + page_size]), pagination


def in_states(state: str, wanted: list[str] | None) -> bool:
    """A list's state filter (repeatable, any case): the spec keeps the set of states open, so a
    state nothing is in (one sandgate never produces) matches nothing; it is no error."""
    return not wanted or state.lower() in {w.lower() for w in wanted}


class ListSandboxesResponse(WireModel):
    items: list[Sandbox]
    pagination: PaginationInfo


class RenewSandboxExpirationRequest(WireModel):
    expires_at: datetime


class RenewSandboxExpirationResponse(WireModel):
    expires_at: datetime


class Endpoint(WireModel):
    endpoint: str = Field(description="host[:port][/path], no scheme")
    headers: dict[str, str] | None = None


class MetricsEvent(WireModel):
    event_type: Literal["sandbox.create"]
    sandbox_id: str | None = None
    image: str | None = None
    create_duration_ms: Annotated[int, Field(ge=0)]
    success: bool


class DiagnosticContent(WireModel):
    sandbox_id: str
    kind: Literal["logs", "events"]
    scope: str
    delivery: Literal["inline"] = "inline"
    content_type: str = "text/plain"
    content: str
    truncated: bool = False
