"""A small RFC 6455 WebSocket server side: the handshake answer and the frame codec (stdlib only).

Rules:
1. `handshake(request)` checks a GET upgrade request (version 13, a 16-byte key) and returns the
   101 response; anything else is a 400 before the upgrade, so errors stay plain HTTP.
2. After the 101 the connection is a `WebSocket`: `receive()` returns whole messages
   (fragments joined, at most `MAX_MESSAGE` bytes), answers pings itself, and returns None once
   the peer closed (its close frame is echoed) or broke the protocol (closed with 1002/1009).
3. Client frames must be masked and server frames never are; sends are serialised by a lock so
   frames of concurrent senders never interleave.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import os
import struct
from collections.abc import Awaitable, Callable

from .errors import bad_request
from .web import Request, Response

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
MAX_MESSAGE = 1024 * 1024
CONTINUATION, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
NORMAL_CLOSURE, PROTOCOL_ERROR, TOO_BIG = 1000, 1002, 1009

Session = Callable[["WebSocket"], Awaitable[None]]


def handshake(request: Request, session: Session) -> Response:
    """The 101 answer to a WebSocket upgrade request; `session` then runs on the socket."""
    headers = request.headers
    upgrade = headers.get("upgrade", "").lower()
    connection = {token.strip() for token in headers.get("connection", "").lower().split(",")}
    key = headers.get("sec-websocket-key", "")
    if request.method != "GET" or upgrade != "websocket" or "upgrade" not in connection:
        raise bad_request(
            f"{request.path} is a WebSocket endpoint: send GET with 'Upgrade: websocket' and "
            "'Connection: Upgrade'"
        )
    if headers.get("sec-websocket-version") != "13":
        raise bad_request("unsupported Sec-WebSocket-Version: this server speaks version 13 (RFC 6455)")
    try:
        valid_key = len(base64.b64decode(key, validate=True)) == 16
    except ValueError:
        valid_key = False
    if not valid_key:
        raise bad_request("Sec-WebSocket-Key must be 16 random bytes in base64")
    accept = base64.b64encode(hashlib.sha1(key.encode() + GUID).digest()).decode()
    response = Response(
        101, headers={"upgrade": "websocket", "connection": "Upgrade", "sec-websocket-accept": accept}
    )
    response.switch = lambda data, reader, writer: session(WebSocket(reader, writer, data))
    return response


def encode_frame(opcode: int, payload: bytes) -> bytes:
    size = len(payload)
    if size < 126:
        head = struct.pack("!BB", 0x80 | opcode, size)
    elif size < 1 << 16:
        head = struct.pack("!BBH", 0x80 | opcode, 126, size)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 127, size)
    return head + payload


def unmask(payload: bytes, mask: bytes) -> bytes:
    if not payload:
        return payload
    repeated = (mask * (len(payload) // 4 + 1))[: len(payload)]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(repeated, "big")).to_bytes(len(payload), "big")


class ProtocolError(Exception):
    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


class WebSocket:
    """One accepted WebSocket connection (the server side)."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, early: bytes = b""
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.early = early  # bytes the client sent right after its handshake
        self.closed = False
        self.send_lock = asyncio.Lock()

    async def _read(self, size: int) -> bytes:
        if self.early:
            taken, self.early = self.early[:size], self.early[size:]
            return taken + (await self.reader.readexactly(size - len(taken)) if len(taken) < size else b"")
        return await self.reader.readexactly(size)

    async def _frame(self) -> tuple[bool, int, bytes]:
        first, second = await self._read(2)
        fin, opcode, masked, size = bool(first & 0x80), first & 0x0F, bool(second & 0x80), second & 0x7F
        if first & 0x70:
            raise ProtocolError(PROTOCOL_ERROR, "reserved bits set (no extension was negotiated)")
        if not masked:
            raise ProtocolError(PROTOCOL_ERROR, "client frames must be masked")
        if size == 126:
            size = struct.unpack("!H", await self._read(2))[0]
        elif size == 127:
            size = struct.unpack("!Q", await self._read(8))[0]
        if opcode >= CLOSE and (size > 125 or not fin):
            raise ProtocolError(PROTOCOL_ERROR, "control frames are at most 125 bytes and not fragmented")
        if size > MAX_MESSAGE:
            raise ProtocolError(TOO_BIG, f"frame larger than {MAX_MESSAGE} bytes")
        mask = await self._read(4)
        return fin, opcode, unmask(await self._read(size), mask)

    async def receive(self) -> tuple[int, bytes] | None:
        """The next TEXT or BINARY message, or None once the connection is closed."""
        message, kind = bytearray(), 0  # 0: no message started
        try:
            while True:
                fin, opcode, payload = await self._frame()
                if opcode == PING:
                    await self._send(PONG, payload)
                elif opcode == PONG:
                    continue
                elif opcode == CLOSE:
                    code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else NORMAL_CLOSURE
                    await self.close(code)
                    return None
                elif (opcode == CONTINUATION) == (kind == 0) or opcode not in (CONTINUATION, TEXT, BINARY):
                    raise ProtocolError(PROTOCOL_ERROR, f"unexpected frame opcode {opcode:#x}")
                else:
                    kind = kind if opcode == CONTINUATION else opcode
                    message += payload
                    if len(message) > MAX_MESSAGE:
                        raise ProtocolError(TOO_BIG, f"message larger than {MAX_MESSAGE} bytes")
                    if fin:
                        return kind, bytes(message)
        except ProtocolError as error:
            await self.close(error.code, error.reason)
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed = True
        return None

    async def _send(self, opcode: int, payload: bytes) -> None:
        async with self.send_lock:
            if self.closed:
                raise ConnectionResetError("the WebSocket is closed")
            self.writer.write(encode_frame(opcode, payload))
            await self.writer.drain()

    async def send_binary(self, data: bytes) -> None:
        await self._send(BINARY, data)

    async def send_text(self, text: str) -> None:
        await self._send(TEXT, text.encode())

    async def ping(self) -> None:
        await self._send(PING, os.urandom(4))

    async def close(self, code: int = NORMAL_CLOSURE, reason: str = "") -> None:
        """Send a close frame (once) and stop sending; the connection ends when the session returns."""
        if code in (1005, 1006, 1015) or not 1000 <= code < 5000:
            code = NORMAL_CLOSURE
        with contextlib.suppress(ConnectionError, RuntimeError):
            await self._send(CLOSE, struct.pack("!H", code) + reason.encode()[:120])
        self.closed = True

    def abort(self) -> None:
        """Drop the connection at once (a takeover of a client that does not read)."""
        self.closed = True
        self.writer.close()
