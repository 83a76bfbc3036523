"""The adversarial cases that concern the node, for a sandbox on EACH node of the two-node cluster
(issue 41): no way out but its own node's proxy, no secret in it or in the cluster's objects,
nothing of the node visible. The world of test_two_node_proxies (its fixtures, by name: one
`sandgate serve --runtime kubernetes` out of the cluster, an agent per node, one sandbox per node,
here under the bearer policy); every case runs once per node, its probes inside the sandbox
through execd (the SDK, as a user drives it), with the busybox of the sandbox's image.

Evidence from the other side: each node's nft counters (every kind of drop has its own), the
origin's log (what arrived, from which node address, with which credential), the other node's
sandbox and a plain Pod listening and recording who came (and the host reaching them, the control),
the node's own audit file, the API server's objects and etcd's files, the node's processes and
files as the host sees them. Each probe has a control that must pass: a counter that moved, a
planted needle the scan finds, a listener the host reaches.
"""

from __future__ import annotations

import ipaddress
import json
import secrets
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from pathlib import Path

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import ConfigMap, Pod, Secret
from opensandbox import SandboxSync
from opensandbox.models.execd import RunCommandOpts

from sandgate.lifecycle.node_client import PodPlacement
from sandgate.lifecycle.runtime.kubernetes_execd import launch_command
from tests.kubernetes import test_two_node_proxies as two_nodes
from tests.kubernetes.cluster import Cluster, up_to_a_build
from tests.kubernetes.serving import (
    AGENT_PORT,
    Agent,
    assert_dropped_and_counted,
    icmp_probes,
    node_counters,
    node_probes,
)
from tests.kubernetes.test_node_proxy import OK, POLICY, SECRET, SHELL_PORT, http_get, pod_sh, start_shell_pod
from tests.kubernetes.test_runtime import connection, execd_token
from tests.kubernetes.test_two_node_proxies import NODES, Placed, arrived, node_audit, node_netns, sandbox_pod
from tests.support.internet import Internet
from tests.support.server import SandgateServer

pytestmark = pytest.mark.root

# test_two_node_proxies' world, by name: the two-node cluster, its client, the test internet routed
# to both nodes, an agent per node, the server with the bound value, one sandbox per node
cluster, client, internet = two_nodes.cluster, two_nodes.client, two_nodes.internet
agents, server, placed = two_nodes.agents, two_nodes.server, two_nodes.placed

VICTIM_PORT = 7777
EXECD_PYTHON = " ".join(launch_command([])[:4])  # the Python every sandbox Pod has, execd's
# The mount points a sandbox Pod has (the runtime's, the kubelet's, and the runtime's masks of /proc
# and /sys): anything else mounted in would be something of the node's.
POD_MOUNTS = ("/", "/.sandgate", "/run/sandgate", "/workspace", "/etc/hosts", "/etc/hostname",
              "/etc/resolv.conf", "/dev/termination-log")  # fmt: skip
POD_MOUNT_TREES = ("/proc", "/dev", "/sys")
# The node's own programs, by a word of their command lines (the host sees them; a sandbox must not)
NODE_PROGRAMS = ("kubelet", "containerd", "node-proxy", "kube-apiserver", "etcd", "mitmdump")


@dataclass
class OnNode:
    """The sandbox on one node, as a user drives it (execd, through the SDK), and its node."""

    node: str
    placed: Placed
    sandbox: SandboxSync
    agent: Agent
    netns: str
    neighbour: PodPlacement  # a plain Pod on the same node

    @property
    def node_ip(self) -> str:
        return NODES[self.node][0]

    @property
    def gateway(self) -> str:
        return str(ipaddress.ip_network(NODES[self.node][1]).network_address + 1)

    def sh(self, command: str, timeout: float = 60) -> str:
        """Run `command` in the sandbox; its output (stdout and stderr) and `status=N`, as pod_sh's."""
        opts = RunCommandOpts(timeout=timedelta(seconds=timeout))
        execution = self.sandbox.commands.run(f'{{ {command}; }} 2>&1; echo "status=$?"', opts=opts)
        return "\n".join(m.text for m in [*execution.logs.stdout, *execution.logs.stderr])


@pytest.fixture(scope="module")
def under_policy(server: SandgateServer, placed: dict[str, Placed]) -> dict[str, Placed]:
    """Both sandboxes under the bearer policy (api.example.com allowed, its credential injected),
    so each has a way out to prove: its node's proxy."""
    with server.client(timeout=60) as api:
        for sandbox in placed.values():
            path = f"/v1/sandboxes/{sandbox.sandbox_id}/egress/sandgate-policy"
            answer = api.put(path, json={"policy": POLICY})
            assert answer.status_code == 200, answer.text
    return placed


