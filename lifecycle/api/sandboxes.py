"""The OpenSandbox lifecycle routes (served bare and under /v1).

Rules: handlers translate between wire models and the service, nothing more; status codes are
exactly the ones the 1.1.1 clients expect (create 202, delete 204, pause/resume 202 empty).
"""

from __future__ import annotations

import json
import os
import re
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Annotated, Any
from urllib.parse import parse_qsl

from fastapi import APIRouter, Body, Query, Request, Response
from fastapi.responses import PlainTextResponse

from sandgate.lifecycle.api.auth import EGRESS_AUTH_HEADER, EGRESS_PORT
from sandgate.lifecycle.api.calls import ERRORS, call, service_of
from sandgate.lifecycle.api.errors import ApiError
from sandgate.lifecycle.api.models import (
    CreateSandboxRequest,
    CreateSandboxResponse,
    DiagnosticContent,
    Endpoint,
    ImageSpec,
    ListSandboxesResponse,
    MetricsEvent,
    PlatformSpec,
    RenewSandboxExpirationRequest,
    RenewSandboxExpirationResponse,
    Sandbox,
    SandboxStatus,
    in_states,
    paginate,
)
from sandgate.lifecycle.errors import LifecycleError
from sandgate.lifecycle.execd_client import execd_headers
from sandgate.lifecycle.images import snapshot_image
from sandgate.lifecycle.principals import acting, caller_sees, caller_tenant
from sandgate.lifecycle.quantities import parse_quantity
from sandgate.lifecycle.registry import Credentials
from sandgate.lifecycle.runtime.base import EXECD_PORT, BindMount, ClaimMount, UnsafeBind, check_target
from sandgate.lifecycle.runtime.claims import CLAIM_NAME, check_claim
from sandgate.lifecycle.runtime.sandbox_disk import MIN_DISK_BYTES
from sandgate.lifecycle.sandbox_store import SandboxRecord
from sandgate.lifecycle.service import CreateRequest

DEFAULT_ENTRYPOINT = ["tail", "-f", "/dev/null"]
ACCESS_MODES = frozenset({"ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"})
STORAGE = re.compile(r"^\d+(\.\d+)?(Ki|Mi|Gi|Ti|Pi|Ei)?$")  # the spec's pattern for pvc.storage
router = APIRouter(tags=["Sandboxes"], responses=ERRORS)


def to_status(record: SandboxRecord) -> SandboxStatus:
    return SandboxStatus(
        state=record.state,  # type: ignore[arg-type]
        reason=record.reason,
        message=record.message,
        last_transition_at=record.transition_at,
    )


def to_sandbox(record: SandboxRecord) -> Sandbox:
    return Sandbox(
        id=record.id,
        image=ImageSpec(uri=record.image),
        status=to_status(record),
        metadata=record.metadata,
        extensions=record.extensions or None,
        platform=PlatformSpec(**record.platform) if record.platform else None,
        expires_at=record.expires_at,
        created_at=record.created_at,
        entrypoint=record.entrypoint,
    )


