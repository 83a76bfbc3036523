"""`/sandboxes/{id}/proxy/{port}/...`: reach a port inside a sandbox through the control plane.

This is the one way in from clients: the `useServerProxy` endpoints and, by default, the execd
endpoint every SDK is handed (`GET .../endpoints/44772`) point here.

Rules:
1. Who may pass: a key the auth middleware let through (its role and tenant checked against
   api/access.py), or for execd (44772) the sandbox's own execd token instead (the
   header the execd endpoint carries; it opens that sandbox's execd and nothing else). The
   request goes to `<sandbox address>:<port>` over the host's veth, never anywhere else.
2. A faithful intermediary (RFC 9110 7.6): only hop-by-hop fields are removed (Connection and
   every field it names, Keep-Alive, Proxy-*, TE, Trailer, Transfer-Encoding, Upgrade);
   Content-Length, repeated fields (Set-Cookie) and their order are kept both ways; bodies
   stream unbuffered (SSE arrives as execd writes it); a request without a body gets none.
   Upstream connections are kept alive and reused (api/upstream.py).
   Host names the sandbox's address, and `Via` says a gateway forwarded the request.
3. No control-plane credential enters a sandbox. To execd (44772) only the fields execd reads
   pass (`EXECD_READS`: Content-Type, Content-Length, Range) plus the sandbox's token, added
   here: whatever a client adds of its own (the JS SDK's `OPEN-SANDBOX-API-KEY`, an
   `Authorization` for a gateway in front of sandgate, custom headers) stays outside, whatever
   its name. To other ports (the sandbox's own services, which may want `Authorization` or
   cookies) everything end-to-end passes except the API key and egress/execd token fields and
   any field whose value holds the API key or the sandbox's tokens.
4. WebSocket upgrades are relayed message by message, with the client's fields (the same
   filter) and the sandbox's close code and reason passed to the client. To execd, the session
   is recorded like an HTTP call, and a PTY's typed lines each before they pass
   (api/exec_audit.py rule 5); a session that cannot be recorded is closed (1011).
5. Traffic that passes renews an opted-in sandbox's expiry, at most once a minute (setting
   renew_on_access_interval), in a worker thread off the request's path
   (lifecycle/renew_on_access.py).
6. The egress port (18080) is not forwarded: OpenSandbox's clients find its egress API there
   (its sidecar listens on it), and sandgate serves that API outside the sandbox, so
   `/sandboxes/{id}/proxy/18080/...` is answered by the egress routes themselves
   (`/sandboxes/{id}/egress/...`, api/egress.py): one implementation, the same checks (token or
   API key, validation, audit), nothing reaches the sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import unquote

import websockets
from fastapi import APIRouter, Request, WebSocket
from starlette.datastructures import Headers
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from sandgate.lifecycle.api.auth import (
    API_KEY_HEADER,
    EGRESS_AUTH_HEADER,
    EGRESS_PORT,
    bearer_token,
    keys_match,
)
from sandgate.lifecycle.api.calls import call
from sandgate.lifecycle.api.errors import ApiError
from sandgate.lifecycle.api.exec_audit import Call, Terminal
from sandgate.lifecycle.api.upstream import Exchange, UpstreamError
from sandgate.lifecycle.errors import LifecycleError
from sandgate.lifecycle.execd_client import execd_headers
from sandgate.lifecycle.renew_on_access import EXTENSION
from sandgate.lifecycle.runtime.base import EXECD_PORT, EXECD_TOKEN_HEADER
from sandgate.lifecycle.sandbox_store import SandboxRecord

# RFC 9110 7.6.1 (plus the obsolete Proxy-Connection, and Proxy-* below as a prefix).
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding",
                        "upgrade"})  # fmt: skip
CONTROL_PLANE = frozenset(h.lower() for h in (API_KEY_HEADER, EGRESS_AUTH_HEADER, EXECD_TOKEN_HEADER))
# Every field execd reads (besides its token and a WebSocket handshake's own): whatever else a
# client adds, under any name, stays outside the sandbox.
EXECD_READS = frozenset({"content-type", "content-length", "range"})
VIA = ("via", "1.1 sandgate")
PROXY_PATH = re.compile(r"^(?:/v1)?/sandboxes/(?P<sandbox>[^/]+)/proxy/(?P<port>[0-9]{1,5})(?P<rest>/.*)?$")
UNSENDABLE_CLOSE_CODES = frozenset({1005, 1006, 1015})  # "no status", "abnormal", "TLS": never on the wire

router = APIRouter(tags=["Proxy"])
log = logging.getLogger(__name__)
RENEWING: set[asyncio.Task[None]] = set()  # renewals under way (the loop keeps weak references)


def target(app_state: Any, scope: Scope, headers: Headers, sandbox_id: str, port: int) -> SandboxRecord:
    """The running sandbox behind the route, once the caller has shown a key for it (checked
    here too: a path the auth middleware let through as the egress API's, spelt so that the
    front door does not take it as one, must not pass on any key)."""
    if not 1 <= port <= 65535:
        raise ApiError(400, "INVALID_REQUEST", f"port {port} is outside 1-65535")
    if port == EGRESS_PORT:  # rule 6, however the path was spelt
        raise ApiError(404, "NOT_FOUND", f"port {EGRESS_PORT} is the egress API; nothing is forwarded to it")
    record: SandboxRecord = call(app_state.service.get, sandbox_id)
    if scope["state"].get("principal") is None and (
        port != EXECD_PORT or not keys_match(headers.get(EXECD_TOKEN_HEADER, ""), record.execd_token or "\0")
    ):
        raise ApiError(
            401, "INVALID_EXECD_TOKEN", f"{EXECD_TOKEN_HEADER} does not hold sandbox {sandbox_id}'s token"
        )
    if record.address is None or record.state != "Running":
        raise ApiError(409, "NOT_RUNNING", f"sandbox {sandbox_id} is {record.state}; nothing to proxy to")
    renew_on_access(app_state, record)
    return record


def renew_on_access(app_state: Any, record: SandboxRecord) -> None:
    """Rule 5: decided in memory; the renewal (a database write, an audit line) runs in a thread."""
    if (
        EXTENSION not in record.extensions
        or record.expires_at is None
        or not app_state.renewals.due(record.id)
    ):
        return
    task = asyncio.get_running_loop().create_task(
        asyncio.to_thread(renew_quietly, app_state.service, record.id)
    )
    RENEWING.add(task)
    task.add_done_callback(RENEWING.discard)


def renew_quietly(service: Any, sandbox_id: str) -> None:
    try:
        service.renew_on_access(sandbox_id)
    except LifecycleError as exc:  # deleted meanwhile: nothing to renew
        log.info("no renewal on access for %s: %s", sandbox_id, exc.message)
    except Exception:
        log.exception("renewal on access of %s failed", sandbox_id)


def end_to_end(fields: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The fields without the hop-by-hop ones (and those Connection names), order and repeats kept."""
    fields = list(fields)
    listed = (value for name, value in fields if name.lower() == "connection")
    named = {token.strip().lower() for value in listed for token in value.split(",")}
    return [
        (name, value)
        for name, value in fields
        if (low := name.lower()) not in HOP_BY_HOP and low not in named and not low.startswith("proxy-")
    ]


