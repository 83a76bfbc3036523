"""Two nodes, each confining its own sandboxes: one `sandgate serve --runtime kubernetes` (out of
cluster) and a node agent on each node of a two-node cluster (`SANDGATE_CLUSTER_NODES=2`).

The world: the cluster of scripts/cluster with two nodes, the test internet routed to both nodes
(node 2's traffic crosses node 1, which routes but does not proxy it), an agent per node run
with `nsenter --net` as a hostNetwork DaemonSet would. Sandboxes are created through the API
until both nodes hold one; each one's entrypoint asks the origin for an allowed and a denied
path, each path carrying a nonce of that sandbox.

Evidence from the other side: the origin's log (which paths arrived, from which node address,
with which credential), each node's own audit file and entry table (its agent's API), the API
server's Pods (where each runs; what is left on a drained node), the server's one audit log
through `sandgate logs`.
"""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest
from lightkube import Client, KubeConfig
from lightkube.resources.core_v1 import Pod

from sandgate.lifecycle.node_client import NodeAgents
from tests.kubernetes.cluster import SCRIPTS, Cluster, running_cluster, skip_unless_built, up_to_a_build
from tests.kubernetes.serving import (
    AGENT_PORT,
    HOST_LINK_IP,
    NODE_ZONE,
    SANDBOX_NAMESPACE,
    Agent,
    write_agent_tls,
)
from tests.kubernetes.test_node_proxy import POLICY, SECRET, server_with_the_secret, wait_until
from tests.support.internet import HOST_V4, ORIGIN_V4, Internet, start_internet
from tests.support.netns import ip
from tests.support.server import SANDGATE, SandgateServer

pytestmark = pytest.mark.root
skip_unless_built()

# scripts/cluster/common.sh: node name -> (InternalIP, Pod range, the address node n routes the
# world through: node 1's end of its link)
NODES = {
    "sandgate-node": ("10.231.0.2", "10.232.0.0/24", HOST_LINK_IP),
    "sandgate-node-2": ("10.231.0.6", "10.232.1.0/24", "10.231.0.5"),
}
DRAINED = "sandgate-node-2"
MAX_CREATES = 8  # the scheduler spreads by free resources: both nodes are reached well before
ALLOWED, DENIED = "api.example.com", "denied.example.com"


@dataclass
class Placed:
    """A sandbox of the server, where the scheduler put it, and the nonce its requests carry."""

    sandbox_id: str
    pod_ip: str
    node: str
    nonce: str

    @property
    def allowed_path(self) -> str:
        return f"/echo/allowed-{self.nonce}"

    @property
    def denied_path(self) -> str:
        return f"/echo/denied-{self.nonce}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("cluster") / "state", SANDGATE_CLUSTER_NODES="2") as handle:
        yield handle


# test_in_cluster.py takes this module's fixtures by name (two nodes' cluster, its client)
@pytest.fixture(scope="module")
def client(cluster: Cluster) -> Client:
    return Client(config=KubeConfig.from_file(cluster.kubeconfig))


def node_netns(cluster: Cluster, node: str) -> str:
    return cluster.netns if node == "sandgate-node" else f"{cluster.netns}-n2"


@pytest.fixture(scope="module")
def internet(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Internet]:
    """The test internet, routed to and from both nodes (and only them) through this namespace."""
    with start_internet(tmp_path_factory.mktemp("internet")) as net:
        net.set_names(NODE_ZONE)
        Path("/proc/sys/net/ipv4/ip_forward").write_text("1")  # this test's own namespace
        for node, (_, _, way_out) in NODES.items():
            ip("route", "add", "198.51.100.0/24", "via", way_out, netns=node_netns(cluster, node))
        ip("route", "add", "10.231.0.0/24", "via", HOST_V4, netns=net.netns_name)
        yield net


@pytest.fixture(scope="module")
def agents(
    cluster: Cluster, internet: Internet, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Agent]]:
    workdir = tmp_path_factory.mktemp("node-agents")
    ca_file = write_agent_tls(workdir, tuple(address for address, _, _ in NODES.values()))
    token_file = workdir / "token"
    token_file.write_text(secrets.token_urlsafe(32))
    token_file.chmod(0o600)
    shared = NodeAgents(AGENT_PORT, ca_file, token_file)
    started: dict[str, Agent] = {}
    try:
        for number, (node, (address, pod_cidr, _)) in enumerate(NODES.items(), start=1):
            agent = Agent(node_netns(cluster, node), workdir / f"state-{number}", shared,
                          workdir / f"agent-{number}.log", node_ip=address, pod_cidr=pod_cidr)  # fmt: skip
            started[node] = agent
            agent.start(internet.ca_cert)
        yield started
    finally:
        for agent in started.values():
            agent.stop()


