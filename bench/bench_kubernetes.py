"""Kubernetes sandboxes: create-to-ready through the HTTP API on the one-node cluster of
scripts/cluster (bench_docker has local and Docker on the same machine).

Runs as root in a network namespace of its own (the module re-executes itself after unshare):
a cluster started there (tests/kubernetes/cluster.py; its build must be cached: `make
cluster-build`), the execd image imported (scripts/cluster/execd-image.sh, untimed), and one
`sandgate serve --runtime kubernetes` (tests.support.server). The sandbox image is the cluster's
imported busybox with pull policy `never`, so a create is the Pod's scheduling and start, the
init container's copy of execd, the token's hand-over and execd's first /ping, never a pull.
Bounded: SEQUENTIAL sandboxes one after another (`POST /v1/sandboxes` until its 202; then
`DELETE`, which returns once the API server has no Pod left). The cluster is torn down at the
end. Set SANDGATE_BENCH_KUBERNETES_RUNS to change SEQUENTIAL."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

from bench import sized
from bench.sandbox_rig import create_timed, delete_timed, enter_own_netns, row, run_as_root_child

SEQUENTIAL = int(os.environ.get("SANDGATE_BENCH_KUBERNETES_RUNS", sized(20, 2)))
CHILD_FLAG = "SANDGATE_BENCH_KUBERNETES_CHILD"
IMAGE = "sandgate.example.test/busybox:1"  # imported by up.sh
NAMESPACE = "sandgate-bench"


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
                body = {
                    "image": {"uri": IMAGE},
                    "entrypoint": ["/bin/busybox", "sleep", "3600"],
                    "resourceLimits": {},
                }
                for _ in range(SEQUENTIAL):
                    created, took = create_timed(server, body)
                    ready.append(took)
                    teardowns.append(delete_timed(server, created["id"]))
                print(
                    f"kubernetes runtime ({IMAGE}), {SEQUENTIAL} sandboxes one after another through the API:"
                )
                row("create-to-ready", ready)
                row("teardown", teardowns)


if __name__ == "__main__" and os.environ.get(CHILD_FLAG) == "1":
    _child()
