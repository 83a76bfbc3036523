"""Who may call the API, and the request id every answer carries.

Rules:
1. Every path needs `OPEN-SANDBOX-API-KEY` except the open ones (health, version, docs,
   OpenAPI document), prefixes of routers with a login of their own (the console), and the
   egress API, which a per-sandbox `OPENSANDBOX-EGRESS-AUTH` token (`EGRESS_AUTH_HEADER`)
   guards instead (the clients send no API key there in direct mode), at its own path and at
   the sandbox's proxied egress port (`/proxy/18080`, api/sandbox_proxy.py serves the egress API
   there: its routes check the token or the key), and the reverse proxy to
   a sandbox's execd, which takes that sandbox's execd token instead (the header of the execd
   endpoint; api/sandbox_proxy.py checks it against the sandbox).
2. Keys are compared in constant time.
3. `X-Request-ID` is echoed when the client sent one, generated otherwise.
"""

from __future__ import annotations

import hmac
import os
import re
import secrets
import uuid
from pathlib import Path

from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandgate.lifecycle.runtime.base import EXECD_PORT, EXECD_TOKEN_HEADER

API_KEY_HEADER = "OPEN-SANDBOX-API-KEY"
EGRESS_AUTH_HEADER = "OPENSANDBOX-EGRESS-AUTH"  # a sandbox's own egress-API token (rule 1)
EGRESS_PORT = 18080  # OpenSandbox's egress sidecar's port: its endpoint is the egress API
REQUEST_ID_HEADER = "X-Request-ID"
OPEN_PATHS = frozenset({"/health", "/version", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})
EGRESS_PATH = re.compile(rf"^(/v1)?/sandboxes/[^/]+/(egress|proxy/{EGRESS_PORT})(/|$)")
EXECD_PROXY_PATH = re.compile(rf"^(/v1)?/sandboxes/[^/]+/proxy/{EXECD_PORT}(/|$)")


def load_or_create_api_key(state_dir: Path) -> tuple[str, bool]:
    """The key stored in `<state_dir>/api_key` (0600), created on first use; True if new."""
    path = state_dir / "api_key"
    if path.is_file():
        return path.read_text().strip(), False
    key = "sg-" + secrets.token_urlsafe(32)  # never '-' first: a CLI would read it as an option
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(key + "\n")
    return key, True


def keys_match(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


class AuthMiddleware:
    """Pure ASGI middleware (also guards WebSocket upgrades on the reverse proxy)."""

    def __init__(
        self,
        app: ASGIApp,
        api_key: str,
        open_paths: frozenset[str] = OPEN_PATHS,
        open_prefixes: tuple[str, ...] = (),
    ) -> None:
        self.app = app
        self.api_key = api_key
        self.open_paths = open_paths
        self.open_prefixes = open_prefixes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        request_id = headers.get(REQUEST_ID_HEADER) or uuid.uuid4().hex

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)[REQUEST_ID_HEADER] = request_id
            await send(message)

        scope.setdefault("state", {})["request_id"] = request_id
        refusal = self._refusal(scope["path"], headers.get(API_KEY_HEADER), EXECD_TOKEN_HEADER in headers)
        if refusal is None:
            await self.app(scope, receive, send_with_id)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 4401, "reason": refusal[1]})
        else:
            response = JSONResponse({"code": refusal[0], "message": refusal[1]}, status_code=401)
            await response(scope, receive, send_with_id)

    def _refusal(self, path: str, given: str | None, execd_token: bool) -> tuple[str, str] | None:
        if path in self.open_paths or path.startswith(self.open_prefixes) or EGRESS_PATH.match(path):
            return None
        if given is None and execd_token and EXECD_PROXY_PATH.match(path):
            return None  # the reverse proxy checks the token against the sandbox's
        if not given:
            return ("MISSING_API_KEY", f"send the API key in the {API_KEY_HEADER} header")
        if not keys_match(given, self.api_key):
            return ("INVALID_API_KEY", f"the {API_KEY_HEADER} header does not hold this server's key")
        return None
