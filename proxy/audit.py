"""The proxy's audit writer: every record the engine decides reaches the audit file through here.

Rules:
1. One writer: every line goes through `contract.audit.written` (redaction of every secret value
   the proxy holds, query strings replaced) and `to_line`; callers hand over records, not lines.
2. The proxy owns the audit file (`AuditLog`: each line appended with one write(), rotated by
   size to `audit.jsonl.1` ... `audit.jsonl.N` by its one writer). With proxy
   workers the one writer is the pool: a worker's `AuditLog` sends its lines there (`AuditPipe`).
3. Write-ahead (the meaning of the lines: contract/audit.py rule 5): `AuditLog.write_ahead` returns
   only once its line is in the file (through the kernel: it survives the death of any process;
   with `fsync`, of the machine). In a worker that means the pool's answer on the audit pipe
   (`PipeAnswer`), not the send: a message the pool has not read dies with the pool.
4. Fail closed: a write that fails (a full disk, a file too large, an unwritable file) raises
   `AuditUnwritable` from `write_ahead`, so the request is refused, not forwarded, and sets
   `AuditLog.failure` (why, for DNS and connection decisions to refuse by) until a write succeeds.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import fcntl
import logging
import os
import socket
from pathlib import Path

from sandgate.proxy.contract.audit import AuditRecord, Redact, to_line, written
from sandgate.proxy.contract.chain import ChainHead, append_chained, append_line

log = logging.getLogger(__name__)


PIPE_RECORD_MAX = 256 * 1024  # bytes: larger audit lines of a worker skip the pipe (AuditPipe)
ACK_TIMEOUT = 10.0  # seconds a worker waits for the pool to say a write-ahead line is written


class AuditUnwritable(RuntimeError):
    """The audit log cannot be written; the message says why (it names no path: it may reach a
    sandbox in a refusal)."""


def why_unwritable(exc: OSError) -> str:
    code = errno.errorcode.get(exc.errno or 0, "error")
    return f"the audit log cannot be written ({code}: {exc.strerror or exc})"


class AuditLog:
    """Append-only JSON-lines audit stream. The lines go to an `AuditFile` (one proxy process, or the worker
    pool) or, in a worker (`pipe_fd`), through an `AuditPipe` to the pool's one `AuditFile`."""

    def __init__(
        self,
        path: Path,
        max_bytes: int,
        backups: int,
        redact: Redact | None = None,
        pipe_fd: int | None = None,
        fsync: bool = False,
        sink: AuditFile | None = None,
    ) -> None:
        self.path = path
        self.redact = redact
        self.sink: AuditFile | AuditPipe
        if sink is not None:  # a file another part of this process writes too (the pool's DNS)
            self.sink = sink
        elif pipe_fd is not None:
            self.sink = AuditPipe(pipe_fd, path)
        else:
            self.sink = AuditFile(path, max_bytes, backups, fsync)

    @property
    def failure(self) -> str | None:
        """Why the audit log cannot be written now (the last write failed), or None."""
        return self.sink.failure

    def write(self, record: AuditRecord) -> None:
        """Append `record` (a failure is logged and kept in `failure`, not raised: the decision
        was made, and what refuses while the log is unwritable reads `failure`)."""
        record = written(record, self.redact)
        try:
            self.sink.write(to_line(record).encode())
        except OSError as exc:
            log.error("audit record %s lost: %s", record.id, exc)

    async def write_ahead(self, record: AuditRecord) -> None:
        """Append `record` and return once it is in the file (rule 5); raises AuditUnwritable."""
        record = written(record, self.redact)
        line = to_line(record).encode()
        if isinstance(self.sink, AuditPipe):
            await self.sink.write_acknowledged(line)
        else:
            try:
                self.sink.write(line)
            except OSError as exc:
                raise AuditUnwritable(why_unwritable(exc)) from exc

    def listen(self, loop: asyncio.AbstractEventLoop) -> None:
        """A worker hears the pool's news (its failure, its recovery) from now on."""
        if isinstance(self.sink, AuditPipe):
            self.sink.listen(loop)

    def close(self) -> None:
        self.sink.close()


