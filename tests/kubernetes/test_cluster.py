"""The one-node cluster of `make cluster` (scripts/cluster/): it starts, runs a Pod from a locally
imported image, and its teardown leaves nothing behind.

Proof from the other side: the node's readiness and the Pod's output come from the API server
(kubelet's report, the container's log as kubelet serves it), and the output holds what only the
container could compute (the SHA-256 of a nonce the test made up, its own address on eth0). The
teardown is checked against what the cluster was seen to hold while it ran (its processes, mounts,
network namespace, veth, nft table, cgroups), so each check had something to find.

The cluster builds once per version (scripts/cluster/build.sh; a cold build takes long, see
docs/kubernetes.md): the module runs when the build is cached or SANDGATE_TEST_KUBERNETES=1 asks
for the build.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
import secrets
import socket
import subprocess
import time
from pathlib import Path

import pytest
from lightkube import Client
from lightkube.models.core_v1 import Container, EnvVar, PodSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node, Pod

from tests.kubernetes.cluster import (
    BUILD_TIMEOUT,
    BUSYBOX_IMAGE,
    START_TIMEOUT,
    Cluster,
    run_script,
    skip_unless_built,
    sysctls,
    up_to_a_build,
    wait_for_pod,
)

pytestmark = pytest.mark.root

NODE_NAME = "sandgate-node"
POD_CIDR = ipaddress.ip_network("10.232.0.0/24")
CNI_RESULTS = Path("/var/lib/cni/results")  # libcni's cache: containerd cannot move it
HOST_LINK_IP = "10.231.0.1"  # the host's end of the node's veth (scripts/cluster/common.sh)
skip_unless_built()


def cgroup_hierarchies() -> list[Path]:
    mounts = Path("/proc/self/mounts").read_text().splitlines()
    return [Path(fields[1]) for fields in map(str.split, mounts) if fields[2] in ("cgroup", "cgroup2")]


def cluster_processes(cgroup: str) -> set[str]:
    """PID and start time (so a reused PID is not mistaken) of every process in the cgroup."""
    found: set[str] = set()
    for hierarchy in cgroup_hierarchies():
        for procs in (hierarchy / cgroup).rglob("cgroup.procs"):
            for pid in procs.read_text().split():
                try:
                    start = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
                except FileNotFoundError:
                    continue
                found.add(f"{pid}:{start}")
    return found


def alive(process: str) -> bool:
    pid, start = process.split(":")
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19] == start
    except FileNotFoundError:
        return False


def mounts_under(path: Path) -> set[str]:
    points = (line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines())
    return {point for point in points if point == str(path) or point.startswith(f"{path}/")}


def links(kind: str) -> set[str]:
    out = subprocess.run(
        ["ip", "-o", "link", "show", "type", kind], capture_output=True, text=True, check=True
    )
    return {line.split(":")[1].strip().split("@")[0] for line in out.stdout.splitlines()}


def node_nft_tables(netns: str) -> set[str]:
    out = subprocess.run(
        ["ip", "netns", "exec", netns, "nft", "list", "tables"], capture_output=True, text=True, check=True
    )
    return set(out.stdout.splitlines())


@up_to_a_build
def test_a_start_that_fails_leaves_nothing(tmp_path: Path) -> None:
    """up.sh fails after the network, cgroups and certificates exist (its image writer fails) and
    must take them down again itself."""
    state_dir = tmp_path / "state"
    veths_before = links("veth")  # this test's namespace: no other cluster's
    failed = run_script("up.sh", state_dir, timeout=BUILD_TIMEOUT + START_TIMEOUT, PYTHON="false")
    assert failed.returncode != 0
    assert "cluster: start failed" in failed.stderr, failed.stderr
    removed = re.search(r"cluster: removed sgk8s-([0-9a-f]+)", failed.stderr)  # down.sh ran, and succeeded
    assert removed, failed.stderr
    assert not state_dir.exists()
    # its own names only: netns and cgroups are the machine's, where other clusters may run
    assert not Path(f"/run/netns/sgk8s-{removed[1]}").exists()
    assert links("veth") == veths_before
    assert not [
        hierarchy for hierarchy in cgroup_hierarchies() if (hierarchy / f"sandgate-k8s-{removed[1]}").exists()
    ]


@up_to_a_build
def test_node_is_ready(client: Client) -> None:
    node = client.get(Node, NODE_NAME)
    assert node.status is not None and node.status.conditions is not None
    ready = {condition.type: condition.status for condition in node.status.conditions}["Ready"]
    assert ready == "True"
    assert node.status.nodeInfo is not None
    assert node.status.nodeInfo.kubeletVersion.startswith("v1.")
    assert node.status.nodeInfo.containerRuntimeVersion.startswith("containerd://2.")


def run_busybox(client: Client, name: str, script: str, env: dict[str, str]) -> None:
    """Creates a Pod that runs `script` under busybox sh in the locally imported image."""
    container = Container(
        name="main",
        image=BUSYBOX_IMAGE,
        imagePullPolicy="Never",
        command=["/bin/busybox", "sh", "-c", script],
        env=[EnvVar(name=key, value=value) for key, value in env.items()],
    )
    spec = PodSpec(restartPolicy="Never", automountServiceAccountToken=False, containers=[container])
    client.create(Pod(metadata=ObjectMeta(name=name), spec=spec), namespace="default")


@up_to_a_build
def test_pod_runs_a_local_image(cluster: Cluster, client: Client) -> None:
    nonce = secrets.token_hex(16)
    name = f"echo-{nonce[:8]}"
    script = 'echo "digest=$(printf %s "$NONCE" | busybox sha256sum)"; busybox ip -4 -o addr show eth0'
    run_busybox(client, name, script, {"NONCE": nonce})
    ended = wait_for_pod(client, name, ("Succeeded", "Failed"), timeout=180)
    assert ended.status is not None
    assert ended.status.phase == "Succeeded", ended.status
    output = "\n".join(client.log(name, namespace="default"))
    digest = f"digest={hashlib.sha256(nonce.encode()).hexdigest()}"
    assert digest in output, output
    pod_ip = ended.status.podIP
    assert pod_ip is not None and ipaddress.ip_address(pod_ip) in POD_CIDR
    assert f"inet {pod_ip}/" in output, output
    # kubelet wrote the log under the cluster's own state dir, where no other cluster looks
    assert ended.metadata is not None and ended.metadata.uid is not None
    logs = list((cluster.state_dir / "pod-logs").glob(f"default_{name}_{ended.metadata.uid}/*/*.log"))
    assert logs and any(digest in log.read_text() for log in logs), logs


def connect_with_retry(address: tuple[str, int], timeout: float) -> bytes:
    """The Pod's listener starts a moment after the Pod is Running: retry, bounded."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(address, timeout=5) as connection:
                return connection.recv(100)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


