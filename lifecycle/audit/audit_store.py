"""The running audit store: one background ingester per server, live follow for any number of readers.

Rules: exactly one thread writes the index (the ingester started by `start()`); API requests
and the console only read. Followers poll the index by `seq` (cheap, primary key), so a record
reaches them within about one poll interval of being written to the JSONL, and a follower that
reconnects with its last `seq` (SSE Last-Event-ID) misses nothing.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

from sandgate.lifecycle.audit.index import AuditIndex, Retention
from sandgate.lifecycle.audit.query import AuditFilter
from sandgate.lifecycle.audit.record import RecordJSON
from sandgate.proxy import audit_path

log = logging.getLogger(__name__)

INDEX_FILE = "audit-index.db"
RETENTION_EVERY_S = 60.0
FOLLOW_BATCH = 500


class AuditStore:
    """The index of `<state_dir>/audit.jsonl` at `<state_dir>/audit-index.db`, kept current."""

    def __init__(
        self, state_dir: Path, retention: Retention | None = None, poll_interval: float = 0.25
    ) -> None:
        self.index = AuditIndex(state_dir / INDEX_FILE, audit_path(state_dir))
        self.retention = retention or Retention()
        self.poll_interval = poll_interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Index what is there, then keep indexing in a background thread until `stop()`."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="audit-ingest", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None and not self._stop.is_set()

    def _run(self) -> None:
        next_retention = 0.0
        try:
            while not self._stop.is_set():
                try:
                    self.index.ingest()
                    if time.monotonic() >= next_retention:
                        self.index.apply_retention(self.retention)
                        next_retention = time.monotonic() + RETENTION_EVERY_S
                except Exception:  # keep following: the next pass retries from the saved position
                    log.exception("audit ingest failed; retrying in %.1f s", self.poll_interval)
                self._stop.wait(self.poll_interval)
        finally:
            self.index.close()

    async def follow(
        self, query: AuditFilter, after_seq: int | None = None
    ) -> AsyncIterator[tuple[int, RecordJSON]]:
        """Records matching `query` ingested after `after_seq` (default: from now on), as they come."""
        seq = after_seq if after_seq is not None else await asyncio.to_thread(self.index.last_seq)
        while not self._stop.is_set():
            top = await asyncio.to_thread(self.index.last_seq)
            batch = await asyncio.to_thread(self.index.after, seq, query, FOLLOW_BATCH, top)
            for row_seq, record in batch:
                yield row_seq, record
            # Rows up to `top` that did not match are skipped for good, so polls stay cheap.
            seq = batch[-1][0] if len(batch) == FOLLOW_BATCH else top
            if len(batch) < FOLLOW_BATCH:
                await asyncio.sleep(self.poll_interval)
