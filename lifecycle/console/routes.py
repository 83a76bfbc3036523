"""`console_router(...)`: the reviewer's web console under /console, server-rendered.

Rules: one module per group of pages, each adding its routes to the one router built here:
session.py (login, logout, the session every other page needs), sandboxes.py (overview, one
sandbox), feed.py (the request feed and its live stream, policy changes and their diffs),
approvals.py (requests held for a reviewer, answered with a CSRF-checked form),
pages.py (what they share: templates, security headers, static files; its docstring holds the
rules for untrusted audit content).
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter, Depends

from sandgate.lifecycle.audit import AuditStore
from sandgate.lifecycle.console.approvals import Desk, add_approval_pages
from sandgate.lifecycle.console.feed import add_change_pages, add_feed_pages
from sandgate.lifecycle.console.pages import Console, SandboxLister, add_static_routes
from sandgate.lifecycle.console.sandboxes import add_sandbox_pages
from sandgate.lifecycle.console.session import Login, Sessions, add_login_routes, require_session


def console_router(
    store: AuditStore,
    verify_key: Callable[[str], Login | None],
    sandboxes: SandboxLister,
    desk: Desk | None = None,
    *,
    sessions: Sessions | None = None,
    prefix: str = "/console",
    secure_cookie: bool = False,
) -> APIRouter:
    """The console pages. `sandboxes()` returns the live sandboxes the caller may see (dicts or
    objects with id, status, address, policy); `verify_key(key)` names the principal of a key (or
    OIDC token) of this server and its expiry (None: not one); `sessions` are shared with the
    auth middleware."""
    router = APIRouter(prefix=prefix, include_in_schema=False)
    console = Console(store, sandboxes, prefix, secure_cookie)
    sessions = sessions or Sessions()
    authed = Depends(require_session(console, sessions))
    add_static_routes(router)
    add_login_routes(router, console, sessions, verify_key)
    add_sandbox_pages(router, console, authed)
    add_feed_pages(router, console, authed)
    add_change_pages(router, console, authed)
    if desk is not None:
        add_approval_pages(router, console, sessions, desk, authed)
    return router
