"""Request bodies and query parameters: parsed into pydantic models or refused with a clear 400."""

from __future__ import annotations

import json
from typing import Any

from pydantic import TypeAdapter, ValidationError
from starlette.requests import Request

from .errors import INVALID_REQUEST, ApiError, bad_request

MAX_JSON_BODY = 8 * 1024 * 1024


async def read_json(request: Request, *, optional: bool = False) -> Any:
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_JSON_BODY:
            raise ApiError(413, INVALID_REQUEST, f"JSON body larger than {MAX_JSON_BODY} bytes")
    if not body.strip():
        if optional:
            return None
        raise bad_request(f"{request.method} {request.url.path} needs a JSON body")
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(f"body of {request.method} {request.url.path} is not valid JSON: {exc}") from None


def validate[T](data: Any, shape: TypeAdapter[T], where: str) -> T:
    try:
        return shape.validate_python(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'body'}: {err['msg']}" for err in exc.errors()
        )
        raise bad_request(f"invalid {where}: {problems}") from None


async def parse_body[T](request: Request, shape: TypeAdapter[T], *, optional: bool = False) -> T:
    """The JSON body validated against `shape` (an absent optional body validates as `{}`)."""
    data = await read_json(request, optional=optional)
    return validate({} if data is None else data, shape, f"body of {request.method} {request.url.path}")


def query_paths(request: Request) -> list[str]:
    paths = request.query_params.getlist("path")
    if not paths or not all(p.strip() for p in paths):
        raise bad_request("missing query parameter 'path' (repeat it for several paths)", "MISSING_QUERY")
    return paths


def query_int(request: Request, name: str, default: int | None, minimum: int) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise ApiError(
            400, "INVALID_QUERY", f"query parameter {name}={raw!r} must be an integer >= {minimum}"
        )
    return value
