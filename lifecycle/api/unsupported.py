"""The OpenSandbox 1.1.1 lifecycle routes sandgate does not serve: snapshots, templates, pools.

Rules: each is answered as the spec answers a server without the feature (501 with the
`{code, message}` error shape; the reference server does the same for pools on Docker), never
with a route-miss 404, and the message names what sandgate does instead. One table, one handler.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn

from fastapi import APIRouter

from sandgate.lifecycle.api.errors import ApiError
from sandgate.lifecycle.api.models import ErrorResponse

SNAPSHOTS = (
    "sandgate does not snapshot sandboxes: a sandbox keeps its files while it exists (also across "
    "pause/resume); copy files out with execd's GET /files/download and create sandboxes from an "
    "image (POST /v1/sandboxes with image.uri)"
)
TEMPLATES = (
    "sandgate has no sandbox templates: create from an image (image.uri) and give the egress "
    "policy at create (networkPolicy) or later (PUT /v1/sandboxes/{id}/egress/sandgate-policy)"
)
POOLS = (
    "sandgate has no pool API: its warm pool is a server setting (warm_pool_size, env "
    "SANDGATE_WARM_POOL_SIZE) that creates from the default image claim, and GET /health shows "
    "its size and ready count"
)
ROUTES = [
    ("POST", "/sandboxes/{sandbox_id}/snapshots", "Create Snapshot", SNAPSHOTS),
    ("GET", "/snapshots", "List Snapshots", SNAPSHOTS),
    ("GET", "/snapshots/{snapshot_id}", "Get Snapshot", SNAPSHOTS),
    ("DELETE", "/snapshots/{snapshot_id}", "Delete Snapshot", SNAPSHOTS),
    ("POST", "/templates", "Create Template", TEMPLATES),
    ("GET", "/templates", "List Templates", TEMPLATES),
    ("GET", "/templates/{template_id}", "Get Template", TEMPLATES),
    ("DELETE", "/templates/{template_id}", "Delete Template", TEMPLATES),
    ("POST", "/pools", "Create Pool", POOLS),
    ("GET", "/pools", "List Pools", POOLS),
    ("GET", "/pools/{pool_name}", "Get Pool", POOLS),
    ("PUT", "/pools/{pool_name}", "Update Pool", POOLS),
    ("DELETE", "/pools/{pool_name}", "Delete Pool", POOLS),
]

router = APIRouter(tags=["Not supported"])


def refusal(message: str) -> Callable[[], NoReturn]:
    def refuse() -> NoReturn:
        raise ApiError(501, "UNSUPPORTED", message)

    return refuse


for method, path, summary, message in ROUTES:
    router.add_api_route(
        path,
        refusal(message),
        methods=[method],
        summary=summary,
        description=message,
        status_code=501,
        response_model=None,
        responses={501: {"model": ErrorResponse, "description": message}},
    )
