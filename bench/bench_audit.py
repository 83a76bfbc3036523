"""Audit index benchmark: 1,000,000 realistic records, index build time, filtered-page latency.

Writes the records with size rotation (like the proxy's writer) into a fresh state dir's audit
log (`sandgate.proxy.audit_path`), indexes them from scratch with the CLI (`sandgate logs`, which
brings the index up to date before it answers), then starts a real `sandgate serve` on that state
dir and times, through the HTTP API, the pages a reviewer asks for (`GET /v1/audit`: "what did
sandbox X reach today", "what was denied and why", "where did credential Y go"), the next page
by cursor, and the summaries (`GET /v1/audit/summary`). Goal: < 200 ms per filtered page.
Root (serve builds its network). `SANDGATE_BENCH_AUDIT_RECORDS` changes the count (default
1,000,000).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from bench import sized
from bench.sandbox_rig import enter_own_netns, run_as_root_child
from sandgate.proxy import audit_path

if TYPE_CHECKING:
    from tests.support.server import SandgateServer

CHILD_FLAG = "SANDGATE_BENCH_AUDIT_CHILD"
SANDGATE = str(Path(sys.executable).with_name("sandgate"))

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


PROGRAMS = ("/usr/bin/curl", "/usr/bin/python3.11", "/usr/bin/git")  # what opened a connection


def synthetic_records(
    count: int, end: datetime, span: timedelta, sandboxes: int = 200, seed: int = 7
) -> Iterator[dict[str, Any]]:
    """`count` records spread evenly over [end - span, end], in time order, realistic mix."""
    rng = random.Random(seed)
    names = [f"sbx-{n:04d}" for n in range(sandboxes)]
    start_us = _micros(end - span)
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
            "ts": _rfc3339(start_us + n * step + rng.randrange(step)),
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
            "process": {
                "pid": 4000 + n % 9000,
                "sandbox_pid": 2 + n % 300,
                "exe": PROGRAMS[n % 3],
                "unknown": None,
            }
            if kind in ("request", "connection")
            else None,
            "principal": None,
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


def _micros(moment: datetime) -> int:
    return round(moment.timestamp() * 1_000_000)


def _rfc3339(micros: int) -> str:
    """As the proxy's writer formats `ts`: UTC with microseconds."""
    return datetime.fromtimestamp(micros / 1_000_000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _time_ms(action: Any, repeat: int = 7) -> tuple[float, Any]:
    samples = []
    result = None
    for _ in range(repeat):
        started = time.perf_counter()
        result = action()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples), result


def _get(client: httpx.Client, path: str, params: dict[str, Any]) -> dict[str, Any]:
    response = client.get(path, params=params)
    response.raise_for_status()
    return response.json()  # type: ignore[no-any-return]


CASES: dict[str, dict[str, Any]] = {
    "sandbox X today": {"sandbox": "sbx-0000", "since": "today"},
    "sandbox X (rare) all": {"sandbox": "sbx-0150"},
    "denied, all sandboxes": {"decision": "deny"},
    "denied for sandbox X today": {"sandbox": "sbx-0003", "decision": "deny", "since": "today"},
    "binding github-token": {"binding": "github-token"},
    "binding + sandbox": {"binding": "model-key", "sandbox": "sbx-0042"},
    "host, last 1h": {"host": "metadata.example.test", "since": "1h"},
    "host glob": {"host": "cdn1*.example.test"},
    "reason (no index)": {"reason": "SNI does not match Host"},
    "status 500 since 2d": {"status": 500, "since": "2d"},
    "no match": {"sandbox": "sbx-0001", "host": "nothing.example.com"},
}
SUMMARIES: dict[str, dict[str, Any]] = {
    "summary sandbox X today": {"sandbox": "sbx-0000", "since": "today"},
    "summary sandbox X (7 days)": {"sandbox": "sbx-0000"},
    "summary all, today": {"since": "today"},
}


def main() -> None:
    run_as_root_child("bench.bench_audit", CHILD_FLAG, "sandgate serve: netns, nftables")


def _child() -> None:
    enter_own_netns()
    from tests.support.server import sandgate_server

    count = int(os.environ.get("SANDGATE_BENCH_AUDIT_RECORDS", sized(1_000_000, 5_000)))
    with tempfile.TemporaryDirectory(prefix="sandgate-bench-audit-") as tmp:
        state = Path(tmp) / "state"  # the state dir sandgate_server(tmp) uses
        state.mkdir()
        log = audit_path(state)
        started = time.perf_counter()
        write_log(log, synthetic_records(count, datetime.now(UTC), timedelta(days=7)))
        files = list(state.glob(f"{log.name}*"))
        print(
            f"generated {count:,} records in {time.perf_counter() - started:.1f} s "
            f"({sum(p.stat().st_size for p in files) / 1e6:.0f} MB, {len(files)} files)"
        )
        started = time.perf_counter()
        env = {**os.environ, "SANDGATE_STATE_DIR": str(state)}
        built = subprocess.run(
            [SANDGATE, "logs", "--limit", "1", "-o", "json"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        build = time.perf_counter() - started
        index_mb = sum(p.stat().st_size for p in state.glob("*.db*")) / 1e6
        print(
            f"index build (sandgate logs): {build:.1f} s ({count / build:,.0f} records/s), {index_mb:.0f} MB"
        )
        if not built.stdout.strip():  # one JSON line per record, the newest here
            raise RuntimeError(f"sandgate logs found no record: {built.stderr}")
        with sandgate_server(Path(tmp)) as server:
            _pages(server, count)


def _pages(server: SandgateServer, count: int) -> None:
    with server.client() as client:
        indexed = _get(client, "/v1/audit/index", {})["records"]
        if indexed < count:
            raise RuntimeError(f"the server's index holds {indexed} of {count} records")
        print(f"through the API (GET /v1/audit, {indexed:,} records indexed)")
        print(f"{'query (page of 50)':32} {'first':>9} {'next':>9}  rows")
        worst = 0.0
        for name, query in CASES.items():
            first_ms, page = _time_ms(lambda q=query: _get(client, "/v1/audit", {**q, "limit": 50}))
            next_ms = 0.0
            if page["next_cursor"]:
                params = {**query, "limit": 50, "cursor": page["next_cursor"]}
                next_ms, _ = _time_ms(lambda p=params: _get(client, "/v1/audit", p))
            worst = max(worst, first_ms, next_ms)
            print(f"{name:32} {first_ms:7.1f}ms {next_ms:7.1f}ms  {len(page['records'])}")
        for name, query in SUMMARIES.items():
            ms, _ = _time_ms(lambda q=query: _get(client, "/v1/audit/summary", q), repeat=3)
            print(f"{name:32} {ms:7.1f}ms")
    print(f"worst filtered page: {worst:.1f} ms (goal < 200 ms): {'OK' if worst < 200 else 'MISSED'}")


if __name__ == "__main__" and os.environ.get(CHILD_FLAG) == "1":
    _child()
