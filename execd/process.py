"""Child processes: environment, identity, output framing, exit codes and signals.

Rules:
1. Every child runs in its own session and process group (`start_new_session`), so a timeout, an
   interrupt or a dropped client kills the whole group, not just the shell.
2. The environment is execd's own, then the `KEY=VALUE` lines of the file named by `EXECD_ENVS`
   (what the SDK's `commands.set_env` appends to), then the request's `envs`, in that order.
3. Output is framed like the Go execd: one event per line, without its terminator (`\\n`, `\\r` or
   `\\r\\n`); an empty line is sent as "\\n"; a trailing partial line is sent when the stream ends
   (or once it grows past `MAX_LINE_BYTES`, so memory stays bounded).
4. Exit codes follow the shell: a child killed by signal N exits with 128+N.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import re
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from .errors import ApiError, bad_request

MAX_LINE_BYTES = 64 * 1024
READ_CHUNK = 64 * 1024
KILL_GRACE_S = 2.0
_VAR = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def kill_session(sid: int) -> None:
    """SIGKILL every process of session `sid` (a kernel leads one: jupyter_client starts it with a
    new session): its process group and any group it made beside it, as GoNB does for gopls."""
    kill_group(sid)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as stat:
                session = int(stat.read().rsplit(")", 1)[1].split()[3])  # state ppid pgrp session
            if session == sid:
                os.kill(int(entry), signal.SIGKILL)


async def terminate_group(pid: int, done: Callable[[], bool]) -> None:
    """SIGTERM the group, then SIGKILL it if it is still there after a grace period."""
    kill_group(pid, signal.SIGTERM)
    for _ in range(int(KILL_GRACE_S / 0.05)):
        if done():
            return
        await asyncio.sleep(0.05)
    kill_group(pid, signal.SIGKILL)


def _unquote_env_value(raw: str) -> str:
    if len(raw) >= 2 and raw[0] == raw[-1] == "'":
        return raw[1:-1]
    if len(raw) >= 2 and raw[0] == raw[-1] == '"':
        escapes = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"'}
        return re.sub(r"\\(.)", lambda m: escapes.get(m.group(1), "\\" + m.group(1)), raw[1:-1])
    return raw


def env_file_entries() -> dict[str, str]:
    """`KEY=VALUE` lines of the `EXECD_ENVS` file (single-quoted literal or double-quoted escaped)."""
    path = os.environ.get("EXECD_ENVS")
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return {}
    entries = {}
    for line in lines:
        key, sep, raw = line.strip().partition("=")
        if sep and key and not key.startswith("#"):
            entries[key] = _unquote_env_value(raw)
    return entries


def child_env(extra: dict[str, str] | None, uid: int | None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("EXECD_ACCESS_TOKEN", None)  # execd's own credential is not the command's business
    env.update(env_file_entries())
    if uid is not None:
        try:
            user = pwd.getpwuid(uid)
            env.update(HOME=user.pw_dir, USER=user.pw_name, LOGNAME=user.pw_name)
        except KeyError:
            pass
    env.update(extra or {})
    return env


def expand_cwd(cwd: str | None, env: dict[str, str], default: str) -> str:
    """Expand `$NAME`/`${NAME}` from the child's env and a leading `~`; the result must be a dir."""
    if not cwd:
        return default

    def var(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in env:
            raise bad_request(f"cwd {cwd!r} uses ${name}, which is not set in the command's environment")
        return env[name]

    path = os.path.expanduser(_VAR.sub(var, cwd))
    if not os.path.isdir(path):
        raise bad_request(f"cwd {cwd!r} is not an existing directory; create it first or pick another")
    return path


@dataclass
class Identity:
    """Who the child runs as; `None` keeps execd's own ids."""

    uid: int | None = None
    gid: int | None = None

    @classmethod
    def from_request(cls, uid: int | None, gid: int | None) -> Identity:
        if gid is not None and uid is None:
            raise bad_request(
                "gid needs uid: give both, or uid alone (gid then defaults to the user's group)"
            )
        if uid is None:
            return cls()
        if os.geteuid() != 0 and uid != os.geteuid():
            raise ApiError(
                403, "PERMISSION_DENIED", f"execd runs as uid {os.geteuid()} and cannot switch to {uid}"
            )
        if gid is None:
            try:
                gid = pwd.getpwuid(uid).pw_gid
            except KeyError:
                gid = uid
        return cls(uid, gid)

    def popen_kwargs(self) -> dict[str, object]:
        if self.uid is None:
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": []}


class LineSplitter:
    """Bytes in, Go-execd style line events out (see rule 3)."""

    def __init__(self) -> None:
        self._partial = bytearray()
        self._after_cr = False

    def feed(self, data: bytes) -> list[str]:
        lines: list[str] = []
        start = 0
        for index, byte in enumerate(data):
            if byte not in (10, 13):
                continue
            self._partial += data[start:index]
            start = index + 1
            if self._partial:
                lines.append(self._take())
            elif not (byte == 10 and self._after_cr):
                lines.append("\n")
            self._after_cr = byte == 13
        if start < len(data):
            self._after_cr = False
            self._partial += data[start:]
        if len(self._partial) >= MAX_LINE_BYTES:
            lines.append(self._take())
        return lines

    def flush(self) -> list[str]:
        return [self._take()] if self._partial else []

    def _take(self) -> str:
        text = self._partial.decode("utf-8", errors="replace")
        self._partial.clear()
        return text


Emit = Callable[[str, str], Awaitable[None]]


async def pump_stream(reader: asyncio.StreamReader, kind: str, emit: Emit) -> None:
    """Read one pipe to its end, emitting one event per line."""
    splitter = LineSplitter()
    while chunk := await reader.read(READ_CHUNK):
        for line in splitter.feed(chunk):
            await emit(kind, line)
    for line in splitter.flush():
        await emit(kind, line)


async def drain_after_exit(readers: list[asyncio.Task[None]], progress: Callable[[], object]) -> None:
    """Let the readers finish; cancel them once output stops (a grandchild may hold a pipe open).

    `progress()` must change while output still flows or waits for the consumer.
    """
    while True:
        seen = progress()
        _, pending = await asyncio.wait(readers, timeout=0.3)
        if not pending:
            return
        if progress() == seen:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            return