@dataclass(frozen=True)
class HostVolumes:
    """Where a create's `host` volumes may come from: under the `volume_host_prefixes` setting
    (none: refused), never at or around `unsafe` (the state dir) or the runtime's unsafe paths;
    and whether `pvc` volumes are served at all (`claims`)."""

    prefixes: tuple[Path, ...] = ()
    unsafe: tuple[Path, ...] = ()
    claims: bool = False  # the `pvc_volumes` setting: serve `pvc` volumes (runtime/claims.py)

    def mount(self, index: int, volume: dict[str, Any]) -> BindMount | ClaimMount:
        """`volumes[index]` as a checked bind or claim, or a 400 naming the field and how to fix it."""
        where = f"volumes[{index}]"
        backends = [name for name in ("host", "pvc", "ossfs") if name in volume]
        if backends == ["pvc"] and not self.claims:
            raise ApiError(400, "UNSUPPORTED", f"{where}.pvc: pvc volumes are off on this server; the "
                           "operator turns them on with pvc_volumes")  # fmt: skip
        if backends == ["pvc"]:
            return claim_mount(where, volume)
        if backends != ["host"]:
            raise ApiError(400, "UNSUPPORTED", f"{where}: sandgate mounts `host` and `pvc` volumes (one "
                           f"backend per volume), not {', '.join(backends) or 'no backend'}")  # fmt: skip
        return self.bind(where, volume)

    def bind(self, where: str, volume: dict[str, Any]) -> BindMount:
        path, target = (volume.get("host") or {}).get("path"), volume.get("mountPath")
        sub = volume.get("subPath") or ""
        for field, value in ((f"{where}.host.path", path), (f"{where}.mountPath", target)):
            if not (isinstance(value, str) and value.startswith("/")):
                raise ApiError(400, "INVALID_REQUEST", f"{field} must be an absolute path, got {value!r}")
        if not isinstance(sub, str) or sub.startswith("/") or ".." in PurePosixPath(sub).parts:
            raise ApiError(400, "INVALID_REQUEST", f"{where}.subPath must be a relative path without '..'")
        if not self.prefixes:
            raise ApiError(400, "UNSUPPORTED", f"{where}.host.path: host volumes are off on this "
                           "server; the operator allows directories with volume_host_prefixes")  # fmt: skip
        wanted = BindMount(os.path.join(str(path), sub), str(target), read_only=bool(volume.get("readOnly")))
        try:
            bind = wanted.checked(unsafe=self.unsafe)
        except UnsafeBind as exc:
            raise ApiError(400, "INVALID_REQUEST", f"{where}: {exc}") from None
        if not bind.under(self.prefixes):
            allowed = ", ".join(map(str, self.prefixes))
            raise ApiError(400, "INVALID_REQUEST", f"{where}.host.path: {bind.source} is not under "
                           f"volume_host_prefixes ({allowed})")  # fmt: skip
        return bind


def claim_mount(where: str, volume: dict[str, Any]) -> ClaimMount:
    """A `pvc` volume, its claim name and subPath checked (runtime/claims.py rule 1)."""
    pvc, target = volume.get("pvc") or {}, volume.get("mountPath")
    if not (isinstance(target, str) and target.startswith("/")):
        raise ApiError(400, "INVALID_REQUEST", f"{where}.mountPath must be an absolute path, got {target!r}")
    try:
        check_target(f"{where}.mountPath", target)
        check_claim(pvc.get("claimName"), volume.get("subPath") or "")
    except UnsafeBind as exc:
        raise ApiError(400, "INVALID_REQUEST", str(exc)) from None
    except LifecycleError as exc:
        raise ApiError(400, "INVALID_REQUEST", f"{where}.pvc: {exc.message}") from None
    return ClaimMount(
        name=pvc["claimName"],
        target=target,
        read_only=bool(volume.get("readOnly")),
        sub_path=volume.get("subPath") or "",
        create=pvc.get("createIfNotExists", True) is not False,
        delete_on_end=bool(pvc.get("deleteOnSandboxTermination")),
        size_bytes=claim_size(where, pvc.get("storage")),
        storage_class=claim_storage_class(where, pvc.get("storageClass")),
        access_modes=claim_access_modes(where, pvc.get("accessModes")),
    )


def claim_storage_class(where: str, name: object) -> str | None:
    if name is not None and not (isinstance(name, str) and CLAIM_NAME.match(name)):
        raise ApiError(
            400, "INVALID_REQUEST", f"{where}.pvc.storageClass must be a StorageClass name, got {name!r}"
        )
    return name


def claim_access_modes(where: str, modes: object) -> tuple[str, ...]:
    if modes is None:
        return ()
    if not (isinstance(modes, list) and modes and set(modes) <= ACCESS_MODES):
        raise ApiError(400, "INVALID_REQUEST", f"{where}.pvc.accessModes must be a list of "
                       f"{', '.join(sorted(ACCESS_MODES))}, got {modes!r}")  # fmt: skip
    return tuple(modes)


def claim_size(where: str, storage: object) -> int | None:
    """`pvc.storage` in bytes (the spec's pattern: '512Mi', '10Gi'); None when absent."""
    if storage is None:
        return None
    if not (isinstance(storage, str) and STORAGE.match(storage)):
        raise ApiError(400, "INVALID_REQUEST", f"{where}.pvc.storage must be a size such as '512Mi' "
                       f"or '10Gi', got {storage!r}")  # fmt: skip
    size = int(parse_quantity(storage, "storage"))
    if size < MIN_DISK_BYTES:
        raise ApiError(400, "INVALID_REQUEST", f"{where}.pvc.storage={storage!r} is below 16Mi")
    return size


