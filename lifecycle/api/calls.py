"""How a route reaches the service and turns its errors into answers; shared by every router.

Rules: routes find the service on `app.state` (`service_of`, `egress_of` for its egress part)
and call it through `call`, which
turns a `LifecycleError` into an `ApiError` with the status of its kind (`KIND_STATUS`); no
router imports another router's internals for this.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import Request

from sandgate.lifecycle.api.errors import ApiError
from sandgate.lifecycle.api.models import ErrorResponse
from sandgate.lifecycle.egress_control import EgressControl
from sandgate.lifecycle.errors import ErrorKind, LifecycleError
from sandgate.lifecycle.service import Service

# The error answers the lifecycle routes document in the OpenAPI schema.
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 401, 403, 404, 409, 422, 500, 503)
}
KIND_STATUS: dict[ErrorKind, int] = {"not_found": 404, "invalid": 400, "forbidden": 403, "conflict": 409,
                                     "unsupported": 400, "unavailable": 503, "precondition": 412}  # fmt: skip


def service_of(request: Request) -> Service:
    return request.app.state.service


def egress_of(request: Request) -> EgressControl:
    return service_of(request).egress


def api_error(exc: LifecycleError) -> ApiError:
    return ApiError(KIND_STATUS[exc.kind], exc.kind.upper(), exc.message)


def call[T](fn: Callable[..., T], *args: Any) -> T:
    """Run a service call, turning its errors into API errors."""
    try:
        return fn(*args)
    except LifecycleError as exc:
        raise api_error(exc) from exc
