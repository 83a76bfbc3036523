"""Audit index benchmark: 1,000,000 realistic records, index build time, filtered-page latency.

Writes the records with size rotation (like the proxy's writer) into a temp state dir, indexes
them from scratch, then times the pages a reviewer asks for ("what did sandbox X reach today",
"what was denied and why", "where did credential Y go"), the next page by cursor, and the
per-sandbox summary. Goal: < 200 ms per filtered page. `SANDGATE_BENCH_AUDIT_RECORDS` changes
the count (default 1,000,000).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sandgate.lifecycle.audit import AuditFilter, AuditIndex, format_ts, parse_time, to_micros

# Popular first: the generator picks hosts with an exponential (long-tail) distribution.
HOSTS = [
    "github.example.com",
    "api0.example.com",
    "pypi.example.test",
    *(f"api{n}.example.com" for n in range(1, 40)),
    "files.example.test",
    "metadata.example.test",
    *(f"cdn{n}.example.test" for n in range(200)),
]
BINDINGS = {
    "github-token": "github.example.com",
    "model-key": "api0.example.com",
    "pypi-upload": "pypi.example.test",
}
DENY_REASONS = [
    "no rule matched (default deny)",
    "upstream address is private (10.0.0.0/8)",
    "method POST not allowed by rule",
    "SNI does not match Host",
    "binding github-token may not go to this host",
]


class RotatingWriter:
    """Appends lines to `path` and rotates by size to path.1 ... path.N, like the proxy's writer."""

    def __init__(self, path: Path, max_bytes: int, backups: int) -> None:
        self.path, self.max_bytes, self.backups = path, max_bytes, backups
        self._handle = path.open("ab")

    def write(self, line: bytes) -> None:
        if self._handle.tell() + len(line) > self.max_bytes:
            self.rotate()
        self._handle.write(line)

    def flush(self) -> None:
        self._handle.flush()

    def rotate(self) -> None:
        self._handle.close()
        for n in range(self.backups, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{n}")
            if n == self.backups:
                older.unlink(missing_ok=True)
            newer = self.path.with_name(f"{self.path.name}.{n - 1}") if n > 1 else self.path
            if newer.exists():
                newer.rename(older)
        self._handle = self.path.open("ab")

    def close(self) -> None:
        self._handle.close()


def synthetic_records(
    count: int, end: datetime, span: timedelta, sandboxes: int = 200, seed: int = 7
) -> Iterator[dict[str, Any]]:
    """`count` records spread evenly over [end - span, end], in time order, realistic mix."""
    rng = random.Random(seed)
    names = [f"sbx-{n:04d}" for n in range(sandboxes)]
    start_us = to_micros(end - span)
    step = max(1, int(span.total_seconds() * 1_000_000) // max(count, 1))
    for n in range(count):
        sandbox = (
            names[min(int(rng.paretovariate(1.2)) - 1, sandboxes - 1)]
            if rng.random() < 0.5
            else rng.choice(names)
        )
        host = HOSTS[min(int(rng.expovariate(0.08)), len(HOSTS) - 1)]
        kind = rng.choices(["request", "connection", "dns", "security_event"], [70, 22, 7, 1])[0]
        decision = rng.choices(["allow", "deny", "report"], [90, 8, 2])[0]
        binding = next((b for b, h in BINDINGS.items() if h == host), None) if kind == "request" else None
        yield {
            "v": 1,
            "ts": format_ts(start_us + n * step + rng.randrange(step)),
            "id": f"r{n:09d}-{rng.getrandbits(40):010x}",
            "kind": kind,
            "sandbox": sandbox,
            "client": f"10.213.{n % 250}.{2 + 4 * (n % 60)}:{40000 + n % 20000}",
            "upstream": None if decision == "deny" else f"198.51.100.{n % 250 + 1}:443",
            "via": None,
            "sni": host if kind != "dns" else None,
            "scheme": "https" if kind in ("request", "connection") else None,
            "method": rng.choice(["GET", "GET", "GET", "POST", "PUT"]) if kind == "request" else None,
            "host": host,
            "port": 443 if kind != "dns" else 53,
            "path": rng.choice(["/v1/items", "/v1/items?<redacted>", "/simple/pkg/", "/repos/o/r"])
            if kind == "request"
            else None,
            "decision": decision,
            "reason": rng.choice(DENY_REASONS) if decision == "deny" else "allowed by rule",
            "rule": f"policy.yaml:{rng.randrange(3, 80)}"
            if decision != "deny" or rng.random() < 0.5
            else None,
            "inspect": kind == "request",
            "binding": binding if decision == "allow" else None,
            "status": (rng.choice([200, 200, 200, 201, 404, 500]) if decision != "deny" else 403)
            if kind == "request"
            else None,
            "bytes_in": rng.randrange(100, 200_000),
            "bytes_out": rng.randrange(100, 5_000),
            "duration_ms": round(rng.uniform(1, 400), 3),
            "event": "sni_mismatch" if kind == "security_event" else None,
            "detail": None,
        }


def write_log(
    path: Path, records: Iterator[dict[str, Any]], max_bytes: int = 100 << 20, backups: int = 20
) -> int:
    writer = RotatingWriter(path, max_bytes, backups)
    written = 0
    try:
        for record in records:
            writer.write(json.dumps(record, separators=(",", ":")).encode() + b"\n")
            written += 1
    finally:
        writer.close()
    return written


def _time_ms(action: Any, repeat: int = 7) -> tuple[float, Any]:
    samples = []
    result = None
    for _ in range(repeat):
        started = time.perf_counter()
        result = action()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples), result


def main() -> None:
    count = int(os.environ.get("SANDGATE_BENCH_AUDIT_RECORDS", "1000000"))
    now = datetime.now(UTC)
    with tempfile.TemporaryDirectory(prefix="sandgate-bench-audit-") as tmp:
        state = Path(tmp)
        started = time.perf_counter()
        write_log(state / "audit.jsonl", synthetic_records(count, now, timedelta(days=7)))
        print(
            f"generated {count:,} records in {time.perf_counter() - started:.1f} s "
            f"({sum(p.stat().st_size for p in state.glob('audit.jsonl*')) / 1e6:.0f} MB, "
            f"{len(list(state.glob('audit.jsonl*')))} files)"
        )
        index = AuditIndex(state / "audit-index.db", state / "audit.jsonl")
        started = time.perf_counter()
        result = index.ingest()
        build = time.perf_counter() - started
        print(
            f"index build: {build:.1f} s ({result.added / build:,.0f} records/s), "
            f"{(state / 'audit-index.db').stat().st_size / 1e6:.0f} MB"
        )
        today = parse_time("today")
        cases = {
            "sandbox X today": AuditFilter(sandbox="sbx-0000", since=today),
            "sandbox X (rare) all": AuditFilter(sandbox="sbx-0150"),
            "denied, all sandboxes": AuditFilter(decision="deny"),
            "denied for sandbox X today": AuditFilter(sandbox="sbx-0003", decision="deny", since=today),
            "binding github-token": AuditFilter(binding="github-token"),
            "binding + sandbox": AuditFilter(binding="model-key", sandbox="sbx-0042"),
            "host, last 1h": AuditFilter(host="metadata.example.test", since=parse_time("1h")),
            "host glob": AuditFilter(host="cdn1*.example.test"),
            "reason (no index)": AuditFilter(reason="SNI does not match Host"),
            "status 500 since 2d": AuditFilter(status=500, since=parse_time("2d")),
            "no match": AuditFilter(sandbox="sbx-0001", host="nothing.example.com"),
        }
        print(f"{'query (page of 50)':32} {'first':>9} {'next':>9}  rows")
        worst = 0.0
        for name, query in cases.items():
            first_ms, page = _time_ms(lambda q=query: index.page(q, 50))
            next_ms = 0.0
            if page.next_cursor:
                next_ms, _ = _time_ms(lambda q=query, c=page.next_cursor: index.page(q, 50, c))
            worst = max(worst, first_ms, next_ms)
            print(f"{name:32} {first_ms:7.1f}ms {next_ms:7.1f}ms  {len(page.records)}")
        for name, query in {
            "summary sandbox X today": AuditFilter(sandbox="sbx-0000", since=today),
            "summary sandbox X (7 days)": AuditFilter(sandbox="sbx-0000"),
            "summary all, today": AuditFilter(since=today),
        }.items():
            ms, _ = _time_ms(lambda q=query: index.summary(q), repeat=3)
            print(f"{name:32} {ms:7.1f}ms")
        ms, _ = _time_ms(lambda: index.counts_by_sandbox(AuditFilter(since=parse_time("24h"))), repeat=3)
        print(f"{'console overview counts (24h)':32} {ms:7.1f}ms")
        print(f"worst filtered page: {worst:.1f} ms (goal < 200 ms): {'OK' if worst < 200 else 'MISSED'}")
        index.close()


if __name__ == "__main__":
    main()