@up_to_a_build
def dropped_pod_packets(netns: str) -> int:
    """The node's counter of new connections from Pods that it dropped on the way out."""
    command = ["ip", "netns", "exec", netns, "nft", "--json", "list", "table", "inet", "sandgate_cluster"]
    ruleset = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    counters = [
        expression["counter"]["packets"]
        for item in ruleset["nftables"]
        if "rule" in item
        for expression in item["rule"]["expr"]
        if "counter" in expression
    ]
    assert len(counters) == 1, ruleset
    return int(counters[0])


@up_to_a_build
def test_pod_reaches_nothing_beyond_its_node(cluster: Cluster, client: Client) -> None:
    """The host reaches the Pod (so a route exists both ways), but the Pod's own connection to the
    host's end of the link never arrives: the listener there says so, and the node counted the drop."""
    dropped_before = dropped_pod_packets(cluster.netns)
    with socket.create_server((HOST_LINK_IP, 0)) as listener:
        listener.setblocking(False)
        port = listener.getsockname()[1]
        name = f"egress-{secrets.token_hex(4)}"
        script = (
            "busybox nc -l -p 7000 -e busybox echo pong & "
            'busybox nc -w 5 "$TARGET" "$PORT" </dev/null; echo "egress=$?"; wait'
        )
        run_busybox(client, name, script, {"TARGET": HOST_LINK_IP, "PORT": str(port)})
        running = wait_for_pod(client, name, ("Running", "Succeeded", "Failed"), timeout=180)
        assert running.status is not None and running.status.podIP is not None
        assert connect_with_retry((running.status.podIP, 7000), timeout=30).strip() == b"pong"
        ended = wait_for_pod(client, name, ("Succeeded", "Failed"), timeout=60)
        output = "\n".join(client.log(name, namespace="default"))
        assert "egress=" in output and "egress=0" not in output, output
        with pytest.raises(BlockingIOError):
            listener.accept()
    assert ended.status is not None and ended.status.phase == "Succeeded", ended.status
    assert dropped_pod_packets(cluster.netns) > dropped_before


@up_to_a_build
def test_teardown_leaves_nothing(cluster: Cluster, client: Client) -> None:
    """Torn down with a Pod running, as a user would: what the cluster held must all be gone."""
    cni_results_before = set(CNI_RESULTS.glob("*"))
    name = f"sleeper-{secrets.token_hex(4)}"
    run_busybox(client, name, "exec busybox sleep 3600", {})
    running = wait_for_pod(client, name, ("Running",), timeout=180)
    assert running.status is not None and running.status.phase == "Running", running.status
    # each check below has something to find: the cluster holds it now
    processes = cluster_processes(cluster.cgroup)
    assert len(processes) >= 9, processes  # 6 daemons, a shim, pause, sleep
    mounts = mounts_under(cluster.state_dir)
    assert any("/rootfs" in point for point in mounts), mounts
    nft_tables = node_nft_tables(cluster.netns)
    assert "table inet sandgate_cluster" in nft_tables, nft_tables
    assert f"sgk8s-{cluster.cluster_id}" in links("veth")
    new_cni_results = set(CNI_RESULTS.glob("*")) - cni_results_before
    assert new_cni_results, "the running Pod has no cached CNI result"

    result = cluster.down()
    assert result.returncode == 0, result.stderr
    assert "killing" not in result.stderr, f"down.sh had to force processes: {result.stderr}"

    assert not {process for process in processes if alive(process)}
    assert not mounts_under(cluster.state_dir)
    assert not new_cni_results & set(CNI_RESULTS.glob("*"))
    assert not Path(f"/run/netns/{cluster.netns}").exists()
    assert f"sgk8s-{cluster.cluster_id}" not in links("veth")
    assert not any((hierarchy / cluster.cgroup).exists() for hierarchy in cgroup_hierarchies())
    assert not cluster.state_dir.exists()
    routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True, check=True).stdout
    assert str(POD_CIDR) not in routes
    assert sysctls() == cluster.sysctls_before
