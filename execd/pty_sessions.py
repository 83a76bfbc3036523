"""`/pty`: interactive terminal sessions over a WebSocket, framed as the Go execd frames them.

Rules:
1. `POST /pty {cwd?, command?}` makes a session (201 `{session_id}`); its shell starts when the
   first WebSocket attaches to `/pty/{id}/ws`, and again on a later attach once it has exited.
   The shell is `bash --norc --noprofile` (or `bash -c command`) in its own session and process
   group. PTY mode (default) gives it a real terminal (`os.openpty`, the slave as its
   controlling tty, 80x24 to start); `?pty=0` gives it plain pipes, stderr kept apart.
2. Frames, server to client: JSON text `{"type":"connected","session_id","mode"}` first, then
   binary output: byte 0x01 + stdout (the terminal in PTY mode), 0x02 + stderr (pipe mode),
   0x03 + 8-byte big-endian offset + bytes for a replay. When the shell exits:
   `{"type":"exit","exit_code"}` after all its output, then close 1000. Client to server:
   binary 0x00 + stdin bytes; JSON text `stdin{data}`, `resize{cols,rows}`,
   `signal{signal: SIGINT|SIGTERM|SIGKILL|SIGQUIT|SIGHUP}` (to the terminal's foreground job,
   as Ctrl-C would; in pipe mode to the shell's process group) and
   `ping` (answered `pong`); anything else gets `{"type":"error","code":"INVALID_FRAME"}`.
3. Output is kept in a 1 MiB replay buffer with a running byte offset (`GET /pty/{id}` says
   `output_offset`); an attach sends the output from `?since=N` (default 0) as one replay frame,
   and what follows live, each byte once (the snapshot and the attach happen together).
4. One client at a time: another attach is a 409 unless it asks `?takeover=1`; the holder is then
   closed with 4001 `TAKEN_OVER` and the new client gets the same shell. A slow client slows
   the shell (bounded queue), it never grows execd's memory.
5. Errors before the upgrade are plain HTTP JSON (404 unknown session, 409 busy, 400 not a
   WebSocket request or a bad body), and change nothing. `DELETE /pty/{id}` kills the shell's
   process group. Exit codes follow the shell: killed by signal N is 128+N.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import fcntl
import json
import os
import signal
import struct
import termios
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from .errors import ApiError, not_found
from .process import child_env, exit_code, expand_cwd, kill_group
from .requests import Field, check, parse_body
from .web import Request, Response, json_response
from .websocket import BINARY, TEXT, WebSocket, handshake

REPLAY_BYTES = 1 << 20
READ_CHUNK = 32 * 1024
QUEUE_CHUNKS = 64
PING_INTERVAL_S = 30.0
EVICT_TIMEOUT_S = 0.2
DRAIN_AFTER_EXIT_S = 1.0
STDIN, STDOUT, STDERR, REPLAY = 0, 1, 2, 3
TAKEN_OVER = 4001
SIGNALS = {name: getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGKILL", "SIGQUIT", "SIGHUP")}
CREATE_PTY = {"cwd": Field("str"), "command": Field("str")}
NOT_FOUND = "CONTEXT_NOT_FOUND"
ALREADY_CONNECTED = "ALREADY_CONNECTED"


class ReplayBuffer:
    """The last `size` bytes of output and the offset of the next byte."""

    def __init__(self, size: int = REPLAY_BYTES) -> None:
        self.size = size
        self.data = bytearray()
        self.total = 0

    def write(self, chunk: bytes) -> None:
        self.data += chunk
        self.total += len(chunk)
        if len(self.data) > self.size:
            del self.data[: len(self.data) - self.size]

    def since(self, offset: int) -> tuple[bytes, int]:
        """The bytes from `offset` on (from the oldest kept, if older) and where they start."""
        oldest = self.total - len(self.data)
        start = min(max(offset, oldest), self.total)
        return bytes(self.data[start - oldest :]), start


def take_terminal() -> None:
    """In the child, after setsid: make the pty slave (fd 0) the controlling terminal."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def set_size(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