@pytest.fixture(scope="module")
def sandboxes(server: SandgateServer, under_policy: dict[str, Placed]) -> Iterator[dict[str, SandboxSync]]:
    """Each node's sandbox through the SDK, listening on VICTIM_PORT and recording each connection in
    /workspace/hits (busybox nc runs a script per connection); the host reaches each listener (the
    control), then the hits are forgotten."""
    found = {node: SandboxSync.connect(p.sandbox_id, connection_config=connection(server))
             for node, p in under_policy.items()}  # fmt: skip
    try:
        for node, sandbox in found.items():
            sandbox.files.write_file(
                "/workspace/hit.sh", "#!/bin/sh\necho hit >> /workspace/hits\necho victim\n"
            )
            listen = f"busybox nc -ll -p {VICTIM_PORT} -e /bin/sh /workspace/hit.sh"
            started = sandbox.commands.run(f"touch /workspace/hits; ({listen} >/dev/null 2>&1 &)")
            assert started.exit_code == 0, started
            address = under_policy[node].pod_ip
            answer = listener_answer(address, VICTIM_PORT)
            assert "victim" in answer, (node, answer)
            sandbox.commands.run(": > /workspace/hits")
        yield found
    finally:
        for sandbox in found.values():
            sandbox.close()


def listener_answer(address: str, port: int) -> str:
    """What a listener at address:port answers the host (bounded, retried while it starts)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            with socket.create_connection((address, port), timeout=5) as connection_:
                connection_.settimeout(10)
                return connection_.recv(100).decode(errors="replace")
        except OSError:
            assert time.monotonic() < deadline, f"nothing listens at {address}:{port}"
            time.sleep(0.5)


@pytest.fixture(scope="module")
def neighbours(client: Client) -> dict[str, PodPlacement]:
    """A plain Pod (no sandbox, no entry) on each node, serving a shell the host reaches."""
    return {node: start_shell_pod(client, f"plain-{secrets.token_hex(3)}", node) for node in NODES}


@pytest.fixture(scope="module", params=list(NODES))
def on_node(
    request: pytest.FixtureRequest,
    cluster: Cluster,
    agents: dict[str, Agent],
    under_policy: dict[str, Placed],
    sandboxes: dict[str, SandboxSync],
    neighbours: dict[str, PodPlacement],
) -> OnNode:
    node = request.param
    return OnNode(node, under_policy[node], sandboxes[node], agents[node], node_netns(cluster, node),
                  neighbours[node])  # fmt: skip


def other_node(node: str) -> str:
    return next(name for name in NODES if name != node)


@up_to_a_build
def test_the_only_way_out_is_the_nodes_own_proxy(on_node: OnNode, internet: Internet) -> None:
    """The control of every case below: the allowed host answers, through the node's own proxy
    (the origin saw the request from this node's address, with the injected credential, which the
    sandbox never saw); a denied host gets the proxy's 403 and never reaches the origin."""
    nonce = secrets.token_hex(4)
    allowed = on_node.sh(http_get("api.example.com", f"/echo/adv-allowed-{nonce}"))
    assert OK in allowed, f"{allowed}\n{on_node.agent.evidence()}"
    assert SECRET not in allowed
    denied = on_node.sh(http_get("denied.example.com", f"/echo/adv-denied-{nonce}"))
    assert "HTTP/1.1 403" in denied, denied
    (request,) = arrived(internet, f"/echo/adv-allowed-{nonce}")
    assert str(request["client"]).startswith(f"{on_node.node_ip}:"), request
    headers = request["headers"]
    assert isinstance(headers, dict) and headers["authorization"] == f"Bearer {SECRET}"
    assert arrived(internet, f"/echo/adv-denied-{nonce}") == []


@up_to_a_build
def test_the_node_and_the_pod_beside_it_are_out_of_reach(on_node: OnNode) -> None:
    """The API server and kubelet ports, every node port but the proxy's, the metadata range, the
    plain Pod on the same bridge, other UDP, ICMP, IPv6: each fails in the sandbox and moves its
    own counter on this node (test_node_proxy's probes, here from a sandbox of the server)."""
    probes = node_probes(
        on_node.node_ip, on_node.gateway, on_node.neighbour.pod_ip, SHELL_PORT, on_node.netns
    )
    assert_dropped_and_counted(on_node.netns, on_node.sh, probes)
    # ICMP: the sandbox's own kernel refuses to make it (no NET_RAW, no unprivileged ICMP); a Pod
    # that may (the plain one beside it) has it dropped and counted by the node
    refused = on_node.sh(f"busybox ping -c 1 -W 2 {on_node.gateway}")
    assert "permission denied" in refused and "status=0" not in refused, refused
    neighbour_sh = partial(pod_sh, on_node.neighbour.pod_ip)
    assert_dropped_and_counted(on_node.netns, neighbour_sh, icmp_probes(on_node.gateway))
    assert "status=0" in pod_sh(on_node.neighbour.pod_ip, "true")  # alive: only the Pod-to-Pod path is closed


