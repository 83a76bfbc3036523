"""Console sessions and the login pages: how a reviewer gets in and out.

Rules: the key is taken only from the login form's POST body (a query string ends up in access
logs and browser history) and checked by the app's `verify_key`, which names its principal and
when its credential expires (the session is that principal's: the auth middleware checks its key
at every page, and revoking the key ends its sessions); a login sets an HttpOnly,
SameSite=Strict cookie holding a random session token (never the API key). Sessions live in
memory for 12 hours, or until the credential's expiry if sooner (an OIDC token's `exp`: the
session ends with it, and so does what it has open); a restart logs everyone out; logout ends
one. `next` after a login only ever points inside the console.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, Form, HTTPException, Request
from fastapi.responses import RedirectResponse, Response

from sandgate.lifecycle.api.auth import CONSOLE_COOKIE as COOKIE
from sandgate.lifecycle.console.pages import Console
from sandgate.lifecycle.principals import Principal

SESSION_LIFETIME_S = 12 * 3600  # a console login lasts a working day
Login = tuple[Principal, datetime | None]  # who logged in, and when the credential expires


def add_login_routes(
    router: APIRouter, console: Console, sessions: Sessions, verify_key: Callable[[str], Login | None]
) -> None:
    def safe_next(target: str | None) -> str:
        prefix = console.prefix
        return target if target and target.startswith(prefix) and not target.startswith("//") else prefix

    def with_session(response: Response, login: Login) -> Response:
        token, secure = sessions.new(*login), console.secure_cookie
        response.set_cookie(
            COOKIE, token, httponly=True, samesite="strict", secure=secure, path=console.prefix
        )
        return response

    @router.get("/login")
    def login_form(next: str | None = None) -> Response:
        return console.page("login.html", nav="login", error=None, next=safe_next(next))

    @router.post("/login")
    def login(key: Annotated[str, Form()], next: Annotated[str, Form()] = "") -> Response:
        login = verify_key(key)
        if login is None:
            error = "That key is not this server's API key (or it was revoked or has expired)."
            return console.page("login.html", nav="login", status_code=401, error=error, next=safe_next(next))
        return with_session(RedirectResponse(safe_next(next), 303), login)

    @router.post("/logout")
    def logout(request: Request) -> Response:
        sessions.end(request.cookies.get(COOKIE))
        response = RedirectResponse(f"{console.prefix}/login", 303)
        response.delete_cookie(COOKIE, path=console.prefix)
        return response


def require_session(console: Console, sessions: Sessions) -> Callable[[Request], None]:
    """The dependency of every page but login and the static files: a valid session, else the
    login form (with `next` pointing back)."""

    def logged_in(request: Request) -> None:
        if not sessions.valid(request.cookies.get(COOKIE)):
            target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            location = f"{console.prefix}/login?{urlencode({'next': target})}"
            raise HTTPException(303, "log in first", headers={"Location": location})

    return logged_in


class Sessions:
    """Console sessions: random tokens held in memory, each valid for `lifetime` seconds after
    the login (then the form again), the oldest dropped past `limit`."""

    def __init__(
        self,
        limit: int = 1000,
        lifetime: float = SESSION_LIFETIME_S,
        clock: Callable[[], float] = time.monotonic,
        still_valid: Callable[[Principal], bool] = lambda principal: True,
    ) -> None:
        self.limit = limit
        self.still_valid = still_valid  # the principal's key is not revoked or expired (api/auth.py)
        self.lifetime = lifetime
        self.clock = clock
        self._csrf_key = secrets.token_bytes(32)
        # token -> (when it ends, who, when its credential expires); oldest first
        self._tokens: dict[str, tuple[float, Principal, datetime | None]] = {}
        self._guard = threading.Lock()

    def csrf(self, token: str | None) -> str:
        """The form token of a session: every state-changing form carries it (a forged cross-site
        form has no way to learn it; the SameSite=Strict cookie is the first line, this the second)."""
        return hmac.new(self._csrf_key, (token or "").encode(), hashlib.sha256).hexdigest()

    def csrf_valid(self, token: str | None, given: str) -> bool:
        return self.valid(token) and hmac.compare_digest(self.csrf(token), given)

    def new(self, principal: Principal, expires_at: datetime | None = None) -> str:
        token = secrets.token_urlsafe(32)
        lifetime = self.lifetime
        if expires_at is not None:
            lifetime = min(lifetime, max(0.0, (expires_at - datetime.now(UTC)).total_seconds()))
        with self._guard:
            self._tokens[token] = (self.clock() + lifetime, principal, expires_at)
            while len(self._tokens) > self.limit:
                del self._tokens[next(iter(self._tokens))]
        return token

    def valid(self, token: str | None) -> bool:
        return self.principal(token) is not None

    def principal(self, token: str | None) -> Principal | None:
        """Who logged in with this session token, while it lasts."""
        found = self.login(token)
        return found[0] if found else None

    def login(self, token: str | None) -> Login | None:
        """Who logged in with this session token and when its credential expires, while it lasts."""
        found = self._tokens.get(token or "")
        if found is None or self.clock() >= found[0] or not self.still_valid(found[1]):
            return None
        return found[1], found[2]

    def end_for(self, key_id: str) -> None:
        """End every session of a key (it was revoked)."""
        with self._guard:
            for token in [t for t, (_, who, _) in self._tokens.items() if who.id == key_id]:
                del self._tokens[token]

    def end(self, token: str | None) -> None:
        with self._guard:
            self._tokens.pop(token or "", None)
