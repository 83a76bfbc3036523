"""What the sandbox benchmarks share: how they run, reach sandgate and report.

Rules: a benchmark that builds sandboxes runs as root in a child process moved into a network
namespace of its own (so nothing touches the machine's network) and drives a real `sandgate
serve` (tests.support.server: its own nft table, interface prefix and address pool) through the
HTTP API, as a user's client does; it prints its timings as `row`s (p50 and p95 in milliseconds).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.support.server import SandgateServer

CREATE_TIMEOUT = 120.0
CGROUP_ROOT = Path("/sys/fs/cgroup")


def run_as_root_child(module: str, child_flag: str, needs: str) -> None:
    """Re-run `module` with `child_flag`=1 (the child does the work), or say why it is skipped."""
    name = module.rsplit(".", 1)[-1]
    if os.geteuid() != 0:
        print(f"{name}: needs root ({needs}); skipped")
        return
    env = {**os.environ, child_flag: "1"}
    subprocess.run([sys.executable, "-m", module], env=env, check=True, timeout=1800)


def enter_own_netns() -> None:
    """Move this process into a fresh netns with only lo (up): nothing reaches the machine's network."""
    os.unshare(os.CLONE_NEWNET)
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)


def create_timed(server: SandgateServer, body: dict[str, Any]) -> tuple[dict[str, Any], float]:
    """`POST /v1/sandboxes` (answered 202 once execd is ready): the sandbox's JSON and the wall time."""
    with server.client(timeout=CREATE_TIMEOUT) as client:
        started = time.perf_counter()
        response = client.post("/v1/sandboxes", json=body)
        took = time.perf_counter() - started
    if response.status_code != 202:
        raise RuntimeError(f"create answered {response.status_code}: {response.text}")
    return response.json(), took


def delete_timed(server: SandgateServer, sandbox_id: str) -> float:
    """`DELETE /v1/sandboxes/{id}`: its wall time."""
    with server.client(timeout=CREATE_TIMEOUT) as client:
        started = time.perf_counter()
        client.delete(f"/v1/sandboxes/{sandbox_id}").raise_for_status()
        return time.perf_counter() - started


def sandbox_cgroup(controller: str, sandbox_id: str) -> Path:
    """The sandbox's cgroup for `controller` (cgroup v1; under v2 the one unified cgroup)."""
    pattern = f"sandgate-*-{sandbox_id}"
    (found,) = [*CGROUP_ROOT.glob(f"{controller}/{pattern}"), *CGROUP_ROOT.glob(pattern)]
    return found


def row(label: str, seconds: list[float]) -> None:
    ordered = sorted(seconds)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    print(f"  {label:<28} p50 {statistics.median(ordered) * 1000:7.1f} ms   p95 {p95 * 1000:7.1f} ms")
