"""The exec audit trail's cost: a command round trip through the host's reverse proxy with the
trail off, with every execd call recorded (`exec_audit = "execd"`, the default) and with every
process too (`"processes"`); and the server's CPU per process event.

Runs as root in a network namespace of its own (the module re-executes itself after unshare):
three real `sandgate serve` (tests.support.server), one real `sandgate/host` sandbox each. The
rows run in rounds, the order turned each round, on one keep-alive client per server. Rows: a
command round trip (`POST /command` `true`, up to the last event), p50 and p95, and serve's own
CPU per command (load-independent); then a sandbox loop of `/bin/true` execs on each server and
serve's CPU per exec (the process watcher's cost per event, beside the servers without it).
SANDGATE_BENCH_EXEC_AUDIT_RUNS sets the round trips per row and round (default 150).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from bench import sized
from bench.bench_gateway import _command, _cpu_s, _p, _timed
from bench.sandbox_rig import enter_own_netns, run_as_root_child

CHILD_FLAG = "SANDGATE_BENCH_EXEC_AUDIT_CHILD"
RUNS = int(os.environ.get("SANDGATE_BENCH_EXEC_AUDIT_RUNS", sized("150", "10")))
ROUNDS = sized(4, 2)
EXECS = sized(2000, 100)  # /bin/true execs per server for the per-event row
SETTINGS = ("off", "execd", "processes")
TRUE = {"command": "true"}


def main() -> None:
    run_as_root_child("bench.bench_exec_audit", CHILD_FLAG, "netns, nftables, mounts, the process connector")


def _child() -> None:
    host_netns = os.open("/proc/self/ns/net", os.O_RDONLY)  # the process connector's (initial) netns
    # ... unless this runs under pytest (the smoke test), whose conftest left the initial netns
    # for one of its own and names the initial one here
    connector_netns = os.environ.get("SANDGATE_TEST_HOST_NETNS") or f"/proc/{os.getpid()}/fd/{host_netns}"
    enter_own_netns()
    from tests.support.server import sandgate_server

    with (
        tempfile.TemporaryDirectory(prefix="sandgate-bench-exec-audit-") as temp,
        contextlib.ExitStack() as stack,
    ):
        servers = {}
        for setting in SETTINGS:
            extra = {
                "SANDGATE_EXEC_AUDIT": setting,
                "SANDGATE_PROCESS_EVENTS_NETNS": connector_netns,
            }
            (Path(temp) / setting).mkdir()
            servers[setting] = stack.enter_context(sandgate_server(Path(temp) / setting, extra))
        clients = {}
        for setting, server in servers.items():
            sandbox_id = server.create_sandbox()["id"]
            clients[setting] = stack.enter_context(
                httpx.Client(
                    base_url=f"{server.base_url}/v1/sandboxes/{sandbox_id}/proxy/44772",
                    headers={"OPEN-SANDBOX-API-KEY": server.api_key},
                    timeout=120,
                    trust_env=False,
                )
            )
        rows: dict[str, dict[str, list[float]]] = {setting: {} for setting in SETTINGS}
        for setting in SETTINGS:  # warm every path
            for _ in range(10):
                _command(clients[setting], TRUE)
        for round_number in range(ROUNDS):
            order = SETTINGS if round_number % 2 == 0 else tuple(reversed(SETTINGS))
            for setting in order:
                pid = servers[setting].process.pid  # type: ignore[union-attr]
                cpu = _cpu_s(pid)
                rows[setting].setdefault("true", []).extend(
                    _timed(lambda c=clients[setting]: _command(c, TRUE), RUNS)
                )
                rows[setting].setdefault("cpu", []).append((_cpu_s(pid) - cpu) / RUNS)
        loop = {
            "command": f"i=0; while [ $i -lt {EXECS} ]; do /bin/true; i=$((i+1)); done",
            "timeout": 600_000,
        }
        for setting in SETTINGS:
            pid = servers[setting].process.pid  # type: ignore[union-attr]
            cpu = _cpu_s(pid)
            _command(clients[setting], loop)
            lines = _settle(servers[setting].state_dir / "audit.jsonl")
            rows[setting]["exec_cpu"] = [(_cpu_s(pid) - cpu) / EXECS]
            rows[setting]["lines"] = [lines]
    _report(rows)


def _settle(audit: Path) -> int:
    """Wait (bounded) until the audit file stops growing: the watcher has written the loop's
    records; its line count then."""
    size = -1
    for _ in range(600):
        now = audit.stat().st_size
        if now == size:
            break
        size = now
        time.sleep(0.5)
    return sum(1 for _ in audit.open("rb"))


def _report(rows: dict[str, dict[str, list[float]]]) -> None:
    print(f"exec audit trail: {RUNS} x {ROUNDS} command round trips per setting, {EXECS} execs per sandbox")
    base = statistics.median(rows["off"]["true"])
    for setting in SETTINGS:
        row = rows[setting]
        p50, p95 = statistics.median(row["true"]) * 1000, _p(row["true"], 0.95) * 1000
        print(
            f"  exec_audit={setting:<9} command round trip p50 {p50:6.2f} ms p95 {p95:6.2f} ms "
            f"({statistics.median(row['true']) / base:.2f}x off) | serve CPU/command "
            f"{statistics.median(row['cpu']) * 1e3:5.2f} ms | serve CPU per exec in the sandbox "
            f"{row['exec_cpu'][0] * 1e6:6.0f} us | audit lines {int(row['lines'][0])}"
        )


if __name__ == "__main__":
    if os.environ.get(CHILD_FLAG) == "1":
        _child()
    else:
        main()
