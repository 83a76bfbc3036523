"""gVisor beside the standard isolation, through one real `sandgate serve` (local runtime):
create-to-ready (POST /v1/sandboxes until it answers 202, execd ready), a command round trip
(`true` through the server's reverse proxy), a 100 MiB download through the egress proxy (curl
inside the sandbox, from the test internet's origin) and the CPU an idle sandbox uses (its
cgroup's cpu.stat). Only the measured sandbox is alive while it is measured: each earlier create
is deleted at once (an idle gVisor sandbox uses CPU, which would otherwise be charged to the
figures on this 2-core machine).

Goals (issue 26): gvisor create-to-ready under 1 s, round trip within 2x of standard, download
within 1.5x. `python -m bench gvisor` (root; its own netns and test internet).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import sized
from bench.sandbox_rig import enter_own_netns, row, run_as_root_child

CHILD_FLAG = "SANDGATE_BENCH_GVISOR_CHILD"
CREATES = int(os.environ.get("SANDGATE_BENCH_GVISOR_CREATES", sized(5, 1)))
ROUND_TRIPS = sized(20, 3)
DOWNLOADS = sized(3, 1)
DOWNLOAD_HOST = "download.example.com"
DOWNLOAD_MIB = sized(100, 4)
DOWNLOAD_BYTES = DOWNLOAD_MIB * 2**20
ISOLATIONS = ("standard", "gvisor")
IDLE_SECONDS = sized(5.0, 1.0)
SETTLE_SECONDS = sized(1.0, 0.2)
CGROUP_ROOT = Path("/sys/fs/cgroup")


def main() -> None:
    run_as_root_child("bench.bench_gvisor", CHILD_FLAG, "netns, nftables, mounts, cgroups, runsc")


def _child() -> None:
    enter_own_netns()
    from tests.support.internet import DNS_ADDR, ORIGIN_V4, start_internet
    from tests.support.server import sandgate_server

    with tempfile.TemporaryDirectory(prefix="sandgate-bench-gvisor-") as temp:
        for name in ("internet", "serve"):
            (Path(temp) / name).mkdir()
        with start_internet(Path(temp) / "internet") as net:
            net.set_names({DOWNLOAD_HOST: [ORIGIN_V4]})
            extra = {"SANDGATE_UPSTREAM_DNS": f'["{DNS_ADDR}"]', "SANDGATE_UPSTREAM_CA": str(net.ca_cert)}
            with sandgate_server(Path(temp) / "serve", extra) as server:
                results = {isolation: _measure(server, isolation) for isolation in ISOLATIONS}
    _report(results)


def _measure(server: Any, isolation: str) -> dict[str, list[float]]:
    body = {
        "extensions": {"sandgate.isolation": isolation},
        "networkPolicy": {"defaultAction": "deny", "egress": [{"action": "allow", "target": DOWNLOAD_HOST}]},
    }
    ready: list[float] = []
    sandbox_id = ""
    for _ in range(CREATES):
        if sandbox_id:
            _delete(server, sandbox_id)
        start = time.perf_counter()
        sandbox_id = server.create_sandbox(**body)["id"]
        ready.append(time.perf_counter() - start)
    for _ in range(3):  # warm execd's first spawns
        server.run(sandbox_id, "true")
    trips = []
    for _ in range(ROUND_TRIPS):
        start = time.perf_counter()
        assert server.run(sandbox_id, "true").exit_code == 0
        trips.append(time.perf_counter() - start)
    downloads = []
    url = f"http://{DOWNLOAD_HOST}/bytes?n={DOWNLOAD_BYTES}"
    for _ in range(DOWNLOADS):
        done = server.run(
            sandbox_id, f"curl -sS -o /dev/null -w '%{{time_total}} %{{size_download}}' {url}", 300
        )
        seconds, size = done.stdout.split()
        assert int(size) == DOWNLOAD_BYTES, done
        downloads.append(float(seconds))
    idle = _idle_cpu(sandbox_id)
    _delete(server, sandbox_id)
    load = os.getloadavg()[0]
    return {"ready": ready, "trip": trips, "download": downloads, "idle": [idle], "load": [load]}


def _delete(server: Any, sandbox_id: str) -> None:
    with server.client() as client:
        client.delete(f"/v1/sandboxes/{sandbox_id}").raise_for_status()


def _idle_cpu(sandbox_id: str) -> float:
    """Share of one core the sandbox's processes used over IDLE_SECONDS with nothing asked of
    them (user + system time of every process in its cgroup; cgroup v1 or v2)."""
    pattern = f"sandgate-*-{sandbox_id}"
    (cgroup,) = [*CGROUP_ROOT.glob(pattern), *CGROUP_ROOT.glob(f"pids/{pattern}")]
    ticks_per_s = os.sysconf("SC_CLK_TCK")

    def used_s() -> float:
        ticks = 0
        for pid in (cgroup / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):  # a process that just exited
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                ticks += int(fields[11]) + int(fields[12])  # utime, stime
        return ticks / ticks_per_s

    time.sleep(SETTLE_SECONDS)  # let the last command's exit settle
    before = used_s()
    time.sleep(IDLE_SECONDS)
    return (used_s() - before) / IDLE_SECONDS


def _report(results: dict[str, dict[str, list[float]]]) -> None:
    print("one sandgate serve, local runtime")
    for isolation, rows in results.items():
        print(f"{isolation} (load average {rows['load'][0]:.1f} after its figures):")
        row(f"create-to-ready ({CREATES})", rows["ready"])
        row(f"command round trip ({ROUND_TRIPS})", rows["trip"])
        row(f"download {DOWNLOAD_MIB} MiB ({DOWNLOADS})", rows["download"])
        print(f"  {'idle CPU (one sandbox)':<28} {rows['idle'][0] * 100:5.1f} % of a core")
    standard, gvisor = results["standard"], results["gvisor"]
    for label, key, goal in (
        ("create-to-ready", "ready", None),
        ("round trip", "trip", 2.0),
        ("download", "download", 1.5),
    ):
        ratio = statistics.median(gvisor[key]) / statistics.median(standard[key])
        target = f" (goal < {goal}x)" if goal else ""
        print(f"  gvisor/standard {label:<16} p50 {ratio:5.2f}x{target}")
    mib_s = {name: DOWNLOAD_BYTES / 2**20 / statistics.median(r["download"]) for name, r in results.items()}
    print("  download speed: " + ", ".join(f"{name} {speed:.0f} MiB/s" for name, speed in mib_s.items()))


if __name__ == "__main__":
    if os.environ.get(CHILD_FLAG) == "1":
        _child()
    else:
        main()
