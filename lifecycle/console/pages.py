"""What every console page shares: the templates, the security headers, the live sandboxes.

Rules: audit content is written by sandboxes, i.e. untrusted: record fields are shown `visible`
(control and bidi characters escaped, in the pages and in the live feed's stream), templates
autoescape, the live feed builds rows with textContent, and a strict Content-Security-Policy
(scripts and styles from 'self' only) backs them up. Nothing is loaded from anywhere else (no
CDN). The console only reads: the audit index, and sandboxes with their live policy through the
`sandboxes` callable the app hands in (no import of lifecycle internals).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse, HTMLResponse

from sandgate.lifecycle.audit import KINDS, LABELS, SYSTEM_KINDS, AuditFilter, AuditStore, QueryError
from sandgate.lifecycle.console.views import ConsoleSandbox
from sandgate.lifecycle.visible import visible
from sandgate.policy import OUTCOMES

HERE = Path(__file__).parent
STATIC_FILES = {"console.css": "text/css", "console.js": "text/javascript"}
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
_templates.globals.update(
    outcomes=list(OUTCOMES), kinds=list(KINDS), kind_labels=LABELS, system_kinds=SYSTEM_KINDS
)


@dataclass(frozen=True)
class Console:
    """One mounted console: where it lives and what it reads."""

    store: AuditStore
    sandboxes: SandboxLister  # the live sandboxes (dicts or objects with id, status, address, policy)
    prefix: str = "/console"
    secure_cookie: bool = False

    def page(self, template: str, nav: str = "", status_code: int = 200, **values: Any) -> HTMLResponse:
        html = _templates.get_template(template).render(
            root=self.prefix, nav=nav, authed=nav != "login", **values
        )
        return HTMLResponse(html, status_code=status_code, headers=SECURITY_HEADERS)

    def live_sandboxes(self) -> list[ConsoleSandbox]:
        return sorted((ConsoleSandbox.model_validate(s) for s in self.sandboxes()), key=lambda s: s.id)


def add_static_routes(router: APIRouter) -> None:
    @router.get("/static/{name}")
    def static(name: str) -> FileResponse:
        if name not in STATIC_FILES:
            raise HTTPException(404, f"no static file {name}")
        return FileResponse(HERE / "static" / name, media_type=STATIC_FILES[name], headers=SECURITY_HEADERS)


def filter_or_400(**values: Any) -> AuditFilter:
    try:
        return AuditFilter.model_validate(values)
    except (QueryError, ValueError) as exc:
        raise HTTPException(400, str(exc)) from None
