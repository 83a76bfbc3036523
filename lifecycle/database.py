"""The control-plane database: SQLite in the state dir (the default) or an external PostgreSQL.

Rules:
1. The stores (sandbox_store.py, keys.py) write one SQL for both: `?` placeholders, `ON CONFLICT
   ... DO UPDATE` upserts, types both know (TEXT, INTEGER). This module turns `?` into pg8000's
   `%s`; a statement either engine would read differently is not written.
2. A `Database` is one connection behind one lock (pg8000's connections, like the sqlite3 one
   shared across threads, must not be used by two threads at once); `transaction()` holds the lock
   from BEGIN to COMMIT and rolls back on any exception.
3. PostgreSQL is named by a URL, `postgresql://user:password@host:port/database` (the password
   percent-encoded), given as a secret (env SANDGATE_DATABASE_URL from a Secret): it never
   appears in an error, a log line or a repr. `?sslmode=verify-full` (optionally `&sslrootcert=`
   a CA file) speaks TLS and verifies the server; without it the connection is plain, for a
   database on the same host or a network the operator trusts.
4. Transactions on PostgreSQL are SERIALIZABLE: the stores read a revision and write the next
   in one transaction, which SQLite's BEGIN IMMEDIATE serializes and PostgreSQL's default level
   would not; a conflict with another writer then fails the transaction instead of losing a write.
5. A PostgreSQL connection that was cut (a restart, a failover, an idle timeout) is opened again
   at the next statement, which runs once more on the new one; inside a transaction the error is
   raised instead (the transaction went with the connection: the caller's write did not happen).
"""

from __future__ import annotations

import contextlib
import sqlite3
import ssl
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qs, unquote, urlsplit

POSTGRES_SCHEMES = ("postgresql", "postgres")


class DatabaseError(RuntimeError):
    """The database cannot be opened (a bad URL, an unreachable server): the reason, no secret."""


class _Connection(Protocol):
    def cursor(self) -> Any: ...
    def close(self) -> None: ...


class Database:
    """One connection and its lock (rule 2); `connect` opens it (again: rule 5), `cut` says
    whether an exception means the connection is gone."""

    def __init__(
        self,
        connect: Callable[[], _Connection],
        placeholder: str,
        begin: str,
        where: str,
        cut: Callable[[BaseException], bool] = lambda exc: False,
    ) -> None:
        self._connect = connect
        self._connection = connect()
        self._placeholder = placeholder
        self._begin = begin
        self._cut = cut
        self._in_transaction = False
        self.where = where  # for messages: a path, or the PostgreSQL host and database (no secret)
        self.lock = threading.RLock()

    def __repr__(self) -> str:
        return f"Database({self.where})"

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Run one statement; its rows (empty for a statement that returns none)."""
        with self.lock:
            try:
                return self._run(sql, params)
            except Exception as exc:
                if self._in_transaction or not self._cut(exc):
                    raise
            with contextlib.suppress(Exception):
                self._connection.close()
            self._connection = self._connect()  # rule 5
            return self._run(sql, params)

    def _run(self, sql: str, params: Sequence[Any]) -> list[Any]:
        cursor = self._connection.cursor()
        try:
            cursor.execute(sql.replace("?", self._placeholder), tuple(params))
            return list(cursor.fetchall()) if cursor.description else []
        finally:
            cursor.close()

    def one(self, sql: str, params: Sequence[Any] = ()) -> Any | None:
        rows = self.execute(sql, params)
        return rows[0] if rows else None

    def script(self, statements: str) -> None:
        """Statements separated by `;` (a schema), each run in turn."""
        for statement in statements.split(";"):
            if statement.strip():
                self.execute(statement)

    @contextmanager
    def transaction(self) -> Iterator[Database]:
        with self.lock:
            self.execute(self._begin)
            self._in_transaction = True  # from here a cut connection is an error (rule 5)
            try:
                yield self
                self._run("COMMIT", ())
            except BaseException as exc:
                if not self._cut(exc):
                    self._run("ROLLBACK", ())
                raise
            finally:
                self._in_transaction = False

    def close(self) -> None:
        with self.lock:
            self._connection.close()


def open_database(target: Path | str) -> Database:
    """SQLite at a path, or PostgreSQL at a `postgresql://` URL (rule 3)."""
    if isinstance(target, str) and urlsplit(target).scheme in POSTGRES_SCHEMES:
        return _postgres(target)
    path = Path(target)
    path.parent.mkdir(parents=True, exist_ok=True)

    def connect() -> sqlite3.Connection:
        connection = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA foreign_keys=ON")
        return connection

    database = Database(connect, "?", "BEGIN IMMEDIATE", str(path))
    path.chmod(0o600)
    return database


# SQLSTATE classes of a connection that is gone: 08 (connection exception), 57P01-57P03 (the
# server shut down or cannot take connections now)
CUT_STATES = ("08", "57P01", "57P02", "57P03")


def _postgres(url: str) -> Database:
    import pg8000.dbapi

    parts = urlsplit(url)
    query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    database = parts.path.lstrip("/") or "postgres"
    where = f"PostgreSQL {parts.hostname or 'localhost'}:{parts.port or 5432}/{database}"
    mode = query.get("sslmode", "disable")
    if mode not in ("disable", "verify-full"):
        raise DatabaseError(f"{where}: sslmode {mode!r} is not offered (disable or verify-full)")
    context = ssl.create_default_context(cafile=query.get("sslrootcert")) if mode == "verify-full" else None

    def connect() -> pg8000.dbapi.Connection:
        try:
            connection = pg8000.dbapi.connect(
                user=unquote(parts.username or "postgres"),
                password=unquote(parts.password) if parts.password else None,
                host=parts.hostname or "localhost",
                port=parts.port or 5432,
                database=database,
                ssl_context=context,
                timeout=30,
            )
        except Exception as exc:  # the driver's message names no password; its args may hold the URL's
            raise DatabaseError(f"cannot open {where}: {type(exc).__name__}: {_reason(exc)}") from None
        connection.autocommit = True  # transactions are ours: BEGIN ... COMMIT (rule 4)
        return connection

    def cut(exc: BaseException) -> bool:
        if isinstance(exc, pg8000.dbapi.InterfaceError):  # the socket is closed or broken
            return True
        first = exc.args[0] if isinstance(exc, pg8000.dbapi.DatabaseError) and exc.args else None
        return isinstance(first, dict) and str(first.get("C", "")).startswith(CUT_STATES)

    return Database(connect, "%s", "BEGIN ISOLATION LEVEL SERIALIZABLE", where, cut)


def _reason(exc: Exception) -> str:
    """pg8000 raises DatabaseError with the server's fields as a dict: its message (M) alone."""
    first = exc.args[0] if exc.args else ""
    return str(first.get("M", "")) if isinstance(first, dict) else str(first)
