"""Execution events and their wire framing, exactly as the Go execd writes them.

Rules: an event is one bare JSON object followed by a blank line (`{...}\\n\\n`, no `data:`
prefix; the 1.1.1 SDKs accept it, see `opensandbox/adapters/sse.py`); fields that are empty are
left out; `timestamp` is Unix milliseconds. A stream sends `init` (text = the execution id) first,
then output, then either `execution_complete` (success) or `error` (failure: for commands
`ename` `CommandExecError`, `evalue` the exit code as text), and `ping` while it waits.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from .web import Response

PING_INTERVAL_S = 3.0
EXEC_ERROR = "CommandExecError"


def now_ms() -> int:
    return int(time.time() * 1000)


def event(kind: str, text: str | None = None, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"type": kind, "timestamp": now_ms()}
    if text is not None:
        body["text"] = text
    body.update({k: v for k, v in fields.items() if v is not None})
    return body


def error_event(value: str, traceback: list[str] | None = None, name: str = EXEC_ERROR) -> dict[str, Any]:
    return event("error", error={"ename": name, "evalue": value, "traceback": traceback or []})


def frame(body: dict[str, Any]) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


async def with_pings(events: asyncio.Queue[dict[str, Any] | None]) -> AsyncIterator[bytes]:
    """Frame events from `events` until a `None` arrives, sending a ping every 3 s of silence."""
    while True:
        try:
            item = await asyncio.wait_for(events.get(), PING_INTERVAL_S)
        except TimeoutError:
            yield frame(event("ping"))
            continue
        if item is None:
            return
        yield frame(item)


def sse_response(body: AsyncIterator[bytes]) -> Response:
    return Response(
        200,
        body,
        {"cache-control": "no-cache", "x-accel-buffering": "no"},
        "text/event-stream; charset=utf-8",
    )
