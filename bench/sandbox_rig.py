"""What the sandbox benchmarks (bench_sandboxes, bench_docker) share: how they run and report.

Rules: a benchmark that builds sandboxes runs as root in a child process moved into a network
namespace of its own (so nothing touches the machine's network), with its own nft table and
interface prefix; it prints its timings as `row`s (p50 and p95 in milliseconds).
"""

from __future__ import annotations

import os
import secrets
import statistics
import subprocess
import sys
from ipaddress import IPv4Network
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sandgate.lifecycle.network import SandboxNetworks


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


def own_network(iface_prefix: str) -> SandboxNetworks:
    """Move this process into a fresh netns (lo up) and build sandbox networking in it."""
    enter_own_netns()
    from sandgate.lifecycle.network import SandboxNetworks

    networks = SandboxNetworks(
        table=f"sgbench_{secrets.token_hex(3)}",
        iface_prefix=iface_prefix,
        address_pool=IPv4Network("10.213.0.0/16"),
        instance=secrets.token_hex(3),
    )
    networks.ensure_table()
    return networks


def row(label: str, seconds: list[float]) -> None:
    ordered = sorted(seconds)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    print(f"  {label:<28} p50 {statistics.median(ordered) * 1000:7.1f} ms   p95 {p95 * 1000:7.1f} ms")
