"""The audit record as the index stores it.

Rules: the JSONL file written by the proxy is the source of truth and `sandgate.proxy.AuditRecord`
is its schema (v1, see docs/audit.md). This module converts a record to an index row and back
without losing anything the schema defines; it does no I/O. Times are kept as integer
microseconds since the epoch (UTC) in the index so that ranges and ordering are integer
comparisons.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from sandgate.proxy import AuditRecord

SCHEMA_VERSION = 1

# A record as it leaves the index: the JSON object of its schema, field for field in schema order
# (`from_row`). It was validated as an AuditRecord when the proxy wrote it; the API, console, CLI
# and OCSF mapping read it and shape their own output, without parsing it into a model per read.
RecordJSON = dict[str, Any]


# Index columns in table order; `ts_us` replaces `ts`. Every schema field is a column; an object
# field (`process`, `principal`) is its JSON text.
OBJECT_COLUMNS = ("process", "principal")
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


def parse_ts(text: str) -> int:
    """Microseconds of an RFC 3339 time ('Z' or an offset)."""
    return to_micros(datetime.fromisoformat(text.replace("Z", "+00:00")))


def to_row(record: AuditRecord) -> tuple[Any, ...]:
    values = record.__dict__
    return tuple(_cell(col, values[col]) if col != "ts_us" else parse_ts(record.ts) for col in COLUMNS)


def _cell(col: str, value: Any) -> Any:
    if col in OBJECT_COLUMNS and value is not None:
        return value.model_dump_json()
    return value


def from_row(row: tuple[Any, ...] | Any) -> RecordJSON:
    """The record as JSON-ready dict, fields in schema order (row is in COLUMNS order)."""
    out: RecordJSON = {}
    for col, value in zip(COLUMNS, row, strict=True):
        if col == "ts_us":
            out["ts"] = format_ts(value)
        elif col == "inspect":
            out[col] = bool(value)
        elif col in OBJECT_COLUMNS and value is not None:
            out[col] = json.loads(value)
        else:
            out[col] = value
    return out
