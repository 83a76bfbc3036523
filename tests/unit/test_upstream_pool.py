"""The reverse proxy's upstream pool meets a sandbox server that closes keep-alive connections
behind its back (lifecycle/api/upstream.py rule 4), on a real loopback server: a request that a
closed pooled connection never answered is sent once more on a new one, whatever its method;
one that got part of an answer is not; a body too long to hold never meets a pooled connection."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import h11
import pytest

from sandgate.lifecycle.api.upstream import REPLAYABLE_BYTES, Pool, UpstreamError


@dataclass
class ClosingServer:
    """Answers the first request of each connection; on the next one it acts as `second` says:
    "reset" (closes with RST without answering, as a server that had closed the idle
    connection) or "half" (sends half a status line, then closes)."""

    second: str = "reset"
    seen: list[tuple[int, str, bytes]] = field(default_factory=list)  # (connection, method, body)
    connections: int = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        protocol = h11.Connection(h11.SERVER)
        for turn in range(2):
            method, body = await self._request(reader, protocol)
            if method is None:
                break
            self.seen.append((number, method, body))
            if turn == 1:
                await self._misbehave(writer)
                return
            writer.write(
                protocol.send(h11.Response(status_code=200, headers=[("content-length", "2")])) or b""
            )
            writer.write(
                (protocol.send(h11.Data(data=b"ok")) or b"") + (protocol.send(h11.EndOfMessage()) or b"")
            )
            await writer.drain()
            protocol.start_next_cycle()
        writer.close()

    async def _misbehave(self, writer: asyncio.StreamWriter) -> None:
        if self.second == "half":
            writer.write(b"HTTP/1.1 2")
            await writer.drain()
        else:
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.close()

    @staticmethod
    async def _request(reader: asyncio.StreamReader, protocol: h11.Connection) -> tuple[str | None, bytes]:
        method, body = None, b""
        while True:
            event = protocol.next_event()
            if event is h11.NEED_DATA:
                data = await reader.read(65536)
                if not data:
                    return None, b""
                protocol.receive_data(data)
            elif isinstance(event, h11.Request):
                method = event.method.decode()
            elif isinstance(event, h11.Data):
                body += bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return method, body


async def _body(data: bytes) -> AsyncIterator[bytes]:
    for start in range(0, len(data), 16384):
        yield data[start : start + 16384]


async def _exchange(pool: Pool, port: int, method: str, data: bytes | None) -> tuple[int, bytes]:
    fields = [("content-length", str(len(data)))] if data is not None else []
    body = _body(data) if data is not None else None
    exchange = await pool.send(("sb-1", "127.0.0.1", port), method, "/", fields, body)
    return exchange.status, b"".join([chunk async for chunk in exchange.body()])


async def _run(server: ClosingServer, steps: list[tuple[str, bytes | None]]) -> list[tuple[int, bytes] | str]:
    listener = await asyncio.start_server(server.serve, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    pool = Pool()
    results: list[tuple[int, bytes] | str] = []
    try:
        for method, data in steps:
            try:
                results.append(await _exchange(pool, port, method, data))
            except UpstreamError as exc:
                results.append(f"UpstreamError: {exc}")
    finally:
        pool.close()
        listener.close()
        await listener.wait_closed()
    return results


@pytest.mark.parametrize("method", ["POST", "GET", "PATCH"])
def test_a_request_a_closed_pooled_connection_never_answered_is_sent_again(method: str) -> None:
    server = ClosingServer("reset")
    data = b"x" * 100 if method != "GET" else None
    results = asyncio.run(_run(server, [("GET", None), (method, data)]))
    assert results == [(200, b"ok"), (200, b"ok")]
    sent = data or b""
    assert server.seen == [(1, "GET", b""), (1, method, sent), (2, method, sent)]


def test_a_request_that_got_part_of_an_answer_is_not_sent_again() -> None:
    server = ClosingServer("half")
    results = asyncio.run(_run(server, [("GET", None), ("POST", b"once")]))
    assert results[0] == (200, b"ok")
    assert isinstance(results[1], str) and results[1].startswith("UpstreamError")
    assert server.seen == [(1, "GET", b""), (1, "POST", b"once")]


def test_a_body_too_long_to_hold_goes_on_a_new_connection() -> None:
    server = ClosingServer("reset")
    long = b"y" * (REPLAYABLE_BYTES + 1)
    results = asyncio.run(_run(server, [("GET", None), ("PUT", long)]))
    assert results == [(200, b"ok"), (200, b"ok")]
    assert server.seen == [(1, "GET", b""), (2, "PUT", long)]