def to_create_request(body: CreateSandboxRequest, host_volumes: HostVolumes) -> CreateRequest:
    if body.template_id:
        raise ApiError(400, "UNSUPPORTED", "sandgate creates from images and snapshots (no templates)")
    if body.snapshot_id and body.image is not None:
        raise ApiError(400, "INVALID_REQUEST", "give image or snapshotId, not both")
    if body.snapshot_id:
        body = body.model_copy(update={"image": ImageSpec(uri=snapshot_image(body.snapshot_id))})
    if body.image is None:
        raise ApiError(
            400, "INVALID_REQUEST", "image.uri is required (e.g. {'image': {'uri': 'sandgate/host'}})"
        )
    if body.credential_proxy and body.credential_proxy.enabled and body.network_policy is None:
        raise ApiError(
            422, "INVALID_REQUEST", "credentialProxy.enabled needs a networkPolicy in the same request"
        )
    mounts = [host_volumes.mount(i, dict(volume)) for i, volume in enumerate(body.volumes or [])]
    return CreateRequest(
        image=body.image.uri,
        entrypoint=body.entrypoint or DEFAULT_ENTRYPOINT,
        env={k: v for k, v in (body.env or {}).items() if v is not None},
        metadata=body.metadata or {},
        extensions=body.extensions or {},
        platform=body.platform.model_dump() if body.platform else None,
        resource_limits=body.resource_limits or {},
        timeout=body.timeout,
        network_policy=body.network_policy,
        credential_proxy=bool(body.credential_proxy and body.credential_proxy.enabled),
        binds=tuple(m for m in mounts if isinstance(m, BindMount)),
        claims=tuple(m for m in mounts if isinstance(m, ClaimMount)),
        image_auth=Credentials(body.image.auth.username, body.image.auth.password)
        if body.image.auth
        else None,
    )


@router.post(
    "/sandboxes", status_code=202, response_model=CreateSandboxResponse, response_model_exclude_none=True
)
def create_sandbox(request: Request, body: CreateSandboxRequest) -> CreateSandboxResponse:
    if body.snapshot_id and not caller_sees(
        request.app.state.gate.owner_of("snapshot_id", body.snapshot_id) or ""
    ):
        raise ApiError(404, "NOT_FOUND", f"snapshot {body.snapshot_id!r} does not exist")
    create = replace(to_create_request(body, request.app.state.host_volumes), tenant=caller_tenant())
    record = call(service_of(request).create, create)
    request.scope["state"]["audit_detail"] = {"sandbox": record.id}  # the api record's target
    return CreateSandboxResponse(**to_sandbox(record).model_dump(exclude={"image"}))


def parse_metadata_filter(metadata: str | None) -> dict[str, str]:
    if not metadata:
        return {}
    pairs = parse_qsl(metadata, keep_blank_values=True)
    if not pairs:
        raise ApiError(400, "INVALID_REQUEST", f"metadata filter {metadata!r} is not k=v&k2=v2")
    return dict(pairs)


@router.get("/sandboxes", response_model=ListSandboxesResponse, response_model_exclude_none=True)
def list_sandboxes(
    request: Request,
    state: Annotated[
        list[str] | None,
        Query(description="keep only these states (repeatable, any case); one no sandbox is in matches none"),
    ] = None,
    metadata: Annotated[str | None, Query(description="URL-encoded k=v&k2=v2; all must match")] = None,
    page: Annotated[int, Query(ge=1, le=1_000_000)] = 1,
    page_size: Annotated[int, Query(alias="pageSize", ge=1, le=200)] = 20,
) -> ListSandboxesResponse:
    wanted_metadata = parse_metadata_filter(metadata)
    records = [
        r
        for r in service_of(request).list_sandboxes()
        if caller_sees(r.tenant)
        and in_states(r.state, state)
        and all(r.metadata.get(k) == v for k, v in wanted_metadata.items())
    ]
    shown, pagination = paginate(records, page, page_size)
    return ListSandboxesResponse(items=[to_sandbox(r) for r in shown], pagination=pagination)


