"""One server per state dir: `serve` holds an exclusive flock on `<state_dir>/serve.lock`.

Rules:
1. The lock is taken before anything in the state dir is read or written (API key, proxy
   config, control socket, nft table, database): a second `serve` on the same state dir stops
   there and touches nothing of the running one.
2. The kernel holds the lock for the process: it is released when the server exits, even by
   SIGKILL, so a stale pid in the file never blocks a start. The descriptor is close-on-exec,
   so neither the proxy child nor a sandbox inherits it.
3. The file holds the holder's pid, for the one-line refusal. `sandgate down` takes the same
   lock for its whole run: it refuses while a server runs, and no server starts meanwhile.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

LOCK_FILE = "serve.lock"


class AlreadyRunning(Exception):
    """Another process holds the state dir; `pid` is None when it has not written it yet."""

    def __init__(self, state_dir: Path, pid: int | None) -> None:
        self.state_dir = state_dir
        self.pid = pid
        super().__init__(f"already running, pid {pid if pid is not None else '?'} (state dir {state_dir})")


class StateLock:
    """The held lock; `release()` (or process exit) gives it up."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def acquire(state_dir: Path) -> StateLock:
    """Lock the state dir for this process or raise AlreadyRunning (never waits)."""
    fd = os.open(state_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise AlreadyRunning(state_dir, holder_pid(state_dir)) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return StateLock(fd)


def holder_pid(state_dir: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int((state_dir / LOCK_FILE).read_text(encoding="ascii").strip())
    return None
