"""The worker template: a process that has everything a worker runs imported, and forks workers.

Rules:
1. Importing the proxy (mitmproxy above all) costs about 1.2 s of CPU. The pool, which has
   imported it already, forks the template before it starts an event loop or a thread, and the
   template forks every worker, first start and restart alike: a worker starts in a fork, not
   an import, and the processes share the imported code's pages.
2. The pool asks over a SOCK_SEQPACKET pair: one message names the worker ("I/N") and carries
   its three descriptors (transparent listener, explicit listener, audit pipe); the template
   forks and answers with the worker's PID and a pidfd for it (SCM_RIGHTS). The pool waits for
   and signals the worker through the pidfd, which names that process and no later one with
   its PID. The template reaps its workers only between requests, so a worker's PID is never
   reused before its pidfd is open.
3. A forked worker closes the template's socket, builds its own event loop and never returns
   into the template's code (it leaves by os._exit).
4. PR_SET_PDEATHSIG with SIGKILL links the chain: the template dies with the pool, a worker
   with the template. A worker then writes no unaudited byte: with the pool gone, nobody would
   record what it decided. The pool ends when its template ends (the supervisor restarts it).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import os
import select
import signal
import socket
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
REAP_INTERVAL = 1.0  # the template reaps ended workers at least this often
EXIT_FAILED = 70  # a worker that ended with an exception (EX_SOFTWARE)


@dataclass(frozen=True)
class WorkerSlot:
    """What a forked worker is told: which one it is, and the descriptors it received."""

    index: int
    count: int
    fds: tuple[int, int, int]  # transparent listener, explicit listener, audit pipe
    template: int  # the template's PID: the worker's parent

    @property
    def name(self) -> str:
        return f"{self.index}/{self.count}"

    @property
    def audit_fd(self) -> int:
        return self.fds[2]

    def listeners(self) -> tuple[socket.socket, socket.socket]:
        transparent, explicit = (socket.socket(fileno=fd) for fd in self.fds[:2])
        for sock in (transparent, explicit):
            sock.setblocking(False)
        return transparent, explicit


class TemplateGone(RuntimeError):
    """The template is not there to fork a worker."""


def die_with_parent(parent: int) -> None:
    """SIGKILL when the parent ends, however it ends (rule 4); a parent that ended before this
    was set ends this process here."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:
        os._exit(1)


# ---------------------------------------------------------------------- the pool's side


class WorkerProcess:
    """A forked worker as the pool sees it: its PID and a pidfd to wait for and signal it."""

    def __init__(self, pid: int, pidfd: int) -> None:
        self.pid = pid
        self._pidfd = pidfd

    @property
    def running(self) -> bool:
        return self._pidfd >= 0 and not _readable(self._pidfd)

    async def wait(self) -> None:
        if self._pidfd >= 0:
            await _until_readable(self._pidfd)

    def send(self, signum: int) -> None:
        if self._pidfd >= 0:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signum)

    def close(self) -> None:
        """Once it has ended: it is waited for and signalled no more."""
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1


class Template:
    """The pool's handle on its template: `start` before any loop or thread, then `fork` per worker."""

    def __init__(self, pid: int, requests: socket.socket) -> None:
        self.pid = pid
        self._requests = requests
        self._pidfd = os.pidfd_open(pid)
        self._lock = asyncio.Lock()

    @classmethod
    def start(cls, run_worker: Callable[[WorkerSlot], None]) -> Template:
        """Fork the template (rule 1): call in the pool before it has an event loop or a thread."""
        if threading.active_count() > 1:  # a fork copies one thread: the others' locks stay held
            raise RuntimeError("the worker template must be forked before the pool starts a thread")
        pool_end, template_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pool = os.getpid()
        gc.freeze()  # what is imported now stays shared: the collector does not touch it again
        pid = os.fork()
        if pid == 0:
            pool_end.close()
            code = 1
            try:
                die_with_parent(pool)
                # Ctrl-C reaches the whole process group: the pool stops its workers, and the
                # template must outlive that, or its death would SIGKILL them mid-stop.
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                code = _serve_requests(template_end, run_worker)
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        template_end.close()
        pool_end.setblocking(False)
        return cls(pid, pool_end)

    async def ended(self) -> None:
        await _until_readable(self._pidfd)

    async def fork(self, index: int, count: int, fds: tuple[int, int, int], timeout: float) -> WorkerProcess:
        """A new worker holding `fds` (rule 2); raises TemplateGone if the template is not there."""
        async with self._lock:
            try:
                socket.send_fds(self._requests, [f"{index}/{count}".encode()], list(fds))
                await asyncio.wait_for(_until_readable(self._requests.fileno()), timeout)
                message, pidfds, _flags, _address = socket.recv_fds(self._requests, 64, 1)
            except (OSError, TimeoutError) as exc:
                self._end_unanswered()
                raise TemplateGone(f"the worker template (pid {self.pid}) forked no worker: {exc!r}") from exc
        if not message or len(pidfds) != 1:
            self._end_unanswered()
            raise TemplateGone(f"the worker template (pid {self.pid}) is gone")
        return WorkerProcess(int(message), pidfds[0])

    def _end_unanswered(self) -> None:
        """A template that missed an answer could answer the next request with this one's: it
        ends, and the pool with it (rule 4)."""
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    def stop(self) -> None:
        """End the template and reap it (its workers, if any are left, die with it)."""
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(self._pidfd, signal.SIGTERM)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        os.close(self._pidfd)
        self._requests.close()


def _readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


async def _until_readable(fd: int) -> None:
    """A pidfd is readable once its process has ended; a socket, once it has a message."""
    if _readable(fd):
        return
    loop = asyncio.get_running_loop()
    ready = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        loop.remove_reader(fd)


# ---------------------------------------------------------------------- the template's side


def _serve_requests(requests: socket.socket, run_worker: Callable[[WorkerSlot], None]) -> int:
    """Fork a worker per request until the pool closes its end (rule 2)."""
    template = os.getpid()
    requests.settimeout(REAP_INTERVAL)
    while True:
        _reap()
        try:
            message, fds, _flags, _address = socket.recv_fds(requests, 64, 3)
        except TimeoutError:
            continue
        if not message:
            return 0
        index, _, count = message.decode().partition("/")
        slot = WorkerSlot(int(index), int(count), (fds[0], fds[1], fds[2]), template)
        pid = os.fork()
        if pid == 0:
            requests.close()
            signal.signal(signal.SIGINT, signal.default_int_handler)
            os._exit(_run_worker(slot, run_worker))
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        try:
            socket.send_fds(requests, [str(pid).encode()], [pidfd])
        finally:
            os.close(pidfd)


def _run_worker(slot: WorkerSlot, run_worker: Callable[[WorkerSlot], None]) -> int:
    """The forked worker's whole life (rule 3): its exit status."""
    try:
        die_with_parent(slot.template)
        run_worker(slot)
        return 0
    except BaseException as exc:  # nothing may return into the template's loop
        if not isinstance(exc, SystemExit | KeyboardInterrupt):
            traceback.print_exc()
        return exc.code if isinstance(exc, SystemExit) and isinstance(exc.code, int) else EXIT_FAILED
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def _reap() -> None:
    """Collect ended workers (rule 2: only here, between requests) and say how each ended."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        log.warning("proxy worker pid %d ended: %s", pid, _ending(status))


def _ending(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit status {os.waitstatus_to_exitcode(status)}"


__all__ = ["Template", "TemplateGone", "WorkerProcess", "WorkerSlot", "die_with_parent"]
