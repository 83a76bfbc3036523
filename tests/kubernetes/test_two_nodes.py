"""Two nodes on one machine (`SANDGATE_CLUSTER_NODES=2`, scripts/cluster/up.sh `add_node`): the
second node's own kubelet and containerd join node 1's API server, Pods land on both, each node
walls its own Pods, and the teardown leaves nothing of either.

Proof from the other side: where a Pod runs is read from the node's own containerd (its
container id in that containerd's list), its address from inside the container and from the
host's connection to it; the walls from each node's nft counter; the teardown against what both
nodes were seen to hold while they ran.
"""

from __future__ import annotations

import ipaddress
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube import Client
from lightkube.models.core_v1 import Container, PodSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node, Pod

from tests.kubernetes.cluster import (
    BUSYBOX_IMAGE,
    SCRIPTS,
    Cluster,
    running_cluster,
    skip_unless_built,
    up_to_a_build,
    wait_for_pod,
)
from tests.kubernetes.test_cluster import (
    alive,
    cgroup_hierarchies,
    cluster_processes,
    connect_with_retry,
    dropped_pod_packets,
    links,
    mounts_under,
    node_nft_tables,
)

pytestmark = pytest.mark.root
skip_unless_built()

# scripts/cluster/common.sh: node 1 and node 2, their addresses and Pod ranges
NODES = {
    "sandgate-node": ("10.231.0.2", ipaddress.ip_network("10.232.0.0/24")),
    "sandgate-node-2": ("10.231.0.6", ipaddress.ip_network("10.232.1.0/24")),
}
HOST_LINK_IP = "10.231.0.1"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("cluster") / "state", SANDGATE_CLUSTER_NODES="2") as handle:
        yield handle


def node_netns(cluster: Cluster, node: str) -> str:
    return cluster.netns if node == "sandgate-node" else f"{cluster.netns}-n2"


def node_containers(cluster: Cluster, node: str) -> str:
    """The container list of `node`'s own containerd."""
    root = cluster.state_dir if node == "sandgate-node" else cluster.state_dir / "nodes" / "2"
    built = subprocess.run(["bash", str(SCRIPTS / "build.sh"), "--cached"], capture_output=True, text=True)
    ctr = Path(built.stdout.strip()) / "ctr"
    command = [str(ctr), "--address", str(root / "containerd" / "containerd.sock"), "-n", "k8s.io"]
    return subprocess.run(
        [*command, "containers", "list", "-q"], capture_output=True, text=True, check=True
    ).stdout


def run_on(client: Client, node: str, name: str, script: str) -> Pod:
    """A busybox Pod that the scheduler must place on `node` (its hostname label), once Running."""
    container = Container(name="main", image=BUSYBOX_IMAGE, imagePullPolicy="Never",
                          command=["/bin/busybox", "sh", "-c", script])  # fmt: skip
    spec = PodSpec(restartPolicy="Never", automountServiceAccountToken=False, containers=[container],
                   nodeSelector={"kubernetes.io/hostname": node})  # fmt: skip
    client.create(Pod(metadata=ObjectMeta(name=name), spec=spec), namespace="default")
    return wait_for_pod(client, name, ("Running", "Succeeded", "Failed"), timeout=180)


@up_to_a_build
def test_both_nodes_are_ready_at_their_own_addresses(client: Client) -> None:
    for name, (address, _) in NODES.items():
        node = client.get(Node, name)
        assert node.status is not None and node.status.conditions is not None
        assert {c.type: c.status for c in node.status.conditions}["Ready"] == "True", name
        assert [a.address for a in node.status.addresses or [] if a.type == "InternalIP"] == [address]


@up_to_a_build
def test_pods_land_on_both_nodes_and_the_host_reaches_each(cluster: Cluster, client: Client) -> None:
    for node, (_, pod_cidr) in NODES.items():
        name = f"where-{secrets.token_hex(4)}"
        pod = run_on(client, node, name, "busybox nc -l -p 7000 -e busybox ip -4 -o addr show eth0")
        assert pod.status is not None and pod.status.podIP is not None, pod.status
        assert pod.spec is not None and pod.spec.nodeName == node
        assert ipaddress.ip_address(pod.status.podIP) in pod_cidr
        answer = connect_with_retry((pod.status.podIP, 7000), timeout=30).decode()
        assert f"inet {pod.status.podIP}/" in answer, answer  # the Pod's own word on its address
        container_id = (pod.status.containerStatuses or [])[0].containerID or ""
        assert container_id.removeprefix("containerd://") in node_containers(cluster, node)
        others = [other for other in NODES if other != node]
        assert container_id.removeprefix("containerd://") not in node_containers(cluster, others[0])


@up_to_a_build
def test_each_node_walls_its_own_pods(cluster: Cluster, client: Client) -> None:
    """A Pod on node 2 cannot reach the host's end of node 1's link; node 2 counts the drop."""
    netns = node_netns(cluster, "sandgate-node-2")
    dropped_before = dropped_pod_packets(netns)
    script = f'busybox nc -w 5 {HOST_LINK_IP} 9 </dev/null; echo "egress=$?"'
    name = f"egress-{secrets.token_hex(4)}"
    run_on(client, "sandgate-node-2", name, script)
    ended = wait_for_pod(client, name, ("Succeeded", "Failed"), timeout=60)
    assert ended.status is not None and ended.status.phase == "Succeeded", ended.status
    output = "\n".join(client.log(name, namespace="default"))
    assert "egress=" in output and "egress=0" not in output, output
    assert dropped_pod_packets(netns) > dropped_before


@up_to_a_build
def test_teardown_leaves_nothing_of_either_node(cluster: Cluster, client: Client) -> None:
    for node in NODES:
        pod = run_on(client, node, f"sleeper-{secrets.token_hex(4)}", "exec busybox sleep 3600")
        assert pod.status is not None and pod.status.phase == "Running", pod.status
    namespaces = [node_netns(cluster, node) for node in NODES]
    processes = cluster_processes(cluster.cgroup)
    assert len(processes) >= 14, (
        processes
    )  # 6 daemons, node 2's containerd and kubelet, 2 x (shim, pause, sleep)
    node2_cgroup = [hierarchy / cluster.cgroup / "node-2" for hierarchy in cgroup_hierarchies()]
    assert any(path.exists() for path in node2_cgroup)
    mounts = mounts_under(cluster.state_dir / "nodes" / "2")
    assert any("/rootfs" in point for point in mounts), mounts
    for netns in namespaces:
        assert "table inet sandgate_cluster" in node_nft_tables(netns)

    result = cluster.down()
    assert result.returncode == 0, result.stderr
    assert "killing" not in result.stderr, f"down.sh had to force processes: {result.stderr}"

    assert not {process for process in processes if alive(process)}
    assert not mounts_under(cluster.state_dir)
    assert not any(Path(f"/run/netns/{netns}").exists() for netns in namespaces)
    assert not any(link.startswith(f"sgk8s-{cluster.cluster_id}") for link in links("veth"))
    assert not any((hierarchy / cluster.cgroup).exists() for hierarchy in cgroup_hierarchies())
    assert not cluster.state_dir.exists()
    routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True, check=True).stdout
    assert not any(str(cidr) in routes for _, cidr in NODES.values()) and "10.231.0.4/30" not in routes
