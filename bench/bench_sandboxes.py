"""Local sandboxes: create-to-ready (execd /ping 200) and teardown time; many sandboxes at once.

Runs as root in a network namespace of its own (the module re-executes itself after unshare), so
nothing touches the machine's network. Bounded: SEQUENTIAL sandboxes one after another (runtime
level, with execd's CPU time to its first /ping), then SEQUENTIAL creates through the real
control plane (`Service.create`: proxy push, runtime, ready, store) cold and from the warm pool,
then CONCURRENT alive at once (created by a few threads), each step with a timeout; everything
is torn down in `finally`. Set SANDGATE_BENCH_SANDBOXES to change CONCURRENT.
"""

from __future__ import annotations

import os
import secrets
import statistics
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.sandbox_rig import own_network, row, run_as_root_child

SEQUENTIAL = 30
CONCURRENT = int(os.environ.get("SANDGATE_BENCH_SANDBOXES", "200"))
CREATE_THREADS = 6
READY_TIMEOUT = 60.0
CHILD_FLAG = "SANDGATE_BENCH_SANDBOXES_CHILD"
WARM_POOL = 2


def main() -> None:
    run_as_root_child("bench.bench_sandboxes", CHILD_FLAG, "netns, nftables, mounts, cgroups")


def _child() -> None:
    networks = own_network("sgb")
    from sandgate.lifecycle.images import ImageStore
    from sandgate.lifecycle.runtime.base import SandboxSpec
    from sandgate.lifecycle.runtime.local import LocalRuntime

    state_dir = Path(tempfile.mkdtemp(prefix="sandgate-bench-"))
    runtime = LocalRuntime(state_dir, ImageStore(state_dir / "images"), instance=networks.instance)
    alive: list[str] = []

    def create(sandbox_id: str) -> tuple[float, float, float, float]:
        start = time.perf_counter()
        net = networks.create(sandbox_id)
        alive.append(sandbox_id)
        built = time.perf_counter()
        runtime.create(SandboxSpec(sandbox_id, "sandgate/host", ["sleep", "3600"]), net)
        launched = time.perf_counter()
        runtime.wait_ready(sandbox_id, net, timeout=READY_TIMEOUT)
        ready = time.perf_counter()
        cpu = _execd_cpu_ms(f"sandgate-{networks.instance}-{sandbox_id}")
        return built - start, launched - built, ready - start, cpu

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
        row("network create", [t[0] for t in timings])
        row("runtime launch", [t[1] for t in timings])
        row("create-to-ready", [t[2] for t in timings])
        row("teardown", teardowns)
        cpu = sorted(t[3] for t in timings)
        print(
            f"  {'execd CPU to first /ping':<28} p50 {statistics.median(cpu):7.1f} ms   max {cpu[-1]:7.1f} ms"
        )

        started = time.perf_counter()
        with ThreadPoolExecutor(CREATE_THREADS) as pool:
            ready = list(pool.map(create, [f"many{index}" for index in range(CONCURRENT)]))
        elapsed = time.perf_counter() - started
        memory = sum(_memory_bytes(f"sandgate-{networks.instance}-{sandbox_id}") for sandbox_id in alive)
        print(
            f"{CONCURRENT} alive at once: all ready after {elapsed:.1f} s ({CREATE_THREADS} creating threads)"
        )
        row("create-to-ready under load", [t[2] for t in ready])
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
    _through_the_service()


def _through_the_service() -> None:
    """Cold and warm-pool creates through the real control plane (proxy, store, runtime)."""
    from sandgate.lifecycle.service import CreateRequest, Service
    from sandgate.lifecycle.settings import load_settings
    from sandgate.lifecycle.wiring import build_components

    state_dir = Path(tempfile.mkdtemp(prefix="sandgate-bench-service-"))
    settings = load_settings(
        state_dir=state_dir, nft_table=f"sgbench_{secrets.token_hex(3)}", iface_prefix="sgs"
    )
    parts = build_components(settings, api_key=secrets.token_urlsafe(16))
    request = CreateRequest(
        image="sandgate/host", entrypoint=["sleep", "3600"], env={"GREETING": "hi"}, metadata={},
        extensions={}, platform=None, resource_limits={"memory": "512Mi"}, timeout=None,
        network_policy={"egress": [{"action": "allow", "target": "api.example.com"}]}, credential_proxy=False,
    )  # fmt: skip
    warm: Service | None = None
    try:
        parts.supervisor.start()
        parts.service.start()
        cold = _creates(parts.service, request, None)
        warm = Service(
            parts.service.store, networks=parts.service.networks, runtime=parts.service.runtime,
            egress=parts.service.egress, check_image=parts.service.check_image,
            ca_cert=parts.service.ca_cert, warm_pool_size=WARM_POOL,
        )  # fmt: skip
        warm.start()
        pooled = _creates(warm, request, warm)
        print(f"through the control plane (Service.create, proxy + store), {SEQUENTIAL} each:")
        row("create-to-ready, cold", cold[0])
        row("create-to-ready, warm pool", pooled[0])
        row("teardown", cold[1] + pooled[1])
        row("pool refill (background)", pooled[2])
    finally:
        if warm is not None:
            warm.stop()
        for record in parts.service.list_sandboxes():
            parts.service.delete(record.id)
        parts.close()
        parts.service.networks.remove_table()  # type: ignore[attr-defined]
        subprocess.run(["rm", "-rf", str(state_dir)], check=False)


def _creates(service: Any, request: Any, pooled: Any) -> tuple[list[float], list[float], list[float]]:
    """SEQUENTIAL creates and deletes; with a pool, each create waits for a full pool first."""
    ready, teardowns, refills = [], [], []
    for _ in range(SEQUENTIAL):
        if pooled is not None:
            started = time.perf_counter()
            if not pooled.pool.wait_full(READY_TIMEOUT):
                raise RuntimeError("the warm pool did not fill")
            refills.append(time.perf_counter() - started)
        started = time.perf_counter()
        record = service.create(request)
        ready.append(time.perf_counter() - started)
        if pooled is not None and record.id in pooled.pool.members():
            raise RuntimeError("a claimed sandbox is still in the pool")
        started = time.perf_counter()
        service.delete(record.id)
        teardowns.append(time.perf_counter() - started)
    return ready, teardowns, refills[1:]


def _execd_cpu_ms(cgroup: str) -> float:
    """User + system CPU execd has used (read right after its first /ping 200). bwrap's argv
    names execd too, but execd is the process of the sandbox that used the most CPU."""
    used = [0.0]
    for pid in Path("/sys/fs/cgroup/pids", cgroup, "cgroup.procs").read_text().split():
        try:
            if b"sandgate.execd" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                continue
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        used.append((int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK"))
    return max(used)


def _memory_bytes(cgroup: str) -> int:
    try:
        return int(Path("/sys/fs/cgroup/memory", cgroup, "memory.usage_in_bytes").read_text())
    except (FileNotFoundError, ValueError):
        return 0


if __name__ == "__main__" and os.environ.get(CHILD_FLAG) == "1":
    _child()