def upstream_headers(
    fields: Iterable[tuple[str, str]], record: SandboxRecord, port: int, api_key: str
) -> list[tuple[str, str]]:
    """The client's end-to-end fields for the sandbox, with nothing of the control plane (the
    server's key, the caller's own key, the sandbox's tokens)."""
    fields = list(fields)
    callers = [value for name, value in fields if name.lower() == API_KEY_HEADER.lower()] or [
        token for name, value in fields if name.lower() == "authorization" and (token := bearer_token(value))
    ]  # the caller's own credential: its key field, else the bearer token it authenticated with
    secrets = [s for s in (api_key, *callers, record.egress_token, record.execd_token) if s]
    kept = [
        (name, value) for name, value in end_to_end(fields) if _passes(name.lower(), value, port, secrets)
    ]
    return [*kept, VIA, *(execd_headers(record).items() if port == EXECD_PORT else ())]


def _passes(name: str, value: str, port: int, secrets: list[str]) -> bool:
    if port == EXECD_PORT:
        return name in EXECD_READS
    return name not in CONTROL_PLANE and name != "host" and not any(secret in value for secret in secrets)


def has_body(headers: Headers) -> bool:
    """RFC 9112 6.3: a request has a body only when it says so by Content-Length or chunking."""
    return "transfer-encoding" in headers or headers.get("content-length", "0") != "0"


