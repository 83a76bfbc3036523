"""Audit records: one JSON line per decision, plus security events.

Rules: a record is written for every connection-level and request-level decision the proxy
makes and for every DNS answer; nothing else writes decisions. Query strings never reach the
log (`redact_path`), and callers pass every free-text field through the sandbox's redactor
before building a record. Lines are appended and flushed one at a time; the file rotates by
size to `audit.jsonl.1` ... `audit.jsonl.N`. The same records go to in-process subscribers
(live views); a failing subscriber is dropped, never allowed to stop the log.
"""

from __future__ import annotations

import datetime
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO, Literal

from pydantic import BaseModel, Field

log = logging.getLogger(__name__)

RecordKind = Literal["connection", "request", "dns", "security_event", "policy_change"]
AuditDecision = Literal["allow", "deny", "report"]
Subscriber = Callable[["AuditRecord"], None]


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
    decision: AuditDecision
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


class AuditLog:
    """Append-only JSON-lines file with size-based rotation and in-process subscribers."""

    def __init__(self, path: Path, max_bytes: int, backups: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self._subscribers: list[Subscriber] = []
        self._file: IO[str] = self._open()

    def _open(self) -> IO[str]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        return os.fdopen(fd, "a", encoding="utf-8")

    def write(self, record: AuditRecord) -> None:
        self._file.write(record.model_dump_json() + "\n")
        self._file.flush()
        if self._file.tell() >= self.max_bytes:
            self._rotate()
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

    def _rotate(self) -> None:
        self._file.close()
        if self.backups == 0:
            self.path.unlink(missing_ok=True)
        else:
            for n in range(self.backups - 1, 0, -1):
                older = self.path.with_name(f"{self.path.name}.{n}")
                if older.exists():
                    os.replace(older, self.path.with_name(f"{self.path.name}.{n + 1}"))
            os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        self._file = self._open()

    def close(self) -> None:
        self._file.close()