@router.get("/sandboxes/{sandbox_id}", response_model=Sandbox, response_model_exclude_none=True)
def get_sandbox(request: Request, sandbox_id: str) -> Sandbox:
    return to_sandbox(call(service_of(request).observed, sandbox_id))


@router.delete("/sandboxes/{sandbox_id}", status_code=204, response_class=Response)
def delete_sandbox(request: Request, sandbox_id: str) -> Response:
    call(service_of(request).delete, sandbox_id)
    return Response(status_code=204)


@router.patch("/sandboxes/{sandbox_id}/metadata", response_model=Sandbox, response_model_exclude_none=True)
def patch_metadata(
    request: Request, sandbox_id: str, patch: Annotated[dict[str, str | None], Body()]
) -> Sandbox:
    return to_sandbox(call(service_of(request).patch_metadata, sandbox_id, patch))


@router.post("/sandboxes/{sandbox_id}/pause", status_code=202, response_class=Response)
def pause_sandbox(request: Request, sandbox_id: str) -> Response:
    call(service_of(request).pause, sandbox_id)
    return Response(status_code=202)


@router.post("/sandboxes/{sandbox_id}/resume", status_code=202, response_class=Response)
def resume_sandbox(request: Request, sandbox_id: str) -> Response:
    call(service_of(request).resume, sandbox_id)
    return Response(status_code=202)


@router.post("/sandboxes/{sandbox_id}/renew-expiration", response_model=RenewSandboxExpirationResponse)
def renew_expiration(
    request: Request, sandbox_id: str, body: RenewSandboxExpirationRequest
) -> RenewSandboxExpirationResponse:
    return RenewSandboxExpirationResponse(
        expires_at=call(service_of(request).renew, sandbox_id, body.expires_at)
    )


@router.get(
    "/sandboxes/{sandbox_id}/endpoints/{port}", response_model=Endpoint, response_model_exclude_none=True
)
def get_endpoint(
    request: Request,
    sandbox_id: str,
    port: int,
    use_server_proxy: bool = False,
    expires: Annotated[int | None, Query(ge=0)] = None,
) -> Endpoint:
    """44772 (execd) is served here by default: the reverse proxy, with the sandbox's execd token
    as the header (the SDK sends an endpoint's headers on every request to it), so no
    control-plane header a client adds ever reaches the sandbox (api/sandbox_proxy.py strips them).
    Every key is handed tokens bound to it (api/auth.py rule 4), valid while the key is.
    With `execd_endpoint = "direct"` it is the sandbox's own address and token, for trusted
    clients (execd in the sandbox checks only that token: it cannot learn of a revocation).
    18080 (egress API) is served here, with the sandbox's token: at `.../egress`, or with
    `use_server_proxy` at `.../proxy/18080` as OpenSandbox answers (the same API is served
    there, api/sandbox_proxy.py). `use_server_proxy` routes through this server with the API
    key, which adds execd's token itself, so that endpoint carries none."""
    if not 1 <= port <= 65535:
        raise ApiError(400, "INVALID_REQUEST", f"port {port} is outside 1-65535")
    record = call(service_of(request).get, sandbox_id)
    here = request.headers.get("host") or f"{request.url.hostname}:{request.url.port}"
    prefix = "/v1" if request.url.path.startswith("/v1/") else ""
    proxied = f"{here}{prefix}/sandboxes/{sandbox_id}/proxy/{port}"
    if port == EGRESS_PORT:
        return Endpoint(
            endpoint=proxied if use_server_proxy else f"{here}{prefix}/sandboxes/{sandbox_id}/egress",
            headers={EGRESS_AUTH_HEADER: bound(request, "egress", record.id, record.egress_token)},
        )
    if use_server_proxy:
        return Endpoint(endpoint=proxied)
    if record.address is None or record.state != "Running":
        raise ApiError(409, "NOT_RUNNING", f"sandbox {sandbox_id} is {record.state}; it has no endpoint now")
    headers = execd_headers(record) if port == EXECD_PORT else {}
    if port == EXECD_PORT and request.app.state.execd_endpoint == "host":
        headers = {name: bound(request, "execd", record.id, token) for name, token in headers.items()}
        return Endpoint(endpoint=proxied, headers=headers or None)
    return Endpoint(endpoint=f"{record.address}:{port}", headers=headers or None)


