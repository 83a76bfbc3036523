"""The control API on a Unix socket (mode 0600), and `ProxyControl`, the client lifecycle uses.

Rules: only lifecycle talks to this socket (it lives in the state dir, which sandboxes never
see). `PUT /sandboxes/{address}` compiles the entry's policy before it swaps it in, so a bad
policy is answered 422 with the issues and the old entry stays in force. A PUT or DELETE is
answered once the open connections the change no longer allows are closed (proxy/revocation.py).
Entries live in memory only: lifecycle re-pushes every entry after it (re)starts the proxy.

    PUT    /sandboxes/{address}   body: SandboxEntry        -> 200 {"sandbox_id", "address", "rules"}
    DELETE /sandboxes/{address}                             -> 204 (404 if unknown)
    GET    /sandboxes                                       -> 200 [SandboxEntry, ...]
    GET    /sandboxes/{address}                             -> 200 SandboxEntry (404 if unknown)
    GET    /health                                          -> 200 {"status": "ok", "sandboxes": n}
    GET    /metrics                                         -> 200 Prometheus text
    POST   /vault/changed   body: {"names": [...]} or {}    -> 200 {"refreshed": n}

A worker of the pool (proxy/workers.py) has its own socket, which only the pool talks to, with
one more route: `POST /serve` (start accepting: the pool sends it once the worker holds every
entry). The pool's socket adds `GET /names/{sandbox}/{address}` (the name that sandbox resolved
to that address through the pool's DNS: how workers attribute a connection without SNI).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, HTTPException, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel

from sandgate.policy import PolicyError
from sandgate.proxy.config import SandboxEntry
from sandgate.proxy.state import ProxyState


class VaultChange(BaseModel):
    """Vault entries that were stored, rotated or removed; None means "maybe all of them"."""

    names: list[str] | None = None


def control_app(state: ProxyState, serve: Callable[[], Awaitable[None]] | None = None) -> FastAPI:
    """The control API; `serve` given: a worker's, with `POST /serve` calling it."""
    app = FastAPI(title="sandgate proxy control", docs_url=None, redoc_url=None, openapi_url=None)
    if serve is not None:
        add_worker_routes(app, state, serve)

    @app.put("/sandboxes/{address}")
    def put_sandbox(address: str, entry: SandboxEntry) -> Any:
        if entry.address != address:
            raise HTTPException(422, f"path address {address} differs from body address {entry.address}")
        previous = state.table.get(address)
        try:
            sandbox = state.table.put(entry)
        except PolicyError as exc:
            return JSONResponse(
                status_code=422,
                content={
                    "detail": f"policy of sandbox {entry.sandbox_id} rejected; old entry kept",
                    "issues": [str(issue) for issue in exc.issues],
                },
            )
        if previous is not None and previous.id != sandbox.id:  # the address was reused
            state.names.forget(address)
        return {"sandbox_id": sandbox.id, "address": sandbox.address, "rules": sandbox.policy.rule_count}

    @app.delete("/sandboxes/{address}", status_code=204)
    def drop_sandbox(address: str) -> Response:
        if not state.table.drop(address):
            raise HTTPException(404, f"no sandbox at {address}")
        state.names.forget(address)
        return Response(status_code=204)

    @app.post("/vault/changed")
    def vault_changed(change: VaultChange) -> dict[str, int]:
        # A sync handler: FastAPI runs it in a worker thread, so the vault reads never block the loop.
        return {"refreshed": state.table.values.refresh(change.names)}

    @app.get("/sandboxes")
    def list_sandboxes() -> list[SandboxEntry]:
        return state.table.entries()

    @app.get("/sandboxes/{address}")
    def get_sandbox(address: str) -> SandboxEntry:
        sandbox = state.table.get(address)
        if sandbox is None:
            raise HTTPException(404, f"no sandbox at {address}")
        return sandbox.entry

    @app.get("/health")
    def health() -> dict[str, Any]:
        audit = state.audit.failure or "ok"
        return {"status": "ok", "audit": audit, "sandboxes": len(state.table), "pid": os.getpid()}

    @app.get("/metrics")
    def metrics() -> PlainTextResponse:
        return PlainTextResponse(state.metrics.render(), media_type="text/plain; version=0.0.4")

    return app


def add_worker_routes(app: FastAPI, state: ProxyState, serve: Callable[[], Awaitable[None]]) -> None:
    @app.post("/serve")
    async def start_serving() -> dict[str, str]:
        await serve()
        return {"status": "serving"}


class ControlServer:
    """uvicorn serving a control app on a socket bound here with mode 0600, inside the proxy's loop."""

    def __init__(self, app: FastAPI, path: Path) -> None:
        self.path = path
        self._server = uvicorn.Server(
            uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
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


class ProxyControlError(RuntimeError):
    """The proxy refused a control request; the message says why and what to fix."""


class ProxyControl:
    """Sync client of the control API: `ProxyControl(state_dir / "proxy.sock")`."""

    def __init__(self, socket_path: Path | str, timeout: float = 5.0) -> None:
        self.socket_path = Path(socket_path)
        self._client = httpx.Client(
            transport=httpx.HTTPTransport(uds=str(socket_path)), base_url="http://proxy", timeout=timeout
        )

    def put_sandbox(self, entry: SandboxEntry) -> dict[str, Any]:
        return self._ok(
            self._client.put(
                f"/sandboxes/{entry.address}",
                content=entry.model_dump_json(),
                headers={"content-type": "application/json"},
            )
        ).json()

    def drop_sandbox(self, address: str) -> bool:
        """True if it was there; dropping an unknown address is not an error."""
        response = self._client.delete(f"/sandboxes/{address}")
        if response.status_code == 404:
            return False
        self._ok(response)
        return True

    def vault_changed(self, names: list[str] | None = None) -> int:
        """Tell the proxy these vault entries changed (None: any); how many it re-read."""
        response = self._client.post("/vault/changed", json={"names": names})
        return int(self._ok(response).json()["refreshed"])

    def list(self) -> list[SandboxEntry]:
        return [SandboxEntry.model_validate(item) for item in self._ok(self._client.get("/sandboxes")).json()]

    def health(self) -> dict[str, Any]:
        return self._ok(self._client.get("/health")).json()

    def metrics(self) -> str:
        return self._ok(self._client.get("/metrics")).text

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> ProxyControl:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ok(self, response: httpx.Response) -> httpx.Response:
        if response.is_success:
            return response
        try:
            body = response.json()
        except ValueError:
            body = response.text
        request = response.request
        where = f"{request.method} {request.url.path}"
        raise ProxyControlError(f"proxy control {where} -> {response.status_code}: {body}")
