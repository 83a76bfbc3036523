"""The SQLite index of the audit log: fed from the JSONL, queried by the API, console and CLI.

Rules:
1. The JSONL is the truth; this index can always be deleted and rebuilt from it.
2. Ingest is exactly-once: the reader position is saved in the same transaction as the rows it
   produced (BEGIN IMMEDIATE, so a second ingester waits and then resumes after us), and record
   ids are unique, so a replayed line is ignored rather than counted twice.
3. One row per logical record: a request's write-ahead line (`event: "incomplete"`) is replaced
   by its whole line (same id) when that arrives, and the row takes a new `seq`, so followers see
   the finished record; a row that stays `incomplete` is a request forwarded whose response
   never ended (or has not yet).
4. Rows are ordered by (ts_us, seq): `seq` is the ingest order (the follow cursor), `ts_us` the
   record time. Every filtered page is an index range scan in that order, limited, keyset-paged.
5. Retention deletes from the index only; the writer's rotation bounds the JSONL.

One connection per thread (sqlite3 objects must stay in their thread), WAL journal so readers
never wait for the ingester.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sandgate.lifecycle.audit.query import MAX_PAGE, AuditFilter, CountRow, Cursor, IngestStats, Page, Summary
from sandgate.lifecycle.audit.reader import Position, RotatingLog
from sandgate.lifecycle.audit.record import COLUMNS, AuditRecord, RecordJSON, format_ts, from_row, to_row
from sandgate.proxy import INCOMPLETE

log = logging.getLogger(__name__)

_COLUMN_TYPES = {
    "v": "INTEGER NOT NULL",
    "ts_us": "INTEGER NOT NULL",
    "id": "TEXT NOT NULL UNIQUE",
    "kind": "TEXT NOT NULL",
    "sandbox": "TEXT NOT NULL",
    "decision": "TEXT NOT NULL",
    "reason": "TEXT NOT NULL",
    "inspect": "INTEGER NOT NULL",
    "port": "INTEGER",
    "status": "INTEGER",
    "bytes_in": "INTEGER NOT NULL",
    "bytes_out": "INTEGER NOT NULL",
    "duration_ms": "REAL",
}
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS records (
  seq INTEGER PRIMARY KEY,
  {", ".join(f"{col} {_COLUMN_TYPES.get(col, 'TEXT')}" for col in COLUMNS)}
);
CREATE INDEX IF NOT EXISTS by_time ON records (ts_us);
CREATE INDEX IF NOT EXISTS by_sandbox ON records (sandbox, ts_us);
CREATE INDEX IF NOT EXISTS by_sandbox_host ON records (sandbox, host, ts_us);
CREATE INDEX IF NOT EXISTS by_sandbox_decision ON records (sandbox, decision, ts_us);
CREATE INDEX IF NOT EXISTS by_decision ON records (decision, ts_us);
CREATE INDEX IF NOT EXISTS by_host ON records (host, ts_us);
CREATE INDEX IF NOT EXISTS by_binding ON records (binding, ts_us) WHERE binding IS NOT NULL;
CREATE TABLE IF NOT EXISTS ingest_state (
  source TEXT PRIMARY KEY, device INTEGER, inode INTEGER, head BLOB, offset INTEGER,
  malformed INTEGER NOT NULL DEFAULT 0, gaps INTEGER NOT NULL DEFAULT 0
);
"""
# Which rows count as decisions: a pass-through connection's second record (`event: "closed"`)
# carries its bytes and duration, not another decision, so counts skip it and byte sums keep it.
_COUNTED = "(kind != 'connection' OR event IS NULL)"
# A line whose id is indexed already is ignored, unless it finishes an incomplete row (rule 3).
_INSERT = (
    f"INSERT INTO records ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"
    f" ON CONFLICT (id) DO UPDATE SET {', '.join(f'{col} = excluded.{col}' for col in COLUMNS)},"
    " seq = (SELECT max(seq) + 1 FROM records)"
    f" WHERE records.event IS '{INCOMPLETE}' AND excluded.event IS NOT '{INCOMPLETE}'"
)
_SELECT = f"SELECT seq, {', '.join(COLUMNS)} FROM records"


@dataclass(frozen=True)
class Retention:
    """How much the index keeps; None means no limit."""

    max_age_days: float | None = None
    max_rows: int | None = None


@dataclass(frozen=True)
class IngestResult:
    lines: int = 0
    added: int = 0
    malformed: int = 0
    gap: bool = False