@pytest.fixture(scope="module")
def server(
    cluster: Cluster, client: Client, agents: dict[str, Agent], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SandgateServer]:
    shared = next(iter(agents.values())).agents
    with server_with_the_secret(cluster, client, shared, tmp_path_factory.mktemp("k8s-server")) as handle:
        yield handle


def asking_entrypoint(nonce: str) -> list[str]:
    """Ask the origin for the allowed and the denied path every few seconds (busybox nc: the
    static busybox cannot resolve names, so the address with the name in Host)."""

    def ask(host: str, path: str) -> str:
        request = f"GET {path} HTTP/1.1\\r\\nHost: {host}\\r\\nConnection: close\\r\\n\\r\\n"
        return f"{{ busybox printf '{request}'; busybox sleep 2; }} | busybox nc -w 5 {ORIGIN_V4} 80"

    loop = (
        f"while true; do {ask(ALLOWED, f'/echo/allowed-{nonce}')}; "
        f"{ask(DENIED, f'/echo/denied-{nonce}')}; busybox sleep 1; done"
    )
    return ["/bin/busybox", "sh", "-c", loop]


def sandbox_pod(client: Client, sandbox_id: str) -> Pod:
    pods = list(client.list(Pod, namespace=SANDBOX_NAMESPACE, labels={"sandgate/sandbox": sandbox_id}))
    assert len(pods) == 1, pods
    return pods[0]


@pytest.fixture(scope="module")
def placed(server: SandgateServer, client: Client) -> Iterator[dict[str, Placed]]:
    """One sandbox per node: created through the API until the scheduler put one on each; the
    extra ones are deleted at once."""
    found: dict[str, Placed] = {}
    extra: list[str] = []
    with server.client(timeout=300) as api:
        try:
            for _ in range(MAX_CREATES):
                nonce = secrets.token_hex(4)
                body = {"image": {"uri": "sandgate.example.test/busybox:1"},
                        "entrypoint": asking_entrypoint(nonce), "resourceLimits": {}}  # fmt: skip
                created = api.post("/v1/sandboxes", json=body)
                assert created.status_code == 202, created.text
                sandbox_id = created.json()["id"]
                pod = sandbox_pod(client, sandbox_id)
                assert pod.spec is not None and pod.status is not None and pod.status.podIP
                node = str(pod.spec.nodeName)
                if node in found:
                    extra.append(sandbox_id)
                else:
                    found[node] = Placed(sandbox_id, pod.status.podIP, node, nonce)
                if len(found) == len(NODES):
                    break
            assert set(found) == set(NODES), f"{MAX_CREATES} creates placed sandboxes only on {set(found)}"
            for sandbox_id in extra:
                assert api.delete(f"/v1/sandboxes/{sandbox_id}").status_code in (200, 204)
            yield found
        finally:
            for sandbox_id in extra + [p.sandbox_id for p in found.values()]:
                api.delete(f"/v1/sandboxes/{sandbox_id}")


def node_audit(agent: Agent) -> list[dict[str, object]]:
    path = agent.state_dir / "audit.jsonl"
    text = path.read_text() if path.exists() else ""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def judged(agent: Agent, placed: Placed, host: str, decision: str) -> bool:
    """The node's own audit file holds a `decision` on `host` for the sandbox's Pod."""
    return any(
        record.get("host") == host
        and record.get("decision") == decision
        and str(record.get("client", "")).startswith(f"{placed.pod_ip}:")
        for record in node_audit(agent)
    )


def arrived(internet: Internet, path: str) -> list[dict[str, object]]:
    return [request for request in internet.origin_requests() if request.get("path") == path]


def has_arrived(internet: Internet, path: str) -> bool:
    return bool(arrived(internet, path))


def held(agent: Agent) -> set[str]:
    with agent.client() as node:
        return {entry["address"] for entry in node.sandboxes()}


@up_to_a_build
def test_each_sandbox_is_held_by_its_own_node_only(
    placed: dict[str, Placed], agents: dict[str, Agent]
) -> None:
    for node, sandbox in placed.items():
        assert sandbox.pod_ip in held(agents[node])
        for other in (name for name in NODES if name != node):
            assert sandbox.pod_ip not in held(agents[other])


