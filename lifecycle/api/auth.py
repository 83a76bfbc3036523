"""Who may call the API, and the request id every answer carries.

Rules:
1. Every path needs `OPEN-SANDBOX-API-KEY` (or, with an OIDC issuer set, its JWT there or as
   `Authorization: Bearer`) except the open ones (health, version, docs,
   OpenAPI document), prefixes of routers with a login of their own (the console), and the
   egress API, which a per-sandbox `OPENSANDBOX-EGRESS-AUTH` token (`EGRESS_AUTH_HEADER`)
   guards instead (the clients send no API key there in direct mode), at its own path and at
   the sandbox's proxied egress port (`/proxy/18080`, api/sandbox_proxy.py serves the egress API
   there: its routes check the token or the key), and the reverse proxy to
   a sandbox's execd, which takes that sandbox's execd token instead (the header of the execd
   endpoint; api/sandbox_proxy.py checks it against the sandbox).
2. Keys are compared in constant time.
3. `X-Request-ID` is echoed when the client sent one, generated otherwise.
4. Who a key is (`Gate`): the bootstrap key is the admin `BOOTSTRAP`; a managed key is its row's
   principal (lifecycle/keys.py), refused once revoked or expired. What it may call is
   api/access.py's table. The execd and egress endpoints a key is handed carry a token bound to
   that key and sandbox (`sgx_...`, an HMAC under the server's key) instead of the sandbox's
   own: a call with it is that key's call (its role, tenant and audit principal), and stops
   working when the key does, open streams included (`Streams`): a managed key's when it is
   revoked or expires, an OIDC token's at its `exp`, the bootstrap key's when it is replaced
   (the MAC is made under it). Only `execd_endpoint = "direct"` hands out the sandbox's own
   execd token (execd in the sandbox checks that token alone, api/sandboxes.py).
5. A refused credential (an unknown, wrong, revoked or expired key or token) is an `api` record,
   but a flood of them must not flood the log: per source address and refusal code the first is
   recorded at once and opens a window of `REFUSAL_WINDOW` seconds; the refusals inside it are
   counted and written as one record (`detail.refused_more`) when it closes.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from starlette.datastructures import Headers, MutableHeaders
from starlette.requests import cookie_parser
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandgate.lifecycle.api import access
from sandgate.lifecycle.api.access import EGRESS_PORT
from sandgate.lifecycle.api.errors import EGRESS_MARKER
from sandgate.lifecycle.errors import LifecycleError
from sandgate.lifecycle.keys import KeyBook, now
from sandgate.lifecycle.oidc import OidcVerifier
from sandgate.lifecycle.principals import BOOTSTRAP, DEFAULT_TENANT, Principal, acting, may_see
from sandgate.lifecycle.runtime.base import EXECD_PORT, EXECD_TOKEN_HEADER
from sandgate.proxy import REFUSAL_WINDOW, AuditRecord, RefusalWindows

API_KEY_HEADER = "OPEN-SANDBOX-API-KEY"
EGRESS_AUTH_HEADER = "OPENSANDBOX-EGRESS-AUTH"  # a sandbox's own egress-API token (rule 1)
REQUEST_ID_HEADER = "X-Request-ID"
OPEN_PATHS = frozenset({"/health", "/version", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})
EGRESS_PATH = re.compile(rf"^(/v1)?/sandboxes/(?P<sandbox>[^/]+)/(egress|proxy/{EGRESS_PORT})(/|$)")
EXECD_PROXY_PATH = re.compile(rf"^(/v1)?/sandboxes/(?P<sandbox>[^/]+)/proxy/{EXECD_PORT}(/|$)")
CONSOLE_COOKIE = "sandgate_console"
CONTROL_PLANE_CLIENT = "control-plane"
REVOKED_CLOSE = 4401  # a WebSocket's close code when its key was revoked or expired
BOUND_PREFIX = "sgx_"  # an endpoint token bound to a managed key (rule 4)
BAD_CREDENTIAL = frozenset({"INVALID_API_KEY", "INVALID_TOKEN"})  # refusals recorded per window (rule 5)
log = logging.getLogger(__name__)


def Cookies(scope: Scope) -> dict[str, str]:
    return cookie_parser(Headers(scope=scope).get("cookie", ""))


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


def looks_like_jwt(token: str) -> bool:
    return token.count(".") == 2 and not token.startswith(("sgk_", BOUND_PREFIX))


def bearer(headers: Headers) -> str | None:
    """An `Authorization: Bearer` token (an OIDC client's way), when no API key field was sent."""
    return bearer_token(headers.get("authorization", ""))


def bearer_token(value: str) -> str | None:
    scheme, _, token = value.partition(" ")
    return (token.strip() or None) if scheme.lower() == "bearer" else None


def keys_match(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


@dataclass
class Gate:
    """What the middleware checks a call with: the bootstrap key, the managed keys, whose an
    object is (`owner_of(parameter, value)`: a tenant, or None when there is no such object),
    the console's sessions (`session_principal(cookie)`), the open streams of each key, and
    where the `api` audit records go."""

    api_key: str
    keys: KeyBook | None = None
    owner_of: Callable[[str, str], str | None] = lambda parameter, value: DEFAULT_TENANT
    session_principal: Callable[[str | None], tuple[Principal, datetime | None] | None] = lambda cookie: None
    streams: Streams = field(default_factory=lambda: Streams())
    audit: Callable[[AuditRecord], None] | None = None
    console_prefix: str = "/console"
    oidc: OidcVerifier | None = None  # bearer tokens of an OIDC issuer (lifecycle/oidc.py)

    def principal(self, given: str) -> tuple[Principal | None, datetime | None]:
        """The principal a key (or an OIDC token) proves and when it stops being valid, or
        (None, None). An OIDC token may need the issuer's key set fetched: call it off the loop."""
        if keys_match(given, self.api_key):
            return BOOTSTRAP, None
        if self.oidc is not None and looks_like_jwt(given):
            return self.oidc.principal(given) or (None, None)
        row = self.keys.resolve(given) if self.keys is not None else None
        return (row.principal, row.expires_at) if row else (None, None)

    def endpoint_token(
        self, principal: Principal, expires_at: datetime | None, kind: str, sandbox_id: str
    ) -> str:
        """The token an endpoint hands a key's or an OIDC token's holder for a sandbox's execd
        or egress API (rule 4): `sgx_<principal>.<mac>`, bound to that principal and sandbox, so
        the key's revocation (or the token's expiry, or a new bootstrap key) ends it too."""
        facts = {**principal.model_dump(), "exp": expires_at.timestamp() if expires_at else None}
        payload = base64.urlsafe_b64encode(json.dumps(facts, sort_keys=True).encode()).decode().rstrip("=")
        return f"{BOUND_PREFIX}{payload}.{self._mac(payload, kind, sandbox_id)}"

    def endpoint_principal(
        self, token: str, kind: str, sandbox_id: str
    ) -> tuple[Principal | None, datetime | None]:
        """The principal behind an endpoint token while it may still act (its key usable, its
        OIDC token unexpired); else (None, None)."""
        payload, _, mac = token.removeprefix(BOUND_PREFIX).rpartition(".")
        if not hmac.compare_digest(mac, self._mac(payload, kind, sandbox_id)):
            return None, None
        facts = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        expires = datetime.fromtimestamp(facts.pop("exp"), UTC) if facts.get("exp") else None
        principal = Principal(**facts)
        if principal.via == "bootstrap":  # the MAC checked is under the bootstrap key itself
            return BOOTSTRAP, None
        if principal.via == "key":
            return (principal, expires) if self._key_usable(principal.id) else (None, None)
        return (principal, expires) if expires is None or now() < expires else (None, None)

    def _mac(self, payload: str, kind: str, sandbox_id: str) -> str:
        message = f"{kind}\0{sandbox_id}\0{payload}".encode()
        return hmac.new(self.api_key.encode(), message, hashlib.sha256).hexdigest()

    def _key_usable(self, key_id: str) -> bool:
        if self.keys is None:
            return False
        try:
            return self.keys.get(key_id).usable(now())
        except LifecycleError:
            return False

    def console_principal(self, key: str) -> tuple[Principal, datetime | None] | None:
        """Who a console login's key (or OIDC token) is and when it expires (`still_valid`)."""
        principal, expires_at = self.principal(key)
        return (principal, expires_at) if principal is not None and self.still_valid(principal) else None

    def still_valid(self, principal: Principal) -> bool:
        """A console session's principal, checked at each page: its key not revoked or expired
        (an OIDC token's session ends at its `exp`: console/session.py)."""
        if principal.via == "key":
            return self._key_usable(principal.id)
        return principal.via in ("bootstrap", "oidc")


class Streams:
    """The calls under way of each managed key (follow streams, console streams, WebSockets,
    long execd answers): revoking the key, or its expiry, cancels them (api/keys.py)."""

    def __init__(self) -> None:
        self._open: dict[str, set[asyncio.Task[None]]] = {}
        self._cut: set[asyncio.Task[None]] = set()  # cancelled here, not by the client leaving

    async def run(
        self, key_id: str, expires_at: datetime | None, call: Awaitable[None], ticket: dict[str, Any]
    ) -> bool:
        """Run `call` until it ends, the key is revoked or it expires; True if it was cut off
        (however the call ended then: a relay may turn its cancellation into an error)."""
        task = ticket["task"] = asyncio.ensure_future(call)
        self._open.setdefault(key_id, set()).add(task)
        timer = None
        if expires_at is not None:
            delay = max(0.0, (expires_at - now()).total_seconds())
            timer = asyncio.get_running_loop().call_later(delay, self._cut_off, task)
        try:
            await task
        except BaseException:
            if task not in self._cut:
                raise
        finally:
            if timer is not None:
                timer.cancel()
            self._open[key_id].discard(task)
            if not self._open[key_id]:
                del self._open[key_id]
            if not task.done():  # this call itself was cancelled (the client left, a shutdown)
                task.cancel()
        cut = task in self._cut
        self._cut.discard(task)
        return cut

    def close(self, key_id: str) -> int:
        """Cancel every call of the key under way; how many."""
        tasks = list(self._open.get(key_id, ()))
        for task in tasks:
            self._cut_off(task)
        return len(tasks)

    def was_cut(self, call: dict[str, Any]) -> bool:
        """Whether the call `run` was given `call` for is being cut off (its key revoked or
        expired); asked from its tasks (a WebSocket relay's run beside the call's own)."""
        return call.get("task") in self._cut

    def _cut_off(self, task: asyncio.Task[None]) -> None:
        self._cut.add(task)
        task.cancel()


class AuthMiddleware:
    """Pure ASGI middleware: authenticates every call (also WebSocket upgrades on the reverse
    proxy), checks it against api/access.py's table, sets `principals.acting`, runs a managed
    key's call so that revoking the key ends it, and writes the `api` audit record of a change
    or a refusal."""

    def __init__(
        self,
        app: ASGIApp,
        gate: Gate,
        open_paths: frozenset[str] = OPEN_PATHS,
        open_prefixes: tuple[str, ...] = (),
    ) -> None:
        self.app = app
        self.gate = gate
        self.open_paths = open_paths
        self.open_prefixes = open_prefixes
        self.refusals = RefusalWindows()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        request_id = headers.get(REQUEST_ID_HEADER) or uuid.uuid4().hex
        outcome: dict[str, Any] = {"status": 0}  # the answer's status; Streams' ticket

        def answered(status: int) -> None:
            """The call's `api` record, once, when its answer's status is known and before the
            client sees it (a change, or a refusal; not a read, nor a call with no credential)."""
            outcome["status"] = status
            if outcome.get("recorded") or (method in ("GET", "HEAD", "WS") and 0 < status < 400):
                return
            outcome["recorded"] = True
            if not outcome.get("quiet") and self._first_in_window(scope, outcome.get("code"), found):
                self._record(scope, found, principal, status)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)[REQUEST_ID_HEADER] = request_id
                answered(message["status"])
            elif message["type"] == "websocket.accept":
                outcome["status"] = 101
            elif message["type"] == "websocket.close":
                outcome["closed"] = 1
                if self.gate.streams.was_cut(outcome):  # the relay closing as its key was revoked
                    message = {**message, "code": REVOKED_CLOSE, "reason": "key revoked or expired"}
            await send(message)

        scope.setdefault("state", {})["request_id"] = request_id
        method = "WS" if scope["type"] == "websocket" else scope["method"]
        found = access.match(method, scope["path"])
        principal, expires_at, refusal = await self._caller(scope, headers, found)
        if found is None and scope["path"] not in self.open_paths:  # no row: fail closed (access.py rule 1)
            refusal = refusal or (404, "NOT_FOUND", "Not Found")  # the router's own words
        elif refusal is None and found is not None and principal is not None:
            refusal = self._refusal(principal, *found)
        if refusal is not None:
            outcome["quiet"] = refusal[1] == "MISSING_API_KEY"  # no credential at all: no record
            outcome["code"] = refusal[1]
            answered(refusal[0])
            await self._refuse(scope, receive, send_with_id, refusal)
            return
        scope["state"]["principal"] = principal
        scope["state"]["principal_expires"] = expires_at
        token = acting.set(principal)
        try:
            if principal is not None and principal.via in ("key", "oidc"):
                call = self.app(scope, receive, send_with_id)
                cut = await self.gate.streams.run(principal.id, expires_at, call, outcome)
                if cut and not outcome.get("closed"):
                    await self._cut_off(scope, send_with_id, outcome["status"])
                    outcome["status"] = outcome["status"] or 401
            else:
                await self.app(scope, receive, send_with_id)
        finally:
            acting.reset(token)
            answered(outcome["status"])  # a call that ended without an answer (cut off, failed)

    async def _caller(
        self, scope: Scope, headers: Headers, found: tuple[access.Rule, dict[str, str]] | None
    ) -> tuple[Principal | None, datetime | None, tuple[int, str, str] | None]:
        """Who calls: (principal, when it expires, None), or a refusal (status, code, message).
        No principal and no refusal: an open route, or a sandbox's own token, which its route
        checks (rule 1)."""
        path, given = scope["path"], headers.get(API_KEY_HEADER) or self._oidc_bearer(headers)
        if path in self.open_paths or (found is not None and found[0].is_open):
            return None, None, None
        if given:
            if looks_like_jwt(given):  # the issuer's key set may be fetched: not on the loop
                principal, expires_at = await asyncio.to_thread(self.gate.principal, given)
            else:
                principal, expires_at = self.gate.principal(given)
            if principal is None:
                message = f"{API_KEY_HEADER} holds no valid key of this server (unknown, revoked or expired)"
                return None, None, (401, "INVALID_API_KEY", message)
            return principal, expires_at, None
        if path.startswith(self.gate.console_prefix):
            session = self.gate.session_principal(Cookies(scope).get(CONSOLE_COOKIE))
            if session is not None and self.gate.still_valid(session[0]):
                return session[0], session[1], None  # an OIDC session's feeds end at its token's exp
            return None, None, None  # the console's own login check answers (a redirect)
        bound = self._bound_token(path, headers)
        if bound is not None:
            kind, token, sandbox_id = bound
            scope["state"]["endpoint_token"] = kind  # the credential shown (the audit's `actor`)
            principal, expires_at = self.gate.endpoint_principal(token, kind, sandbox_id)
            if principal is None:
                return (
                    None,
                    None,
                    (401, "INVALID_TOKEN", f"the {kind} token's key was revoked or has expired"),
                )
            return principal, expires_at, None
        if EGRESS_PATH.match(path) or (EXECD_TOKEN_HEADER in headers and EXECD_PROXY_PATH.match(path)):
            return None, None, None  # the route checks the sandbox's token against the sandbox's
        if path.startswith(self.open_prefixes):
            return None, None, None
        return None, None, (401, "MISSING_API_KEY", f"send the API key in the {API_KEY_HEADER} header")

    def _oidc_bearer(self, headers: Headers) -> str | None:
        """`Authorization: Bearer` is a credential only with an OIDC issuer set and no endpoint
        token beside it; otherwise it is the client's own header (an SDK may send one with every
        call), which the reverse proxy keeps from the sandbox."""
        if self.gate.oidc is None or EXECD_TOKEN_HEADER in headers or EGRESS_AUTH_HEADER in headers:
            return None
        return bearer(headers)

    @staticmethod
    def _bound_token(path: str, headers: Headers) -> tuple[str, str, str] | None:
        """(kind, token, sandbox id) of a key-bound endpoint token on its path, else None."""
        for kind, header, pattern in (("execd", EXECD_TOKEN_HEADER, EXECD_PROXY_PATH),
                                      ("egress", EGRESS_AUTH_HEADER, EGRESS_PATH)):  # fmt: skip
            token = headers.get(header, "")
            if token.startswith(BOUND_PREFIX) and (found := pattern.match(path)):
                return kind, token, found["sandbox"]
        return None

    def _refusal(
        self, principal: Principal, rule: access.Rule, params: dict[str, str]
    ) -> tuple[int, str, str] | None:
        if rule.owner is not None:
            tenant = self.gate.owner_of(rule.owner, params[rule.owner])
            if tenant is not None and not may_see(principal, tenant):
                what = rule.owner.removesuffix("_id")
                return 404, "NOT_FOUND", f"{what} {params[rule.owner]!r} does not exist"
        if principal.role not in rule.roles:
            return (
                403,
                "FORBIDDEN",
                f"role {principal.role} may not {rule.action} (allowed: {', '.join(sorted(rule.roles))})",
            )
        return None

    @staticmethod
    async def _refuse(scope: Scope, receive: Receive, send: Send, refusal: tuple[int, str, str]) -> None:
        status, code, message = refusal
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 4000 + status, "reason": message})
            return
        response: Response
        if EGRESS_MARKER in scope["path"] + "/" or EGRESS_PATH.match(scope["path"]):
            response = PlainTextResponse(message, status_code=status)
        else:
            response = JSONResponse({"code": code, "message": message}, status_code=status)
        await response(scope, receive, send)

    @staticmethod
    async def _cut_off(scope: Scope, send: Send, status: int) -> None:
        """A call whose key was revoked (or expired) while it ran: a WebSocket is closed with
        4401, an answer not begun is a 401, a streamed answer ends there (its last chunk)."""
        try:
            if scope["type"] == "websocket":
                await send(
                    {"type": "websocket.close", "code": REVOKED_CLOSE, "reason": "key revoked or expired"}
                )
            elif status == 0:
                await JSONResponse({"code": "KEY_REVOKED", "message": "the key was revoked or expired"},
                                   status_code=401)(scope, _no_body, send)  # fmt: skip
            else:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except Exception:  # the client left meanwhile, or the answer had ended
            log.warning("could not end a call of a revoked key", exc_info=True)

    def _first_in_window(
        self, scope: Scope, code: str | None, found: tuple[access.Rule, dict[str, str]] | None
    ) -> bool:
        """Whether a refusal gets its own record (rule 5): any call but a bad credential does."""
        if code not in BAD_CREDENTIAL:
            return True
        window = (scope["client"][0] if scope.get("client") else "unknown", str(code))
        if not self.refusals.refused(window):
            return False
        scope["state"]["audit_detail"] = {"code": code, "source": window[0]}
        summary = {**scope, "state": {}}  # the window's summary names the first call's route
        asyncio.get_running_loop().call_later(REFUSAL_WINDOW, self._close_window, window, summary, found)
        return True

    def _close_window(
        self, window: tuple[str, str], scope: Scope, found: tuple[access.Rule, dict[str, str]] | None
    ) -> None:
        more = self.refusals.close(window)
        if more:
            source, code = window
            scope["state"]["audit_detail"] = {
                "refused_more": more,
                "window_s": REFUSAL_WINDOW,
                "code": code,
                "source": source,
            }
            self._record(scope, found, None, 401)

    def _record(
        self,
        scope: Scope,
        found: tuple[access.Rule, dict[str, str]] | None,
        principal: Principal | None,
        status: int,
    ) -> None:
        if self.gate.audit is None or (found is not None and found[0].is_open):
            return
        rule, params = found if found is not None else (None, {})
        if rule is not None and rule.action == "sandbox.proxy" and status < 400:
            return  # the exec trail records each execd call with its principal
        extra = scope["state"].get("audit_detail") or {}
        detail = {"params": params, **extra}
        record = AuditRecord(
            kind="api",
            sandbox=params.get("sandbox_id") or extra.get("sandbox") or "-",
            client=CONTROL_PLANE_CLIENT,
            decision="allow" if 0 < status < 400 else "deny",
            reason=rule.action if rule else "unknown route",
            method="WS" if scope["type"] == "websocket" else scope["method"],
            path=scope["path"],
            status=status or None,
            detail=json.dumps(detail, sort_keys=True),
            principal=principal or scope["state"].get("principal"),
        )
        try:
            self.gate.audit(record)
        except OSError:
            log.exception("could not write the api audit record of %s %s", record.method, record.path)


async def _no_body() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}
