"""The FastAPI application of the control plane.

Rules: every route is served bare and under `/v1` (the clients use `/v1`, the reference server
answers both); auth and `X-Request-ID` are one ASGI middleware around everything; errors go
through `errors.install_error_handlers`. The app holds no state of its own: the service, the
key and the audit path are handed in, so tests and `sandgate serve` build it the same way.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from email.utils import formatdate
from importlib.metadata import version
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandgate.lifecycle.api import (
    approvals,
    egress,
    keys,
    metrics,
    sandbox_proxy,
    sandboxes,
    snapshots,
    tenants,
    unsupported,
)
from sandgate.lifecycle.api.auth import OPEN_PATHS, AuthMiddleware, Gate
from sandgate.lifecycle.api.errors import install_error_handlers
from sandgate.lifecycle.api.exec_audit import ExecTrail
from sandgate.lifecycle.api.sandbox_proxy import ProxyFrontDoor
from sandgate.lifecycle.api.sandboxes import HostVolumes
from sandgate.lifecycle.api.upstream import Pool
from sandgate.lifecycle.renew_on_access import AccessRenewals
from sandgate.lifecycle.service import Service
from sandgate.lifecycle.trail_secrets import Secrets
from sandgate.proxy import append_record

API_PREFIXES = ("", "/v1")


def create_app(
    service: Service,
    *,
    api_key: str,
    audit_path: Path,
    extra_routers: Iterable[APIRouter] = (),
    open_prefixes: Iterable[str] = (),
    execd_endpoint: str = "host",
    exec_audit: bool = True,
    host_volumes: HostVolumes | None = None,
    renew_interval: float = 60.0,
    gate: Gate | None = None,
) -> FastAPI:
    """The lifecycle + egress API. `extra_routers` (e.g. audit, console) are mounted as given,
    behind the same API-key check unless their paths start with one of `open_prefixes` (routers
    that check a login of their own). `execd_endpoint` is the setting of that name: "host" hands
    out the reverse proxy as execd's endpoint, "direct" the sandbox's address. `exec_audit`
    records every execd call the reverse proxy forwards (api/exec_audit.py). `host_volumes` says
    where a create's host volumes may come from (none: refused). `renew_interval`: the setting
    renew_on_access_interval. `gate`: who may call (api/auth.py; default: the one key, whose
    principal is the bootstrap admin)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.upstream = Pool()
        try:
            yield
        finally:
            app.state.upstream.close()

    app = FastAPI(
        title="sandgate lifecycle API",
        version=version("sandgate"),
        description="OpenSandbox-compatible lifecycle, egress-policy and credential-vault API.",
        lifespan=lifespan,
    )
    app.state.service = service
    app.state.api_key = api_key
    app.state.gate = gate = gate or Gate(api_key)
    if gate.audit is None:
        gate.audit = lambda record: append_record(audit_path, record)
    gate.owner_of = owners(service)
    app.state.audit_path = audit_path
    app.state.execd_endpoint = execd_endpoint
    app.state.exec_trail = (
        ExecTrail(audit_path, Secrets(service.egress.vault_values, api_key)) if exec_audit else None
    )
    app.state.host_volumes = host_volumes or HostVolumes()
    app.state.create_metrics = deque(maxlen=1000)
    app.state.renewals = AccessRenewals(renew_interval)
    install_error_handlers(app)

    @app.get("/health", tags=["Server"])
    def health() -> dict[str, Any]:
        """With a warm pool, how many of its sandboxes are ready to be claimed (counts only)."""
        answer: dict[str, Any] = {"status": "healthy"}
        if service.pool is not None:
            answer["warmPool"] = {"size": service.pool.size, "ready": len(service.pool.members())}
        return answer

    @app.get("/version", tags=["Server"])
    def server_version() -> dict[str, str]:
        return {"version": version("sandgate"), "compatible": "opensandbox-1.1.1"}

    for prefix in API_PREFIXES:
        routers = (
            sandboxes.router,
            egress.router,
            egress.network_policy_router,
            sandbox_proxy.router,
            metrics.router,
            snapshots.router,
            approvals.router,
            keys.router,
            tenants.router,
            unsupported.router,
        )
        for router in routers:
            app.include_router(router, prefix=prefix)
    for router in extra_routers:
        app.include_router(router)
    app.add_middleware(ProxyFrontDoor)  # innermost: after the API-key check, before routing
    app.add_middleware(AuthMiddleware, gate=gate, open_paths=OPEN_PATHS, open_prefixes=tuple(open_prefixes))
    app.add_middleware(DateHeader)
    return app


def owners(service: Service) -> Callable[[str, str], str | None]:
    """Whose the object a path parameter names is (api/access.py rule 3): a sandbox's tenant, a
    snapshot's sandbox's, a held request's sandbox's; None when there is no such object."""
    from sandgate.lifecycle.approvals import ApprovalDesk
    from sandgate.lifecycle.snapshots import Snapshots

    def owner_of(parameter: str, value: str) -> str | None:
        if parameter == "tenant":
            return value
        if parameter == "sandbox_id":
            return service.store.tenant_of(value)
        try:
            if parameter == "snapshot_id":
                taken = Snapshots(service).get(value).snapshot
                return service.store.tenant_of(taken.sandbox_id) if taken else None
            held = next((item for item in ApprovalDesk(service.egress).pending() if item.id == value), None)
        except Exception:  # no such snapshot; the proxy's list unreachable: the route answers
            return None
        return service.store.tenant_of(held.sandbox) if held else None

    return owner_of


class DateHeader:
    """RFC 9110 6.6.1: an answer without Date gets one; a proxied answer that has its own keeps
    it alone (`sandgate serve` turns uvicorn's Date and Server off: they were added to every
    answer, doubling a sandbox's)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_dated(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                if not any(name.lower() == b"date" for name, _ in headers):
                    message["headers"] = [*headers, (b"date", formatdate(usegmt=True).encode())]
            await send(message)

        await self.app(scope, receive, send_dated)