class AuditIndex:
    """The index database at `db_path`, fed from the rotating JSONL at `log_path`."""

    def __init__(self, db_path: Path, log_path: Path) -> None:
        self.db_path = db_path
        self.log = RotatingLog(log_path)
        self._local = threading.local()
        self._analyzed_at_rows = 0
        self._conn().executescript(_SCHEMA)
        self._add_new_columns()
        # The sandboxes the caller may read (None: all). The server sets it to the acting
        # principal's tenant's (api/access.py); every query below goes through it, so a page, a
        # follow stream, a summary or one record never shows another tenant's.
        self.scope: Callable[[], list[str] | None] = lambda: None

    def _add_new_columns(self) -> None:
        """An index made before the schema gained a field (v1 only grows optional fields, such as
        `via`) gets its column; old rows hold NULL there, as their records had no such field."""
        db = self._conn()
        have = {row[1] for row in db.execute("PRAGMA table_info(records)")}
        for column in COLUMNS:
            if column not in have:
                db.execute(f"ALTER TABLE records ADD COLUMN {column} {_COLUMN_TYPES.get(column, 'TEXT')}")

    # -- connections ---------------------------------------------------------------------------
    def _conn(self) -> sqlite3.Connection:
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            self.db_path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.db_path, timeout=30, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("PRAGMA cache_size=-65536")
            self._local.db = db
        return db

    def close(self) -> None:
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None

    # -- ingest --------------------------------------------------------------------------------
    def ingest(self, max_bytes: int = 8 << 20) -> IngestResult:
        """Index everything written since the saved position; returns what one pass did."""
        total = IngestResult()
        while True:
            step = self._ingest_chunk(max_bytes)
            total = IngestResult(
                total.lines + step.lines,
                total.added + step.added,
                total.malformed + step.malformed,
                total.gap or step.gap,
            )
            if step.lines == 0:
                break
        if total.added:
            self._analyze_if_grown()
        return total

    def _ingest_chunk(self, max_bytes: int) -> IngestResult:
        db = self._conn()
        source = str(self.log.path)
        db.execute("BEGIN IMMEDIATE")
        try:
            position = self._position(db, source)
            chunk = self.log.read(position, max_bytes)
            rows, malformed = _parse(chunk.lines, self.log.path)
            before = db.total_changes
            db.executemany(_INSERT, rows)
            added = db.total_changes - before
            if chunk.position is not None and chunk.position != position:
                self._save_position(db, source, chunk.position, malformed, chunk.gap)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        if chunk.gap:
            log.warning(
                "audit log %s rotated past its backups before it was indexed; lines may be lost",
                self.log.path,
            )
        return IngestResult(len(chunk.lines), added, malformed, chunk.gap)

    @staticmethod
    def _position(db: sqlite3.Connection, source: str) -> Position | None:
        row = db.execute(
            "SELECT device, inode, head, offset FROM ingest_state WHERE source = ?", (source,)
        ).fetchone()
        return Position(row[0], row[1], bytes(row[2]), row[3]) if row else None

    @staticmethod
    def _save_position(
        db: sqlite3.Connection, source: str, position: Position, malformed: int, gap: bool
    ) -> None:
        db.execute(
            "INSERT INTO ingest_state (source, device, inode, head, offset, malformed, gaps)"
            " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (source) DO UPDATE SET device = excluded.device,"
            " inode = excluded.inode, head = excluded.head, offset = excluded.offset,"
            " malformed = malformed + excluded.malformed, gaps = gaps + excluded.gaps",
            (source, position.device, position.inode, position.head, position.offset, malformed, int(gap)),
        )

    def _analyze_if_grown(self) -> None:
        """Refresh planner statistics when the table has doubled since the last ANALYZE."""
        rows = self.count()
        if rows >= 2 * max(self._analyzed_at_rows, 500):
            self._conn().execute("ANALYZE")
            self._analyzed_at_rows = rows

    # -- queries -------------------------------------------------------------------------------
    def count(self, query: AuditFilter | None = None) -> int:
        where, params = _where(query or AuditFilter(), scope=self.scope())
        return int(self._conn().execute(f"SELECT count(*) FROM records{where}", params).fetchone()[0])

    def page(self, query: AuditFilter, limit: int = 50, cursor: str | None = None) -> Page:
        """Newest first; pass `next_cursor` back for the next (older) page."""
        limit = max(1, min(limit, MAX_PAGE))
        position = Cursor.decode(cursor, query) if cursor else None
        if position is not None:
            query = query.model_copy(update={"since": position.since, "until": position.until})
        where, params = _where(query, position, scope=self.scope())
        rows = (
            self._conn()
            .execute(f"{_SELECT}{where} ORDER BY ts_us DESC, seq DESC LIMIT ?", [*params, limit + 1])
            .fetchall()
        )
        more = len(rows) > limit
        rows = rows[:limit]
        next_cursor = Cursor(ts_us=rows[-1][1 + COLUMNS.index("ts_us")], seq=rows[-1][0]) if more else None
        return Page(
            records=[from_row(row[1:]) for row in rows],
            next_cursor=next_cursor.encode(query) if next_cursor else None,
        )

    def after(
        self, seq: int, query: AuditFilter, limit: int = 500, upto: int | None = None
    ) -> list[tuple[int, RecordJSON]]:
        """Records ingested after `seq` (and at most `upto`), oldest first, with their seq."""
        where, params = _where(query, after_seq=seq, upto_seq=upto, scope=self.scope())
        rows = self._conn().execute(f"{_SELECT}{where} ORDER BY seq LIMIT ?", [*params, limit]).fetchall()
        return [(row[0], from_row(row[1:])) for row in rows]

    def last_seq(self) -> int:
        return int(self._conn().execute("SELECT coalesce(max(seq), 0) FROM records").fetchone()[0])

    def get(self, record_id: str) -> RecordJSON | None:
        row = self._conn().execute(f"{_SELECT} WHERE id = ?", (record_id,)).fetchone()
        scope = self.scope()
        return (
            from_row(row[1:])
            if row and (scope is None or row[1 + COLUMNS.index("sandbox")] in scope)
            else None
        )

    def of_process(self, sandbox: str, pid: int, limit: int = 200) -> list[RecordJSON]:
        """A sandbox's records of one process (its host pid), newest first: the kernel's records
        of it (`process`: its execs, its ptrace attaches) and the connections and requests it
        opened (their `process`). A pid the kernel reused later shows both lives, by time."""
        scope = self.scope()
        if scope is not None and sandbox not in scope:
            return []
        where = (
            " WHERE sandbox = ? AND ((kind = 'process' AND json_extract(detail, '$.pid') = ?)"
            " OR json_extract(process, '$.pid') = ?)"
        )
        rows = self._conn().execute(
            f"{_SELECT}{where} ORDER BY ts_us DESC, seq DESC LIMIT ?", (sandbox, pid, pid, limit)
        )
        return [from_row(row[1:]) for row in rows.fetchall()]

    def summary(self, query: AuditFilter, top: int = 15) -> Summary:
        """Top hosts, denials by reason and injections by binding for the filtered records."""
        where, params = _where(query, scope=self.scope())
        db = self._conn()
        total, denied = db.execute(
            f"SELECT coalesce(sum({_COUNTED}), 0), coalesce(sum(decision = 'deny' AND {_COUNTED}), 0)"
            f" FROM records{where}",
            params,
        ).fetchone()

        def grouped(sql: str, extra: str) -> list[CountRow]:
            clause = f"{where} AND {extra}" if where else f" WHERE {extra}"
            rows = db.execute(sql.format(where=clause), [*params, top]).fetchall()
            return [
                CountRow(key=r[0], count=r[1], denied=r[2], bytes_in=r[3], bytes_out=r[4], example=r[5])
                for r in rows
            ]

        return Summary(
            sandbox=query.sandbox,
            since=format_ts(query.since) if query.since is not None else None,
            total=total,
            denied=denied,
            top_hosts=grouped(
                f"SELECT host, sum({_COUNTED}) n, sum(decision = 'deny' AND {_COUNTED}), sum(bytes_in),"
                " sum(bytes_out), max(binding) FROM records{where} GROUP BY host ORDER BY n DESC LIMIT ?",
                "host IS NOT NULL",
            ),
            denials_by_reason=grouped(
                "SELECT reason, count(*) n, count(*), sum(bytes_in), sum(bytes_out), max(host)"
                " FROM records{where} GROUP BY reason ORDER BY n DESC LIMIT ?",
                f"decision = 'deny' AND {_COUNTED}",
            ),
            injections_by_binding=grouped(
                f"SELECT binding || ' -> ' || coalesce(host, '?'), sum({_COUNTED}) n,"
                f" sum(decision = 'deny' AND {_COUNTED}),"
                " sum(bytes_in), sum(bytes_out), NULL"
                " FROM records{where} GROUP BY binding, host ORDER BY n DESC LIMIT ?",
                "binding IS NOT NULL",
            ),
        )

    def counts_by_sandbox(self, query: AuditFilter) -> dict[str, tuple[int, int]]:
        """sandbox -> (records, denied) for the filtered records."""
        where, params = _where(query, scope=self.scope())
        rows = self._conn().execute(
            f"SELECT sandbox, sum({_COUNTED}), sum(decision = 'deny' AND {_COUNTED}) FROM records{where}"
            " GROUP BY sandbox",
            params,
        )
        return {sandbox: (total, denied) for sandbox, total, denied in rows}

    def sandboxes_starting_with(self, prefix: str, limit: int = 10) -> list[str]:
        """Up to `limit` sandbox ids in the index that start with `prefix`, in order (one index
        seek each: a sandbox's record count does not matter)."""
        db, bound, op = self._conn(), prefix, ">="
        found: list[str] = []
        while len(found) < limit:
            (sandbox,) = db.execute(
                f"SELECT min(sandbox) FROM records WHERE sandbox {op} ?", (bound,)
            ).fetchone()
            if sandbox is None or not sandbox.startswith(prefix):
                break
            found.append(sandbox)
            bound, op = sandbox, ">"
        return found

    def ingest_stats(self) -> IngestStats:
        row = self._conn().execute(
            "SELECT coalesce(sum(malformed), 0), coalesce(sum(gaps), 0) FROM ingest_state"
        )
        malformed, gaps = row.fetchone()
        return IngestStats(records=self.count(), malformed_lines=malformed, gaps=gaps)

    # -- retention -----------------------------------------------------------------------------
    def apply_retention(self, retention: Retention, now_us: int | None = None) -> int:
        """Delete rows older than max_age and beyond max_rows (oldest first); returns rows deleted."""
        db = self._conn()
        deleted = 0
        if retention.max_age_days is not None:
            now_us = now_us if now_us is not None else to_micros_now()
            cutoff = now_us - int(retention.max_age_days * 86_400 * 1_000_000)
            deleted += _delete_batches(db, "ts_us < ?", (cutoff,))
        if retention.max_rows is not None:
            excess = self.count() - retention.max_rows
            if excess > 0:
                # The oldest by time; seq breaks ties like the page order does.
                row = db.execute(
                    "SELECT ts_us, seq FROM records ORDER BY ts_us, seq LIMIT 1 OFFSET ?", (excess - 1,)
                ).fetchone()
                deleted += _delete_batches(db, "(ts_us, seq) <= (?, ?)", (row[0], row[1]))
        return deleted


