"""The audit record as the index stores it.

Rules: the JSONL file written by the proxy is the source of truth and `AuditRecord` is its
schema (v1, see docs/audit.md). This module converts a record to an index row and back without
losing anything the schema defines; it does no I/O. Times are kept as integer microseconds since
the epoch (UTC) in the index so that ranges and ordering are integer comparisons.

`AuditRecord` mirrors the contract in the team brief until `sandgate.proxy` exports its model;
then this module imports that one instead.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

SCHEMA_VERSION = 1
Kind = Literal["connection", "request", "dns", "security_event", "policy_change"]
Action = Literal["allow", "deny", "report"]


class AuditRecord(BaseModel):
    """One audit line (schema version 1)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    v: int = SCHEMA_VERSION
    ts: datetime
    id: str
    kind: Kind
    sandbox: str
    client: str | None = None
    upstream: str | None = None
    sni: str | None = None
    scheme: str | None = None
    method: str | None = None
    host: str | None = None
    port: int | None = None
    path: str | None = None
    decision: Action
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


# Index columns in table order; `ts_us` replaces `ts`. Every schema field is a column.
COLUMNS: tuple[str, ...] = tuple("ts_us" if name == "ts" else name for name in AuditRecord.model_fields)


def to_micros(moment: datetime) -> int:
    """UTC microseconds since the epoch; naive datetimes are taken as UTC."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    delta = moment - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_micros(micros: int) -> datetime:
    seconds, rest = divmod(micros, 1_000_000)
    return datetime.fromtimestamp(seconds, UTC).replace(microsecond=rest)


def format_ts(micros: int) -> str:
    """RFC 3339 UTC with microseconds, as the writer formats it."""
    return from_micros(micros).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def to_row(record: AuditRecord) -> tuple[Any, ...]:
    values = record.__dict__
    return tuple(to_micros(record.ts) if col == "ts_us" else values[col] for col in COLUMNS)


def from_row(row: tuple[Any, ...] | Any) -> dict[str, Any]:
    """The record as JSON-ready dict, fields in schema order (row is in COLUMNS order)."""
    out: dict[str, Any] = {}
    for col, value in zip(COLUMNS, row, strict=True):
        if col == "ts_us":
            out["ts"] = format_ts(value)
        elif col == "inspect":
            out[col] = bool(value)
        else:
            out[col] = value
    return out
