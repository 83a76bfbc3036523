"""Request bodies and query parameters: checked against small shapes, or refused with a clear 400.

Rules: execd does not use pydantic (importing it costs more start-up time than all of execd
together). A shape maps field names to `Field`s; `check` returns the fields' values (None when
absent) or raises one 400 that names every bad field. Unknown fields are ignored, as the
OpenSandbox execd does. Types are strict: `"5"` is not an integer and `1` is not a string.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import INVALID_REQUEST, ApiError, bad_request
from .web import Request

MAX_JSON_BODY = 8 * 1024 * 1024


@dataclass(frozen=True)
class Field:
    """One JSON field: kind is "str", "int", "bool", "strings" (list of str), "str_map"
    (object of str values) or "mode" (int or str, parsed later by `paths.parse_mode`)."""

    kind: str
    required: bool = False
    minimum: int | None = None
    min_length: int | None = None

    def problem(self, value: Any) -> str | None:
        problem = KIND_PROBLEMS[self.kind](value)
        if problem is None and self.kind == "str" and self.min_length and len(value) < self.min_length:
            problem = f"must have at least {self.min_length} character(s)"
        if problem is None and self.kind == "int" and self.minimum is not None and value < self.minimum:
            problem = f"must be >= {self.minimum}"
        return problem


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


KIND_PROBLEMS: dict[str, Callable[[Any], str | None]] = {
    "str": lambda v: None if isinstance(v, str) else "must be a string",
    "int": lambda v: None if _is_int(v) else "must be an integer",
    "bool": lambda v: None if isinstance(v, bool) else "must be true or false",
    "strings": lambda v: (
        None if isinstance(v, list) and all(isinstance(i, str) for i in v) else "must be a list of strings"
    ),
    "str_map": lambda v: (
        None
        if isinstance(v, dict) and all(isinstance(i, str) for i in v.values())
        else "must be an object whose values are strings"
    ),
    "mode": lambda v: (
        None
        if _is_int(v) or isinstance(v, str)
        else "must be octal digits, as an integer (644) or a string ('0644')"
    ),
}


def check(data: Any, shape: dict[str, Field], where: str) -> dict[str, Any]:
    """The values of `shape`'s fields in `data` (a JSON object), or one 400 naming every problem."""
    if not isinstance(data, dict):
        raise bad_request(f"invalid {where}: expected a JSON object, got {type(data).__name__}")
    values: dict[str, Any] = {}
    problems: list[str] = []
    for name, field in shape.items():
        value = data.get(name)
        if value is None:
            if field.required:
                problems.append(f"{name}: field required")
        elif (problem := field.problem(value)) is not None:
            problems.append(f"{name}: {problem}")
        values[name] = value
    if problems:
        raise bad_request(f"invalid {where}: {'; '.join(problems)}")
    return values


def each_object[T](data: Any, parse: Callable[[Any, str], T], where: str) -> dict[str, T]:
    """A JSON object of path -> object, each parsed with `parse`."""
    if not isinstance(data, dict):
        raise bad_request(f"invalid {where}: expected an object of path -> settings")
    return {key: parse(value, f"{where}, entry {key!r}") for key, value in data.items()}


def each_item[T](data: Any, parse: Callable[[Any, str], T], where: str) -> list[T]:
    """A JSON array of objects, each parsed with `parse`."""
    if not isinstance(data, list):
        raise bad_request(f"invalid {where}: expected a JSON array")
    return [parse(value, f"{where}, item {index}") for index, value in enumerate(data)]


async def read_json(request: Request, *, optional: bool = False) -> Any:
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_JSON_BODY:
            raise ApiError(413, INVALID_REQUEST, f"JSON body larger than {MAX_JSON_BODY} bytes")
    if not body.strip():
        if optional:
            return None
        raise bad_request(f"{request.method} {request.path} needs a JSON body")
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(f"body of {request.method} {request.path} is not valid JSON: {exc}") from None


async def parse_body[T](request: Request, parse: Callable[[Any, str], T], *, optional: bool = False) -> T:
    """The JSON body parsed with `parse(data, where)` (an absent optional body parses as `{}`)."""
    data = await read_json(request, optional=optional)
    return parse({} if data is None else data, f"body of {request.method} {request.path}")


def query_paths(request: Request) -> list[str]:
    paths = request.query_all("path")
    if not paths or not all(p.strip() for p in paths):
        raise bad_request("missing query parameter 'path' (repeat it for several paths)", "MISSING_QUERY")
    return paths


def query_int(request: Request, name: str, default: int | None, minimum: int) -> int | None:
    raw = request.query(name)
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
