"""`/session`: persistent bash shells whose state (cwd, variables, functions) carries across runs.

Rules:
1. A session is one `bash --noprofile --norc` in its own process group, fed through its stdin.
   Each run's command is written to a file and sourced (`. file < /dev/null`), so a syntax error
   fails that run only and the command cannot read the shell's own input.
2. After the command the shell prints a random per-session marker with the exit status on stdout
   and the marker on stderr; output before the markers is the run's output, framed like /command.
3. One run at a time per session (409 otherwise). A timeout, a client that goes away, or `exit`
   in the command ends the session (its process group is killed); later runs answer 410.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shlex
import shutil
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from .commands import EVENT_QUEUE, CommandRunner
from .errors import CONFLICT, ApiError, not_found
from .events import error_event, event, frame, sse_response, with_pings
from .process import READ_CHUNK, LineSplitter, child_env, exit_code, expand_cwd, kill_group
from .requests import Field, check, parse_body
from .web import Request, Response, json_response


@dataclass(frozen=True)
class CreateSessionRequest:
    cwd: str | None = None

    @classmethod
    def parse(cls, data: Any, where: str) -> CreateSessionRequest:
        return cls(**check(data, {"cwd": Field("str")}, where))


RUN_IN_SESSION = {
    "command": Field("str", required=True, min_length=1),
    "cwd": Field("str"),
    "timeout": Field("int", minimum=0),
}


@dataclass(frozen=True)
class RunInSessionRequest:
    command: str
    cwd: str | None = None
    timeout: int | None = None

    @classmethod
    def parse(cls, data: Any, where: str) -> RunInSessionRequest:
        return cls(**check(data, RUN_IN_SESSION, where))


@dataclass
class Session:
    id: str
    process: asyncio.subprocess.Process
    marker: bytes = field(default_factory=lambda: f"__SANDGATE_{secrets.token_hex(16)}__".encode())
    busy: asyncio.Lock = field(default_factory=asyncio.Lock)
    ended: str = ""
    runs: int = 0

    def end(self, why: str) -> None:
        self.ended = self.ended or why
        kill_group(self.process.pid)


async def read_until_marker(
    reader: asyncio.StreamReader, marker: bytes, kind: str, queue: asyncio.Queue[dict[str, Any] | None]
) -> bytes | None:
    """Emit line events until `marker`; returns what follows it on its line (None at EOF)."""
    splitter, window = LineSplitter(), b""
    while True:
        chunk = await reader.read(READ_CHUNK)
        window += chunk
        found = window.find(marker)
        if found >= 0 or not chunk:
            output = window[:found] if found >= 0 else window
            for line in splitter.feed(output) + splitter.flush():
                await queue.put(event(kind, line))
            if found < 0:
                return None
            rest = window[found + len(marker) :]
            while b"\n" not in rest and (more := await reader.read(READ_CHUNK)):
                rest += more
            return rest.split(b"\n", 1)[0]
        keep = len(marker) - 1
        for line in splitter.feed(window[:-keep] if keep < len(window) else b""):
            await queue.put(event(kind, line))
        window = window[-keep:] if keep < len(window) else window


class Sessions:
    """Every live session, created and ended on request."""

    def __init__(self, commands: CommandRunner) -> None:
        self.commands = commands
        self.sessions: dict[str, Session] = {}

    def get(self, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if session is None:
            raise not_found(f"no session {session_id!r}; create one with POST /session")
        if session.ended:
            raise ApiError(
                410, "SESSION_ENDED", f"session {session_id} has ended ({session.ended}); create a new one"
            )
        return session

    async def create(self, cwd: str | None) -> Session:
        env = child_env(None, None)
        directory = expand_cwd(cwd, env, self.commands.default_cwd)
        process = await asyncio.create_subprocess_exec(
            shutil.which("bash") or "/bin/bash",
            "--noprofile",
            "--norc",
            cwd=directory,
            env=env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        session = Session(uuid.uuid4().hex, process)
        self.sessions[session.id] = session
        return session

    def delete(self, session_id: str) -> None:
        session = self.sessions.pop(session_id, None)
        if session is None:
            raise not_found(f"no session {session_id!r}")
        session.end("deleted")

    def shutdown(self) -> None:
        for session in self.sessions.values():
            session.end("execd stopped")

    async def run(self, session: Session, req: RunInSessionRequest) -> AsyncIterator[bytes]:
        async with session.busy:
            session.runs += 1
            run_id = f"{session.id}-{session.runs}"
            script = os.path.join(self.commands.state_dir, f"session-{run_id}.sh")
            with open(script, "w", encoding="utf-8") as handle:
                handle.write(req.command + "\n")
            queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(EVENT_QUEUE)
            yield frame(event("init", run_id))
            task = asyncio.create_task(self._drive(session, req, script, queue))
            try:
                async for chunk in with_pings(queue):
                    yield chunk
            finally:
                if not task.done():
                    session.end("the client went away during a run")
                await asyncio.gather(task, return_exceptions=True)
                os.unlink(script)

    async def _drive(
        self,
        session: Session,
        req: RunInSessionRequest,
        script: str,
        queue: asyncio.Queue[dict[str, Any] | None],
    ) -> None:
        started = time.time()
        process = session.process
        assert process.stdin is not None and process.stdout is not None and process.stderr is not None
        marker = session.marker.decode()
        enter = f"__sg_back=$PWD; cd -- {shlex.quote(req.cwd)} && " if req.cwd else ""
        leave = '; cd -- "$__sg_back"' if req.cwd else ""
        process.stdin.write(
            f"{enter}. {shlex.quote(script)} < /dev/null; __sg_rc=$?{leave}\n"
            f"printf '%s%d\\n' '{marker}' \"$__sg_rc\"; printf '%s\\n' '{marker}' >&2\n".encode()
        )
        try:
            await process.stdin.drain()
            stdout = asyncio.create_task(read_until_marker(process.stdout, session.marker, "stdout", queue))
            stderr = asyncio.create_task(read_until_marker(process.stderr, session.marker, "stderr", queue))
            timeout = req.timeout / 1000 if req.timeout else None
            done, _ = await asyncio.wait([stdout, stderr], timeout=timeout)
            if len(done) < 2:
                session.end(f"a run exceeded its {req.timeout} ms timeout")
                await asyncio.gather(stdout, stderr, return_exceptions=True)
                await queue.put(
                    error_event("137", [f"killed after the {req.timeout} ms timeout; session ended"])
                )
                return
            status = stdout.result()
            if status is None:  # the shell itself exited (`exit` in the command)
                code = exit_code(await process.wait())
                session.end(f"the shell exited with status {code}")
            else:
                code = int(status or b"0")
            if code == 0:
                await queue.put(
                    event("execution_complete", execution_time=int((time.time() - started) * 1000))
                )
            else:
                await queue.put(error_event(str(code), [f"exit status {code}"]))
        except (BrokenPipeError, ConnectionResetError):
            session.end("the shell is gone")
            await queue.put(error_event("1", ["the session's shell is gone; create a new session"]))
        finally:
            await queue.put(None)


def sessions_of(request: Request) -> Sessions:
    sessions: Sessions = request.state.sessions
    return sessions


async def create_session(request: Request) -> Response:
    req = await parse_body(request, CreateSessionRequest.parse, optional=True)
    session = await sessions_of(request).create(req.cwd)
    return json_response({"session_id": session.id})


async def run_in_session(request: Request) -> Response:
    sessions = sessions_of(request)
    session = sessions.get(request.path_params["session_id"])
    req = await parse_body(request, RunInSessionRequest.parse)
    if session.busy.locked():
        raise ApiError(
            409, CONFLICT, f"session {session.id} is running another command; wait for it to finish"
        )
    return sse_response(sessions.run(session, req))


async def delete_session(request: Request) -> Response:
    sessions_of(request).delete(request.path_params["session_id"])
    return Response()