class ProxyFrontDoor:
    """The HTTP side of the reverse proxy, served before FastAPI's routing (inside the API-key
    middleware): FastAPI's request handling cost about 0.6 ms of CPU per request on the
    benchmark machine, more than the hop itself (bench/bench_gateway.py). The path after the
    port and the query go upstream as the client wrote them (`raw_path`, not decoded).
    WebSocket upgrades go on to the router (`proxy_websocket`)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw_path = scope.get("raw_path") or scope.get("path", "").encode()
        found = (
            PROXY_PATH.match(raw_path.decode("latin-1")) if scope["type"] in ("http", "websocket") else None
        )
        if found is not None and int(found["port"]) == EGRESS_PORT:
            await self.app(egress_api_scope(scope, raw_path, found), receive, send)  # rule 6
            return
        if found is None or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        try:
            response: Response = await forward(
                request, found["sandbox"], int(found["port"]), found["rest"] or "/"
            )
        except ApiError as exc:
            response = JSONResponse({"code": exc.code, "message": exc.message}, status_code=exc.status)
        await response(scope, receive, send)


def egress_api_scope(scope: Scope, raw_path: bytes, found: re.Match[str]) -> Scope:
    """The request to `[/v1]/sandboxes/{id}/proxy/18080/...` as one to `.../egress/...`."""
    head = raw_path[: found.start("port")].removesuffix(b"/proxy/")
    egress = head + b"/egress" + raw_path[found.end("port") :]
    return {**scope, "raw_path": egress, "path": unquote(egress.decode("latin-1"))}


async def forward(request: Request, sandbox_id: str, port: int, path: str) -> Relay:
    """Forward one HTTP request into the sandbox; the answer streams back through the Relay."""
    state = request.app.state
    record = target(state, request.scope, request.headers, sandbox_id, port)
    query = request.scope.get("query_string", b"").decode("latin-1")
    body = request.stream() if has_body(request.headers) else None
    trail = state.exec_trail.begin(request, record, port, path) if state.exec_trail else None
    if trail is not None:
        body = await trail.request_body(body, request.headers.get("content-type", ""))
        trail.write_ahead()
    try:
        exchange = await state.upstream.send(
            (record.id, record.address, port),
            request.method,
            f"{path}?{query}" if query else path,
            upstream_headers(request.headers.items(), record, port, state.api_key),
            body,
        )
    except UpstreamError as exc:
        if trail is not None:
            trail.finish(None, f"execd did not answer: {exc}")
        raise ApiError(502, "BAD_GATEWAY", f"sandbox {sandbox_id} port {port} did not answer: {exc}") from exc
    return Relay(exchange, trail)


class Relay(Response):
    """The sandbox's answer as it arrives: its status and end-to-end fields, then the body chunk
    by chunk. If the client leaves first, the upstream connection is closed (a command's SSE
    stream stops being read; execd sees the disconnect). An execd call's trail sees each chunk
    and is finished when the answer ends or the client leaves."""

    def __init__(self, exchange: Exchange, trail: Call | None = None) -> None:
        self.exchange = exchange
        self.trail = trail
        self.status_code = exchange.status
        self.background = None
        fields = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in exchange.fields]
        self.raw_headers = [
            (name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in end_to_end(fields)
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        relay = asyncio.ensure_future(self._relay(send))
        left = asyncio.ensure_future(_disconnected(receive))
        client_left = True
        try:
            await asyncio.wait((relay, left), return_when=asyncio.FIRST_COMPLETED)
            client_left = not relay.done()
        finally:
            left.cancel()
            if client_left:
                relay.cancel()
                self.exchange.discard()
            if self.trail is not None:
                self.trail.finish(self.status_code, _broken_off(relay))
        if client_left:  # an ordinary end, not an error: let the cancelled relay end first
            await asyncio.gather(relay, return_exceptions=True)
        else:
            relay.result()

    async def _relay(self, send: Send) -> None:
        async for chunk in self.exchange.body():
            if self.trail is not None:
                self.trail.answer(chunk)
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        if self.trail is not None:  # the outcome is in the file before the client sees the end
            self.trail.finish(self.status_code)
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _broken_off(relay: asyncio.Future[None]) -> str | None:
    """Why an answer did not reach its end, or None when it did."""
    if not relay.done() or relay.cancelled():
        return "the client left before the answer ended"
    error = relay.exception()
    return None if error is None else f"the answer broke off: {error!r}"[:300]


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


@router.websocket("/sandboxes/{sandbox_id}/proxy/{port}/{path:path}")
async def proxy_websocket(websocket: WebSocket, sandbox_id: str, port: int, path: str = "") -> None:
    """Relay a WebSocket session into the sandbox, message by message, until either side closes."""
    state = websocket.app.state
    try:
        record = target(state, websocket.scope, websocket.headers, sandbox_id, port)
    except ApiError as exc:
        await websocket.close(code=4000 + exc.status, reason=exc.message[:120])
        return
    query = f"?{websocket.url.query}" if websocket.url.query else ""
    fields = [
        (name, value)
        for name, value in upstream_headers(websocket.headers.items(), record, port, state.api_key)
        if not name.lower().startswith("sec-websocket-")  # the upstream handshake makes its own
    ]
    trail = state.exec_trail.begin(websocket, record, port, f"/{path}") if state.exec_trail else None
    terminal = Terminal(trail) if trail is not None else None
    try:
        if trail is not None:
            trail.write_ahead()
        upstream = await websockets.connect(
            f"ws://{record.address}:{port}/{path}{query}",
            subprotocols=websocket.scope.get("subprotocols") or None,
            additional_headers=fields,
            user_agent_header=None,
            max_size=None,
        )
    except ApiError as exc:
        await websocket.close(code=1011, reason=exc.message[:120])
        return
    except (OSError, websockets.WebSocketException) as exc:
        if terminal is not None:
            terminal.close(None, f"execd did not accept: {exc}")
        await websocket.close(code=1011, reason=f"sandbox did not accept: {exc}"[:120])
        return
    await websocket.accept(subprotocol=upstream.subprotocol)
    problem = None
    try:
        async with upstream:
            problem = await _relay(websocket, upstream, terminal)
    finally:
        if terminal is not None:
            terminal.close(101, problem)


def sendable(code: int) -> int:
    return 1000 if code in UNSENDABLE_CLOSE_CODES else code


async def _relay(client: WebSocket, upstream: Any, terminal: Terminal | None) -> str | None:
    """Relay until either side closes; why the session was cut off when its trail could not be
    written (rule 4), else None."""
    refused: list[str] = []

    async def inbound() -> None:
        while True:
            message = await client.receive()
            if message["type"] == "websocket.disconnect":
                await upstream.close(sendable(message.get("code", 1000)), message.get("reason") or "")
                return
            data = message["bytes"] if message.get("bytes") is not None else message.get("text") or ""
            if terminal is not None:
                try:
                    terminal.client_message(data)
                except ApiError as exc:
                    refused.append(exc.message)
                    await upstream.close(1011, "audit unwritable")
                    await client.close(1011, exc.message[:120])
                    return
            await upstream.send(data)

    async def outbound() -> None:
        with contextlib.suppress(websockets.ConnectionClosed):  # a code other than 1000/1001
            async for message in upstream:
                if terminal is not None:
                    terminal.sandbox_message(message)
                if isinstance(message, bytes):
                    await client.send_bytes(message)
                else:
                    await client.send_text(message)
        await client.close(sendable(upstream.close_code or 1000), upstream.close_reason or None)

    tasks = [asyncio.create_task(inbound()), asyncio.create_task(outbound())]
    with contextlib.suppress(Exception):
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in tasks:
        task.cancel()
    with contextlib.suppress(Exception):
        await client.close()
    return refused[0] if refused else None
