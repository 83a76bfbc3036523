"""The reverse proxy's upstream side: keep-alive HTTP/1.1 connections to sandbox ports, framed by h11.

Why not httpx: its asyncio client cost about 2 ms of CPU per request on the loaded benchmark
machine against 0.3 ms for h11 on a plain asyncio stream (bench/bench_gateway.py); the hop to
execd is on every SDK call, so that difference is the hop.

Rules:
1. Connections are pooled per (sandbox id, address, port): a new sandbox that gets an old
   sandbox's address never inherits its connections. At most `IDLE_PER_TARGET` idle ones are
   kept, each for at most `IDLE_SECONDS` (shorter than common servers' keep-alive timeouts).
2. A connection goes back to the pool only when both messages ended cleanly and h11 agrees it
   can carry another (`start_next_cycle`); anything else (an error, a consumer that stopped
   reading, `Connection: close`) closes it.
3. Bodies stream both ways: the request body as the client sends it, the answer as
   `Exchange.body()` yields it.
4. A pooled connection may have been closed by the sandbox after its last answer without our
   seeing it yet (a server that closes without `Connection: close`, or its idle timeout racing
   ours). A request sent on one that ends before a single byte of answer came back is sent once
   more on a new connection, whatever its method: the server closed the connection without
   taking the request (RFC 9110 9.2.2, "some means to detect that the original request was
   never applied"), as browsers resend on a reused connection. So the request must be sendable
   twice: on a pooled connection a body of known length up to `REPLAYABLE_BYTES` is read first;
   a longer or unframed one goes on a new connection instead.
5. Fields are passed as given (order, repeats, case); only Host and the framing of a body whose
   length is unknown (chunked) are added here.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import h11

REPLAYABLE_BYTES = 64 * 1024  # rule 4
IDLE_PER_TARGET = 16
IDLE_SECONDS = 4.0
CONNECT_TIMEOUT = 10.0
READ_SIZE = 65536

Target = tuple[str, str, int]  # sandbox id, address, port


class UpstreamError(Exception):
    """The sandbox's port did not answer (refused, reset, or closed before a response)."""


class ClosedUnanswered(UpstreamError):
    """The connection ended before a single byte of the answer (rule 4)."""


@dataclass
class Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    protocol: h11.Connection = field(default_factory=lambda: h11.Connection(h11.CLIENT, READ_SIZE))
    idle_since: float = 0.0
    answered: bool = False  # a byte of the current answer arrived

    def close(self) -> None:
        self.writer.close()

    async def next_event(self) -> object:
        while True:
            event = self.protocol.next_event()
            if event is not h11.NEED_DATA:
                return event
            data = await self.reader.read(READ_SIZE)
            self.answered = self.answered or bool(data)
            self.protocol.receive_data(data)


@dataclass
class Exchange:
    """One answer from the sandbox: status and fields now, the body as it arrives."""

    status: int
    fields: list[tuple[bytes, bytes]]
    connection: Connection
    pool: Pool
    target: Target

    async def body(self) -> AsyncIterator[bytes]:
        reusable = False
        try:
            while True:
                event = await self.connection.next_event()
                if isinstance(event, h11.Data):
                    yield bytes(event.data)
                elif isinstance(event, h11.EndOfMessage):
                    reusable = (
                        self.connection.protocol.our_state is h11.DONE is self.connection.protocol.their_state
                    )
                    return
                else:
                    raise UpstreamError(f"unexpected {type(event).__name__} in the answer's body")
        finally:
            self.pool.release(self.target, self.connection, reusable)

    def discard(self) -> None:
        """The answer is not wanted (the client left): the connection cannot carry another."""
        self.pool.release(self.target, self.connection, reusable=False)


