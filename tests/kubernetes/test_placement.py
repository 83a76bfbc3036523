"""Sandbox nodes: the settings `[kubernetes] node_selector` and `tolerations` on the two-node test
cluster (`SANDGATE_CLUSTER_NODES=2`), node 2 labelled and tainted for sandboxes as a platform team
would (docs/kubernetes.md, "Sandbox nodes"), a node agent on each node (test_two_node_proxies.py's
fixtures) and a real `sandgate serve --runtime kubernetes` out of the cluster.

Evidence from the other side: where each Pod runs and what its spec carries, from the API server;
the container in node 2's own containerd and in none of node 1's; the Pod's entry in node 2's
agent; the scheduler's own words in a create that no node accepts; the origin's log for a sandbox
whose node has no agent (its entrypoint must never run).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import PatchType

from tests.kubernetes import test_two_node_proxies as two_nodes
from tests.kubernetes.cluster import BUSYBOX_IMAGE, Cluster, skip_unless_built, up_to_a_build
from tests.kubernetes.serving import SANDBOX_NAMESPACE, Agent, kubernetes_settings
from tests.kubernetes.test_node_proxy import wait_until
from tests.kubernetes.test_two_node_proxies import NODES, held, sandbox_pod
from tests.kubernetes.test_two_nodes import node_containers
from tests.support.internet import ORIGIN_V4, Internet
from tests.support.server import SandgateServer, sandgate_server

pytestmark = pytest.mark.root
skip_unless_built()

# the two nodes' cluster, its client, the test internet routed to both, an agent on each
cluster, client, internet, agents = two_nodes.cluster, two_nodes.client, two_nodes.internet, two_nodes.agents

SANDBOX_NODE, OTHER_NODE = "sandgate-node-2", "sandgate-node"
LABEL = TAINT = "sandgate.example.test/sandboxes"
NODE_SELECTOR = {LABEL: "true"}
TOLERATION = {"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}
CREATES = 3  # the scheduler spreads over both nodes when nothing keeps it off one
START_TIMEOUT = 20
GONE_TIMEOUT = 90


@pytest.fixture(scope="module")
def sandbox_node(client: Client) -> Iterator[str]:
    """Node 2 labelled and tainted for sandboxes only; both undone after."""
    taint = {"key": TAINT, "value": "true", "effect": "NoSchedule"}
    client.patch(Node, SANDBOX_NODE, {"metadata": {"labels": NODE_SELECTOR}, "spec": {"taints": [taint]}},
                 patch_type=PatchType.MERGE)  # fmt: skip
    try:
        yield SANDBOX_NODE
    finally:
        client.patch(Node, SANDBOX_NODE, {"metadata": {"labels": {LABEL: None}}, "spec": {"taints": None}},
                     patch_type=PatchType.MERGE)  # fmt: skip


@pytest.fixture(scope="module")
def settings(
    cluster: Cluster, client: Client, agents: dict[str, Agent], sandbox_node: str
) -> dict[str, object]:
    """The `[kubernetes]` table of serving.py (its namespace made, the execd image imported)."""
    shared = next(iter(agents.values())).agents
    env = kubernetes_settings(cluster, client, shared)
    return dict(json.loads(env["SANDGATE_KUBERNETES"]))


def server_env(kubernetes: dict[str, object]) -> dict[str, str]:
    return {
        "SANDGATE_RUNTIME": "kubernetes",
        "SANDGATE_KUBERNETES": json.dumps(kubernetes),
        "SANDGATE_IMAGE_PULL_POLICY": "never",
    }


@pytest.fixture(scope="module")
def placing_server(
    settings: dict[str, object], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SandgateServer]:
    """A server whose sandboxes go to the sandbox nodes: the selector and the toleration set."""
    placement = {**settings, "node_selector": NODE_SELECTOR, "tolerations": [TOLERATION]}
    with sandgate_server(tmp_path_factory.mktemp("placing-server"), server_env(placement)) as server:
        yield server


def asking_entrypoint(nonce: str) -> list[str]:
    """Ask the origin for a path with the nonce every few seconds (the address: busybox's static
    build cannot resolve names)."""
    request = (
        f"GET /echo/placed-{nonce} HTTP/1.1\\r\\nHost: api.example.com\\r\\nConnection: close\\r\\n\\r\\n"
    )
    ask = f"{{ busybox printf '{request}'; busybox sleep 1; }} | busybox nc -w 3 {ORIGIN_V4} 80"
    return ["/bin/busybox", "sh", "-c", f"while true; do {ask}; busybox sleep 1; done"]


def create_body(nonce: str) -> dict[str, object]:
    return {"image": {"uri": BUSYBOX_IMAGE}, "entrypoint": asking_entrypoint(nonce), "resourceLimits": {}}


def namespace_pods(client: Client) -> list[Pod]:
    return list(client.list(Pod, namespace=SANDBOX_NAMESPACE))


def unschedulable(pod: Pod) -> str:
    """The scheduler's message when it placed the Pod nowhere, else ""."""
    conditions = (pod.status.conditions if pod.status else None) or []
    found = [c for c in conditions if c.type == "PodScheduled" and c.reason == "Unschedulable"]
    return str(found[0].message) if found else ""


