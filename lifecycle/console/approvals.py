"""The approvals page: requests held for a reviewer (policy `ask`), answered with a click.

Rules: the page lists what the proxy holds (it reloads itself every few seconds, so a new request
appears without a click); each answer is a POST carrying the session's CSRF token (and the
SameSite=Strict session cookie), checked before anything changes. Host and path are the
sandbox's words: templates autoescape them. The actor the audit records is `console`.
"""

from __future__ import annotations

from typing import Annotated, Any, Protocol

from fastapi import APIRouter, Form, HTTPException, Request
from fastapi.responses import RedirectResponse, Response

from sandgate.lifecycle.console.pages import Console
from sandgate.lifecycle.console.session import COOKIE, Sessions

ACTOR = "console"
DECISIONS = ("allow-once", "allow-sandbox", "deny")


class Desk(Protocol):
    """lifecycle/approvals.py's ApprovalDesk, as the console uses it."""

    def pending(self) -> list[Any]: ...
    def answer(self, approval_id: str, decision: Any, actor: str) -> Any: ...


def add_approval_pages(
    router: APIRouter, console: Console, sessions: Sessions, desk: Desk, authed: Any
) -> None:
    @router.get("/approvals", dependencies=[authed])
    def approvals(request: Request, done: str | None = None) -> Response:
        csrf = sessions.csrf(request.cookies.get(COOKIE))
        return console.page("approvals.html", nav="approvals", held=desk.pending(), csrf=csrf, done=done)

    @router.post("/approvals/{approval_id}", dependencies=[authed])
    def answer(
        request: Request, approval_id: str, decision: Annotated[str, Form()], csrf: Annotated[str, Form()]
    ) -> Response:
        if not sessions.csrf_valid(request.cookies.get(COOKIE), csrf):
            raise HTTPException(403, "the form's CSRF token does not match this session; reload the page")
        if decision not in DECISIONS:
            raise HTTPException(400, f"decision must be one of {', '.join(DECISIONS)}")
        try:
            desk.answer(approval_id, decision, ACTOR)
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from None
        done = f"{decision} {approval_id}"
        return RedirectResponse(f"{console.prefix}/approvals?done={done}", 303)