async def wait_fd(fd: int, writable: bool) -> None:
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    add, remove = (loop.add_writer, loop.remove_writer) if writable else (loop.add_reader, loop.remove_reader)
    add(fd, lambda: None if ready.done() else ready.set_result(None))
    try:
        await ready
    finally:
        remove(fd)


async def read_chunks(fd: int) -> AsyncIterator[bytes]:
    """Chunks from a non-blocking fd until EOF (or EIO: a pty whose slave side is all closed)."""
    while True:
        try:
            data = os.read(fd, READ_CHUNK)
        except BlockingIOError:
            await wait_fd(fd, writable=False)
            continue
        except OSError:
            return
        if not data:
            return
        yield data


async def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            await wait_fd(fd, writable=True)


@dataclass
class Attachment:
    """One WebSocket client of a session: its socket and its bounded output queue."""

    ws: WebSocket
    queue: asyncio.Queue[tuple[int, bytes] | None] = field(
        default_factory=lambda: asyncio.Queue(QUEUE_CHUNKS)
    )
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def evict(self) -> None:
        """Close this client for a takeover, without waiting on a client that does not read."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.ws.close(TAKEN_OVER, "TAKEN_OVER"), EVICT_TIMEOUT_S)
        self.ws.abort()
        self.stop.set()

    def detach(self) -> None:
        self.stop.set()
        while not self.queue.empty():  # a reader blocked on a full queue goes on
            self.queue.get_nowait()


class PtySession:
    def __init__(self, session_id: str, cwd: str, command: str | None) -> None:
        self.id = session_id
        self.cwd = cwd
        self.command = command
        self.replay = ReplayBuffer()
        self.pid = 0
        self.mode = "pty"
        self.stdin_fd = -1
        self.resize_fd = -1  # the pty master in PTY mode
        self.client: Attachment | None = None
        self.exited: asyncio.Event = asyncio.Event()
        self.exit_code: int | None = None
        self.deleted = False
        self.tasks: list[asyncio.Task[None]] = []  # the running shell's output readers and exit watcher

    @property
    def running(self) -> bool:
        return self.pid != 0 and not self.exited.is_set()

    # -- the shell ------------------------------------------------------------------------------

    async def start(self, pty_mode: bool) -> None:
        env = child_env(None, None)
        argv = ["bash", "--norc", "--noprofile", *(["-c", self.command] if self.command else [])]
        self.exited = asyncio.Event()
        self.exit_code = None
        if pty_mode:
            env.setdefault("TERM", "xterm-256color")
            master, slave = os.openpty()
            set_size(master, 80, 24)
            try:
                process = await asyncio.create_subprocess_exec(
                    *argv, stdin=slave, stdout=slave, stderr=slave, cwd=self.cwd, env=env,
                    start_new_session=True, preexec_fn=take_terminal,
                )  # fmt: skip
            except BaseException:
                os.close(master)
                raise
            finally:
                os.close(slave)
            os.set_blocking(master, False)
            self.mode, self.stdin_fd, self.resize_fd = "pty", master, master
            outputs = [(master, STDOUT)]
        else:
            (in_r, in_w), (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe(), os.pipe()
            try:
                process = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=in_r,
                    stdout=out_w,
                    stderr=err_w,
                    cwd=self.cwd,
                    env=env,
                    start_new_session=True,
                )
            except BaseException:
                for fd in (in_w, out_r, err_r):
                    os.close(fd)
                raise
            finally:
                for fd in (in_r, out_w, err_w):
                    os.close(fd)
            for fd in (in_w, out_r, err_r):
                os.set_blocking(fd, False)
            self.mode, self.stdin_fd, self.resize_fd = "pipe", in_w, -1
            outputs = [(out_r, STDOUT), (err_r, STDERR)]
        self.pid = process.pid
        readers = [asyncio.create_task(self._pump_output(fd, channel)) for fd, channel in outputs]
        self.tasks = [*readers]
        self.tasks.append(asyncio.create_task(self._watch_exit(process, readers, [fd for fd, _ in outputs])))

    async def _pump_output(self, fd: int, channel: int) -> None:
        async for chunk in read_chunks(fd):
            self.replay.write(chunk)
            if self.client is not None:
                await self.client.queue.put((channel, chunk))

    async def _watch_exit(
        self, process: asyncio.subprocess.Process, readers: list[asyncio.Task[None]], fds: list[int]
    ) -> None:
        code = exit_code(await process.wait())
        # output still buffered in the pty or pipes comes first; a background child that keeps
        # them open does not hold the exit back for long
        _, pending = await asyncio.wait(readers, timeout=DRAIN_AFTER_EXIT_S)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for fd in {*fds, self.stdin_fd}:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.stdin_fd = self.resize_fd = -1
        self.exit_code = code
        self.exited.set()
        if self.client is not None:
            await self.client.queue.put(None)

    async def write_stdin(self, data: bytes) -> None:
        if self.stdin_fd < 0:
            raise OSError("the shell has exited")
        await write_all(self.stdin_fd, data)

    def signal(self, name: str) -> None:
        """To the terminal's foreground job (what Ctrl-C reaches), else the shell's group."""
        if not self.running:
            return
        group = self.pid
        if self.resize_fd >= 0:
            with contextlib.suppress(OSError):
                group = os.tcgetpgrp(self.resize_fd)
        kill_group(group, SIGNALS[name])

    def resize(self, cols: int, rows: int) -> None:
        if self.resize_fd >= 0:
            set_size(self.resize_fd, cols, rows)

    def kill(self) -> None:
        self.deleted = True
        if self.running:
            kill_group(self.pid)

    # -- a client ------------------------------------------------------------------------------

    async def attach(self, ws: WebSocket, pty_mode: bool, since: int, takeover: bool) -> None:
        if self.client is not None:
            if not takeover:  # another client attached since the HTTP check
                await send_error(
                    ws, ALREADY_CONNECTED, f"another client is attached to pty session {self.id}"
                )
                return
            await self.client.evict()
            self.client = None
        if self.deleted:
            await send_error(ws, "SESSION_GONE", f"pty session {self.id} was deleted")
            return
        if not self.running:
            try:
                await self.start(pty_mode)
            except OSError as exc:
                await send_error(ws, "START_FAILED", f"cannot start the shell: {exc}")
                return
        replay, offset = self.replay.since(since)
        attachment = self.client = Attachment(ws)  # no await since the snapshot: nothing is lost
        try:
            if replay:
                await ws.send_binary(bytes([REPLAY]) + offset.to_bytes(8, "big") + replay)
            await send_json(ws, {"type": "connected", "session_id": self.id, "mode": self.mode})
            if self.exited.is_set():
                await attachment.queue.put(None)
            await self._serve(attachment)
        finally:
            attachment.detach()
            if self.client is attachment:
                self.client = None

    async def _serve(self, attachment: Attachment) -> None:
        tasks = [
            asyncio.create_task(self._send_output(attachment)),
            asyncio.create_task(self._read_client(attachment.ws)),
            asyncio.create_task(keep_alive(attachment.ws)),
            asyncio.create_task(attachment.stop.wait()),
        ]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _send_output(self, attachment: Attachment) -> None:
        while (item := await attachment.queue.get()) is not None:
            channel, chunk = item
            await attachment.ws.send_binary(bytes([channel]) + chunk)
        await send_json(attachment.ws, {"type": "exit", "exit_code": self.exit_code})
        await attachment.ws.close(1000, "process exited")

    async def _read_client(self, ws: WebSocket) -> None:
        while (message := await ws.receive()) is not None:
            kind, payload = message
            try:
                if kind == BINARY and payload[:1] == bytes([STDIN]):
                    await self.write_stdin(payload[1:])
                elif kind == TEXT:
                    await self._control(ws, payload)
            except OSError as exc:
                await send_error(ws, "STDIN_WRITE_FAILED", f"cannot write to the shell: {exc}")
                return

    async def _control(self, ws: WebSocket, payload: bytes) -> None:
        try:
            frame = json.loads(payload)
        except ValueError:
            return  # as the Go execd: a text frame that is not JSON is ignored
        kind = frame.get("type") if isinstance(frame, dict) else None
        if kind == "stdin" and isinstance(frame.get("data"), str):
            await self.write_stdin(frame["data"].encode())
        elif kind == "signal" and frame.get("signal") in SIGNALS:
            self.signal(frame["signal"])
        elif kind == "resize" and positive(frame.get("cols")) and positive(frame.get("rows")):
            self.resize(frame["cols"], frame["rows"])
        elif kind == "ping":
            await send_json(ws, {"type": "pong"})
        else:
            await send_error(ws, "INVALID_FRAME", f"unknown or malformed frame: {payload[:200]!r}")


def positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 1 << 16


async def send_json(ws: WebSocket, frame: dict[str, Any]) -> None:
    await ws.send_text(json.dumps(frame, separators=(",", ":")))


async def send_error(ws: WebSocket, code: str, message: str) -> None:
    with contextlib.suppress(ConnectionError):
        await send_json(ws, {"type": "error", "error": message, "code": code})


async def keep_alive(ws: WebSocket) -> None:
    while True:
        await asyncio.sleep(PING_INTERVAL_S)
        await ws.ping()


class PtySessions:
    def __init__(self, default_cwd: str) -> None:
        self.default_cwd = default_cwd
        self.sessions: dict[str, PtySession] = {}
        atexit.register(self.shutdown)

    def get(self, session_id: str) -> PtySession:
        session = self.sessions.get(session_id)
        if session is None:
            raise not_found(f"pty session {session_id!r} not found; create one with POST /pty", NOT_FOUND)
        return session

    def shutdown(self) -> None:
        for session in self.sessions.values():
            session.kill()


def sessions_of(request: Request) -> PtySessions:
    state = request.state
    if not hasattr(state, "pty_sessions"):
        state.pty_sessions = PtySessions(state.default_cwd)
    sessions: PtySessions = state.pty_sessions
    return sessions


# -- routes ------------------------------------------------------------------------------------


async def create_pty(request: Request) -> Response:
    values = await parse_body(request, lambda data, where: check(data, CREATE_PTY, where), optional=True)
    sessions = sessions_of(request)
    cwd = expand_cwd(values["cwd"], child_env(None, None), sessions.default_cwd)
    session = PtySession(uuid.uuid4().hex, cwd, values["command"] or None)
    sessions.sessions[session.id] = session
    return json_response({"session_id": session.id}, 201)


async def pty_status(request: Request) -> Response:
    session = sessions_of(request).get(request.path_params["session_id"])
    return json_response(
        {"session_id": session.id, "running": session.running, "output_offset": session.replay.total}
    )


async def delete_pty(request: Request) -> Response:
    sessions = sessions_of(request)
    sessions.get(request.path_params["session_id"]).kill()
    del sessions.sessions[request.path_params["session_id"]]
    return Response(200)


async def pty_websocket(request: Request) -> Response:
    session = sessions_of(request).get(request.path_params["session_id"])
    takeover = request.query("takeover") == "1"
    if session.client is not None and not takeover:
        raise ApiError(
            409,
            ALREADY_CONNECTED,
            f"another client is attached to pty session {session.id}; add ?takeover=1 to take it over",
        )
    pty_mode = request.query("pty") != "0"
    try:
        since = max(int(request.query("since") or 0), 0)
    except ValueError:
        since = 0  # as the Go execd: an unreadable offset replays everything
    return handshake(request, lambda ws: session.attach(ws, pty_mode, since, takeover))
