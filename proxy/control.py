"""The control API on a Unix socket (mode 0600), served inside the proxy's loop.

Rules: the routes are the contract's `ROUTES` (proxy/contract/control.py, where the client
lifecycle uses lives too). `PUT /sandboxes/{address}` loads the entry's policy with sandgate.policy's
validation before anything changes, so a bad policy is answered 422 with the issues and the old
entry stays in force. A PUT or
DELETE is answered once the open connections the change no longer allows are closed
(proxy/revocation.py). Entries live in memory only: lifecycle re-pushes every entry after it
(re)starts the proxy. A worker of the pool (proxy/workers.py) serves `WORKER_ROUTES` too: `POST
/serve` (start accepting: the pool sends it once the worker holds every entry). The pool serves
DNS and `POOL_ROUTES`: `GET /names/{sandbox_address}/{address}` (the name that sandbox resolved to
that address through the pool's DNS: how workers attribute a connection without SNI).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, HTTPException, Response
from fastapi.responses import PlainTextResponse

from sandgate.proxy.contract.config import SandboxEntry
from sandgate.proxy.contract.control import (
    ROUTES,
    WORKER_ROUTES,
    ApprovalAnswer,
    Route,
    VaultChange,
    VaultValues,
)
from sandgate.proxy.state import ProxyState
from sandgate.vault import MemoryStore

# Idle keep-alive connections stay open this long: longer than the clients' (lifecycle's
# ProxyControl and the pool's and workers' clients are httpx, which keeps them 5 s, uvicorn's own
# default: a request sent as uvicorn closed was lost).
IDLE_KEEP_ALIVE = 60


def on(app: FastAPI, route: Route, **options: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`app`'s decorator for `route` (the table's method and path)."""
    return app.api_route(route.path, methods=[route.method], **options)


def control_app(state: ProxyState, serve: Callable[[], Awaitable[None]] | None = None) -> FastAPI:
    """The control API; `serve` given: a worker's, with `POST /serve` calling it."""
    app = FastAPI(title="sandgate proxy control", docs_url=None, redoc_url=None, openapi_url=None)
    if serve is not None:
        add_worker_routes(app, state, serve)

    @on(app, ROUTES.put_sandbox)
    def put_sandbox(address: str, entry: SandboxEntry) -> Any:
        if entry.address != address:
            raise HTTPException(422, f"path address {address} differs from body address {entry.address}")
        previous = state.table.get(address)
        sandbox = state.table.put(entry)
        if previous is not None and previous.id != sandbox.id:  # the address was reused
            state.names.forget(address)
        return {"sandbox_id": sandbox.id, "address": sandbox.address, "rules": sandbox.policy.rule_count}

    @on(app, ROUTES.drop_sandbox, status_code=204)
    def drop_sandbox(address: str) -> Response:
        if (dropped := state.table.get(address)) is not None:
            state.approvals.drop_sandbox(dropped.id)
        if not state.table.drop(address):
            raise HTTPException(404, f"no sandbox at {address}")
        state.names.forget(address)
        return Response(status_code=204)

    @on(app, ROUTES.list_approvals)
    def list_approvals() -> list[dict[str, Any]]:
        return state.approvals.pending()

    @on(app, ROUTES.answer_approval)
    def answer_approval(approval_id: str, answer: ApprovalAnswer) -> dict[str, str]:
        if not state.approvals.answer(approval_id, answer.allow, answer.by):
            raise HTTPException(404, f"approval {approval_id} is not held (answered, timed out, or gone)")
        return {"answered": approval_id}

    @on(app, ROUTES.vault_changed)
    def vault_changed(change: VaultChange) -> dict[str, int]:
        # A sync handler: FastAPI runs it in a worker thread, so the vault reads never block the loop.
        return {"refreshed": state.table.values.refresh(change.names)}

    @on(app, ROUTES.put_values)
    def put_values(change: VaultValues) -> dict[str, int]:
        store = state.table.values.store
        if not isinstance(store, MemoryStore):
            raise HTTPException(409, "values are pushed only into a `memory` vault (a node proxy's)")
        for name, value in change.values.items():
            store.put(name, value.get_secret_value())
        removed = sum(store.delete(name) for name in change.removed)
        state.table.values.refresh([*change.values, *change.removed])
        return {"stored": len(change.values), "removed": removed}

    @on(app, ROUTES.list_sandboxes)
    def list_sandboxes() -> list[SandboxEntry]:
        return state.table.entries()

    @on(app, ROUTES.get_sandbox)
    def get_sandbox(address: str) -> SandboxEntry:
        sandbox = state.table.get(address)
        if sandbox is None:
            raise HTTPException(404, f"no sandbox at {address}")
        return sandbox.entry

    @on(app, ROUTES.health)
    def health() -> dict[str, Any]:
        audit = state.audit.failure or "ok"
        return {"status": "ok", "audit": audit, "sandboxes": len(state.table), "pid": os.getpid()}

    @on(app, ROUTES.metrics)
    def metrics() -> PlainTextResponse:
        return PlainTextResponse(state.metrics.render(), media_type="text/plain; version=0.0.4")

    return app


def add_worker_routes(app: FastAPI, state: ProxyState, serve: Callable[[], Awaitable[None]]) -> None:
    @on(app, WORKER_ROUTES.serve)
    async def start_serving() -> dict[str, str]:
        await serve()
        return {"status": "serving"}


class ControlServer:
    """uvicorn serving a control app on a socket bound here with mode 0600, inside the proxy's loop."""

    def __init__(self, app: FastAPI, path: Path) -> None:
        self.path = path
        self._server = uvicorn.Server(
            uvicorn.Config(
                app, log_level="warning", access_log=False, lifespan="off", timeout_keep_alive=IDLE_KEEP_ALIVE
            )
        )
        self._server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]  # the proxy owns signals
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.path.unlink(missing_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            sock.bind(str(self.path))
        finally:
            os.umask(old_umask)
        os.chmod(self.path, 0o600)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        self._server.should_exit = True
        if self._task:
            await self._task
        self.path.unlink(missing_ok=True)
