"""`/sandboxes/{id}/proxy/{port}/...`: reach a port inside a sandbox through the control plane.

Rules: the caller needs the API key (the clients send it in server-proxy mode); the request
goes to `<sandbox address>:<port>` over the host's veth, never anywhere else. Bodies stream
both ways (SSE from execd arrives as it is written); hop-by-hop headers and the API key are
not forwarded; WebSocket upgrades are relayed message by message. Requests to execd (44772)
carry the sandbox's execd token, added here: a client of the proxy never needs it, and a token
header the client sent is replaced, never passed on.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import httpx
import websockets
from fastapi import APIRouter, Request, WebSocket
from starlette.background import BackgroundTask
from starlette.responses import StreamingResponse

from sandgate.lifecycle.api.auth import API_KEY_HEADER
from sandgate.lifecycle.api.calls import call
from sandgate.lifecycle.api.errors import ApiError
from sandgate.lifecycle.execd_client import execd_headers
from sandgate.lifecycle.runtime.base import EXECD_PORT, EXECD_TOKEN_HEADER
from sandgate.lifecycle.store import SandboxRecord

HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
                        "trailer", "transfer-encoding", "upgrade", "host", "content-length",
                        API_KEY_HEADER.lower()})  # fmt: skip
METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]

router = APIRouter(tags=["Proxy"])


def target(app_state: Any, sandbox_id: str, port: int) -> SandboxRecord:
    if not 1 <= port <= 65535:
        raise ApiError(400, "INVALID_REQUEST", f"port {port} is outside 1-65535")
    record: SandboxRecord = call(app_state.service.get, sandbox_id)
    if record.address is None or record.state != "Running":
        raise ApiError(409, "NOT_RUNNING", f"sandbox {sandbox_id} is {record.state}; nothing to proxy to")
    return record


def forwarded_headers(headers: Any) -> list[tuple[str, str]]:
    return [(k, v) for k, v in headers.items() if k.lower() not in HOP_BY_HOP]


def upstream_headers(headers: Any, record: SandboxRecord, port: int) -> list[tuple[str, str]]:
    """The client's headers for the sandbox; for execd, with the sandbox's token instead of any
    the client sent."""
    forwarded = forwarded_headers(headers)
    if port != EXECD_PORT:
        return forwarded
    kept = [(k, v) for k, v in forwarded if k.lower() != EXECD_TOKEN_HEADER.lower()]
    return kept + list(execd_headers(record).items())


@router.api_route("/sandboxes/{sandbox_id}/proxy/{port}", methods=METHODS, include_in_schema=False)
@router.api_route(
    "/sandboxes/{sandbox_id}/proxy/{port}/{path:path}", methods=METHODS, include_in_schema=False
)
async def proxy_http(request: Request, sandbox_id: str, port: int, path: str = "") -> StreamingResponse:
    """Forward one HTTP request into the sandbox and stream the answer back."""
    record = target(request.app.state, sandbox_id, port)
    client: httpx.AsyncClient = request.app.state.proxy_client
    upstream = client.build_request(
        request.method,
        f"http://{record.address}:{port}/{path}",
        params=request.url.query,
        headers=upstream_headers(request.headers, record, port),
        content=request.stream(),
    )
    try:
        response = await client.send(upstream, stream=True)
    except httpx.HTTPError as exc:
        raise ApiError(502, "BAD_GATEWAY", f"sandbox {sandbox_id} port {port} did not answer: {exc}") from exc
    return StreamingResponse(
        response.aiter_raw(),
        status_code=response.status_code,
        headers=dict(forwarded_headers(response.headers)),
        background=BackgroundTask(response.aclose),
    )


@router.websocket("/sandboxes/{sandbox_id}/proxy/{port}/{path:path}")
async def proxy_websocket(websocket: WebSocket, sandbox_id: str, port: int, path: str = "") -> None:
    """Relay a WebSocket session into the sandbox, message by message, until either side closes."""
    try:
        record = target(websocket.app.state, sandbox_id, port)
    except ApiError as exc:
        await websocket.close(code=4404, reason=exc.message[:120])
        return
    query = f"?{websocket.url.query}" if websocket.url.query else ""
    subprotocols = websocket.scope.get("subprotocols") or None
    try:
        upstream = await websockets.connect(
            f"ws://{record.address}:{port}/{path}{query}",
            subprotocols=subprotocols,
            additional_headers=execd_headers(record) if port == EXECD_PORT else None,
        )
    except (OSError, websockets.WebSocketException) as exc:
        await websocket.close(code=1011, reason=f"sandbox did not accept: {exc}"[:120])
        return
    await websocket.accept(subprotocol=upstream.subprotocol)
    async with upstream:
        await _relay(websocket, upstream)


async def _relay(client: WebSocket, upstream: Any) -> None:
    async def inbound() -> None:
        while True:
            message = await client.receive()
            if message["type"] == "websocket.disconnect":
                return
            await upstream.send(message.get("bytes") or message.get("text") or "")

    async def outbound() -> None:
        async for message in upstream:
            if isinstance(message, bytes):
                await client.send_bytes(message)
            else:
                await client.send_text(message)

    tasks = [asyncio.create_task(inbound()), asyncio.create_task(outbound())]
    with contextlib.suppress(Exception):
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in tasks:
        task.cancel()
    with contextlib.suppress(Exception):
        await client.close()
