"""Local sandboxes through the HTTP API: create-to-ready and teardown, many at once, the warm pool.

Runs as root in a network namespace of its own (the module re-executes itself after unshare),
against one real `sandgate serve` (tests.support.server), so nothing touches the machine's
network and the figures are what an API client sees. Bounded: SEQUENTIAL creates one after
another (`POST /v1/sandboxes` until its 202: network, runtime, execd /ping 200, proxy entry,
store; then `DELETE`), with execd's CPU time to its first /ping read from the sandbox's cgroup;
then CONCURRENT alive at once (created by a few threads, each with a 64 MiB disk); then
SEQUENTIAL creates against a second server with a warm pool (each after the pool is full again,
as `GET /health` reports, and each proven to be a claimed member). Everything is deleted in
`finally` (the server deletes whatever is left). Set SANDGATE_BENCH_SANDBOXES to change
CONCURRENT."""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from bench import sized
from bench.sandbox_rig import (
    create_timed,
    delete_timed,
    enter_own_netns,
    row,
    run_as_root_child,
    sandbox_cgroup,
)

if TYPE_CHECKING:
    from tests.support.server import SandgateServer

SEQUENTIAL = sized(30, 2)  # at least 2: the refill row is measured from the second create on
CONCURRENT = int(os.environ.get("SANDGATE_BENCH_SANDBOXES", sized(200, 3)))
CREATE_THREADS = 6
POOL_TIMEOUT = 60.0
CHILD_FLAG = "SANDGATE_BENCH_SANDBOXES_CHILD"
WARM_POOL = 2
CLAIMED = "claimed from the warm pool"  # the status message of a sandbox the pool handed out
REQUEST = {
    "image": {"uri": "sandgate/host"},
    "entrypoint": ["sleep", "3600"],
    "env": {"GREETING": "hi"},
    "resourceLimits": {"memory": "512Mi"},
    "networkPolicy": {"defaultAction": "deny", "egress": [{"action": "allow", "target": "api.example.com"}]},
}
# Many at once, each with a small disk: the default 2 GiB each would not be admitted past the
# state dir's free space (admission counts every disk's full size), as a user would find too.
MANY_REQUEST = {**REQUEST, "resourceLimits": {"memory": "512Mi", "disk": "64Mi"}}


def main() -> None:
    run_as_root_child("bench.bench_sandboxes", CHILD_FLAG, "netns, nftables, mounts, cgroups")


def _child() -> None:
    enter_own_netns()
    from tests.support.server import sandgate_server

    with tempfile.TemporaryDirectory(prefix="sandgate-bench-sandboxes-") as temp:
        for name in ("cold", "warm"):
            (Path(temp) / name).mkdir()
        with sandgate_server(Path(temp) / "cold") as server:
            _one_after_another(server)
            _many_at_once(server)
        pool = {"SANDGATE_WARM_POOL_SIZE": str(WARM_POOL)}
        with sandgate_server(Path(temp) / "warm", pool) as server:
            _warm_pool(server)


def _one_after_another(server: SandgateServer) -> None:
    ready, teardowns, cpu = [], [], []
    for _ in range(SEQUENTIAL):
        created, took = create_timed(server, REQUEST)
        ready.append(took)
        cpu.append(_execd_cpu_ms(created["id"]))
        teardowns.append(delete_timed(server, created["id"]))
    print(f"one after another, {SEQUENTIAL} sandboxes through the API (sandgate/host, execd + sleep):")
    row("create-to-ready", ready)
    row("teardown", teardowns)
    cpu.sort()
    print(f"  {'execd CPU to first /ping':<28} p50 {statistics.median(cpu):7.1f} ms   max {cpu[-1]:7.1f} ms")


def _many_at_once(server: SandgateServer) -> None:
    alive: list[str] = []

    def create(_: int) -> float:
        created, took = create_timed(server, MANY_REQUEST)
        alive.append(created["id"])
        return took

    try:
        started = time.perf_counter()
        with ThreadPoolExecutor(CREATE_THREADS) as pool:
            ready = list(pool.map(create, range(CONCURRENT)))
        elapsed = time.perf_counter() - started
        memory = sum(int((sandbox_cgroup("memory", i) / "memory.usage_in_bytes").read_text()) for i in alive)
        print(
            f"{CONCURRENT} alive at once (64 MiB disks): all ready after {elapsed:.1f} s "
            f"({CREATE_THREADS} creating threads)"
        )
        row("create-to-ready under load", ready)
        print(f"  memory (cgroup usage) {memory / len(alive) / 2**20:.1f} MiB per sandbox")
        started = time.perf_counter()
        while alive:
            delete_timed(server, alive.pop())
        print(f"  teardown of all {CONCURRENT}: {time.perf_counter() - started:.1f} s")
    finally:
        for sandbox_id in alive:
            delete_timed(server, sandbox_id)


def _warm_pool(server: SandgateServer) -> None:
    """SEQUENTIAL creates, each once the pool is full again (the wait is the refill row)."""
    ready, teardowns, refills = [], [], []
    for index in range(SEQUENTIAL):
        refill = _wait_pool_full(server)
        if index:  # the first wait is the pool's first fill at start-up
            refills.append(refill)
        created, took = create_timed(server, REQUEST)
        if created.get("status", {}).get("message") != CLAIMED:
            raise RuntimeError(f"the create did not claim a pool member: {created.get('status')}")
        ready.append(took)
        teardowns.append(delete_timed(server, created["id"]))
    print(f"with a warm pool of {WARM_POOL} (warm_pool_size), {SEQUENTIAL} creates through the API:")
    row("create-to-ready, warm pool", ready)
    row("teardown", teardowns)
    row("pool refill (background)", refills)


def _wait_pool_full(server: SandgateServer) -> float:
    started = time.perf_counter()
    deadline = started + POOL_TIMEOUT
    with server.client() as client:
        while (pool := client.get("/health").json()["warmPool"])["ready"] < WARM_POOL:
            if time.perf_counter() > deadline:
                raise RuntimeError(f"the warm pool did not fill in {POOL_TIMEOUT:g} s: {pool}")
            time.sleep(0.02)
    return time.perf_counter() - started


def _execd_cpu_ms(sandbox_id: str) -> float:
    """User + system CPU execd has used (read right after its first /ping 200). bwrap's argv
    names execd too, but execd is the process of the sandbox that used the most CPU."""
    used = [0.0]
    for pid in (sandbox_cgroup("pids", sandbox_id) / "cgroup.procs").read_text().split():
        try:
            if b"sandgate.execd" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                continue
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        used.append((int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK"))
    return max(used)


if __name__ == "__main__" and os.environ.get(CHILD_FLAG) == "1":
    _child()