class AuditFile:
    """The audit file: whole lines appended with one write() each, hash-chained and under the
    file's lock (contract/chain.py: lifecycle's `append_record` lines take the same lock, so the
    chain runs through both), rotated by size by this one writer under that lock, and with `fsync`
    flushed to the disk before `write` returns. A write that fails raises OSError and leaves no
    part of its lines behind; `failure` says why until a write succeeds."""

    def __init__(self, path: Path, max_bytes: int, backups: int, fsync: bool = False) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self.fsync = fsync
        self.failure: str | None = None
        self._head = ChainHead()
        self._fd = self._open()

    def _open(self) -> int:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)

    def write(self, lines: bytes) -> None:
        """Append one or more complete lines, all or none (raises OSError)."""
        fd = self._fd
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                append_chained(fd, self.path, lines, self._head, self.fsync)
                if os.fstat(fd).st_size >= self.max_bytes:
                    self._rotate()
            finally:  # the rotated file is closed (which unlocks it), the live one unlocked
                os.close(fd) if fd != self._fd else fcntl.flock(fd, fcntl.LOCK_UN)
        except OSError as exc:
            if self.failure is None:
                log.error("audit log %s: %s; nothing is forwarded until it can be written", self.path, exc)
            self.failure = why_unwritable(exc)
            raise
        if self.failure is not None:
            log.warning("audit log %s is written again", self.path)
            self.failure = None

    def _rotate(self) -> None:
        """Rename, then open the new file (the caller closes the old one): a failure leaves a file
        open."""
        if self.backups == 0:
            self.path.unlink(missing_ok=True)
        else:
            for n in range(self.backups - 1, 0, -1):
                older = self.path.with_name(f"{self.path.name}.{n}")
                if older.exists():
                    os.replace(older, self.path.with_name(f"{self.path.name}.{n + 1}"))
            os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        self._fd = self._open()

    def close(self) -> None:
        os.close(self._fd)


class AuditPipe:
    """A worker's end of its SOCK_SEQPACKET pair to the pool: each record is one message, so a
    record arrives whole or (its worker killed mid-send) not at all, never cut or interleaved.
    Sends block while the pool's queue is full (back-pressure, as a slow disk would). A record
    too large for one message (over PIPE_RECORD_MAX, or the kernel's socket buffer) is appended
    to the live file directly, chained under the file's lock like lifecycle's lines.

    The pool answers on the same pair (`PipeAnswer`): after each batch it wrote, "ok N" (the
    first N messages of this pipe are in the file), or "fail N why" (they are not; the audit
    cannot be written). `write_acknowledged` waits for the answer that covers its message."""

    def __init__(self, fd: int, path: Path) -> None:
        self._sock = socket.socket(fileno=fd)
        self._sock.setblocking(True)
        self.path = path
        self.failure: str | None = None
        self._sent = 0  # messages sent on the pipe; the pool counts the same
        self._waiting: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()
        self._loop: asyncio.AbstractEventLoop | None = None

    def write(self, line: bytes) -> None:
        if len(line) <= PIPE_RECORD_MAX:
            try:
                self._sock.send(line)  # one message: all of it or an error
                self._sent += 1
                return
            except OSError as exc:
                if exc.errno != errno.EMSGSIZE:
                    raise
        append_line(self.path, line)

    async def write_acknowledged(self, line: bytes) -> None:
        """Send `line` and wait until the pool has written it (raises AuditUnwritable)."""
        loop = asyncio.get_running_loop()
        self.listen(loop)
        sent = self._sent
        try:
            self.write(line)
        except OSError as exc:
            raise AuditUnwritable(f"the audit writer (the proxy pool) is not there: {exc}") from exc
        if self._sent == sent:
            return  # too large for the pipe: written to the file directly
        written = loop.create_future()
        self._waiting.append((self._sent, written))
        try:
            await asyncio.wait_for(written, ACK_TIMEOUT)
        except TimeoutError:
            raise AuditUnwritable(
                f"the audit writer did not confirm a record within {ACK_TIMEOUT:g} s"
            ) from None

    def listen(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read the pool's answers on `loop` from now on (also its failure news)."""
        if self._loop is None:
            loop.add_reader(self._sock.fileno(), self._answers)
            self._loop = loop

    def _answers(self) -> None:
        while True:
            try:
                message = self._sock.recv(4096, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                message = b""
            if not message:  # the pool is gone: nothing more will be written
                self._stop_listening()
                self._settle(self._sent, "the audit writer (the proxy pool) has gone")
                return
            answer = PipeAnswer.parse(message)
            self._settle(answer.count, answer.failure)

    def _settle(self, count: int, failure: str | None) -> None:
        self.failure = failure
        while self._waiting and self._waiting[0][0] <= count:
            _seq, future = self._waiting.popleft()
            if future.done():
                continue
            if failure is None:
                future.set_result(None)
            else:
                future.set_exception(AuditUnwritable(failure))

    def _stop_listening(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._sock.fileno())
        self._loop = None

    def close(self) -> None:
        self._stop_listening()
        self._sock.close()


class PipeAnswer:
    """The pool's answer on a worker's audit pipe: how many of its messages it has handled, and
    whether they are in the file (`failure` None) or not (why)."""

    def __init__(self, count: int, failure: str | None) -> None:
        self.count = count
        self.failure = failure

    def encode(self) -> bytes:
        if self.failure is None:
            return f"ok {self.count}".encode()
        return f"fail {self.count} {self.failure}".encode()

    @classmethod
    def parse(cls, message: bytes) -> PipeAnswer:
        word, count, *why = message.decode("utf-8", "replace").split(" ", 2)
        return cls(int(count), None if word == "ok" else (why[0] if why else "unknown"))
