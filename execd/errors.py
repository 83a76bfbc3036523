"""Errors execd answers with: one exception type, one JSON shape.

Rules: every refusal is an `ApiError` raised before anything changes on disk or a process
starts; the body is always `{"code": ..., "message": ...}` (the OpenSandbox `ErrorResponse`),
and the message says what was wrong, where, and how to fix it.
"""

from __future__ import annotations

INVALID_REQUEST = "INVALID_REQUEST_BODY"
MISSING_QUERY = "MISSING_QUERY"
INVALID_PATH = "INVALID_PATH"
PATH_ESCAPE = "PATH_ESCAPES_ROOT"
FILE_NOT_FOUND = "FILE_NOT_FOUND"
NOT_FOUND = "NOT_FOUND"
CONFLICT = "CONFLICT"
RANGE_NOT_SATISFIABLE = "RANGE_NOT_SATISFIABLE"
UNAUTHORIZED = "UNAUTHORIZED"
RUNTIME_ERROR = "RUNTIME_ERROR"


class ApiError(Exception):
    """A request execd refuses or could not serve, with its HTTP status."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers


def bad_request(message: str, code: str = INVALID_REQUEST) -> ApiError:
    return ApiError(400, code, message)


def not_found(message: str, code: str = NOT_FOUND) -> ApiError:
    return ApiError(404, code, message)
