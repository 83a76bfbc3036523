"""Who may call which route: the one table (`ACCESS`), and how a call is matched against it.

Rules:
1. One row per route and method: the action's name (the `api` audit record's `reason`), the
   roles allowed, and the path parameter naming the tenant's object the call acts on (a sandbox,
   a snapshot, an approval), if any. A route without a row answers 404 (fail closed);
   tests/lifecycle/test_access_table.py walks every route of the app and fails on one without a
   row. Open rows (no roles) need no principal: health, version, the API docs, the console's
   login and static files.
2. Rows are written without the `/v1` prefix for the routers served at both (app.API_PREFIXES);
   a path is looked up as sent, then without `/v1`. The egress API served at a sandbox's
   `/proxy/18080` is the egress API's rows (api/sandbox_proxy.py rule 6).
3. Another tenant's object answers 404, exactly as a missing one (never 403: its existence is
   not told); an admin sees every tenant. A role the row does not allow is a 403 naming the
   role and the action, once the object is known to be the caller's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from sandgate.lifecycle.principals import Role

ADMIN: Role = "admin"
OPERATOR: Role = "operator"
REVIEWER: Role = "reviewer"
ANY_ROLE: frozenset[Role] = frozenset({ADMIN, OPERATOR, REVIEWER})
ACTORS: frozenset[Role] = frozenset({ADMIN, OPERATOR})  # who acts on sandboxes
READERS: frozenset[Role] = frozenset({ADMIN, REVIEWER})  # who reads audit and console, answers approvals
ADMINS: frozenset[Role] = frozenset({ADMIN})
OPEN: frozenset[Role] = frozenset()
EGRESS_PORT = 18080  # OpenSandbox's egress sidecar's port: its endpoint is the egress API
OWNED = ("sandbox_id", "snapshot_id", "approval_id", "tenant")  # path parameters naming a tenant's object


@dataclass(frozen=True)
class Rule:
    action: str
    roles: frozenset[Role]
    owner: str | None = None  # the path parameter naming the object (one of OWNED)

    @property
    def is_open(self) -> bool:
        return not self.roles


def _rows() -> dict[tuple[str, str], Rule]:
    sandbox = "/sandboxes/{sandbox_id}"
    egress, vault = f"{sandbox}/egress", f"{sandbox}/egress/credential-vault"
    rows: list[tuple[str, str, str, frozenset[Role]]] = [
        ("GET", "/health", "server.health", OPEN),
        ("GET", "/version", "server.version", OPEN),
        ("GET", "/openapi.json", "server.openapi", OPEN),
        ("GET", "/docs", "server.docs", OPEN),
        ("GET", "/docs/oauth2-redirect", "server.docs", OPEN),
        ("GET", "/redoc", "server.docs", OPEN),
        ("GET", "/metrics", "server.metrics", ADMINS),
        ("POST", "/metrics/events", "server.metrics-event", ACTORS),
        ("POST", "/sandboxes", "sandbox.create", ACTORS),
        ("GET", "/sandboxes", "sandbox.list", ANY_ROLE),
        ("GET", sandbox, "sandbox.get", ANY_ROLE),
        ("DELETE", sandbox, "sandbox.delete", ACTORS),
        ("PATCH", f"{sandbox}/metadata", "sandbox.metadata", ACTORS),
        ("POST", f"{sandbox}/pause", "sandbox.pause", ACTORS),
        ("POST", f"{sandbox}/resume", "sandbox.resume", ACTORS),
        ("POST", f"{sandbox}/renew-expiration", "sandbox.renew", ACTORS),
        ("GET", f"{sandbox}/endpoints/{{port}}", "sandbox.endpoint", ACTORS),  # hands out execd's token
        ("GET", f"{sandbox}/diagnostics/logs", "sandbox.diagnostics", ANY_ROLE),
        ("GET", f"{sandbox}/diagnostics/events", "sandbox.diagnostics", ANY_ROLE),
        ("GET", f"{sandbox}/diagnostics/summary", "sandbox.diagnostics", ANY_ROLE),
        ("GET", f"{sandbox}/diagnostics/inspect", "sandbox.diagnostics", ANY_ROLE),
        ("*", f"{sandbox}/proxy/{{port}}", "sandbox.proxy", ACTORS),  # exec, files, its services
        ("*", f"{sandbox}/proxy/{{port}}/{{path:path}}", "sandbox.proxy", ACTORS),
        ("WS", f"{sandbox}/proxy/{{port}}/{{path:path}}", "sandbox.proxy", ACTORS),
        ("GET", f"{egress}/policy", "policy.read", ANY_ROLE),
        ("POST", f"{egress}/policy", "policy.replace", ACTORS),
        ("PUT", f"{egress}/policy", "policy.replace", ACTORS),
        ("PATCH", f"{egress}/policy", "policy.patch", ACTORS),
        ("DELETE", f"{egress}/policy", "policy.delete", ACTORS),
        ("GET", f"{egress}/sandgate-policy", "policy.read", ANY_ROLE),
        ("PUT", f"{egress}/sandgate-policy", "policy.replace", ACTORS),
        ("GET", f"{sandbox}/networkpolicy", "policy.read", ANY_ROLE),
        ("PUT", f"{sandbox}/networkpolicy", "policy.replace", ACTORS),
        ("PATCH", f"{sandbox}/networkpolicy", "policy.patch", ACTORS),
        ("DELETE", f"{sandbox}/networkpolicy", "policy.delete", ACTORS),
        ("POST", vault, "vault.create", ACTORS),  # names and bindings; values go in, never out
        ("GET", vault, "vault.read", ANY_ROLE),
        ("PATCH", vault, "vault.patch", ACTORS),
        ("DELETE", vault, "vault.delete", ACTORS),
        ("GET", f"{vault}/credentials", "vault.read", ANY_ROLE),
        ("GET", f"{vault}/credentials/{{name}}", "vault.read", ANY_ROLE),
        ("GET", f"{vault}/bindings", "vault.read", ANY_ROLE),
        ("GET", f"{vault}/bindings/{{name}}", "vault.read", ANY_ROLE),
        ("POST", f"{sandbox}/snapshots", "snapshot.create", ACTORS),
        ("GET", "/snapshots", "snapshot.list", ANY_ROLE),
        ("GET", "/snapshots/{snapshot_id}", "snapshot.get", ANY_ROLE),
        ("DELETE", "/snapshots/{snapshot_id}", "snapshot.delete", ACTORS),
        ("GET", "/approvals", "approval.list", READERS),
        ("POST", "/approvals/{approval_id}", "approval.answer", READERS),
        ("GET", "/keys", "key.list", ADMINS),
        ("POST", "/keys", "key.create", ADMINS),
        ("POST", "/keys/{key_id}/rotate", "key.rotate", ADMINS),
        ("DELETE", "/keys/{key_id}", "key.revoke", ADMINS),
        ("GET", "/tenants", "tenant.list", ADMINS),
        ("GET", "/tenants/{tenant}/ceiling", "tenant.ceiling-read", ANY_ROLE),
        ("PUT", "/tenants/{tenant}/ceiling", "tenant.ceiling-set", ADMINS),
        ("DELETE", "/tenants/{tenant}/ceiling", "tenant.ceiling-delete", ADMINS),
        ("GET", "/v1/audit", "audit.query", READERS),
        ("GET", "/v1/audit/follow", "audit.follow", READERS),
        ("GET", "/v1/audit/summary", "audit.summary", READERS),
        ("GET", "/v1/audit/index", "audit.index", ADMINS),
        ("GET", "/console/login", "console.login", OPEN),
        ("POST", "/console/login", "console.login", OPEN),
        ("POST", "/console/logout", "console.logout", OPEN),
        ("GET", "/console/static/{name}", "console.static", OPEN),
        ("GET", "/console", "console.read", READERS),
        ("GET", "/console/sandboxes/{sandbox_id}", "console.read", READERS),
        ("GET", "/console/sandboxes/{sandbox_id}/processes/{pid}", "console.read", READERS),
        ("GET", "/console/feed", "console.read", READERS),
        ("GET", "/console/feed/stream", "console.follow", READERS),
        ("GET", "/console/changes", "console.read", READERS),
        ("GET", "/console/changes/{record_id}", "console.read", READERS),
        ("GET", "/console/approvals", "console.read", READERS),
        ("POST", "/console/approvals/{approval_id}", "approval.answer", READERS),
    ]
    # OpenSandbox's template and pool routes: sandgate answers that it has none
    for path in ("/templates", "/pools"):
        item = "/{template_id}" if path == "/templates" else "/{pool_name}"
        rows += [("POST", path, "unsupported", ACTORS), ("GET", path, "unsupported", ANY_ROLE),
                 ("GET", path + item, "unsupported", ANY_ROLE),
                 ("DELETE", path + item, "unsupported", ACTORS)]  # fmt: skip
    rows.append(("PUT", "/pools/{pool_name}", "unsupported", ACTORS))
    return {
        (method, path): Rule(action, roles, next((p for p in OWNED if f"{{{p}}}" in path), None))
        for method, path, action, roles in rows
    }


ACCESS: dict[tuple[str, str], Rule] = _rows()
_PARAM = re.compile(r"\{(\w+)(:path)?\}")
_EGRESS_AT_PORT = re.compile(rf"^((?:/v1)?/sandboxes/[^/]+)/proxy/{EGRESS_PORT}(?=/|$)")


def _pattern(template: str) -> re.Pattern[str]:
    parts, last = [], 0
    for found in _PARAM.finditer(template):
        parts.append(re.escape(template[last : found.start()]))
        parts.append(f"(?P<{found[1]}>{'.*' if found[2] else '[^/]+'})")
        last = found.end()
    return re.compile("^" + "".join(parts) + re.escape(template[last:]) + "$")


# literal paths before templated ones, so `/keys` is never taken for a `{param}` row
_PATTERNS = sorted(
    ((method, template, _pattern(template)) for method, template in ACCESS),
    key=lambda row: (row[1].count("{"), row[1]),
)


def match(method: str, path: str) -> tuple[Rule, dict[str, str]] | None:
    """The row of a call (`method` "WS" for a WebSocket) and its path parameters, or None."""
    path = _EGRESS_AT_PORT.sub(r"\1/egress", path)
    methods = {"WS"} if method == "WS" else {method, "*", "GET" if method == "HEAD" else method}
    for candidate in (path, path.removeprefix("/v1") if path.startswith("/v1/") else None):
        if candidate is None:
            continue
        for row_method, template, pattern in _PATTERNS:
            if row_method in methods and (found := pattern.match(candidate)):
                return ACCESS[(row_method, template)], found.groupdict()
    return None


def app_routes(routes: list[Any], prefix: str = "") -> list[tuple[str, str]]:
    """Every (method, path) the app routes (method "WS" for a WebSocket), its included routers
    walked (FastAPI keeps them as included-router entries): what the table must cover."""
    found: list[tuple[str, str]] = []
    for route in routes:
        if hasattr(route, "effective_candidates"):  # an included router
            found += app_routes(route.effective_candidates(), prefix)
            continue
        original = getattr(route, "original_route", route)
        path = getattr(route, "path", "") or f"{getattr(route, 'frontend_prefix', '')}{original.path}"
        methods = getattr(original, "methods", None) or {"WS"}
        found += [(method, prefix + path) for method in sorted(methods) if method != "HEAD"]
    return found
