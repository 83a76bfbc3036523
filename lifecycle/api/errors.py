"""Errors of the HTTP API and how each becomes a response.

Rules:
1. The lifecycle API answers every error as JSON `{code, message}` (OpenSandbox ErrorResponse),
   validation errors and unknown routes included; nothing leaks a traceback.
2. The egress API (the 18080 endpoint) answers errors as text/plain, as the OpenSandbox sidecar
   does; its routes raise `EgressError`.
3. A message says what was wrong, where, and how to fix it.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)

EGRESS_MARKER = "/egress/"
STATUS_CODES = {400: "INVALID_REQUEST", 401: "UNAUTHORIZED", 403: "FORBIDDEN", 404: "NOT_FOUND",
                405: "METHOD_NOT_ALLOWED", 409: "CONFLICT", 413: "PAYLOAD_TOO_LARGE",
                415: "UNSUPPORTED_MEDIA_TYPE", 422: "INVALID_REQUEST", 500: "INTERNAL_ERROR",
                502: "BAD_GATEWAY", 503: "UNAVAILABLE"}  # fmt: skip


class ApiError(Exception):
    """An error the lifecycle API reports as `{code, message}` with `status`."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


class EgressError(ApiError):
    """An error of the egress/credential-vault API, reported as text/plain."""


def not_found(what: str, ident: str) -> ApiError:
    return ApiError(404, "NOT_FOUND", f"{what} {ident!r} does not exist (list them with GET /v1/sandboxes)")


def _is_egress(request: Request) -> bool:
    return EGRESS_MARKER in request.url.path + "/"


def error_response(request: Request, status: int, code: str, message: str) -> Response:
    if _is_egress(request):
        return PlainTextResponse(message, status_code=status)
    return JSONResponse({"code": code, "message": message}, status_code=status)


def _describe_validation(exc: RequestValidationError) -> str:
    parts = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error.get("loc", ()))
        parts.append(f"{where}: {error.get('msg', 'invalid')}")
    return "; ".join(parts) or "the request is invalid"


def install_error_handlers(app: FastAPI) -> None:
    async def on_api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return error_response(request, exc.status, exc.code, exc.message)

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        code = STATUS_CODES.get(exc.status_code, "ERROR")
        response = error_response(request, exc.status_code, code, str(exc.detail))
        response.headers.update(exc.headers or {})
        return response

    async def on_validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        status = 400 if _is_egress(request) else 422
        return error_response(request, status, "INVALID_REQUEST", _describe_validation(exc))

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return error_response(request, 500, "INTERNAL_ERROR", f"internal error: {type(exc).__name__}")

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(Exception, on_unexpected)
