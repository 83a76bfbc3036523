"""`console_router(...)`: the reviewer's web console under /console, server-rendered.

Rules:
1. Every page but login and the static files needs the console cookie: an HttpOnly, SameSite=Strict
   cookie holding a random session token (never the API key), set when the login form POSTs
   the key. The key is never taken from a URL: a query string ends up in access logs and
   browser history. The key is checked by the app's `verify_key`; sessions live in memory for
   12 hours (a restart logs everyone out; logout ends one).
2. Audit content is written by sandboxes, i.e. untrusted: record fields are shown `visible`
   (control and bidi characters escaped, in the pages and in the live feed's stream), templates
   autoescape, the live feed builds rows with textContent, and a strict Content-Security-Policy
   (scripts and styles from 'self' only) backs them up. Nothing is loaded from anywhere else (no CDN).
3. The console only reads: the audit index, and sandboxes with their live policy through the
   `sandboxes` callable the app hands in (no import of lifecycle internals).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlencode

import jinja2
from fastapi import APIRouter, Depends, Form, HTTPException, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response, StreamingResponse

from sandgate.lifecycle.audit import AuditFilter, AuditStore, PolicyChange, QueryError
from sandgate.lifecycle.audit.routes import sse_events
from sandgate.lifecycle.console.views import ConsoleSandbox, policy_diff, policy_yaml
from sandgate.lifecycle.visible import visible, visible_record
from sandgate.policy import OUTCOMES
from sandgate.proxy import RECORD_KINDS

HERE = Path(__file__).parent
COOKIE = "sandgate_console"
STATIC_FILES = {"console.css": "text/css", "console.js": "text/javascript"}
WINDOWS = ("1h", "24h", "today", "7d", "30d")
SESSION_LIFETIME_S = 12 * 3600  # a console login lasts a working day
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
SandboxLister = Callable[[], Iterable[Any]]

_templates = jinja2.Environment(
    loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True, undefined=jinja2.StrictUndefined
)
_templates.filters["visible"] = visible
_templates.globals.update(outcomes=list(OUTCOMES), kinds=list(RECORD_KINDS))


def console_router(
    store: AuditStore,
    verify_key: Callable[[str], bool],
    sandboxes: SandboxLister,
    *,
    prefix: str = "/console",
    secure_cookie: bool = False,
) -> APIRouter:
    """The console pages. `sandboxes()` returns the live sandboxes (dicts or objects with id,
    status, address, policy); `verify_key(key)` says whether a key is this server's API key."""
    router = APIRouter(prefix=prefix, include_in_schema=False)

    def page(template: str, nav: str = "", status_code: int = 200, **values: Any) -> HTMLResponse:
        html = _templates.get_template(template).render(root=prefix, nav=nav, authed=nav != "login", **values)
        return HTMLResponse(html, status_code=status_code, headers=SECURITY_HEADERS)

    sessions = Sessions()

    def logged_in(request: Request) -> None:
        if not sessions.valid(request.cookies.get(COOKIE)):
            target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            raise HTTPException(
                303, "log in first", headers={"Location": f"{prefix}/login?{urlencode({'next': target})}"}
            )

    def live_sandboxes() -> list[ConsoleSandbox]:
        return sorted((ConsoleSandbox.model_validate(s) for s in sandboxes()), key=lambda s: s.id)

    def safe_next(target: str | None) -> str:
        return target if target and target.startswith(prefix) and not target.startswith("//") else prefix

    def with_session(response: Response) -> Response:
        token = sessions.new()
        response.set_cookie(
            COOKIE, token, httponly=True, samesite="strict", secure=secure_cookie, path=prefix
        )
        return response

    Authed = Depends(logged_in)

    @router.get("/static/{name}")
    def static(name: str) -> FileResponse:
        if name not in STATIC_FILES:
            raise HTTPException(404, f"no static file {name}")
        return FileResponse(HERE / "static" / name, media_type=STATIC_FILES[name], headers=SECURITY_HEADERS)

    @router.get("/login")
    def login_form(next: str | None = None) -> Response:
        return page("login.html", nav="login", error=None, next=safe_next(next))

    @router.post("/login")
    def login(key: Annotated[str, Form()], next: Annotated[str, Form()] = "") -> Response:
        if not verify_key(key):
            return page(
                "login.html",
                nav="login",
                status_code=401,
                error="That key is not this server's API key.",
                next=safe_next(next),
            )
        return with_session(RedirectResponse(safe_next(next), 303))

    @router.post("/logout")
    def logout(request: Request) -> Response:
        sessions.end(request.cookies.get(COOKIE))
        response = RedirectResponse(f"{prefix}/login", 303)
        response.delete_cookie(COOKIE, path=prefix)
        return response

    @router.get("", dependencies=[Authed])
    def overview(window: str = "24h") -> Response:
        query = _filter_or_400(since=window)
        counts = store.index.counts_by_sandbox(query)
        rows = []
        for sandbox in live_sandboxes():
            total, denied = counts.get(sandbox.id, (0, 0))
            rows.append(
                {
                    "id": sandbox.id,
                    "status": sandbox.status,
                    "address": sandbox.address,
                    "rule_count": sandbox.rule_count,
                    "binding_names": sandbox.binding_names,
                    "total": total,
                    "denied": denied,
                }
            )
        return page(
            "overview.html",
            nav="overview",
            sandboxes=rows,
            window=window,
            summary=store.index.summary(query, top=10),
        )

    @router.get("/sandboxes/{sandbox_id}", dependencies=[Authed])
    def sandbox_page(sandbox_id: str, since: str = "24h") -> Response:
        query = _filter_or_400(sandbox=sandbox_id, since=since)
        live = next((s for s in live_sandboxes() if s.id == sandbox_id), None)
        changes = store.index.page(AuditFilter(sandbox=sandbox_id, kind="policy_change"), 20).records
        denials = store.index.page(AuditFilter(sandbox=sandbox_id, decision="deny", since=query.since), 25)
        return page(
            "sandbox.html",
            nav="overview",
            sandbox_id=sandbox_id,
            sandbox=live,
            since=since,
            windows=WINDOWS,
            summary=store.index.summary(query),
            changes=changes,
            denials=denials.records,
            policy_yaml=policy_yaml(live.policy) if live else "",
        )

    @router.get("/feed", dependencies=[Authed])
    def feed(
        request: Request, cursor: str | None = None, limit: Annotated[int, Query(ge=1, le=500)] = 100
    ) -> Response:
        raw = {k: v for k, v in request.query_params.items() if k in AuditFilter.model_fields and v.strip()}
        error = None
        try:
            query = AuditFilter.model_validate(raw)
            result = store.index.page(query, limit, cursor)
        except (QueryError, ValueError) as exc:
            query, result, error = AuditFilter(), store.index.page(AuditFilter(), limit), str(exc)
            raw = {}
        older = urlencode({**raw, "cursor": result.next_cursor or "", "limit": limit})
        nav = "denied" if raw == {"decision": "deny"} else "feed"
        return page(
            "feed.html",
            nav=nav,
            f=query,
            raw=raw,
            page=result,
            error=error,
            older_url=f"{prefix}/feed?{older}",
            live=cursor is None,
            stream_url=f"{prefix}/feed/stream?{urlencode(raw)}",
            sandbox_ids=[s.id for s in live_sandboxes()],
        )

    @router.get("/feed/stream", dependencies=[Authed])
    def feed_stream(request: Request) -> StreamingResponse:
        raw = {k: v for k, v in request.query_params.items() if k in AuditFilter.model_fields and v.strip()}
        query = _filter_or_400(**raw)
        return StreamingResponse(
            sse_events(store, query, None, visible_record, request),
            media_type="text/event-stream",
            headers={**SECURITY_HEADERS},
        )

    @router.get("/changes", dependencies=[Authed])
    def changes(cursor: str | None = None) -> Response:
        query = AuditFilter(kind="policy_change")
        result = store.index.page(query, 50, cursor)
        older = f"{prefix}/changes?{urlencode({'cursor': result.next_cursor or ''})}"
        return page("changes.html", nav="changes", page=result, older_url=older)

    @router.get("/changes/{record_id}", dependencies=[Authed])
    def change(record_id: str) -> Response:
        record = store.index.get(record_id)
        if record is None or record["kind"] != "policy_change":
            raise HTTPException(404, f"no policy_change record with id {record_id}")
        detail = PolicyChange.from_detail(record.get("detail"))
        return page("diff.html", nav="changes", record=record, change=detail, diff=policy_diff(detail))

    return router


class Sessions:
    """Console sessions: random tokens held in memory, each valid for `lifetime` seconds after
    the login (then the form again), the oldest dropped past `limit`."""

    def __init__(
        self,
        limit: int = 1000,
        lifetime: float = SESSION_LIFETIME_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self.lifetime = lifetime
        self.clock = clock
        self._tokens: dict[str, float] = {}  # token -> when it ends; insertion-ordered: oldest first
        self._guard = threading.Lock()

    def new(self) -> str:
        token = secrets.token_urlsafe(32)
        with self._guard:
            self._tokens[token] = self.clock() + self.lifetime
            while len(self._tokens) > self.limit:
                del self._tokens[next(iter(self._tokens))]
        return token

    def valid(self, token: str | None) -> bool:
        ends = self._tokens.get(token or "")
        return ends is not None and self.clock() < ends

    def end(self, token: str | None) -> None:
        with self._guard:
            self._tokens.pop(token or "", None)


def _filter_or_400(**values: Any) -> AuditFilter:
    try:
        return AuditFilter.model_validate(values)
    except (QueryError, ValueError) as exc:
        raise HTTPException(400, str(exc)) from None
