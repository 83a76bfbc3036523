"""Reading a state dir's audit log the way its readers do (lifecycle's index, `sandgate logs`).

The proxy writes a request's record twice: a write-ahead line (`event: incomplete`) before its
first byte goes upstream, and the whole record, same id, when it ends (docs/audit.md). One
logical record per id is what tests count: the whole one where the response ended.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def audit_records(state_dir: Path, sandbox: str | None = None) -> list[dict[str, Any]]:
    """Every record of the live file and its backups, one per id, oldest first."""
    records: dict[str, dict[str, Any]] = {}
    for path in sorted(state_dir.glob("audit.jsonl*"), reverse=True):
        for line in path.read_text().split("\n"):  # not splitlines(): a record may hold U+0085
            if line:
                record = json.loads(line)
                records.pop(record["id"], None)
                records[record["id"]] = record
    return [r for r in records.values() if sandbox is None or r.get("sandbox") == sandbox]


def wait_records(
    state_dir: Path,
    sandbox: str,
    match: Callable[[dict[str, Any]], bool],
    at_least: int = 1,
    timeout: float = 15.0,
) -> list[dict[str, Any]]:
    """The sandbox's records that `match`, once `at_least` of them are in (bounded by `timeout`;
    then what there is): a node's records reach the server's log through its shipper, a poll
    after the node wrote them, and one poll may carry some of them only."""
    deadline = time.monotonic() + timeout
    while True:
        found = [r for r in audit_records(state_dir, sandbox) if match(r)]
        if len(found) >= at_least or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def dns_decision(state_dir: Path, sandbox: str, name: str, timeout: float = 10.0) -> str:
    """The decision of the proxy's DNS record for `name` (written when the answer is sent)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for record in audit_records(state_dir, sandbox):
            if record["kind"] == "dns" and record["host"] == name:
                return str(record["decision"])
        time.sleep(0.1)
    raise AssertionError(f"no DNS record for {name} in {timeout:g} s")
