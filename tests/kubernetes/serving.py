"""`sandgate serve --runtime kubernetes` with the node agent on the node, for the suites that run
on Kubernetes (test_node_proxy.py, test_conformance.py, the adversarial suite with
RUNTIME=kubernetes): the test internet routed to the node, the agent (`sandgate node-proxy`) in
the node's network namespace as a DaemonSet with hostNetwork would run it, and a real server whose
sandboxes are Pods confined by it. Each part is a context manager that takes down what it made,
also when a test fails.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from lightkube import Client, KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Pod

from sandgate.lifecycle.node import COUNTERS, NODE_TABLE
from sandgate.lifecycle.node_client import NodeAgents, NodeClient
from sandgate.proxy.contract.ca import new_ca
from tests.kubernetes.cluster import Cluster, run_script, running_cluster
from tests.support.internet import DNS_ADDR, HOST_V4, ORIGIN_V4, Internet, start_internet
from tests.support.netns import ip
from tests.support.registry import Registry
from tests.support.server import SandgateServer, sandgate_server

# The test internet's names for the node-agent suites, and their policy (`bearer_policy`).
NODE_ZONE = {"api.example.com": [ORIGIN_V4], "denied.example.com": [ORIGIN_V4]}
NODE_IP = "10.231.0.2"  # scripts/cluster/common.sh
HOST_LINK_IP = "10.231.0.1"
NODE_LINK = "10.231.0.0/30"  # the node's link to the test's namespace (NODE_IP, HOST_LINK_IP)
POD_GATEWAY = "10.232.0.1"
AGENT_PORT = 15443
READY_TIMEOUT = 180.0
SANDBOX_NAMESPACE = "sandgate"


@dataclass
class Agent:
    """The node agent process, and what the server needs to reach it; in the named network
    namespace `netns`, or with None in the test's own."""

    netns: str | None
    state_dir: Path
    agents: NodeAgents
    log: Path
    process: subprocess.Popen[bytes] | None = None
    node_ip: str = NODE_IP
    pod_cidr: str = "10.232.0.0/24"

    def start(self, upstream_ca: Path) -> None:
        argv = [
            sys.executable, "-m", "sandgate.lifecycle.cli", "node-proxy",
            "--state-dir", str(self.state_dir), "--listen", f"{self.node_ip}:{AGENT_PORT}",
            "--pod-cidr", self.pod_cidr,
            "--tls-cert", str(self.state_dir.parent / "agent.crt"),
            "--tls-key", str(self.state_dir.parent / "agent.key"),
            "--token-file", str(self.agents.token_file),
            "--upstream-dns", DNS_ADDR, "--upstream-ca", str(upstream_ca),
        ]  # fmt: skip
        enter = ["nsenter", f"--net=/run/netns/{self.netns}", "--"] if self.netns else []
        with self.log.open("ab") as output:
            self.process = subprocess.Popen(
                [*enter, *argv],
                stdout=output,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            assert self.process.poll() is None, self.log.read_text()[-4000:]
            with contextlib.suppress(Exception), self.client() as node:
                if node.health()["status"] == "ok":
                    return
            assert time.monotonic() < deadline, self.log.read_text()[-4000:]
            time.sleep(0.5)

    @contextlib.contextmanager
    def client(self) -> Iterator[NodeClient]:
        node = self.agents.client(self.node_ip)
        try:
            yield node
        finally:
            node.close()

    def evidence(self) -> str:
        """The tails of the node's audit file and of the proxy's and the agent's logs."""
        tails = []
        for path in (self.state_dir / "audit.jsonl", self.state_dir / "proxy.log", self.log):
            text = path.read_text(errors="replace") if path.exists() else "(none)"
            tails.append(f"--- {path.name}\n{text[-3000:]}")
        with contextlib.suppress(Exception), self.client() as node:
            tails.append(f"--- agent: {node.health()}, holds {node.sandboxes()}")
        return "\n".join(tails)

    def proxy_pid(self) -> int:
        with self.client() as node:
            return int(node.health()["proxy_pid"])

    def kill(self) -> None:
        """SIGKILL by PID, as an OOM kill or a node's crash would end it."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def write_agent_tls(directory: Path, addresses: tuple[str, ...] = (NODE_IP,)) -> Path:
    """A CA and the agents' certificate for the nodes' addresses (the platform's part); the CA file."""
    ca_key, ca = new_ca("sandgate node agents test CA", validity=datetime.timedelta(days=2))
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sandgate-node-agent")]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(a)) for a in addresses]), False
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), False)
        .sign(ca_key, hashes.SHA256())
    )
    (directory / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (directory / "agent.crt").write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    (directory / "agent.key").write_bytes(key_pem)
    os.chmod(directory / "agent.key", 0o600)
    return directory / "ca.crt"


def bearer_policy(credential: str, scheme: str) -> dict[str, object]:
    """Deny by default, allow api.example.com, and inject `credential` as a bearer token on its
    `scheme` requests."""
    return {
        "version": 1,
        "defaultAction": "deny",
        "egress": [{"action": "allow", "target": "api.example.com"}],
        "bindings": [
            {
                "name": "api",
                "credential": credential,
                "match": {"hosts": ["api.example.com"], "schemes": [scheme]},
                "auth": {"type": "bearer"},
            }
        ],
    }


@contextlib.contextmanager
def cluster_pulling_from(registry: Registry, state_dir: Path) -> Iterator[Cluster]:
    """The test cluster, its node pulling docker.io names from the session's test registry only."""
    with (
        running_cluster(state_dir, SANDGATE_CLUSTER_MIRROR=registry.mirror) as handle,
        registry.reachable_from(handle.pid("containerd")),
    ):
        yield handle


def route_internet(cluster: Cluster, net: Internet) -> None:
    """Route the test internet to and from the node (and only the node) through this namespace
    (the routes go with the node's and the internet's namespaces)."""
    Path("/proc/sys/net/ipv4/ip_forward").write_text("1")  # this test's own namespace
    ip("route", "add", "198.51.100.0/24", "via", HOST_LINK_IP, netns=cluster.netns)
    ip("route", "add", NODE_LINK, "via", HOST_V4, netns=net.netns_name)


@contextlib.contextmanager
def internet_for(cluster: Cluster, workdir: Path, names: dict[str, list[str]]) -> Iterator[Internet]:
    """The test internet, routed to and from the node."""
    with start_internet(workdir) as net:
        net.set_names(names)
        route_internet(cluster, net)
        yield net


@contextlib.contextmanager
def node_agent(cluster: Cluster, internet: Internet, workdir: Path) -> Iterator[Agent]:
    """The node agent in the node's namespace, answering on NODE_IP:AGENT_PORT; stopped after."""
    with running_agent(cluster.netns, NODE_IP, internet.ca_cert, workdir) as handle:
        yield handle


@contextlib.contextmanager
def running_agent(netns: str | None, node_ip: str, upstream_ca: Path, workdir: Path) -> Iterator[Agent]:
    """The node agent answering on node_ip:AGENT_PORT in `netns` (None: this test's own); stopped after."""
    ca_file = write_agent_tls(workdir, (node_ip,))
    token_file = workdir / "token"
    token_file.write_text(secrets.token_urlsafe(32))
    token_file.chmod(0o600)
    agents = NodeAgents(AGENT_PORT, ca_file, token_file)
    handle = Agent(netns, workdir / "state", agents, workdir / "agent.log", node_ip=node_ip)
    try:
        handle.start(upstream_ca)
        yield handle
    finally:
        handle.stop()


def kubernetes_settings(cluster: Cluster, admin: Client, agents: NodeAgents) -> dict[str, str]:
    """A server's settings for sandboxes that are Pods in SANDBOX_NAMESPACE (made here), confined
    by the node agents (`[kubernetes]` node_agent_*), with the execd image imported on the node."""
    imported = run_script("execd-image.sh", cluster.state_dir, timeout=600, PYTHON=sys.executable)
    assert imported.returncode == 0, imported.stderr
    admin.create(Namespace(metadata=ObjectMeta(name=SANDBOX_NAMESPACE)))
    settings = {
        "kubeconfig": str(cluster.kubeconfig),
        "namespace": SANDBOX_NAMESPACE,
        "node_agent_port": agents.port,
        "node_agent_ca": str(agents.ca_file),
        "node_agent_token_file": str(agents.token_file),
    }
    return {"SANDGATE_RUNTIME": "kubernetes", "SANDGATE_KUBERNETES": json.dumps(settings)}


@contextlib.contextmanager
def kubernetes_server(
    cluster: Cluster,
    admin: Client,
    agents: NodeAgents,
    workdir: Path,
    extra_env: dict[str, str] | None = None,
) -> Iterator[SandgateServer]:
    """A real server of kubernetes_settings (and `extra_env`)."""
    env = {**kubernetes_settings(cluster, admin, agents), **(extra_env or {})}
    with sandgate_server(workdir, env) as server:
        yield server


def node_counters(netns: str) -> dict[str, int]:
    """The node table's drop counters, by name (inet and bridge tables): where the node counts
    each kind of packet it drops from a Pod."""
    found: dict[str, int] = {}
    for family in ("inet", "bridge"):
        command = [
            "ip",
            "netns",
            "exec",
            netns,
            "nft",
            "--json",
            "list",
            "counters",
            "table",
            family,
            NODE_TABLE,
        ]
        listing = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
        for item in listing["nftables"]:
            if "counter" in item:
                found[item["counter"]["name"]] = int(item["counter"]["packets"])
    assert set(found) == set(COUNTERS), found
    return found


def bridge_link_local(netns: str) -> str:
    """The node's IPv6 link-local address on the Pod bridge (a Pod's nearest IPv6 peer)."""
    command = ["ip", "-n", netns, "-6", "-o", "addr", "show", "dev", "cni0", "scope", "link"]
    listing = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return listing.split()[3].split("/")[0]


def pod_net(server: SandgateServer, sandbox_id: str) -> tuple[str, str]:
    """(Pod IP, the node's Pod gateway) of a sandbox of `server`, from the API server."""
    settings = json.loads(server.extra_env["SANDGATE_KUBERNETES"])
    admin = Client(config=KubeConfig.from_file(settings["kubeconfig"]))
    (pod,) = admin.list(Pod, namespace=settings["namespace"], labels={"sandgate/sandbox": sandbox_id})
    assert pod.status is not None and pod.status.podIP, pod.status
    return pod.status.podIP, POD_GATEWAY


def node_probes(
    node_ip: str, gateway: str, neighbour: str, neighbour_port: int, netns: str
) -> dict[str, list[str]]:
    """What a Pod on the node (at `node_ip`, its Pods' `gateway`, in `netns`) tries against the
    node, the cluster and `neighbour` (a Pod on the same node, listening on `neighbour_port`): busybox
    commands by the node counter each must move (lifecycle/node.py COUNTERS). UDP is tftp's (this
    busybox's nc has no -u), which needs no capability; ICMP needs one (`icmp_probes`)."""
    udp = "busybox timeout 3 busybox tftp -g -r probe -l /dev/null"
    return {
        "apiserver": [f"busybox nc -w 3 {node_ip} 6443", f"busybox nc -w 3 {gateway} 6443"],
        "kubelet": [f"busybox nc -w 3 {node_ip} 10250", f"busybox nc -w 3 {gateway} 10250"],
        "node_ports": [f"busybox nc -w 3 {node_ip} {AGENT_PORT}", f"busybox nc -w 3 {gateway} 22"],
        "metadata": ["busybox nc -w 3 169.254.169.254 80"],
        "bridged": [f"busybox nc -w 3 {neighbour} {neighbour_port}"],
        "other": [f"{udp} {ORIGIN_V4}", f"{udp} {gateway}"],
        "ipv6": [f"{udp} {bridge_link_local(netns)}%eth0"],
    }


def icmp_probes(gateway: str) -> dict[str, list[str]]:
    """ICMP from a Pod that may send it (NET_RAW: a plain Pod, not a sandbox), by its counter."""
    return {"other": [f"busybox ping -c 1 -W 2 {gateway}", f"busybox ping -c 1 -W 2 {ORIGIN_V4}"]}


def assert_dropped_and_counted(netns: str, run: Callable[[str], str], probes: dict[str, list[str]]) -> None:
    """Each probe fails in the Pod (`run`: a shell command there, its output with `status=N`) and
    moves its own counter on the node in `netns`."""
    for counter, commands in probes.items():
        for command in commands:
            before = node_counters(netns)[counter]
            output = run(f"echo true | {command}")
            assert "status=0" not in output, (command, output)
            after = node_counters(netns)[counter]
            assert after > before, (counter, command, before, after, output)
