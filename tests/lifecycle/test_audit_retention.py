"""Audit retention settings reach the running server's index: `audit_max_age_days` and
`audit_max_rows` trim the index (what /v1/audit answers from) and never the JSONL."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sandgate.proxy import AuditRecord
from sandgate.proxy.audit import AuditLog
from tests.support.server import sandgate_server

pytestmark = pytest.mark.root
OLD, RECENT, MAX_ROWS = 10, 20, 15


def request_record(number: int, age: timedelta) -> AuditRecord:
    return AuditRecord(
        ts=(datetime.now(UTC) - age).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        kind="request",
        sandbox="sbx-retention",
        client="10.213.0.2:40000",
        scheme="http",
        method="GET",
        host="api.example.com",
        port=80,
        path=f"/item/{number}",
        decision="allow",
        reason="allowed by rule",
        status=200,
    )


def test_retention_settings_trim_the_index_not_the_log(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o700)
    log = AuditLog(state_dir / "audit.jsonl", max_bytes=1 << 20, backups=2)
    try:
        for n in range(OLD):
            log.write(request_record(n, timedelta(days=3, minutes=n)))
        for n in range(OLD, OLD + RECENT):
            log.write(request_record(n, timedelta(minutes=OLD + RECENT - n)))
    finally:
        log.close()
    settings = {"SANDGATE_AUDIT_MAX_AGE_DAYS": "1", "SANDGATE_AUDIT_MAX_ROWS": str(MAX_ROWS)}
    with sandgate_server(tmp_path, settings) as server, server.client() as client:
        deadline = time.monotonic() + 20
        while True:
            records = client.get("/v1/audit", params={"sandbox": "sbx-retention", "limit": 100}).json()
            paths = [r["path"] for r in records["records"]]
            if len(paths) == MAX_ROWS:
                break
            assert time.monotonic() < deadline, f"the index holds {len(paths)} records, not {MAX_ROWS}"
            time.sleep(0.2)
        newest = [f"/item/{n}" for n in range(OLD + RECENT - 1, OLD + RECENT - 1 - MAX_ROWS, -1)]
        assert paths == newest  # the old ones went by age, then the oldest recent ones by count
    assert len((state_dir / "audit.jsonl").read_text().splitlines()) >= OLD + RECENT