@up_to_a_build
def test_each_sandbox_gets_out_through_its_own_node_under_one_policy(
    server: SandgateServer, placed: dict[str, Placed], agents: dict[str, Agent], internet: Internet
) -> None:
    """Before the policy nothing arrives (each node judged its own Pod's requests); the same
    policy set through the API on both; then each allowed path arrives from its own node's
    address with the credential, and no denied path ever arrives."""
    for node, sandbox in placed.items():
        agent = agents[node]
        wait_until(f"{node} judged its sandbox's requests", partial(judged, agent, sandbox, ALLOWED, "deny"),
                   timeout=90, evidence=agent.evidence)  # fmt: skip
        assert arrived(internet, sandbox.allowed_path) == []
    with server.client(timeout=60) as api:
        for sandbox in placed.values():
            path = f"/v1/sandboxes/{sandbox.sandbox_id}/egress/sandgate-policy"
            answer = api.put(path, json={"policy": POLICY})
            assert answer.status_code == 200, answer.text
    for node, sandbox in placed.items():
        agent = agents[node]
        wait_until(f"the request of the sandbox on {node} at the origin",
                   partial(has_arrived, internet, sandbox.allowed_path), timeout=90,
                   evidence=agent.evidence)  # fmt: skip
        for request in arrived(internet, sandbox.allowed_path):
            address = NODES[node][0]
            assert str(request["client"]).startswith(f"{address}:"), (node, request)
            headers = request["headers"]
            assert isinstance(headers, dict) and headers["authorization"] == f"Bearer {SECRET}"
        wait_until(f"{node} denied the denied host", partial(judged, agent, sandbox, DENIED, "deny"), 60)
        assert judged(agent, sandbox, ALLOWED, "allow")
        others = [agents[other] for other in NODES if other != node]
        assert not any(judged(other, sandbox, ALLOWED, "allow") for other in others)
    for sandbox in placed.values():
        assert arrived(internet, sandbox.denied_path) == []


@up_to_a_build
def test_one_audit_query_covers_both_nodes(server: SandgateServer, placed: dict[str, Placed]) -> None:
    """`sandgate logs` on the server's one audit log: both sandboxes' allowed and denied requests,
    each node's records shipped into it."""

    def query() -> list[dict[str, object]]:
        asked = subprocess.run(
            [*SANDGATE, "logs", "--kind", "request", "--limit", "1000", "-o", "json"],
            capture_output=True, text=True, env=server.server_env(), timeout=60,
        )  # fmt: skip
        assert asked.returncode == 0, asked.stderr
        return [json.loads(line) for line in asked.stdout.splitlines() if line.startswith("{")]

    def covered() -> bool:
        seen = {(r.get("sandbox"), r.get("path"), r.get("decision")) for r in query()}
        return all(
            {(p.sandbox_id, p.allowed_path, "allow"), (p.sandbox_id, p.denied_path, "deny")} <= seen
            for p in placed.values()
        )

    wait_until("both nodes' records in one query", covered, timeout=60, evidence=lambda: str(query()[-6:]))


@up_to_a_build
def test_each_nodes_held_requests_are_listed_and_answered_through_the_server(
    server: SandgateServer, placed: dict[str, Placed], agents: dict[str, Agent], internet: Internet
) -> None:
    """Under the policy with `defaultAction: ask`, each sandbox's denied path is held by its own
    node's proxy; the server lists both nodes' held requests in one listing, and a deny through
    the API reaches the node that holds each one (its agent holds it no more), the path never
    at the origin. (The request's own record is not checked: the Pod's client gives up on a
    held request within seconds, and a request whose client left writes no final record.)"""
    asking = {**POLICY, "defaultAction": "ask", "askTimeout": 120}
    sandboxes = {sandbox.sandbox_id: (node, sandbox) for node, sandbox in placed.items()}
    with server.client(timeout=60) as api:

        def listed() -> dict[str, dict[str, object]]:  # the newest held request of each sandbox
            answer = api.get("/v1/approvals")
            assert answer.status_code == 200, answer.text
            return {str(held["sandbox"]): held for held in answer.json()}

        try:
            for sandbox_id in sandboxes:
                path = f"/v1/sandboxes/{sandbox_id}/egress/sandgate-policy"
                assert api.put(path, json={"policy": asking}).status_code == 200
            wait_until(
                "both nodes' held requests in one listing", lambda: set(sandboxes) <= set(listed()), 90
            )
            for sandbox_id, (node, sandbox) in sandboxes.items():
                for _ in range(5):  # the Pod's client gives up after a few seconds: take a newer one
                    approval = listed()[sandbox_id]
                    assert approval["path"] == sandbox.denied_path, approval
                    on_nodes = {name: approval["id"] in held_ids(agents[name]) for name in NODES}
                    denied = api.post(f"/v1/approvals/{approval['id']}", json={"decision": "deny"})
                    if denied.status_code == 200:
                        break
                assert denied.status_code == 200, denied.text
                assert on_nodes == {name: name == node for name in NODES}, on_nodes
                answered = partial(let_go, agents[node], str(approval["id"]))
                wait_until(
                    f"{node} no longer holds the answered request", answered, 60, agents[node].evidence
                )
                assert arrived(internet, sandbox.denied_path) == []
        finally:
            for sandbox_id in sandboxes:
                path = f"/v1/sandboxes/{sandbox_id}/egress/sandgate-policy"
                assert api.put(path, json={"policy": POLICY}).status_code == 200