@up_to_a_build
def test_the_other_node_and_its_pods_are_out_of_reach(
    on_node: OnNode,
    under_policy: dict[str, Placed],
    sandboxes: dict[str, SandboxSync],
    neighbours: dict[str, PodPlacement],
) -> None:
    """The other node's API server, kubelet and agent ports, its sandbox and its plain Pod, and the
    API server's Service address are not on this node: a connect to them lands at this node's
    proxy, which refuses the IP literal (403, its audit says why) before anything reaches them; the
    other sandbox's listener heard nothing (the host reached it: the control), UDP to it is dropped
    here (counted)."""
    other = other_node(on_node.node)
    victim = under_policy[other]
    targets = [(NODES[other][0], port) for port in (6443, 10250, AGENT_PORT)]
    targets += [(victim.pod_ip, VICTIM_PORT), (neighbours[other].pod_ip, SHELL_PORT)]
    # the API server's Service address: Kubernetes puts it in every Pod's env (service links off)
    service = on_node.sh("echo $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT").splitlines()[0]
    targets.append((service.split(":")[0], int(service.split(":")[1])))
    for address, port in targets:
        request = f"GET / HTTP/1.1\\r\\nHost: {address}:{port}\\r\\nConnection: close\\r\\n\\r\\n"
        output = on_node.sh(f"{{ printf '{request}'; busybox sleep 2; }} | busybox nc -w 5 {address} {port}")
        assert output.startswith("HTTP/1.1 403"), (address, port, output)
        assert "victim" not in output
    refused = {
        str(record.get("host"))
        for record in node_audit(on_node.agent)
        if str(record.get("client", "")).startswith(f"{on_node.placed.pod_ip}:")
        and record.get("decision") == "deny"
        and record.get("reason") == "ip_literal_needs_cidr_rule"
    }
    assert {address for address, _ in targets} <= refused, refused
    before = node_counters(on_node.netns)["other"]
    on_node.sh(f"busybox timeout 3 busybox tftp -g -r probe -l /dev/null {victim.pod_ip} {VICTIM_PORT}")
    assert node_counters(on_node.netns)["other"] > before
    heard = sandboxes[other].commands.run("cat /workspace/hits")
    assert "".join(m.text for m in heard.logs.stdout) == ""
    assert "victim" in listener_answer(victim.pod_ip, VICTIM_PORT)  # it still listens: the host reaches it
    sandboxes[other].commands.run(": > /workspace/hits")


def needles(server: SandgateServer, under_policy: dict[str, Placed], agent: Agent) -> dict[str, str]:
    """What must be nowhere in a sandbox or the cluster's objects, by name: the injected
    credential, every sandbox's execd token, the node agents' bearer token and a line of their
    TLS key."""
    token_file = agent.agents.token_file
    key_lines = (token_file.parent / "agent.key").read_text().split()
    found = {"credential": SECRET, "agent token": token_file.read_text().strip(),
             "agent key": max(key_lines, key=len)}  # fmt: skip
    for node, placed in under_policy.items():
        found[f"execd token ({node})"] = execd_token(server, placed.sandbox_id)
    assert all(len(value) >= 20 for value in found.values()), found
    return found


# Runs in the sandbox (busybox sh): the needles come reversed (nothing in it, its argv or any other
# process holds one), `rev` writes them to a file; the first is a control planted in a file (after
# a NUL: busybox grep stops a line at one, so every input goes through `tr` first) and in a child's
# environment (a real exec: execd's Python, which every sandbox Pod has; busybox's applets run
# forked, with the shell's environ). It prints every file under / (but /proc, /sys, /dev) and
# every process's environ, cmdline and mountinfo that holds a needle, and the child's pid.
SCAN = """cd /workspace && printf '%s\\n' {reversed} | busybox rev > needles
{{ printf 'x\\000'; busybox head -n 1 needles; }} > control-file
CONTROL="$(busybox head -n 1 needles)" {python} -c "import time; time.sleep(300)" &
child=$!; echo "child=$child"
holds() {{ {{ busybox tr '\\000' '\\n' < "$1"; }} 2>/dev/null | busybox grep -qF -f needles && echo "$1"; }}
for d in /*; do
  case "$d" in /proc|/sys|/dev) ;; *) busybox find "$d" -type f | while read -r f; do holds "$f"; done;; esac
done
for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline /proc/[0-9]*/mountinfo; do holds "$f"; done
kill "$child"; rm needles control-file"""


