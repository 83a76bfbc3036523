"""Audit test fixtures: records written by the proxy's real audit writer, a real uvicorn server.

The server is a minimal FastAPI app holding only the audit and console routers (with an API-key
dependency like the control plane's) until the lifecycle server fixture can host them; it
listens on 127.0.0.1 inside the test session's own network namespace.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI, Header, HTTPException

from bench.bench_audit import synthetic_records
from sandgate.lifecycle.audit import AuditStore, audit_router
from sandgate.lifecycle.console import console_router
from sandgate.lifecycle.principals import BOOTSTRAP
from sandgate.proxy import AuditRecord
from sandgate.proxy.audit import AuditLog

API_KEY = "test-key-0123456789"


def write_records(
    state_dir: Path, records: list[dict[str, Any]], max_bytes: int = 1 << 20, backups: int = 20
) -> None:
    """Write through the proxy's AuditLog (its model validates every record, its rotation runs)."""
    log = AuditLog(state_dir / "audit.jsonl", max_bytes=max_bytes, backups=backups)
    try:
        for record in records:
            log.write(AuditRecord.model_validate(record))
    finally:
        log.close()


def generated(
    count: int, span: timedelta = timedelta(hours=6), sandboxes: int = 8, seed: int = 3
) -> list[dict[str, Any]]:
    return list(synthetic_records(count, datetime.now(UTC), span, sandboxes=sandboxes, seed=seed))


@dataclass
class Served:
    url: str
    state_dir: Path
    store: AuditStore
    sandboxes: list[dict[str, Any]]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def require_key(open_sandbox_api_key: str | None = Header(None)) -> None:
    if open_sandbox_api_key != API_KEY:
        raise HTTPException(401, "send the API key in the OPEN-SANDBOX-API-KEY header")


@contextlib.contextmanager
def serve(state_dir: Path, sandboxes: list[dict[str, Any]] | None = None) -> Iterator[Served]:
    """Audit + console routers served by uvicorn over `state_dir`, with `sandboxes` as the live list."""
    live = sandboxes if sandboxes is not None else []
    store = AuditStore(state_dir, poll_interval=0.1)
    app = FastAPI()
    app.include_router(audit_router(store, require_key))
    login = lambda key: (BOOTSTRAP, None) if key == API_KEY else None  # noqa: E731
    app.include_router(console_router(store, login, lambda: live))
    port = _free_port()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=2
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    store.start()
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline, "uvicorn did not start within 10 s"
            time.sleep(0.02)
        yield Served(f"http://127.0.0.1:{port}", state_dir, store, live)
    finally:
        store.stop()
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    with serve(tmp_path) as running:
        yield running


def wait_indexed(store: AuditStore, count: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while store.index.count() < count:
        assert time.monotonic() < deadline, (
            f"index has {store.index.count()} of {count} records after {timeout} s"
        )
        time.sleep(0.05)
