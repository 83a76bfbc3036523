"""Local sandboxes: create-to-ready (execd /ping 200) and teardown time; many sandboxes at once.

Runs as root in a network namespace of its own (the module re-executes itself after unshare), so
nothing touches the machine's network. Bounded: SEQUENTIAL sandboxes one after another, then
CONCURRENT alive at once (created by a few threads), each step with a timeout; everything is torn
down in `finally`. Set SANDGATE_BENCH_SANDBOXES to change CONCURRENT.
"""

from __future__ import annotations

import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from ipaddress import IPv4Network
from pathlib import Path

SEQUENTIAL = 30
CONCURRENT = int(os.environ.get("SANDGATE_BENCH_SANDBOXES", "200"))
CREATE_THREADS = 6
READY_TIMEOUT = 60.0
CHILD_FLAG = "SANDGATE_BENCH_SANDBOXES_CHILD"


def main() -> None:
    if os.geteuid() != 0:
        print("bench_sandboxes: needs root (netns, nftables, mounts, cgroups); skipped")
        return
    env = {**os.environ, CHILD_FLAG: "1"}
    subprocess.run([sys.executable, "-m", "bench.bench_sandboxes"], env=env, check=True, timeout=1800)


def _child() -> None:
    os.unshare(os.CLONE_NEWNET)
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    from sandgate.lifecycle.images import ImageStore
    from sandgate.lifecycle.network import SandboxNetworks
    from sandgate.lifecycle.runtime.base import SandboxSpec
    from sandgate.lifecycle.runtime.local import LocalRuntime

    state_dir = Path(tempfile.mkdtemp(prefix="sandgate-bench-"))
    networks = SandboxNetworks(
        table=f"sgbench_{secrets.token_hex(3)}",
        iface_prefix="sgb",
        address_pool=IPv4Network("10.213.0.0/16"),
        instance=secrets.token_hex(3),
    )
    networks.ensure_table()
    runtime = LocalRuntime(state_dir, ImageStore(state_dir / "images"), instance=networks.instance)
    alive: list[str] = []

    def create(sandbox_id: str) -> tuple[float, float, float]:
        start = time.perf_counter()
        net = networks.create(sandbox_id)
        alive.append(sandbox_id)
        built = time.perf_counter()
        runtime.create(SandboxSpec(sandbox_id, "sandgate/host", ["sleep", "3600"]), net)
        launched = time.perf_counter()
        runtime.wait_ready(sandbox_id, net, timeout=READY_TIMEOUT)
        return built - start, launched - built, time.perf_counter() - start

    def teardown(sandbox_id: str) -> float:
        start = time.perf_counter()
        runtime.delete(sandbox_id)
        networks.destroy(sandbox_id)
        alive.remove(sandbox_id)
        return time.perf_counter() - start

    try:
        timings = []
        teardowns = []
        for index in range(SEQUENTIAL):
            timings.append(create(f"seq{index}"))
            teardowns.append(teardown(f"seq{index}"))
        print(f"sequential, {SEQUENTIAL} sandboxes (sandgate/host, execd + sleep):")
        _row("network create", [t[0] for t in timings])
        _row("runtime launch", [t[1] for t in timings])
        _row("create-to-ready", [t[2] for t in timings])
        _row("teardown", teardowns)

        started = time.perf_counter()
        with ThreadPoolExecutor(CREATE_THREADS) as pool:
            ready = list(pool.map(create, [f"many{index}" for index in range(CONCURRENT)]))
        elapsed = time.perf_counter() - started
        memory = sum(_memory_bytes(f"sandgate-{networks.instance}-{sandbox_id}") for sandbox_id in alive)
        print(
            f"{CONCURRENT} alive at once: all ready after {elapsed:.1f} s ({CREATE_THREADS} creating threads)"
        )
        _row("create-to-ready under load", [t[2] for t in ready])
        print(f"  memory (cgroup usage) {memory / len(alive) / 2**20:.1f} MiB per sandbox")
        started = time.perf_counter()
        for sandbox_id in list(alive):
            teardown(sandbox_id)
        print(f"  teardown of all {CONCURRENT}: {time.perf_counter() - started:.1f} s")
    finally:
        for sandbox_id in list(alive):
            teardown(sandbox_id)
        networks.remove_table()
        subprocess.run(["rm", "-rf", str(state_dir)], check=False)


def _row(label: str, seconds: list[float]) -> None:
    ordered = sorted(seconds)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    print(f"  {label:<28} p50 {statistics.median(ordered) * 1000:7.1f} ms   p95 {p95 * 1000:7.1f} ms")


def _memory_bytes(cgroup: str) -> int:
    try:
        return int(Path("/sys/fs/cgroup/memory", cgroup, "memory.usage_in_bytes").read_text())
    except (FileNotFoundError, ValueError):
        return 0


if __name__ == "__main__" and os.environ.get(CHILD_FLAG) == "1":
    _child()
