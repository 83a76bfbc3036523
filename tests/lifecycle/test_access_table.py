"""The access table (lifecycle/api/access.py) covers every route the app serves: a new route
without a row fails here (and answers 404 to everyone until it has one)."""

from __future__ import annotations

from pathlib import Path
from typing import cast

from sandgate.lifecycle.api import create_app
from sandgate.lifecycle.api.access import ACCESS, OPEN, app_routes, match
from sandgate.lifecycle.audit import AuditStore, audit_router
from sandgate.lifecycle.console import console_router
from sandgate.lifecycle.service import Service


def served_routes(tmp_path: Path) -> list[tuple[str, str]]:
    """Every (method, path) of the app `sandgate serve` builds: the API at both prefixes, the
    audit API and the console (their routers as wiring.py makes them)."""
    store = AuditStore(tmp_path)
    routers = [
        audit_router(store, auth=lambda: None),
        console_router(store, lambda key: None, list, desk=None),
    ]
    service = cast(Service, None)  # the routes are listed, never called
    app = create_app(service, api_key="k", audit_path=tmp_path / "audit.jsonl", extra_routers=routers,
                     open_prefixes=["/console"], exec_audit=False)  # fmt: skip
    return app_routes(app.router.routes)


def test_every_route_has_exactly_its_row(tmp_path: Path) -> None:
    routes = served_routes(tmp_path)
    assert len(routes) > 100  # both prefixes, audit, console: the walk found the included routers
    missing = []
    for method, path in routes:
        bare = path.removeprefix("/v1") if (method, path) not in ACCESS else path
        if (method, bare) not in ACCESS:
            missing.append(f"{method} {path}")
            continue
        # the matcher finds that same row for a concrete call of the route
        concrete = bare.replace("{path:path}", "a/b").replace("{port}", "44772")
        for name in ("sandbox_id", "snapshot_id", "approval_id", "key_id", "name", "pid", "record_id",
                     "tenant", "template_id", "pool_name"):  # fmt: skip
            concrete = concrete.replace(f"{{{name}}}", "x1")
        found = match(method, concrete)
        assert found is not None and found[0] == ACCESS[(method, bare)], f"{method} {concrete} -> {found}"
    assert not missing, f"routes without a row in api/access.py's ACCESS: {missing}"
    # and the HTTP reverse proxy, served before routing (api/sandbox_proxy.py ProxyFrontDoor)
    assert match("POST", "/v1/sandboxes/x1/proxy/44772/command") == (
        ACCESS[("*", "/sandboxes/{sandbox_id}/proxy/{port}/{path:path}")],
        {"sandbox_id": "x1", "port": "44772", "path": "command"},
    )


def test_the_egress_api_at_its_port_is_the_egress_rows() -> None:
    at_port = match("PATCH", "/v1/sandboxes/x1/proxy/18080/policy")
    assert at_port is not None and at_port[0] == ACCESS[("PATCH", "/sandboxes/{sandbox_id}/egress/policy")]


def test_what_no_role_may_do_and_what_is_open() -> None:
    opened = {path for (method, path), rule in ACCESS.items() if rule.roles == OPEN}
    assert opened == {"/health", "/version", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc",
                      "/console/login", "/console/logout", "/console/static/{name}"}  # fmt: skip
    for (method, path), rule in ACCESS.items():
        if "reviewer" in rule.roles:  # read-only: never a change, exec, files or an endpoint's token
            assert method == "GET" or rule.action == "approval.answer", (method, path)
            assert "/proxy/" not in path and "/endpoints/" not in path, path
        if path.startswith("/keys") or path == "/v1/audit/index":
            assert rule.roles == {"admin"}, path
    assert match("GET", "/v1/no/such/route") is None
