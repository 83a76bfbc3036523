"""The proxy's audit writer: every record the engine decides reaches the audit file through here.

Rules:
1. One writer: every line goes through `contract.audit.written` (redaction of every secret value
   the proxy holds, query strings replaced) and `to_line`; callers hand over records, not lines.
2. The proxy owns the audit file (`AuditLog`: each line appended with one write(), rotated by
   size to `audit.jsonl.1` ... `audit.jsonl.N` by its one writer, and published to in-process
   subscribers; a failing subscriber is dropped, never allowed to stop the log). With proxy
   workers the one writer is the pool: a worker's `AuditLog` sends its lines there (`AuditPipe`).
"""

from __future__ import annotations

import errno
import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path

from sandgate.proxy.contract.audit import AuditRecord, Redact, to_line, written

log = logging.getLogger(__name__)

Subscriber = Callable[[AuditRecord], None]

PIPE_RECORD_MAX = 256 * 1024  # bytes: larger audit lines of a worker skip the pipe (AuditPipe)


class AuditLog:
    """Append-only JSON-lines audit stream with in-process subscribers (who get each record as it
    was written, redacted). The lines go to an `AuditFile` (one proxy process, or the worker
    pool) or, in a worker (`pipe_fd`), through an `AuditPipe` to the pool's one `AuditFile`."""

    def __init__(
        self,
        path: Path,
        max_bytes: int,
        backups: int,
        redact: Redact | None = None,
        pipe_fd: int | None = None,
    ) -> None:
        self.path = path
        self.redact = redact
        self.sink = AuditFile(path, max_bytes, backups) if pipe_fd is None else AuditPipe(pipe_fd, path)
        self._subscribers: list[Subscriber] = []

    def write(self, record: AuditRecord) -> None:
        record = written(record, self.redact)
        self.sink.write(to_line(record).encode())
        for subscriber in list(self._subscribers):
            try:
                subscriber(record)
            except Exception:
                log.exception("audit subscriber %r failed; unsubscribed", subscriber)
                self.unsubscribe(subscriber)

    def subscribe(self, subscriber: Subscriber) -> Callable[[], None]:
        """Call `subscriber` with every later record; returns the function that unsubscribes."""
        self._subscribers.append(subscriber)
        return lambda: self.unsubscribe(subscriber)

    def unsubscribe(self, subscriber: Subscriber) -> None:
        if subscriber in self._subscribers:
            self._subscribers.remove(subscriber)

    def close(self) -> None:
        self.sink.close()


class AuditFile:
    """The audit file: whole lines appended with one write() each (O_APPEND, so lifecycle's
    `append_record` lines never interleave with them), rotated by size by this one writer."""

    def __init__(self, path: Path, max_bytes: int, backups: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self._fd = self._open()

    def _open(self) -> int:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def write(self, lines: bytes) -> None:
        """Append one or more complete lines."""
        view = memoryview(lines)
        while view:
            view = view[os.write(self._fd, view) :]
        if os.fstat(self._fd).st_size >= self.max_bytes:
            self._rotate()

    def _rotate(self) -> None:
        os.close(self._fd)
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
    to the live file directly, with one O_APPEND write like lifecycle's lines."""

    def __init__(self, fd: int, path: Path) -> None:
        self._sock = socket.socket(fileno=fd)
        self._sock.setblocking(True)
        self.path = path

    def write(self, line: bytes) -> None:
        if len(line) <= PIPE_RECORD_MAX:
            try:
                self._sock.send(line)  # one message: all of it or an error
                return
            except OSError as exc:
                if exc.errno != errno.EMSGSIZE:
                    raise
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def close(self) -> None:
        self._sock.close()