def held_ids(agent: Agent) -> set[str]:
    with agent.client() as node:
        return {str(held["id"]) for held in node.approvals()}


def let_go(agent: Agent, approval_id: str) -> bool:
    return approval_id not in held_ids(agent)


def kubectl(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    built = subprocess.run(["bash", str(SCRIPTS / "build.sh"), "--cached"], capture_output=True, text=True)
    command = [str(Path(built.stdout.strip()) / "kubectl"), "--kubeconfig", str(cluster.kubeconfig), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def running_on(client: Client, node: str) -> list[Pod]:
    return [
        pod
        for pod in client.list(Pod, namespace="*", fields={"spec.nodeName": node})
        if pod.status is not None and pod.status.phase in ("Pending", "Running")
    ]


@up_to_a_build
def test_draining_a_node_deletes_its_sandboxes_and_leaves_no_pod_without_its_policy(
    cluster: Cluster,
    client: Client,
    server: SandgateServer,
    placed: dict[str, Placed],
    agents: dict[str, Agent],
    internet: Internet,
) -> None:
    """`kubectl drain` evicts the sandbox Pod (bare Pods: --force; no controller recreates it);
    the sandbox is then Failed (SANDBOX_EXITED, "(no Pod)") in the API, its node agent drops the
    entry (the server prunes entries whose Pod is gone), nothing runs on the node's bridge without
    an entry, the other node's sandbox goes on under its policy, and the drained one is deleted
    through the API like any other (no Pod left of it)."""
    drained = placed[DRAINED]
    drain = kubectl(cluster, "drain", DRAINED, "--ignore-daemonsets", "--delete-emptydir-data", "--force",
                    "--grace-period=1", "--timeout=120s")  # fmt: skip
    try:
        assert drain.returncode == 0, drain.stderr
        wait_until("the drained node runs no Pod", lambda: not running_on(client, DRAINED), timeout=120)
        with server.client(timeout=60) as api:  # as docs/kubernetes.md "Draining a node" says
            status = api.get(f"/v1/sandboxes/{drained.sandbox_id}").json()["status"]
            assert (status["state"], status["reason"]) == ("Failed", "SANDBOX_EXITED"), status
            assert "(no Pod)" in status["message"], status
        wait_until("the drained Pod's entry dropped", lambda: drained.pod_ip not in held(agents[DRAINED]),
                   timeout=60, evidence=agents[DRAINED].evidence)  # fmt: skip
        for pod in running_on(client, DRAINED):  # none is left; any that were must be held
            assert pod.status is not None and pod.status.podIP in held(agents[DRAINED]), pod.metadata
        survivor = next(sandbox for node, sandbox in placed.items() if node != DRAINED)
        mark = len(arrived(internet, survivor.allowed_path))
        wait_until("the other node's sandbox still gets out",
                   lambda: len(arrived(internet, survivor.allowed_path)) > mark, timeout=60)  # fmt: skip
        with server.client(timeout=60) as api:  # the drained sandbox is deleted like any other
            assert api.delete(f"/v1/sandboxes/{drained.sandbox_id}").status_code in (200, 204)
            assert api.get(f"/v1/sandboxes/{drained.sandbox_id}").status_code == 404
        left = client.list(Pod, namespace=SANDBOX_NAMESPACE, labels={"sandgate/sandbox": drained.sandbox_id})
        assert list(left) == []
    finally:
        kubectl(cluster, "uncordon", DRAINED)