def bound(request: Request, kind: str, sandbox_id: str, token: str) -> str:
    """The endpoint token for the caller: bound to its principal (a managed key, an OIDC token,
    the bootstrap key: api/auth.py rule 4); the sandbox's own only for a caller with no key."""
    principal = acting.get()
    if principal is None or principal.via not in ("key", "oidc", "bootstrap"):
        return token
    expires = request.scope["state"].get("principal_expires")
    return str(request.app.state.gate.endpoint_token(principal, expires, kind, sandbox_id))


def audit_tail(path: Path, sandbox_id: str, policy_changes: bool, limit: int = 200) -> tuple[str, bool]:
    """The sandbox's last `limit` audit lines (policy changes or traffic), read from the tail."""
    if not path.is_file():
        return "", False
    with path.open("rb") as handle:
        handle.seek(0, 2)
        size = handle.tell()
        handle.seek(max(0, size - 4 * 1024 * 1024))
        # lines end at "\n" only: a record may hold U+0085 or U+2028, where str.splitlines() cuts
        lines = [line.decode(errors="replace") for line in handle.read().split(b"\n")]
    found: deque[str] = deque(maxlen=limit)
    total = 0
    for line in lines:
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if item.get("sandbox") == sandbox_id and (item.get("kind") == "policy_change") == policy_changes:
            found.append(line)
            total += 1
    return "\n".join(found), total > limit


def diagnostics(request: Request, sandbox_id: str, kind: str, scope: str | None) -> Any:
    record = call(service_of(request).get, sandbox_id)
    content, truncated = audit_tail(request.app.state.audit_path, sandbox_id, policy_changes=kind == "events")
    if kind == "events":
        status = json.dumps({"state": record.state, "reason": record.reason or ""})
        content = f"{content}\n{status}".strip()
    if scope is None:
        return PlainTextResponse(content)
    return DiagnosticContent(
        sandbox_id=sandbox_id, kind=kind, scope=scope, content_type="application/x-ndjson",  # type: ignore[arg-type]
        content=content, truncated=truncated,
    )  # fmt: skip


@router.get("/sandboxes/{sandbox_id}/diagnostics/logs", tags=["DevOps"], response_model=DiagnosticContent)
def diagnostics_logs(request: Request, sandbox_id: str, scope: str | None = None) -> Any:
    """The sandbox's egress audit records (one JSON line each, newest last)."""
    return diagnostics(request, sandbox_id, "logs", scope)


@router.get("/sandboxes/{sandbox_id}/diagnostics/events", tags=["DevOps"], response_model=DiagnosticContent)
def diagnostics_events(request: Request, sandbox_id: str, scope: str | None = None) -> Any:
    """The sandbox's policy-change records and current state."""
    return diagnostics(request, sandbox_id, "events", scope)


@router.get("/sandboxes/{sandbox_id}/diagnostics/summary", tags=["DevOps"], response_class=PlainTextResponse)
def diagnostics_summary(request: Request, sandbox_id: str) -> str:
    r = call(service_of(request).get, sandbox_id)
    expires = r.expires_at.isoformat() if r.expires_at else "never"
    lines = [f"sandbox {r.id}", f"state {r.state} ({r.reason or '-'})", f"image {r.image}",
             f"address {r.address}", f"expires {expires}"]  # fmt: skip
    return "\n".join(lines) + "\n"


@router.get("/sandboxes/{sandbox_id}/diagnostics/inspect", tags=["DevOps"], response_class=PlainTextResponse)
def diagnostics_inspect(request: Request, sandbox_id: str) -> str:
    return to_sandbox(call(service_of(request).observed, sandbox_id)).model_dump_json(by_alias=True, indent=2)


@router.post("/metrics/events", status_code=204, response_class=Response, tags=["Metrics"])
def metrics_event(request: Request, event: MetricsEvent) -> Response:
    request.app.state.create_metrics.append(event.model_dump())
    return Response(status_code=204)