class Pool:
    def __init__(self) -> None:
        self.idle: dict[Target, list[Connection]] = {}

    async def _connect(self, target: Target) -> Connection:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(target[1], target[2], limit=READ_SIZE), CONNECT_TIMEOUT
            )
        except (OSError, TimeoutError) as exc:
            raise UpstreamError(f"cannot connect: {exc or type(exc).__name__}") from exc
        return Connection(reader, writer)

    def _pooled(self, target: Target) -> Connection | None:
        idle = self.idle.get(target, [])
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            if now - connection.idle_since < IDLE_SECONDS and not connection.reader.at_eof():
                return connection
            connection.close()
        return None

    def release(self, target: Target, connection: Connection, reusable: bool) -> None:
        idle = self.idle.setdefault(target, [])
        if reusable and len(idle) < IDLE_PER_TARGET:
            connection.protocol.start_next_cycle()
            connection.idle_since = time.monotonic()
            connection.answered = False
            idle.append(connection)
        else:
            connection.close()
        self._forget_stale()

    def _forget_stale(self) -> None:
        """Close idle connections past their time, and drop targets with none left."""
        now = time.monotonic()
        for target in list(self.idle):
            fresh = []
            for connection in self.idle[target]:
                if now - connection.idle_since < IDLE_SECONDS:
                    fresh.append(connection)
                else:
                    connection.close()
            if fresh:
                self.idle[target] = fresh
            else:
                del self.idle[target]

    async def send(
        self,
        target: Target,
        method: str,
        path: str,
        fields: list[tuple[str, str]],
        body: AsyncIterator[bytes] | None,
    ) -> Exchange:
        """Send one request and read the answer's head; the caller must read or discard the body."""
        fields = [("host", f"{target[1]}:{target[2]}"), *fields]
        if body is not None and not any(name.lower() == "content-length" for name, _ in fields):
            fields.append(("transfer-encoding", "chunked"))
        request = h11.Request(method=method, target=path, headers=fields)
        pooled = self._pooled(target) if _replayable(fields, body) else None
        if pooled is not None:  # rule 4
            whole = [chunk async for chunk in body] if body is not None else []
            with contextlib.suppress(ClosedUnanswered):
                return await self._exchange(target, pooled, request, _chunks(whole))
            body = _chunks(whole) if body is not None else None
        return await self._exchange(target, await self._connect(target), request, body)

    async def _exchange(
        self, target: Target, connection: Connection, request: h11.Request, body: AsyncIterator[bytes] | None
    ) -> Exchange:
        try:
            connection.writer.write(connection.protocol.send(request) or b"")
            if body is not None:
                async for chunk in body:
                    if chunk:
                        connection.writer.write(connection.protocol.send(h11.Data(data=chunk)) or b"")
                        await connection.writer.drain()
            connection.writer.write(connection.protocol.send(h11.EndOfMessage()) or b"")
            event = await connection.next_event()
            while isinstance(event, h11.InformationalResponse):  # 100 Continue: the client had its own
                event = await connection.next_event()
        except (OSError, h11.ProtocolError) as exc:
            connection.close()
            failed = ClosedUnanswered if not connection.answered else UpstreamError
            raise failed(f"no answer: {exc or type(exc).__name__}") from exc
        except BaseException:
            connection.close()
            raise
        if not isinstance(event, h11.Response):
            connection.close()
            failed = ClosedUnanswered if not connection.answered else UpstreamError
            raise failed(f"no answer: the connection ended ({type(event).__name__})")
        return Exchange(event.status_code, list(event.headers.raw_items()), connection, self, target)

    def close(self) -> None:
        for connections in self.idle.values():
            for connection in connections:
                connection.close()
        self.idle.clear()


def _replayable(fields: list[tuple[str, str]], body: AsyncIterator[bytes] | None) -> bool:
    """Whether the request can be held and sent twice (rule 4)."""
    if body is None:
        return True
    length = next((value for name, value in fields if name.lower() == "content-length"), "")
    return length.isdigit() and int(length) <= REPLAYABLE_BYTES


async def _chunks(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk
