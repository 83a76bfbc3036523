"""What a reviewer asks of the audit index: filters, time expressions and page cursors.

Rules: pure values only (no SQL, no I/O). A filter is a pydantic model shared by the API, the
console and the CLI, so all three accept the same words. Pages are newest first, ordered by
(ts, seq); a cursor is the opaque, url-safe encoding of the last row's (ts, seq) plus a digest of
the filter it belongs to, so a cursor cannot silently be reused with another filter.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sandgate.lifecycle.audit.record import RecordJSON, to_micros
from sandgate.policy import Outcome
from sandgate.proxy import RecordKind

MAX_PAGE = 1000
_RELATIVE = re.compile(r"^(\d+)\s*(s|m|h|d|w)$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


class QueryError(ValueError):
    """A filter, time or cursor the caller gave is not valid; the message says how to fix it."""


def parse_time(text: str, now: datetime | None = None) -> int:
    """UTC microseconds for '1h' / '30m' / '2d' (ago), 'today', 'yesterday', 'now', or RFC 3339."""
    now = now or datetime.now(UTC)
    value = text.strip().lower()
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    named = {"now": now, "today": midnight, "yesterday": midnight - timedelta(days=1)}
    if value in named:
        return to_micros(named[value])
    match = _RELATIVE.match(value)
    if match:
        return to_micros(now - timedelta(**{_UNITS[match.group(2)]: int(match.group(1))}))
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise QueryError(
            f"time {text!r} is not understood; use a duration ago (90s, 15m, 1h, 2d, 1w), "
            "'today', 'yesterday', 'now', or RFC 3339 (2025-01-31T12:00:00Z)"
        ) from None
    return to_micros(moment if moment.tzinfo else moment.replace(tzinfo=UTC))


class AuditFilter(BaseModel):
    """Which records: every field given must match (AND). `host` may hold `*` wildcards."""

    model_config = ConfigDict(extra="forbid")

    sandbox: str | None = None
    kind: RecordKind | None = None
    decision: Outcome | None = None
    host: str | None = None
    binding: str | None = None
    reason: str | None = None
    status: int | None = Field(default=None, ge=100, le=599)
    since: int | None = Field(default=None, description="UTC microseconds, inclusive")
    until: int | None = Field(default=None, description="UTC microseconds, exclusive")

    @field_validator("sandbox", "host", "binding", "reason", mode="before")
    @classmethod
    def _blank_is_none(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("since", "until", mode="before")
    @classmethod
    def _time_words(cls, value: Any) -> Any:
        if isinstance(value, str):
            return None if not value.strip() else parse_time(value)
        return value

    def digest(self) -> str:
        """Identifies the filter apart from its time window (a cursor carries its own window)."""
        words = self.model_dump_json(exclude={"since", "until"})
        return hashlib.sha256(words.encode()).hexdigest()[:12]


class Cursor(BaseModel):
    """Where the next page starts: strictly older than (ts_us, seq), within the time window of
    the first page (so '--since 1h' means the same hour on every page)."""

    ts_us: int
    seq: int
    since: int | None = None
    until: int | None = None

    def encode(self, query: AuditFilter) -> str:
        fields = [self.ts_us, self.seq, query.digest(), query.since, query.until]
        raw = json.dumps(fields, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decode(cls, token: str, query: AuditFilter) -> Cursor:
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
            ts_us, seq, digest, since, until = json.loads(raw)
            cursor = cls(ts_us=ts_us, seq=seq, since=since, until=until)
        except (ValueError, TypeError) as exc:
            raise QueryError(f"cursor {token!r} is not one this server issued; start without it") from exc
        if digest != query.digest():
            raise QueryError("cursor belongs to other filters; repeat the query that returned it")
        return cursor


class Page(BaseModel):
    """One page of records, newest first; `next_cursor` is None on the last page."""

    records: list[RecordJSON]
    next_cursor: str | None = None


class CountRow(BaseModel):
    key: str
    count: int
    denied: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    example: str | None = None  # a host or reason that illustrates the row


class IngestStats(BaseModel):
    """The index's own health: what it holds and what it could not take from the JSONL. A
    malformed line is one the proxy did not write whole (a crash mid-line); a gap is a rotation
    that went by before the ingester read the rotated file's end (records the index never saw,
    still in the rotated files on disk)."""

    records: int
    malformed_lines: int
    gaps: int


class Summary(BaseModel):
    """What a sandbox (or everything) did in a window: the console's and `logs --summary`'s view."""

    sandbox: str | None
    since: str | None
    total: int
    denied: int
    top_hosts: list[CountRow]
    denials_by_reason: list[CountRow]
    injections_by_binding: list[CountRow]
