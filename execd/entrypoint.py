"""The sandbox's entrypoint when execd's launcher started it: execd is then its parent, so execd
reaps it and says how it ended.

Rules:
1. One line on execd's stderr (the sandbox's log, whose tail the control plane quotes in its
   errors) says how the entrypoint ended: its path as given and its status, shell-style (a
   signal N is status 128+N).
2. A failure (a non-zero status) stops execd with the entrypoint's status, so the sandbox ends
   as a container whose entrypoint failed does, and the create (or a later GET) quotes the log:
   the entrypoint's own output, then that line. A clean exit (0) leaves execd serving.
3. Only this pid is waited for (a pidfd, or where the kernel has none a thread, then waitpid on
   it; a pidfd needs no thread, which a sandbox at its pids limit could not start): the runs
   execd starts are reaped by their own watchers.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from signal import strsignal


@dataclass
class Entrypoint:
    pid: int
    path: str
    status: int | None = field(default=None, init=False)  # shell-style, once it ended
    signal: int | None = field(default=None, init=False)  # what killed it, if a signal did

    def watch(self, loop: asyncio.AbstractEventLoop, on_failure: Callable[[], None]) -> None:
        """Reap the entrypoint when it ends (rule 3); call `on_failure` if it failed (rule 2)."""
        try:
            pidfd = os.pidfd_open(self.pid)
        except OSError:  # a kernel without pidfds (gVisor's may lack them): a thread waits
            self._watch_in_thread(loop, on_failure)
            return

        def readable() -> None:
            loop.remove_reader(pidfd)
            os.close(pidfd)
            self.status = self._reap()
            self._ended(on_failure)

        loop.add_reader(pidfd, readable)

    def _watch_in_thread(self, loop: asyncio.AbstractEventLoop, on_failure: Callable[[], None]) -> None:
        def wait() -> None:
            self.status = self._reap()
            with contextlib.suppress(RuntimeError):  # execd's loop already closed: it is stopping
                loop.call_soon_threadsafe(self._ended, on_failure)

        threading.Thread(target=wait, name="entrypoint", daemon=True).start()

    def _ended(self, on_failure: Callable[[], None]) -> None:
        sys.stderr.write(f"sandgate: the entrypoint {self.path} {self.describe()}\n")
        sys.stderr.flush()
        if self.status != 0:
            on_failure()

    def _reap(self) -> int:
        _, wait_status = os.waitpid(self.pid, 0)
        code = os.waitstatus_to_exitcode(wait_status)
        if code < 0:
            self.signal = -code
        return 128 - code if code < 0 else code

    def describe(self) -> str:
        if self.status is None:
            return "is running"
        if self.signal is not None:
            return f"was killed by signal {self.signal} ({strsignal(self.signal)}); exit status {self.status}"
        return f"exited with status {self.status}"
