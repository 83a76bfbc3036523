"""Kubernetes sandboxes: create-to-ready through the HTTP API on the one-node cluster of
scripts/cluster (bench_docker has local and Docker on the same machine).

Runs as root in a network namespace of its own (the module re-executes itself after unshare):
a cluster started there (tests/kubernetes/cluster.py; its build must be cached: `make
cluster-build`), the execd image imported (scripts/cluster/execd-image.sh, untimed), and one
`sandgate serve --runtime kubernetes` (tests.support.server). The sandbox image is the cluster's
imported busybox with pull policy `never`, so a create is the Pod's scheduling and start, the
init container's copy of execd, the token's hand-over and execd's first /ping, never a pull.
Bounded: SEQUENTIAL sandboxes one after another (`POST /v1/sandboxes` until its 202; then
`DELETE`, which returns once the API server has no Pod left). Set SANDGATE_BENCH_KUBERNETES_RUNS
to change SEQUENTIAL.

Then the node agent (`sandgate node-proxy`, tests/kubernetes/serving.py: in the node's network
namespace, with the test internet as its upstream) and a second server whose sandboxes it
confines: sandboxes are created and kept, one after another, until DENSITY of them run or
DENSITY_SECONDS have passed (SANDGATE_BENCH_KUBERNETES_DENSITY, ..._DENSITY_SECONDS), or a create
fails (the node is full: its reason is printed). Measured from /proc and the cgroups, not from
sandgate: the agent's process family's RSS (the agent, its proxy's pool and workers) before the
first and after the last, per sandbox held; the Pods' memory (the cgroup kubelet puts them in)
per sandbox; create-to-ready with the agent. The cluster is torn down at the end."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from bench import sized
from bench.procfs import process_family
from bench.sandbox_rig import create_timed, delete_timed, enter_own_netns, row, run_as_root_child

if TYPE_CHECKING:
    from tests.kubernetes.cluster import Cluster

SEQUENTIAL = int(os.environ.get("SANDGATE_BENCH_KUBERNETES_RUNS", sized(20, 2)))
DENSITY = int(os.environ.get("SANDGATE_BENCH_KUBERNETES_DENSITY", sized(60, 3)))
DENSITY_SECONDS = float(os.environ.get("SANDGATE_BENCH_KUBERNETES_DENSITY_SECONDS", sized(900, 300)))
CHILD_FLAG = "SANDGATE_BENCH_KUBERNETES_CHILD"
IMAGE = "sandgate.example.test/busybox:1"  # imported by up.sh
NAMESPACE = "sandgate-bench"
MIB = 1 << 20
BODY = {"image": {"uri": IMAGE}, "entrypoint": ["/bin/busybox", "sleep", "3600"], "resourceLimits": {}}


def main() -> None:
    run_as_root_child("bench.bench_kubernetes", CHILD_FLAG, "netns, the cluster's daemons")


def _child() -> None:
    enter_own_netns()
    from lightkube import Client, KubeConfig
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import Namespace

    from tests.kubernetes.cluster import cached_build, run_script, running_cluster
    from tests.support.server import sandgate_server

    if not cached_build():
        print("kubernetes: the cluster's programs are not built (make cluster-build); skipped")
        return
    with tempfile.TemporaryDirectory(prefix="sandgate-bench-kubernetes-") as temp:
        started = time.perf_counter()
        with running_cluster(Path(temp) / "cluster") as cluster:
            imported = run_script("execd-image.sh", cluster.state_dir, timeout=600)
            if imported.returncode != 0:
                raise RuntimeError(f"execd-image.sh failed: {imported.stderr}")
            Client(config=KubeConfig.from_file(cluster.kubeconfig)).create(
                Namespace(metadata=ObjectMeta(name=NAMESPACE))
            )
            took = time.perf_counter() - started
            print(f"(cluster up and the execd image imported after {took:.1f} s, untimed)")
            settings = {"kubeconfig": str(cluster.kubeconfig), "namespace": NAMESPACE}
            env = {
                "SANDGATE_RUNTIME": "kubernetes",
                "SANDGATE_KUBERNETES": json.dumps(settings),
                "SANDGATE_IMAGE_PULL_POLICY": "never",
            }
            (Path(temp) / "server").mkdir()
            with sandgate_server(Path(temp) / "server", env) as server:
                ready, teardowns = [], []
                for _ in range(SEQUENTIAL):
                    created, took = create_timed(server, BODY)
                    ready.append(took)
                    teardowns.append(delete_timed(server, created["id"]))
                print(
                    f"kubernetes runtime ({IMAGE}), {SEQUENTIAL} sandboxes one after another through the API:"
                )
                row("create-to-ready", ready)
                row("teardown", teardowns)
            density(cluster, Path(temp))


def density(cluster: Cluster, temp: Path) -> None:
    """How many sandboxes one node holds with its agent, and what each costs the agent and the node."""
    from lightkube import Client, KubeConfig

    from tests.kubernetes.serving import internet_for, kubernetes_server, node_agent

    admin = Client(config=KubeConfig.from_file(cluster.kubeconfig))
    for name in ("internet", "agent", "agent-server"):
        (temp / name).mkdir()
    with (
        internet_for(cluster, temp / "internet", {}) as internet,
        node_agent(cluster, internet, temp / "agent") as agent,
        kubernetes_server(
            cluster, admin, agent.agents, temp / "agent-server", {"SANDGATE_IMAGE_PULL_POLICY": "never"}
        ) as server,
    ):
        assert agent.process is not None
        agent_before, pods_before = family_rss(agent.process.pid), pods_memory(cluster)
        ready: list[float] = []
        stopped_by = f"the bound of {DENSITY}"
        deadline = time.monotonic() + DENSITY_SECONDS
        while len(ready) < DENSITY:
            if time.monotonic() > deadline:
                stopped_by = f"the time bound of {DENSITY_SECONDS:.0f} s"
                break
            try:
                _, took = create_timed(server, BODY)
            except RuntimeError as refused:
                stopped_by = f"a refused create: {str(refused)[:200]}"
                break
            ready.append(took)
        held = len(ready)
        if held == 0:
            raise RuntimeError(f"the node held no sandbox: {stopped_by}")
        agent_after, pods_after = family_rss(agent.process.pid), pods_memory(cluster)
        print(f"one node with its agent held {held} sandboxes ({IMAGE}), stopped by {stopped_by}:")
        row("create-to-ready (agent)", ready)
        print(
            f"  node agent RSS {agent_before / MIB:.1f} MiB at 0, {agent_after / MIB:.1f} MiB at {held}: "
            f"{(agent_after - agent_before) / held / MIB:.2f} MiB per sandbox"
        )
        print(f"  Pods' memory {(pods_after - pods_before) / held / MIB:.1f} MiB per sandbox (cgroup usage)")


def family_rss(pid: int) -> int:
    """Bytes resident of `pid` and every process below it (/proc/<pid>/status VmRSS)."""
    total = 0
    for member in process_family(pid):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{member}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
    return total


def pods_memory(cluster: Cluster) -> int:
    """Bytes the node's Pods use: the memory cgroup kubelet puts them under (cgroup v1 or v2)."""
    for root in (Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup")):
        pods = root / cluster.cgroup / "kubepods"
        for name in ("memory.usage_in_bytes", "memory.current"):
            if (pods / name).exists():
                return int((pods / name).read_text())
    raise RuntimeError(f"no memory cgroup of the node's Pods under {cluster.cgroup}")


if __name__ == "__main__" and os.environ.get(CHILD_FLAG) == "1":
    _child()
