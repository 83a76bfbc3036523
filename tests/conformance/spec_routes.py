"""The routes of the OpenSandbox 1.1.1 APIs, as (method, path template) pairs, and the routes the
installed OpenSandbox SDKs call, read from their packages at test time.

The table was written once from the 1.1.1 specs (the lifecycle server's OpenAPI document, the
execd and egress API specs) and the 1.1.1 clients (isolated sessions, files as another identity,
PTY sessions); it is not a copy of them. `sdk_routes()` reads what the Python SDK (generated
clients under `opensandbox/api/*/api/`) and the JS SDK (`paths` of its OpenAPI types in
tests/js/node_modules) call, so a client upgrade that adds a route fails the table test until
the route is listed here (and answered).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import opensandbox

JS_SDK = Path(__file__).resolve().parents[1] / "js" / "node_modules" / "@alibaba-group" / "opensandbox"


@dataclass(frozen=True)
class Route:
    api: str  # lifecycle (served bare and under /v1), egress (the 18080 endpoint), execd (44772)
    method: str
    path: str
    supported: bool = True  # False: answered with the spec's "not available" error, not served

    @property
    def shape(self) -> str:
        """The path with parameter names dropped: the SDKs name them differently."""
        return re.sub(r"\{[^}]+\}", "{}", self.path)


def _routes(api: str, spec: str, supported: bool = True) -> list[Route]:
    """`spec`: one "METHOD[,METHOD] /path" per line."""
    routes = []
    for line in filter(str.strip, spec.splitlines()):
        methods, path = line.split()
        routes.extend(Route(api, method, path, supported) for method in methods.split(","))
    return routes


SANDBOX = "/sandboxes/{sandbox_id}"
LIFECYCLE = _routes(
    "lifecycle",
    f"""
    POST,GET /sandboxes
    GET,DELETE {SANDBOX}
    PATCH {SANDBOX}/metadata
    POST {SANDBOX}/pause
    POST {SANDBOX}/resume
    POST {SANDBOX}/renew-expiration
    GET {SANDBOX}/endpoints/{{port}}
    GET {SANDBOX}/diagnostics/logs
    GET {SANDBOX}/diagnostics/events
    GET {SANDBOX}/diagnostics/inspect
    GET {SANDBOX}/diagnostics/summary
    GET,PUT,PATCH,DELETE {SANDBOX}/networkpolicy
    GET,POST,PUT,PATCH,DELETE {SANDBOX}/proxy/{{port}}
    GET,POST,PUT,PATCH,DELETE {SANDBOX}/proxy/{{port}}/{{full_path}}
    POST /metrics/events
    POST {SANDBOX}/snapshots
    GET /snapshots
    GET,DELETE /snapshots/{{snapshot_id}}
    """,
) + _routes(
    "lifecycle",
    """
    POST,GET /templates
    GET,DELETE /templates/{template_id}
    POST,GET /pools
    GET,PUT,DELETE /pools/{pool_name}
    """,
    supported=False,
)
SERVER = _routes("server", "GET /health\nGET /version")  # bare only
EGRESS = _routes(
    "egress",
    """
    GET,POST,PUT,PATCH,DELETE /policy
    POST,GET,PATCH,DELETE /credential-vault
    GET /credential-vault/credentials
    GET /credential-vault/credentials/{credential_name}
    GET /credential-vault/bindings
    GET /credential-vault/bindings/{binding_name}
    """,
)
FILES = """
    POST /files/upload
    GET /files/download
    GET /files/info
    DELETE /files
    POST /files/mv
    POST /files/permissions
    GET /files/search
    POST /files/replace
    GET /directories/list
    POST,DELETE /directories
"""
ISOLATED = "/v1/isolated/session/{session_id}"
EXECD = _routes(
    "execd",
    """
        GET /ping
        POST,DELETE /command
        GET /command/status/{id}
        GET /command/{id}/logs
        POST /session
        POST /session/{session_id}/run
        DELETE /session/{session_id}
        GET /metrics
        GET /metrics/watch
        POST /code/context
        GET,DELETE /code/contexts
        GET,DELETE /code/contexts/{context_id}
        POST,DELETE /code
        POST /pty
        GET,DELETE /pty/{session_id}
        GET /pty/{session_id}/ws
        GET /v1/isolated/capabilities
        """
    + FILES
    + FILES.replace(" /", " /v1/filesystem/{uid}/{gid}/"),
) + _routes(
    "execd",
    f"""
        POST /v1/isolated/session
        GET /v1/isolated/sessions
        GET,DELETE {ISOLATED}
        POST {ISOLATED}/run
        GET {ISOLATED}/runs/{{run_id}}
        GET {ISOLATED}/runs/{{run_id}}/logs
        GET {ISOLATED}/diff
        POST {ISOLATED}/commit
        """
    + FILES.replace(" /", f" {ISOLATED}/"),
    supported=False,
)
ALL = LIFECYCLE + SERVER + EGRESS + EXECD
# Which table a client's API group belongs to (the diagnostics spec is part of the lifecycle API).
SDK_GROUPS = {"lifecycle": "lifecycle", "diagnostic": "lifecycle", "egress": "egress", "execd": "execd"}


def python_sdk_routes() -> set[tuple[str, str, str]]:
    """(api, METHOD, shape) of every generated client in the installed Python SDK: each module's
    `_get_kwargs` returns {"method": ..., "url": "/path/{x}".format(...)}."""
    found = set()
    for group, api in SDK_GROUPS.items():
        for module in (Path(opensandbox.__file__).parent / "api" / group / "api").rglob("*.py"):
            for node in ast.walk(ast.parse(module.read_text())):
                if isinstance(node, ast.Dict):
                    fields = dict(zip((ast.unparse(k) for k in node.keys if k), node.values, strict=False))
                    if "'method'" in fields and "'url'" in fields:
                        method = ast.literal_eval(fields["'method'"]).upper()
                        url = fields["'url'"]
                        template = url.func.value if isinstance(url, ast.Call) else url  # type: ignore[attr-defined]
                        found.add((api, method, Route(api, method, ast.literal_eval(template)).shape))
    return found


def js_sdk_routes() -> set[tuple[str, str, str]]:
    """(api, METHOD, shape) of every operation in the JS SDK's OpenAPI types (`src/api/*.ts`:
    `"/path": { ...; get: operations["x"]; post?: never; ... }`)."""
    found = set()
    for group, api in SDK_GROUPS.items():
        source = JS_SDK / "src" / "api" / f"{group}.ts"
        if not source.exists():
            continue
        paths = source.read_text().split("export interface paths {", 1)[1].split("\n}\n", 1)[0]
        for path, body in re.findall(r'\n    "(/[^"]*)": \{(.*?)\n    \};', paths, re.S):
            for method in re.findall(r"\n        (get|put|post|delete|patch): ", body):
                found.add((api, method.upper(), Route(api, method.upper(), path).shape))
    return found
