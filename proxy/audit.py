"""The audit record: its schema, its file name, and the one way a record becomes a line.

Rules:
1. A record is a decision serialised: `AuditRecord.of` takes the policy's `Decision` (its
   outcome allow/deny/report, reason, rule, inspect, detail) and adds the facts of what was asked,
   captured before injection changed anything. A record is written for every connection-level
   and request-level decision the proxy makes and for every DNS answer.
2. One writer: every line goes through `written`, which, at write time, passes every free-text
   field (`FREE_TEXT`: host, path, SNI, method, reason, detail...) through the redactor of every
   secret value the proxy holds (a superset of each sandbox's own) and replaces query strings
   (`redact_path`). Callers cannot forget either: they hand over records, not lines.
3. The proxy owns `audit.jsonl` (`AuditLog`: each line appended with one write(), rotated by
   size to `audit.jsonl.1` ... `audit.jsonl.N` by its one writer, and published to in-process
   subscribers; a failing subscriber is dropped, never allowed to stop the log). With proxy
   workers the one writer is the pool: a worker's `AuditLog` sends its lines there (`AuditPipe`).
   Other processes (lifecycle's policy changes) add lines with `append_record`, which opens the
   live file per line, so the proxy's rotation never strands them in a backup.
4. This module is the schema: `AUDIT_FILE` is the file's name and `AuditRecord` its fields; the
   index, the API, the CLI, the console and the OCSF export read records by it. It imports only
   pydantic and sandgate.policy, so the CLI can read records without loading mitmproxy.
5. Write-ahead: a request the proxy forwards upstream is written twice under one id, first with
   `event: "incomplete"` by `AuditLog.write_ahead`, which returns only once the line is in the
   file (through the kernel: it survives the death of any process; with `fsync`, of the
   machine), then whole when the response ends. Readers keep the last line of an id; a record
   left `incomplete` was forwarded and its response never ended (or has not yet).
6. Fail closed: a write that fails (a full disk, a file too large, an unwritable file) raises
   `AuditUnwritable` from `write_ahead`, so the request is refused, not forwarded, and sets
   `AuditLog.failure` (why, for DNS and connection decisions to refuse by) until a write succeeds.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime
import errno
import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, Field

from sandgate.policy import Decision, Outcome

log = logging.getLogger(__name__)

AUDIT_FILE = "audit.jsonl"
RecordKind = Literal["connection", "request", "dns", "security_event", "policy_change"]
RECORD_KINDS: tuple[RecordKind, ...] = get_args(RecordKind)
Subscriber = Callable[["AuditRecord"], None]
Redact = Callable[[str], str]
# Fields that hold text a sandbox, an upstream or a policy chose: redacted at write time.
FREE_TEXT = ("sni", "method", "host", "path", "reason", "rule", "binding", "event", "detail")
# `event` of a request's write-ahead line: forwarded upstream, its response not (yet) ended.
INCOMPLETE = "incomplete"
ACK_TIMEOUT = 10.0  # seconds a worker waits for the pool to say a write-ahead line is written


class AuditUnwritable(RuntimeError):
    """The audit log cannot be written; the message says why (it names no path: it may reach a
    sandbox in a refusal)."""


def why_unwritable(exc: OSError) -> str:
    code = errno.errorcode.get(exc.errno or 0, "error")
    return f"the audit log cannot be written ({code}: {exc.strerror or exc})"


def audit_path(state_dir: Path) -> Path:
    """The live audit file of a state dir (backups: the same name with .1, .2, ...)."""
    return state_dir / AUDIT_FILE


def utc_timestamp() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def new_record_id() -> str:
    return os.urandom(10).hex()


def redact_path(path: str | None) -> str | None:
    """The path with any query string replaced: queries carry tokens far too often."""
    if path is None:
        return None
    base, sep, _query = path.partition("?")
    return f"{base}?<redacted>" if sep else base


class AuditRecord(BaseModel):
    """One line of audit.jsonl. `bytes_in`: upstream -> client; `bytes_out`: client -> upstream."""

    v: Literal[1] = 1
    ts: str = Field(default_factory=utc_timestamp)
    id: str = Field(default_factory=new_record_id)
    kind: RecordKind
    sandbox: str
    client: str
    upstream: str | None = None
    sni: str | None = None
    scheme: Literal["http", "https"] | None = None
    method: str | None = None
    host: str | None = None
    port: int | None = None
    path: str | None = None
    decision: Outcome
    reason: str
    rule: str | None = None
    inspect: bool = False
    binding: str | None = None
    status: int | None = None
    bytes_in: int = 0
    bytes_out: int = 0
    duration_ms: float | None = None
    event: str | None = None
    detail: str | None = None

    @classmethod
    def of(cls, kind: RecordKind, sandbox: str, client: str, decision: Decision, **facts: Any) -> AuditRecord:
        """The record of `decision`; `facts` say what was asked (a `detail` or `inspect` among
        them wins over the decision's own)."""
        fields: dict[str, Any] = {"rule": decision.rule, "inspect": decision.inspect, **facts}
        fields["detail"] = fields.get("detail") or decision.detail
        return cls(
            kind=kind,
            sandbox=sandbox,
            client=client,
            decision=decision.outcome,
            reason=decision.reason,
            **fields,
        )


def written(record: AuditRecord, redact: Redact | None = None) -> AuditRecord:
    """`record` as it may be written: free text through `redact`, the path without its query,
    bytes that were not UTF-8 (kept by mitmproxy as lone surrogates) as `\\xNN` text."""
    values = record.__dict__
    changed: dict[str, str | None] = {}
    if record.path is not None and "?" in record.path:
        changed["path"] = redact_path(record.path)
    texts = [changed.get(name, values[name]) or "" for name in FREE_TEXT]
    if redact is not None and redact(joined := "\0".join(texts)) == joined:
        redact = None  # one pass over all of them found nothing: no field holds a secret
    for name, text in zip(FREE_TEXT, texts, strict=True):
        if not text:
            continue
        clean = redact(text) if redact is not None else text
        if not clean.isascii():
            clean = clean.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        if clean != text:
            changed[name] = clean
    return record.model_copy(update=changed) if changed else record


def to_line(record: AuditRecord) -> str:
    """One line of the file (for a record `written` has passed)."""
    return record.model_dump_json() + "\n"


def append_record(path: Path, record: AuditRecord) -> None:
    """Add one line to the live file from outside the proxy (O_APPEND: safe beside it)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a", encoding="utf-8") as handle:
        handle.write(to_line(written(record)))


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
        self._subscribers: list[Subscriber] = []

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
        self._publish(record)

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

    def _publish(self, record: AuditRecord) -> None:
        for subscriber in list(self._subscribers):
            try:
                subscriber(record)
            except Exception:
                log.exception("audit subscriber %r failed; unsubscribed", subscriber)
                self.unsubscribe(subscriber)

    def subscribe(self, subscriber: Subscriber) -> Callable[[], None]:
        """Call `subscriber` with every later record (whole ones: not write-ahead lines);
        returns the function that unsubscribes."""
        self._subscribers.append(subscriber)
        return lambda: self.unsubscribe(subscriber)

    def unsubscribe(self, subscriber: Subscriber) -> None:
        if subscriber in self._subscribers:
            self._subscribers.remove(subscriber)

    def close(self) -> None:
        self.sink.close()


class AuditFile:
    """The audit file: whole lines appended with one write() each (O_APPEND, so lifecycle's
    `append_record` lines never interleave with them), rotated by size by this one writer, and
    with `fsync` flushed to the disk before `write` returns. A write that fails raises OSError
    and leaves no part of its lines behind; `failure` says why until a write succeeds."""

    def __init__(self, path: Path, max_bytes: int, backups: int, fsync: bool = False) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self.fsync = fsync
        self.failure: str | None = None
        self._fd = self._open()

    def _open(self) -> int:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def write(self, lines: bytes) -> None:
        """Append one or more complete lines, all or none (raises OSError)."""
        try:
            self._append(lines)
            if os.fstat(self._fd).st_size >= self.max_bytes:
                self._rotate()
        except OSError as exc:
            if self.failure is None:
                log.error("audit log %s: %s; nothing is forwarded until it can be written", self.path, exc)
            self.failure = why_unwritable(exc)
            raise
        if self.failure is not None:
            log.warning("audit log %s is written again", self.path)
            self.failure = None

    def _append(self, lines: bytes) -> None:
        start = os.fstat(self._fd).st_size
        view = memoryview(lines)
        try:
            while view:
                view = view[os.write(self._fd, view) :]
            if self.fsync:
                os.fsync(self._fd)
        except OSError:
            if len(view) < len(lines):  # a part went in (a full disk takes what fits): take it back
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, start)
            raise

    def _rotate(self) -> None:
        """Rename, then open the new file, then close the old one: a failure leaves a file open."""
        if self.backups == 0:
            self.path.unlink(missing_ok=True)
        else:
            for n in range(self.backups - 1, 0, -1):
                older = self.path.with_name(f"{self.path.name}.{n}")
                if older.exists():
                    os.replace(older, self.path.with_name(f"{self.path.name}.{n + 1}"))
            os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        old, self._fd = self._fd, self._open()
        os.close(old)

    def close(self) -> None:
        os.close(self._fd)


class AuditPipe:
    """A worker's end of its SOCK_SEQPACKET pair to the pool: each record is one message, so a
    record arrives whole or (its worker killed mid-send) not at all, never cut or interleaved.
    Sends block while the pool's queue is full (back-pressure, as a slow disk would). A record
    too large for one message (over PIPE_RECORD_MAX, or the kernel's socket buffer) is appended
    to the live file directly, with one O_APPEND write like lifecycle's lines.

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
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

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
