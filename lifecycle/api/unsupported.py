"""The OpenSandbox 1.1.1 lifecycle routes sandgate does not serve: templates, pools (snapshots are
api/snapshots.py).

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
