"""The small web layer execd needs: requests, responses, routing and an asyncio + h11 server.

Rules:
1. Import cost is start-up time (execd must answer `/ping` fast): this module imports only the
   standard library and h11; route modules are imported on their first request (see `Router`).
2. A response body is bytes (sent with Content-Length) or an async iterator of bytes (sent
   chunked unless the handler set Content-Length). While a streamed body is sent, the server
   watches the connection: a client that goes away cancels the iterator, so its `finally` runs
   (a foreground command uses that to kill a run nobody can read any more).
3. Every request is answered: `ApiError` becomes its JSON error, anything else a JSON 500;
   malformed HTTP gets a 400 and the connection is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import re
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import h11

from .errors import ApiError

READ_SIZE = 256 * 1024
MAX_HEADER_BYTES = 64 * 1024
MAX_DISCARD = 4 * 1024 * 1024
# Reason phrases of the statuses execd answers with (clients print them: "404 Not Found");
# any other status looks its phrase up in `http` (not imported at start-up).
REASONS = {
    101: b"Switching Protocols",
    200: b"OK",
    201: b"Created",
    204: b"No Content",
    206: b"Partial Content",
    400: b"Bad Request",
    401: b"Unauthorized",
    403: b"Forbidden",
    404: b"Not Found",
    405: b"Method Not Allowed",
    409: b"Conflict",
    410: b"Gone",
    413: b"Content Too Large",
    416: b"Range Not Satisfiable",
    500: b"Internal Server Error",
    501: b"Not Implemented",
    503: b"Service Unavailable",
}

Handler = Callable[["Request"], Awaitable["Response"]]
# (method, path, "module:handler") or (..., "module:wrapper"): a wrapper takes the handler and
# returns the handler that serves the route (e.g. the same file route as another identity).
Route = tuple[str, str, str] | tuple[str, str, str, str]


class Response:
    """Status, headers and a body: bytes, or an async iterator of chunks (streamed)."""

    __slots__ = ("body", "headers", "status", "switch")

    def __init__(
        self,
        status: int = 200,
        body: bytes | AsyncIterator[bytes] = b"",
        headers: dict[str, str] | None = None,
        content_type: str | None = None,
    ) -> None:
        self.status = status
        self.body = body
        # a 101's protocol: run on the connection (bytes already read, reader, writer) after it
        self.switch: Callable[[bytes, Any, Any], Awaitable[None]] | None = None
        self.headers = dict(headers or {})
        if content_type is not None:
            self.headers["content-type"] = content_type


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    body = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
    return Response(status, body, headers, "application/json")


def text_response(text: str, headers: dict[str, str] | None = None) -> Response:
    return Response(200, text.encode(), headers, "text/plain; charset=utf-8")


async def iterate_in_thread(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    """A blocking iterator (file reads) as an async one: each step runs in a worker thread.

    Closing it (the client went away) first waits for a step still running, then closes
    `chunks`, so its `finally` (closing the fd) never races a read.
    """
    step: asyncio.Future[bytes | None] | None = None
    try:
        while True:
            step = asyncio.ensure_future(asyncio.to_thread(next, chunks, None))
            chunk = await asyncio.shield(step)
            step = None
            if chunk is None:
                return
            yield chunk
    finally:
        if step is not None:
            await asyncio.wait([step])
        close = getattr(chunks, "close", None)
        if close is not None:
            close()


def error_response(error: ApiError) -> Response:
    return json_response({"code": error.code, "message": error.message}, error.status, error.headers)


def reason_phrase(status: int) -> bytes:
    known = REASONS.get(status)
    if known is not None:
        return known
    from http import HTTPStatus

    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


class Request:
    """One HTTP request; the body is read on demand with `stream()`."""

    def __init__(
        self, method: str, target: str, headers: dict[str, str], state: Any, body: AsyncIterator[bytes]
    ) -> None:
        raw_path, _, self.query_string = target.partition("?")
        if "%" in raw_path:
            from urllib.parse import unquote

            raw_path = unquote(raw_path)
        self.method = method
        self.path = raw_path
        self.headers = headers
        self.state = state
        self.path_params: dict[str, str] = {}
        self._body = body
        self._query: dict[str, list[str]] | None = None

    def stream(self) -> AsyncIterator[bytes]:
        return self._body

    def query_all(self, name: str) -> list[str]:
        if self._query is None:
            from urllib.parse import parse_qs

            self._query = parse_qs(self.query_string, keep_blank_values=True)
        return self._query.get(name, [])

    def query(self, name: str, default: str | None = None) -> str | None:
        values = self.query_all(name)
        return values[-1] if values else default


class Router:
    """Routes `METHOD /path/{param}` to handlers named "module:function" (imported on first use)."""

    def __init__(self, package: str, table: list[Route]) -> None:
        self.package = package
        self.exact: dict[str, dict[str, tuple[str, ...]]] = {}
        self.patterns: list[tuple[re.Pattern[str], dict[str, tuple[str, ...]]]] = []
        for method, path, *targets in table:
            if "{" in path:
                regex = re.compile("^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", path) + "$")
                found = next((m for p, m in self.patterns if p.pattern == regex.pattern), None)
                if found is None:
                    found = {}
                    self.patterns.append((regex, found))
                found[method] = tuple(targets)
            else:
                self.exact.setdefault(path, {})[method] = tuple(targets)
        self.loaded: dict[tuple[str, ...], Handler] = {}

    def find(self, request: Request) -> Handler:
        methods = self.exact.get(request.path)
        if methods is None:
            for regex, candidates in self.patterns:
                match = regex.match(request.path)
                if match:
                    methods, request.path_params = candidates, match.groupdict()
                    break
        if methods is None:
            raise ApiError(404, "NOT_FOUND", f"no route {request.method} {request.path} in execd")
        targets = methods.get(request.method)
        if targets is None:
            raise ApiError(
                405,
                "METHOD_NOT_ALLOWED",
                f"{request.method} is not allowed on {request.path}; use {', '.join(sorted(methods))}",
                {"allow": ", ".join(sorted(methods))},
            )
        return self.load(targets)

    def load(self, targets: tuple[str, ...]) -> Handler:
        handler = self.loaded.get(targets)
        if handler is None:
            handler = self._import(targets[0])
            for wrapper in targets[1:]:
                handler = self._import(wrapper)(handler)
            self.loaded[targets] = handler
        return handler

    def _import(self, target: str) -> Any:
        module, _, name = target.partition(":")
        return getattr(importlib.import_module(f".{module}", self.package), name)


# -- the server ------------------------------------------------------------------------------


class Connection:
    """One client connection: parse requests with h11, answer them one at a time."""

    def __init__(
        self, respond: Callable[[Request], Awaitable[Response]], state: Any, reader: Any, writer: Any
    ) -> None:
        self.respond = respond
        self.state = state
        self.reader: asyncio.StreamReader = reader
        self.writer: asyncio.StreamWriter = writer
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)

    async def serve(self) -> None:
        try:
            while True:
                event = await self._next_event()
                if not isinstance(event, h11.Request):
                    return
                await self._answer(event)
                if self.h11.their_state is h11.SEND_BODY:
                    await self._discard_body()
                if self.h11.our_state is not h11.DONE or self.h11.their_state is not h11.DONE:
                    return  # the client asked to close, or sent too much we did not want
                self.h11.start_next_cycle()
        except h11.RemoteProtocolError as exc:
            with contextlib.suppress(Exception):
                if self.h11.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                    body = json.dumps({"code": "BAD_REQUEST", "message": f"malformed HTTP: {exc}"}).encode()
                    await self._send_all(
                        Response(exc.error_status_hint, body, content_type="application/json")
                    )
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()

    async def _next_event(self) -> Any:
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            data = await self.reader.read(READ_SIZE)
            self.h11.receive_data(data)

    async def _discard_body(self) -> None:
        """Read what is left of a body the route refused, so closing does not reset the
        connection under the answer; a large rest is not worth reading (we close instead)."""
        left = MAX_DISCARD
        while left > 0:
            event = await self._next_event()
            if not isinstance(event, h11.Data):
                return
            left -= len(event.data)

    async def _body(self) -> AsyncIterator[bytes]:
        if self.h11.they_are_waiting_for_100_continue:
            go_on = h11.InformationalResponse(status_code=100, headers=[], reason=b"Continue")
            self.writer.write(self.h11.send(go_on))
        while True:
            try:
                event = await self._next_event()
            except h11.RemoteProtocolError as exc:
                raise ApiError(400, "INVALID_REQUEST_BODY", f"malformed request body: {exc}") from None
            if isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return
            else:
                raise ApiError(400, "INVALID_REQUEST_BODY", "the connection closed in the middle of the body")

    async def _answer(self, event: h11.Request) -> None:
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in event.headers}
        request = Request(
            event.method.decode(), event.target.decode("latin-1"), headers, self.state, self._body()
        )
        response = await self.respond(request)
        if response.switch is not None:
            await self._switch_protocol(response, response.switch)
        elif isinstance(response.body, bytes):
            await self._send_all(response)
        else:
            await self._stream(response)

    async def _switch_protocol(self, response: Response, protocol: Callable[..., Awaitable[None]]) -> None:
        """Answer 101 and hand the connection to `protocol`; it is closed when that returns."""
        await self._discard_body()  # an upgrade request has no body: read to its end
        switching = h11.InformationalResponse(
            status_code=101, headers=list(response.headers.items()), reason=reason_phrase(101)
        )
        self.writer.write(self.h11.send(switching))
        await self.writer.drain()
        early, _ = self.h11.trailing_data
        try:
            await protocol(bytes(early), self.reader, self.writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception:
            import traceback

            traceback.print_exc(file=sys.stderr)

    def _head(self, response: Response) -> bytes:
        return self.h11.send(
            h11.Response(
                status_code=response.status,
                headers=list(response.headers.items()),
                reason=reason_phrase(response.status),
            )
        )

    async def _send_all(self, response: Response) -> None:
        assert isinstance(response.body, bytes)
        response.headers["content-length"] = str(len(response.body))
        data = self._head(response)
        if response.body:
            data += self.h11.send(h11.Data(data=response.body))
        self.writer.write(data + self.h11.send(h11.EndOfMessage()))
        await self.writer.drain()

    async def _stream(self, response: Response) -> None:
        body = response.body
        assert not isinstance(body, bytes)
        self.writer.write(self._head(response))
        sender = asyncio.ensure_future(self._send_chunks(body))
        watcher = asyncio.ensure_future(self._watch_for_close()) if self.h11.their_state is h11.DONE else None
        try:
            waiting = {sender} if watcher is None else {sender, watcher}
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if not sender.done():  # the client went away: stop producing
                sender.cancel()
                with contextlib.suppress(BaseException):
                    await sender
                raise ConnectionResetError("client closed the connection during a streamed response")
            sender.result()
        finally:
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(BaseException):
                    await watcher
            aclose = getattr(body, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(BaseException):
                    await aclose()

    async def _send_chunks(self, body: AsyncIterator[bytes]) -> None:
        async for chunk in body:
            if chunk:
                self.writer.write(self.h11.send(h11.Data(data=chunk)))
                await self.writer.drain()
        self.writer.write(self.h11.send(h11.EndOfMessage()))
        await self.writer.drain()

    async def _watch_for_close(self) -> None:
        """Returns when the client closes; data it sends meanwhile (a pipelined request) is kept."""
        while data := await self.reader.read(READ_SIZE):
            self.h11.receive_data(data)
        self.h11.receive_data(b"")


async def serve(
    respond: Callable[[Request], Awaitable[Response]], state: Any, host: str, port: int, stop: asyncio.Event
) -> None:
    """Serve until `stop` is set; open connections are cancelled then."""
    connections: set[asyncio.Task[None]] = set()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        connections.add(task)
        try:
            await Connection(respond, state, reader, writer).serve()
        finally:
            connections.discard(task)

    server = await asyncio.start_server(accept, host, port, reuse_address=True, limit=READ_SIZE)
    async with server:
        await stop.wait()
        server.close()
        for task in list(connections):
            task.cancel()
        await asyncio.gather(*connections, return_exceptions=True)