@up_to_a_build
def test_no_secret_in_the_sandbox_or_its_pod(
    on_node: OnNode, server: SandgateServer, client: Client, under_policy: dict[str, Placed]
) -> None:
    """The sandbox's files, every process's environment, command line and mounts hold none of
    the needles (the control needle is found where it was planted: the scan sees); the Pod spec the
    API server has gives the sandbox no env but its id and execd's port, no service account token,
    no volume of the node or of a Secret."""
    hidden = needles(server, under_policy, on_node.agent)
    control = f"control-{secrets.token_hex(12)}"
    reversed_ = " ".join(value[::-1] for value in [control, *hidden.values()])
    output = on_node.sh(SCAN.format(reversed=reversed_, python=EXECD_PYTHON), timeout=300)
    lines = output.splitlines()
    child = next(line.split("=", 1)[1] for line in lines if line.startswith("child="))
    hits = {line for line in lines if line.startswith("/")}
    assert hits == {"/workspace/needles", "/workspace/control-file", f"/proc/{child}/environ"}, output

    pod = sandbox_pod(client, on_node.placed.sandbox_id)
    assert pod.spec is not None and pod.spec.automountServiceAccountToken is False
    for container in [*pod.spec.containers, *(pod.spec.initContainers or [])]:
        env = {variable.name for variable in container.env or []}
        assert env <= {"SANDGATE_SANDBOX_ID", "SANDGATE_EXECD_PORT"}, env
        assert not container.envFrom
    for volume in pod.spec.volumes or []:
        assert volume.emptyDir is not None, volume  # no hostPath, Secret, projected token


@up_to_a_build
def test_no_secret_in_the_cluster_objects_or_etcd(
    cluster: Cluster,
    client: Client,
    server: SandgateServer,
    under_policy: dict[str, Placed],
    agents: dict[str, Agent],
) -> None:
    """Every Pod, Secret and ConfigMap the API server returns, and every file etcd wrote (read
    raw: no encryption at rest in the test cluster), hold no needle; the control: etcd's files do
    hold both sandboxes' Pod names (the scan reads what the API server stored)."""
    hidden = needles(server, under_policy, next(iter(agents.values())))
    objects = [*client.list(Pod, namespace="*"), *client.list(Secret, namespace="*"),
               *client.list(ConfigMap, namespace="*")]  # fmt: skip
    for item in objects:
        text = json.dumps(item.to_dict())
        assert not [name for name, value in hidden.items() if value in text], item.metadata
    stored = b"".join(path.read_bytes() for path in (cluster.state_dir / "etcd").rglob("*") if path.is_file())
    for placed in under_policy.values():
        name = sandbox_pod(client, placed.sandbox_id).metadata.name  # type: ignore[union-attr]
        assert name is not None and name.encode() in stored, name
    assert not [name for name, value in hidden.items() if value.encode() in stored]


@up_to_a_build
def test_nothing_of_the_node_is_visible(on_node: OnNode, cluster: Cluster) -> None:
    """The node runs its kubelet, containerd and agent (the host sees them: the control); the
    sandbox sees its own processes only (its entrypoint's loop among them), no mount but its
    Pod's, and neither the agent's token file nor its state dir."""
    for pid in (cluster.pid("kubelet"), cluster.pid("containerd"), on_node.agent.process.pid):  # type: ignore[union-attr]
        assert Path(f"/proc/{pid}").exists()
    assert "node-proxy" in Path(f"/proc/{on_node.agent.process.pid}/cmdline").read_text()  # type: ignore[union-attr]
    listing = on_node.sh("for p in /proc/[0-9]*; do busybox tr '\\0' ' ' < $p/cmdline; echo; done")
    assert f"allowed-{on_node.placed.nonce}" in listing, listing  # its entrypoint: the listing reads
    assert not [word for word in NODE_PROGRAMS if word in listing], listing
    mounts = on_node.sh("cat /proc/self/mountinfo")
    points = {line.split()[4] for line in mounts.splitlines() if len(line.split()) > 4}
    assert "/workspace" in points, mounts
    foreign = {p for p in points if p not in POD_MOUNTS and not p.startswith(POD_MOUNT_TREES)}
    assert foreign == set(), mounts
    token_file = on_node.agent.agents.token_file
    roots = {line.split()[3] for line in mounts.splitlines() if len(line.split()) > 4}
    assert not [root for root in roots if root.startswith(str(token_file.parent))], mounts
    for path in (token_file, on_node.agent.state_dir):
        assert path.exists()
        assert "status=1" in on_node.sh(f"test -e {path}"), path
