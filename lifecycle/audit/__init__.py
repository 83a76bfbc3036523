"""sandgate.lifecycle.audit: the audit store a security reviewer queries.

The proxy's JSONL (`<state_dir>/audit.jsonl` + rotated backups) is the source of truth; an
SQLite index (`<state_dir>/audit-index.db`) is fed from it incrementally and answers filtered,
keyset-paged queries, summaries, live follow and OCSF export. Each record kind is one
row of `KINDS` (kinds.py): its required fields, console label and OCSF class and activity. See docs/audit.md.
The router (`audit_router`, `audit_filter`) is imported when first used: `sandgate logs` reads
the index without the web stack.
"""

from typing import TYPE_CHECKING, Any

from sandgate.lifecycle.audit.audit_store import AuditStore
from sandgate.lifecycle.audit.index import AuditIndex, IngestResult, Retention
from sandgate.lifecycle.audit.kinds import KINDS, LABELS, OCSF_VERSION, SYSTEM_KINDS, AuditKind, OcsfClass
from sandgate.lifecycle.audit.observed import observed
from sandgate.lifecycle.audit.ocsf import to_ocsf
from sandgate.lifecycle.audit.policy_change import Change, PolicyChange, change_record, control_plane_record
from sandgate.lifecycle.audit.query import AuditFilter, Cursor, Page, QueryError, Summary, parse_time
from sandgate.lifecycle.audit.reader import Position, RotatingLog
from sandgate.lifecycle.audit.record import SCHEMA_VERSION, AuditRecord, format_ts, to_micros

if TYPE_CHECKING:
    from sandgate.lifecycle.audit.routes import audit_filter, audit_router

__all__ = [
    "KINDS",
    "LABELS",
    "OCSF_VERSION",
    "SCHEMA_VERSION",
    "SYSTEM_KINDS",
    "AuditFilter",
    "AuditIndex",
    "AuditKind",
    "AuditRecord",
    "AuditStore",
    "Change",
    "Cursor",
    "IngestResult",
    "OcsfClass",
    "Page",
    "PolicyChange",
    "Position",
    "QueryError",
    "Retention",
    "RotatingLog",
    "Summary",
    "audit_filter",
    "audit_router",
    "change_record",
    "control_plane_record",
    "format_ts",
    "observed",
    "parse_time",
    "to_micros",
    "to_ocsf",
]


def __getattr__(name: str) -> Any:
    if name in ("audit_filter", "audit_router"):
        from sandgate.lifecycle.audit import routes

        return getattr(routes, name)
    raise AttributeError(f"module 'sandgate.lifecycle.audit' has no attribute {name!r}")
