"""Relaying a decided pass-through connection in the kernel: `splice(2)` through a pipe.

Rules:
1. No byte of the connection enters Python: each direction moves socket -> pipe -> socket with
   `os.splice`, the pipe holding up to PIPE_SIZE bytes; Python only reacts to readiness (one
   callback per wake-up, whatever the amount) and counts bytes.
2. It runs on the event loop but never blocks it: every splice is non-blocking
   (SPLICE_F_NONBLOCK on a non-blocking socket); a full destination parks the direction on a
   writer callback and stops reading its source until the pipe is drained (back-pressure, so
   memory stays at one pipe per direction).
3. Half-close is relayed: EOF from one side becomes `shutdown(SHUT_WR)` on the other once the
   pipe is drained; the relay ends when both directions ended, or at the first error (then both
   sockets are closed, the peer that still waits sees the close).
4. A relay can be aborted from outside (`Splice.abort`, revocation): both directions stop at
   once and both sockets are reset (SO_LINGER 0), so neither peer can send another byte.
5. A direction may be throttled (a `bytesPerSecond` budget, proxy/budgets.py): each read from
   its source is at most what the throttle allows now, and with nothing allowed the direction
   stops reading until the throttle's wait is over (the sender is held back by TCP).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import socket
import struct
from typing import Protocol

PIPE_SIZE = 1 << 20  # bytes a direction may hold in the kernel between reading and writing
FLAGS = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
RESET_ON_CLOSE = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends an RST


class Throttle(Protocol):
    def allowance(self, most: int) -> tuple[int, float]: ...  # (bytes now, or 0 and seconds to wait)

    def spend(self, n: int) -> None: ...


class _Direction:
    """One way of the relay: src -> pipe -> dst."""

    def __init__(
        self, relay: _Relay, src: socket.socket, dst: socket.socket, throttle: Throttle | None
    ) -> None:
        self.relay, self.src, self.dst, self.throttle = relay, src, dst, throttle
        self.loop = asyncio.get_running_loop()
        self.pipe_r, self.pipe_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        with contextlib.suppress(OSError):  # above /proc/sys/fs/pipe-max-size: keep the default
            fcntl.fcntl(self.pipe_w, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        self.pending = 0  # bytes in the pipe
        self.moved = 0  # bytes delivered to dst
        self.eof = False  # src said EOF
        self.finished = False  # EOF relayed (or the relay failed): this direction is closed

    def start(self) -> None:
        self.loop.add_reader(self.src.fileno(), self._readable)

    def _readable(self) -> None:
        most = PIPE_SIZE
        if self.throttle is not None:
            most, wait = self.throttle.allowance(PIPE_SIZE)
            if not most:  # rule 5: read nothing until the budget has room again
                self.loop.remove_reader(self.src.fileno())
                self.loop.call_later(wait, self._resume)
                return
        try:
            n = os.splice(self.src.fileno(), self.pipe_w, most, flags=FLAGS)
        except BlockingIOError:
            return
        except OSError as exc:
            self.relay.failed(exc)
            return
        if self.throttle is not None:
            self.throttle.spend(n)
        if n == 0:
            self.loop.remove_reader(self.src.fileno())
            self.eof = True
        self.pending += n
        self._drain()

    def _drain(self) -> None:
        while self.pending:
            try:
                n = os.splice(self.pipe_r, self.dst.fileno(), self.pending, flags=FLAGS)
            except BlockingIOError:  # dst is full: stop reading src until dst takes more
                self.loop.remove_reader(self.src.fileno())
                self.loop.add_writer(self.dst.fileno(), self._writable)
                return
            except OSError as exc:
                self.relay.failed(exc)
                return
            self.pending -= n
            self.moved += n
        if self.eof:
            with contextlib.suppress(OSError):
                self.dst.shutdown(socket.SHUT_WR)
            self.close()
            self.relay.direction_finished()

    def _resume(self) -> None:
        if not self.finished and not self.pending:
            self.loop.add_reader(self.src.fileno(), self._readable)

    def _writable(self) -> None:
        self.loop.remove_writer(self.dst.fileno())
        self._drain()
        if not self.pending and not self.finished:
            self.loop.add_reader(self.src.fileno(), self._readable)

    def close(self) -> None:
        if self.finished:
            return
        self.finished = True
        self.loop.remove_reader(self.src.fileno())
        self.loop.remove_writer(self.dst.fileno())
        os.close(self.pipe_r)
        os.close(self.pipe_w)


class _Relay:
    def __init__(
        self,
        client: socket.socket,
        upstream: socket.socket,
        throttles: tuple[Throttle | None, Throttle | None],
    ) -> None:
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.outbound = _Direction(self, client, upstream, throttles[1])
        self.inbound = _Direction(self, upstream, client, throttles[0])

    def direction_finished(self) -> None:
        if self.outbound.finished and self.inbound.finished and not self.done.done():
            self.done.set_result(None)

    def failed(self, exc: OSError) -> None:
        for direction in (self.outbound, self.inbound):
            direction.close()
        if not self.done.done():
            self.done.set_exception(exc)


class Splice:
    """One relay between a client and its upstream: `await run()` relays until both sides are
    done (or one fails) and returns (bytes upstream -> client, bytes client -> upstream); both
    sockets are closed on return, also when cancelled. `abort()` ends it at once (rule 4).
    `throttles`: (upstream -> client, client -> upstream), None for a way without (rule 5)."""

    def __init__(
        self,
        client: socket.socket,
        upstream: socket.socket,
        throttles: tuple[Throttle | None, Throttle | None] = (None, None),
    ) -> None:
        self.client, self.upstream = client, upstream
        self._relay = _Relay(client, upstream, throttles)

    async def run(self) -> tuple[int, int]:
        relay = self._relay
        try:
            relay.outbound.start()
            relay.inbound.start()
            with contextlib.suppress(OSError):  # a reset is how many connections end
                await relay.done
        finally:
            relay.outbound.close()
            relay.inbound.close()
            self.client.close()
            self.upstream.close()
        return relay.inbound.moved, relay.outbound.moved

    def abort(self) -> None:
        for end in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                end.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET_ON_CLOSE)
        for direction in (self._relay.outbound, self._relay.inbound):
            direction.close()
        if not self._relay.done.done():
            self._relay.done.set_result(None)
