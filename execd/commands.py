"""`/command`: foreground runs streamed as events, background runs with status and logs, interrupt.

Rules:
1. Bad input (both or neither of command/argv, gid without uid, a cwd that is not a directory,
   an unknown executable) is a 4xx before any process starts.
2. A foreground run is `init`, one event per output line, then `execution_complete` on exit 0 or
   `error{CommandExecError, "<exit code>"}` otherwise. If the client goes away the run's process
   group is killed: nobody could read its output any more.
3. A background run answers `init` + `execution_complete` at once; its stdout and stderr go to
   one log file in execd's state directory (never into memory), read back with a byte cursor.
4. A timeout (ms) or an interrupt kills the whole process group (SIGTERM, then SIGKILL).
5. Finished runs are kept for status/logs up to `MAX_FINISHED`; older ones are forgotten.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from .errors import ApiError, bad_request, not_found
from .events import error_event, event, frame, sse_response, with_pings
from .paths import rfc3339
from .process import (
    Identity,
    child_env,
    drain_after_exit,
    exit_code,
    expand_cwd,
    kill_group,
    pump_stream,
    terminate_group,
)
from .requests import Field, check, parse_body
from .web import Request, Response, json_response, text_response

MAX_FINISHED = 1000
MAX_LOG_READ = 4 * 1024 * 1024
EVENT_QUEUE = 256


RUN_COMMAND = {
    "command": Field("str"),
    "argv": Field("strings"),
    "cwd": Field("str"),
    "background": Field("bool"),
    "timeout": Field("int", minimum=0),  # milliseconds; 0 or absent: no limit
    "uid": Field("int", minimum=0),
    "gid": Field("int", minimum=0),
    "envs": Field("str_map"),
}


@dataclass(frozen=True)
class RunCommandRequest:
    command: str | None = None
    argv: list[str] | None = None
    cwd: str | None = None
    background: bool = False
    timeout: int | None = None
    uid: int | None = None
    gid: int | None = None
    envs: dict[str, str] | None = None

    @classmethod
    def parse(cls, data: Any, where: str) -> RunCommandRequest:
        values = check(data, RUN_COMMAND, where)
        values["background"] = bool(values["background"])
        req = cls(**values)
        if (req.command is None) == (req.argv is None):
            raise bad_request(
                f"invalid {where}: give exactly one of 'command' (shell text) or 'argv' "
                "(executable and arguments)"
            )
        if req.command is not None and not req.command.strip():
            raise bad_request(f"invalid {where}: 'command' is empty")
        if req.argv is not None and (not req.argv or not req.argv[0] or any("\0" in a for a in req.argv)):
            raise bad_request(
                f"invalid {where}: 'argv' needs a non-empty executable and arguments without NUL bytes"
            )
        return req


@dataclass
class Run:
    """One command execution and what status/logs report about it."""

    id: str
    content: str
    background: bool
    started_at: float = field(default_factory=time.time)
    pid: int | None = None
    exit_code: int | None = None
    error: str = ""
    finished_at: float | None = None
    log_path: str | None = None
    process: asyncio.subprocess.Process | None = None

    @property
    def running(self) -> bool:
        return self.finished_at is None

    def finish(self, code: int, error: str = "") -> None:
        self.exit_code, self.error, self.finished_at = code, error, time.time()

    def status(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "content": self.content,
            "running": self.running,
            "exit_code": self.exit_code,
            "error": self.error,
            "started_at": rfc3339(self.started_at),
            "finished_at": rfc3339(self.finished_at) if self.finished_at is not None else None,
        }


@dataclass
class Launch:
    """A validated request, ready to spawn."""

    argv: list[str]
    cwd: str
    env: dict[str, str]
    identity: Identity
    timeout_s: float | None


def shell_argv(command: str) -> list[str]:
    shell = shutil.which("bash") or "/bin/sh"
    return [shell, "-c", command]


def prepare(req: RunCommandRequest, default_cwd: str) -> Launch:
    identity = Identity.from_request(req.uid, req.gid)
    env = child_env(req.envs, identity.uid)
    cwd = expand_cwd(req.cwd, env, default_cwd)
    if req.argv is not None:
        argv = list(req.argv)
        if "/" not in argv[0]:
            found = shutil.which(argv[0], path=env.get("PATH", os.defpath))
            if found is None:
                raise bad_request(f"executable {argv[0]!r} not found on the command's PATH")
            argv[0] = found
    else:
        argv = shell_argv(req.command or "")
    return Launch(argv, cwd, env, identity, req.timeout / 1000 if req.timeout else None)


class CommandRunner:
    """Owns every run: spawning, timeouts, interrupts and the finished-run history."""

    def __init__(self, state_dir: str, default_cwd: str) -> None:
        self.state_dir = state_dir
        self.default_cwd = default_cwd
        self.runs: dict[str, Run] = {}

    def get(self, run_id: str | None) -> Run:
        run = self.runs.get(run_id or "")
        if run is None:
            raise not_found(f"no command with id {run_id!r}; ids come from the init event of POST /command")
        return run

    def _register(self, run: Run) -> None:
        self.runs[run.id] = run
        finished = [r for r in self.runs.values() if not r.running]
        for old in finished[: max(0, len(finished) - MAX_FINISHED)]:
            del self.runs[old.id]
            if old.log_path:
                _remove_quietly(old.log_path)

    async def spawn(self, launch: Launch, run: Run, stdout: int, stderr: int) -> asyncio.subprocess.Process:
        process = await asyncio.create_subprocess_exec(
            *launch.argv,
            cwd=launch.cwd,
            env=launch.env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
            **launch.identity.popen_kwargs(),  # type: ignore[arg-type]
        )
        run.process, run.pid = process, process.pid
        self._register(run)
        return process

    async def wait(self, run: Run, timeout_s: float | None) -> str:
        """Wait for the run's process; on timeout kill its group. Returns why it failed, if it did."""
        assert run.process is not None
        try:
            await asyncio.wait_for(asyncio.shield(run.process.wait()), timeout_s)
            why = ""
        except TimeoutError:
            kill_group(run.process.pid)
            await run.process.wait()
            why = f"killed after the {int((timeout_s or 0) * 1000)} ms timeout"
        code = exit_code(run.process.returncode or 0)
        if not why and code:
            why = f"exit status {code}"
        run.finish(code, why)  # children it left running (`server &`) keep running, as in a shell
        return why

    async def interrupt(self, run: Run) -> None:
        if run.running and run.pid is not None:
            await terminate_group(run.pid, lambda: not run.running)

    def shutdown(self) -> None:
        for run in self.runs.values():
            if run.running and run.pid is not None:
                kill_group(run.pid)

    # -- foreground ---------------------------------------------------------------------------

    async def foreground(self, launch: Launch, content: str) -> AsyncIterator[bytes]:
        run = Run(uuid.uuid4().hex, content, background=False)
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(EVENT_QUEUE)
        try:
            process = await self.spawn(launch, run, asyncio.subprocess.PIPE, asyncio.subprocess.PIPE)
        except OSError as exc:
            yield frame(event("init", run.id))
            yield frame(error_event(f"cannot start command: {exc.strerror or exc}"))
            return
        yield frame(event("init", run.id))
        pump = asyncio.create_task(self._pump(run, process, launch.timeout_s, queue))
        try:
            async for chunk in with_pings(queue):
                yield chunk
        finally:
            if run.running:  # the client went away: nobody can read this run any more
                kill_group(process.pid)
            await asyncio.gather(pump, return_exceptions=True)

    async def _pump(
        self,
        run: Run,
        process: asyncio.subprocess.Process,
        timeout_s: float | None,
        queue: asyncio.Queue[dict[str, Any] | None],
    ) -> None:
        read = [0]

        async def emit(kind: str, text: str) -> None:
            read[0] += 1
            await queue.put(event(kind, text))

        assert process.stdout is not None and process.stderr is not None
        readers = [
            asyncio.create_task(pump_stream(process.stdout, "stdout", emit)),
            asyncio.create_task(pump_stream(process.stderr, "stderr", emit)),
        ]
        try:
            why = await self.wait(run, timeout_s)
            await drain_after_exit(readers, lambda: (read[0], queue.qsize() > 0 and time.monotonic()))
            if run.exit_code == 0:
                elapsed = int((run.finished_at or time.time()) * 1000 - run.started_at * 1000)
                await queue.put(event("execution_complete", execution_time=elapsed))
            else:
                await queue.put(error_event(str(run.exit_code), [why]))
        finally:
            for task in readers:
                task.cancel()
            await queue.put(None)

    # -- background ---------------------------------------------------------------------------

    async def background(self, launch: Launch, content: str) -> Run:
        run = Run(uuid.uuid4().hex, content, background=True)
        run.log_path = os.path.join(self.state_dir, f"{run.id}.output")
        log_fd = os.open(run.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            await self.spawn(launch, run, log_fd, log_fd)
        except OSError as exc:
            run.finish(255, f"cannot start command: {exc.strerror or exc}")
            self._register(run)
        finally:
            os.close(log_fd)
        if run.running:
            asyncio.get_running_loop().create_task(self.wait(run, launch.timeout_s))
        return run

    def read_log(self, run: Run, cursor: int) -> tuple[bytes, int]:
        if not run.background or run.log_path is None:
            raise bad_request(f"command {run.id} ran in the foreground; its output was streamed, not logged")
        try:
            with open(run.log_path, "rb") as log:
                size = os.fstat(log.fileno()).st_size
                log.seek(min(cursor, size))
                data = log.read(MAX_LOG_READ)
        except FileNotFoundError:
            return b"", cursor
        return data, min(cursor, size) + len(data)


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


# -- routes ------------------------------------------------------------------------------------


def runner_of(request: Request) -> CommandRunner:
    runner: CommandRunner = request.state.commands
    return runner


async def run_command(request: Request) -> Response:
    req = await parse_body(request, RunCommandRequest.parse)
    runner = runner_of(request)
    launch = prepare(req, runner.default_cwd)
    content = req.command if req.command is not None else " ".join(req.argv or [])
    if not req.background:
        return sse_response(runner.foreground(launch, content))
    run = await runner.background(launch, content)

    async def answer() -> AsyncIterator[bytes]:
        yield frame(event("init", run.id))
        yield frame(event("execution_complete", execution_time=0))

    return sse_response(answer())


async def interrupt_command(request: Request) -> Response:
    run_id = request.query("id")
    if not run_id:
        raise bad_request(
            "missing query parameter 'id' (the command id from the init event)", "MISSING_QUERY"
        )
    run = runner_of(request).get(run_id)
    await runner_of(request).interrupt(run)
    return json_response(run.status())


async def command_status(request: Request) -> Response:
    return json_response(runner_of(request).get(request.path_params["id"]).status())


async def command_logs(request: Request) -> Response:
    runner = runner_of(request)
    run = runner.get(request.path_params["id"])
    raw = request.query("cursor") or "0"
    if not raw.isdigit():
        raise ApiError(400, "INVALID_QUERY", f"cursor {raw!r} must be a byte offset >= 0")
    data, cursor = runner.read_log(run, int(raw))
    return text_response(
        data.decode("utf-8", errors="replace"), headers={"EXECD-COMMANDS-TAIL-CURSOR": str(cursor)}
    )
