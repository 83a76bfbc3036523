"""What a client really gets on the wire: one HTTP/1.1 exchange over a raw socket, parsed by h11.

    with RawExchange("127.0.0.1", port) as wire:
        wire.send("GET", "/x", [("host", "a"), ("x-twice", "1"), ("x-twice", "2")])
        head = wire.head()                # the status and every field, repeats and order kept
        chunk = wire.next_data()          # the body as it arrives (SSE), or wire.body() for all

Nothing is normalised: `head.fields` is the field list as sent (names lowercased by h11),
`head.framing` says whether the body was delimited by Content-Length or chunked.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

import h11

from tests.runtime.harness import Closing


@dataclass(frozen=True)
class Head:
    status: int
    fields: list[tuple[str, str]]

    def all(self, name: str) -> list[str]:
        return [value for field, value in self.fields if field == name.lower()]

    def one(self, name: str) -> str:
        values = self.all(name)
        assert len(values) == 1, f"{name}: {values} in {self.fields}"
        return values[0]

    @property
    def framing(self) -> str:
        if self.all("transfer-encoding"):
            return "chunked"
        return "content-length" if self.all("content-length") else "none"


class RawExchange(Closing):
    def __init__(self, host: str, port: int, timeout: float = 30.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.conn = h11.Connection(h11.CLIENT)

    def send(
        self, method: str, target: str, fields: list[tuple[str, str]], body: bytes | None = None
    ) -> None:
        if body is not None:
            fields = [*fields, ("content-length", str(len(body)))]
        self.sock.sendall(self.conn.send(h11.Request(method=method, target=target, headers=fields)) or b"")
        if body:
            self.sock.sendall(self.conn.send(h11.Data(data=body)) or b"")
        self.sock.sendall(self.conn.send(h11.EndOfMessage()) or b"")

    def _event(self) -> h11.Event:
        while True:
            event = self.conn.next_event()
            if event is not h11.NEED_DATA:
                return event  # type: ignore[return-value]
            self.conn.receive_data(self.sock.recv(65536))

    def head(self) -> Head:
        event = self._event()
        while isinstance(event, h11.InformationalResponse):
            event = self._event()
        assert isinstance(event, h11.Response), event
        fields = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in event.headers]
        return Head(event.status_code, fields)

    def next_data(self) -> bytes | None:
        """The next piece of the body as it arrived; None at its end."""
        event = self._event()
        if isinstance(event, h11.EndOfMessage):
            return None
        assert isinstance(event, h11.Data), event
        return bytes(event.data)

    def body(self) -> bytes:
        parts = []
        while (part := self.next_data()) is not None:
            parts.append(part)
        return b"".join(parts)

    def close(self) -> None:
        self.sock.close()