def to_micros_now() -> int:
    return time.time_ns() // 1000


def _delete_batches(db: sqlite3.Connection, condition: str, params: tuple[Any, ...]) -> int:
    deleted = 0
    while True:
        cur = db.execute(
            f"DELETE FROM records WHERE seq IN (SELECT seq FROM records WHERE {condition} LIMIT 20000)",
            params,
        )
        deleted += cur.rowcount
        if cur.rowcount < 20000:
            return deleted


def _parse(lines: list[bytes], path: Path) -> tuple[list[tuple[Any, ...]], int]:
    rows = []
    malformed = 0
    for line in lines:
        try:
            rows.append(to_row(AuditRecord.model_validate_json(line)))
        except ValidationError as exc:
            malformed += 1
            if malformed <= 3:
                log.warning(
                    "skipping malformed audit line in %s: %s (line starts %r)",
                    path,
                    exc.errors()[0]["msg"],
                    line[:80],
                )
    return rows, malformed


def _where(
    query: AuditFilter,
    cursor: Cursor | None = None,
    after_seq: int | None = None,
    upto_seq: int | None = None,
    scope: list[str] | None = None,
) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []
    if scope is not None:  # the caller's tenant's sandboxes only (AuditIndex.scope)
        clauses.append(f"sandbox IN ({', '.join('?' * len(scope))})" if scope else "0")
        params.extend(scope)
    for column in ("sandbox", "kind", "decision", "binding", "reason", "status"):
        value = getattr(query, column)
        if value is not None:
            clauses.append(f"{column} = ?")
            params.append(value)
    if query.host is not None:
        clauses.append("host GLOB ?" if "*" in query.host else "host = ?")
        params.append(query.host)
    if query.since is not None:
        clauses.append("ts_us >= ?")
        params.append(query.since)
    if query.until is not None:
        clauses.append("ts_us < ?")
        params.append(query.until)
    if cursor is not None:
        clauses.append("(ts_us, seq) < (?, ?)")
        params.extend([cursor.ts_us, cursor.seq])
    if after_seq is not None:
        clauses.append("seq > ?")
        params.append(after_seq)
    if upto_seq is not None:
        clauses.append("seq <= ?")
        params.append(upto_seq)
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), params