@up_to_a_build
def test_without_the_toleration_a_create_fails_at_its_timeout_with_the_schedulers_words(
    settings: dict[str, object], client: Client, tmp_path: Path
) -> None:
    """The selector names the sandbox nodes, the toleration is missing: the Pod is Pending on no
    node (seen in the API server while the create waits) and the create fails once
    start_timeout is over, not later, saying why and which settings to check; no Pod is left."""
    assert namespace_pods(client) == []
    untolerated = {**settings, "node_selector": NODE_SELECTOR, "start_timeout": START_TIMEOUT}
    with (
        sandgate_server(tmp_path, server_env(untolerated)) as server,
        server.client(timeout=START_TIMEOUT + 120) as api,
        ThreadPoolExecutor(1) as pool,
    ):
        began = time.monotonic()
        creating = pool.submit(api.post, "/v1/sandboxes", json=create_body("untolerated"))
        seen: list[str] = []

        def pending_nowhere() -> bool:
            seen[:] = [unschedulable(pod) for pod in namespace_pods(client) if unschedulable(pod)]
            return bool(seen) or creating.done()

        wait_until(
            "the sandbox's Pod unschedulable in the API server", pending_nowhere, timeout=START_TIMEOUT
        )
        assert seen and "had untolerated taint" in seen[0], seen  # the scheduler, of node 2
        answer = creating.result()
        took = time.monotonic() - began
        assert answer.status_code == 503, answer.text
        message = answer.json()["message"]
        assert f"did not start within {START_TIMEOUT} s" in message, message
        assert "Unschedulable" in message and "had untolerated taint" in message, message
        assert "kubernetes.node_selector and kubernetes.tolerations" in message, message
        assert START_TIMEOUT <= took < START_TIMEOUT + 60, took  # under load: the API calls are slow
        wait_until("no Pod left", lambda: namespace_pods(client) == [], timeout=GONE_TIMEOUT)


@up_to_a_build
def test_sandboxes_run_on_the_sandbox_node_only(
    placing_server: SandgateServer, client: Client, cluster: Cluster, agents: dict[str, Agent]
) -> None:
    """Node 1 stays schedulable and untainted, yet every sandbox's Pod is on node 2 (the API
    server's nodeName, node 2's containerd), carries the selector and the toleration, and is
    held by node 2's agent."""
    created: list[str] = []
    with placing_server.client(timeout=300) as api:
        try:
            for _ in range(CREATES):
                answer = api.post("/v1/sandboxes", json=create_body(secrets.token_hex(4)))
                assert answer.status_code == 202, answer.text
                created.append(answer.json()["id"])
            for sandbox_id in created:
                pod = sandbox_pod(client, sandbox_id)
                assert pod.spec is not None and pod.status is not None and pod.status.podIP
                assert pod.spec.nodeName == SANDBOX_NODE, (sandbox_id, pod.spec.nodeName)
                assert pod.spec.nodeSelector == NODE_SELECTOR
                assert TOLERATION in [
                    {"key": t.key, "operator": t.operator, "effect": t.effect}
                    for t in pod.spec.tolerations or []
                ]
                container = (pod.status.containerStatuses or [])[0].containerID or ""
                assert container.removeprefix("containerd://") in node_containers(cluster, SANDBOX_NODE)
                assert container.removeprefix("containerd://") not in node_containers(cluster, OTHER_NODE)
                assert pod.status.podIP in held(agents[SANDBOX_NODE])
                assert pod.status.podIP not in held(agents[OTHER_NODE])
        finally:
            for sandbox_id in created:
                api.delete(f"/v1/sandboxes/{sandbox_id}")
    wait_until("no Pod left", lambda: namespace_pods(client) == [], timeout=GONE_TIMEOUT)


@up_to_a_build
def test_a_sandbox_node_without_its_agent_starts_no_sandbox(
    placing_server: SandgateServer, client: Client, agents: dict[str, Agent], internet: Internet
) -> None:
    """Node 2's agent stopped (the last test of the module: it stays stopped): a create placed
    there fails naming the node's agent, its Pod is deleted, and its entrypoint never ran (the
    launcher starts it only after the hand-over, which needs the node proxy's CA): no request of
    its nonce ever reached the origin."""
    agents[SANDBOX_NODE].stop()
    nonce = secrets.token_hex(4)
    with placing_server.client(timeout=300) as api:
        answer = api.post("/v1/sandboxes", json=create_body(nonce))
    assert answer.status_code == 503, answer.text
    address = NODES[SANDBOX_NODE][0]
    assert f"node agent https://{address}:" in answer.json()["message"], answer.text
    wait_until("no Pod left", lambda: namespace_pods(client) == [], timeout=GONE_TIMEOUT)
    assert [r for r in internet.origin_requests() if r.get("path") == f"/echo/placed-{nonce}"] == []
