"""The node agent (`sandgate node-proxy`, lifecycle/node.py) on the real one-node test cluster:
the proxy is every Pod's only way out, proven from the other side.

The world: the cluster of scripts/cluster (its own module-scoped start, torn down also on
failure); the test internet (tests/support/internet.py: origins at 198.51.100.10, DNS at .53)
joined to the test's namespace, and an explicit route from the node to it (the node has no
default route). The agent runs as root in the node's network namespace (`nsenter --net`), as a
DaemonSet with hostNetwork would. Busybox Pods serve a shell on TCP 7000 (`nc -ll -e sh`), which
the test reaches through the node's route to the Pods: every probe runs inside a real Pod.

The evidence is taken outside the Pods: the origin's request log (what arrived, from where, with
which Authorization), the node's nft counters (each kind of drop has its own), the node's audit
file and the server's audit log after shipping, the API server's objects and the node's disk
(no secret there).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.models.core_v1 import Container, PodDNSConfig, PodSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Pod, Secret

from sandgate.lifecycle.node_client import (
    NodeAgents,
    NodeProxies,
    PodPlacement,
    placement,
    pod_locator,
)
from sandgate.proxy import SandboxEntry, audit_path, verify_chain
from sandgate.vault import open_store
from tests.kubernetes.cluster import (
    BUSYBOX_IMAGE,
    Cluster,
    skip_unless_built,
    up_to_a_build,
    wait_for_pod,
)
from tests.kubernetes.serving import (
    NODE_IP,
    SANDBOX_NAMESPACE,
    Agent,
    assert_dropped_and_counted,
    bearer_policy,
    icmp_probes,
    kubernetes_server,
    node_counters,
    node_probes,
)
from tests.support.audit import audit_records
from tests.support.internet import ORIGIN_V4, Internet
from tests.support.server import SANDGATE, SandgateServer

pytestmark = pytest.mark.root
skip_unless_built()

POD_GATEWAY = "10.232.0.1"
SHELL_PORT = 7000
SECRET = "sk-node-" + secrets.token_hex(12)
POLICY = bearer_policy("node-api-token", "http")


def start_shell_pod(client: Client, name: str, node: str | None = None) -> PodPlacement:
    """A busybox Pod serving a shell on TCP 7000 (on `node`, or where the scheduler puts it); its IP
    and its node's, once it runs."""
    container = Container(
        name="main",
        image=BUSYBOX_IMAGE,
        imagePullPolicy="Never",
        command=["/bin/busybox", "nc", "-ll", "-p", str(SHELL_PORT), "-e", "/bin/busybox", "sh"],
    )
    spec = PodSpec(
        restartPolicy="Never",
        nodeName=node,
        automountServiceAccountToken=False,
        containers=[container],
        dnsPolicy="None",
        dnsConfig=PodDNSConfig(nameservers=[POD_GATEWAY]),
    )
    client.create(Pod(metadata=ObjectMeta(name=name), spec=spec), namespace="default")
    running = wait_for_pod(client, name, ("Running",), timeout=180)
    found = placement(running)
    assert found is not None, running.status
    pod_sh(found.pod_ip, "true", timeout=30)  # its shell answers
    return found


def pod_sh(pod_ip: str, command: str, timeout: float = 30) -> str:
    """Run `command` in the Pod's shell; its output (stdout and stderr). The listener starts a
    moment after the Pod is Running: connecting is retried, bounded."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            connection = socket.create_connection((pod_ip, SHELL_PORT), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    with connection:
        connection.settimeout(timeout)
        connection.sendall(f'{command} 2>&1; echo "status=$?"\n'.encode())
        connection.shutdown(socket.SHUT_WR)
        chunks = []
        while data := connection.recv(65536):
            chunks.append(data)
    return b"".join(chunks).decode(errors="replace")


def http_get(host: str, path: str) -> str:
    """A plain HTTP request to the origin's address with `host` in Host (busybox's static wget
    cannot resolve names: glibc's NSS in a static binary; nc takes the address). nc ends the
    connection when its input ends: the input stays open while the answer comes."""
    request = f"GET {path} HTTP/1.1\\r\\nHost: {host}\\r\\nConnection: close\\r\\n\\r\\n"
    return f"{{ printf '{request}'; busybox sleep 4; }} | busybox nc -w 5 {ORIGIN_V4} 80"


OK = "HTTP/1.1 200"


def origin_requests_from(internet: Internet, mark: int) -> list[dict[str, object]]:
    return internet.origin_requests()[mark:]


def entry_for(sandbox_id: str, pod_ip: str) -> SandboxEntry:
    return SandboxEntry(sandbox_id=sandbox_id, address=pod_ip, policy=POLICY)


@up_to_a_build
def test_a_pod_without_an_entry_gets_nothing(
    cluster: Cluster, client: Client, agent: Agent, internet: Internet
) -> None:
    pod = start_shell_pod(client, f"noentry-{secrets.token_hex(3)}")
    mark = len(internet.origin_requests())
    output = pod_sh(pod.pod_ip, http_get("api.example.com", "/echo"))
    assert OK not in output and "status=" in output, output
    output = pod_sh(pod.pod_ip, f"busybox nslookup api.example.com {POD_GATEWAY}")
    assert ORIGIN_V4 not in output, output
    assert origin_requests_from(internet, mark) == []


@dataclass
class Server:
    """The server's side as `sandgate serve --runtime kubernetes` wires it: its vault, its audit
    log, and the Kubernetes confinement's proxy client (`NodeProxies`)."""

    state_dir: Path
    nodes: NodeProxies

    @property
    def audit_log(self) -> Path:
        return audit_path(self.state_dir)

    def shipped(self) -> list[dict[str, object]]:
        if not self.audit_log.exists():
            return []
        return [json.loads(line) for line in self.audit_log.read_text().splitlines()]


@pytest.fixture(scope="module")
def server(client: Client, agent: Agent, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    state_dir = tmp_path_factory.mktemp("server")
    vault = open_store("local", state_dir)
    vault.put("node-api-token", SECRET)
    locate = pod_locator(client, "default")
    nodes = NodeProxies(agent.agents, locate, vault, audit_path(state_dir), state_dir / "node-audit")
    try:
        yield Server(state_dir, nodes)
    finally:
        nodes.close()


@pytest.fixture(scope="module")
def sandbox_pod(client: Client, server: Server) -> PodPlacement:
    """A Pod the server admitted: NodeProxies found its node from its IP (the API server), read
    the bound value from the server's vault and pushed both to that node's agent."""
    pod = start_shell_pod(client, f"sandbox-{secrets.token_hex(3)}")
    entry = entry_for("sbx-node-1", pod.pod_ip)
    server.nodes.put_sandbox(entry)
    server.nodes.on_restart = lambda: server.nodes.put_sandbox(entry)  # the server's repush
    return pod


@up_to_a_build
def test_an_allowed_request_reaches_the_origin_with_the_credential_and_a_denied_one_does_not(
    agent: Agent, internet: Internet, sandbox_pod: PodPlacement
) -> None:
    mark = len(internet.origin_requests())
    allowed = pod_sh(sandbox_pod.pod_ip, http_get("api.example.com", "/echo"))
    assert OK in allowed, f"{allowed}\n{agent.evidence()}"
    assert SECRET not in allowed, "the origin's echo of the credential reached the Pod unscrubbed"
    denied = pod_sh(sandbox_pod.pod_ip, http_get("denied.example.com", "/echo"))
    assert "HTTP/1.1 403" in denied, denied
    seen = origin_requests_from(internet, mark)
    assert len(seen) == 1, seen
    headers = seen[0]["headers"]
    assert isinstance(headers, dict)
    assert headers["host"] == "api.example.com"
    assert headers["authorization"] == f"Bearer {SECRET}"
    assert str(seen[0]["client"]).startswith(f"{NODE_IP}:")  # left through the node's proxy


@up_to_a_build
def test_dns_is_answered_by_the_proxys_resolver(internet: Internet, sandbox_pod: PodPlacement) -> None:
    """Any address's port 53 is the proxy's resolver: an address where nothing answers DNS (the
    gateway, an unrouted one) answers allowed names, and the test's DNS server saw the query."""
    internet.clear_dns_queries()
    for server in (POD_GATEWAY, "192.0.2.99"):
        output = pod_sh(sandbox_pod.pod_ip, f"busybox nslookup api.example.com {server}")
        assert ORIGIN_V4 in output, output
    assert any(query["name"].rstrip(".") == "api.example.com" for query in internet.dns_queries())
    output = pod_sh(sandbox_pod.pod_ip, f"busybox nslookup denied.example.com {POD_GATEWAY}")
    assert ORIGIN_V4 not in output, output


@up_to_a_build
def test_the_node_the_cluster_and_other_pods_are_out_of_reach(
    cluster: Cluster, client: Client, sandbox_pod: PodPlacement
) -> None:
    """Each attempt fails in the Pod and moves its own counter on the node."""
    other = start_shell_pod(client, f"neighbour-{secrets.token_hex(3)}")
    probes = node_probes(NODE_IP, POD_GATEWAY, other.pod_ip, SHELL_PORT, cluster.netns)
    probes["other"] += icmp_probes(POD_GATEWAY)["other"]
    assert_dropped_and_counted(cluster.netns, partial(pod_sh, sandbox_pod.pod_ip), probes)
    # the neighbour is alive and reachable from the host: only the Pod-to-Pod path is closed
    assert "status=0" in pod_sh(other.pod_ip, "true")


def wait_until(
    what: str, check: Callable[[], bool], timeout: float, evidence: Callable[[], str] = str
) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g}s\n{evidence()}"
        time.sleep(0.5)


@up_to_a_build
def test_agent_killed_means_no_egress_and_its_records_are_shipped(
    cluster: Cluster, agent: Agent, internet: Internet, server: Server, sandbox_pod: PodPlacement
) -> None:
    marker = f"/echo/before-kill-{secrets.token_hex(4)}"
    assert OK in pod_sh(sandbox_pod.pod_ip, http_get("api.example.com", marker))
    proxy_pid = agent.proxy_pid()
    agent.kill()
    # the proxy dies with the agent (PR_SET_PDEATHSIG)
    wait_until("the proxy ends with its agent", lambda: not Path(f"/proc/{proxy_pid}").exists(), 30)
    mark = len(internet.origin_requests())
    cut = pod_sh(sandbox_pod.pod_ip, http_get("api.example.com", "/echo/while-down"))
    assert OK not in cut and "status=" in cut, cut
    assert origin_requests_from(internet, mark) == []
    assert node_counters(cluster.netns)  # the table stays while the agent is down (fail closed)

    # the DaemonSet restarts it; the server sees a new boot id and pushes its sandboxes again
    agent.start(internet.ca_cert)
    after = "/echo/after-restart"
    wait_until(
        "egress back after the re-push",
        lambda: OK in pod_sh(sandbox_pod.pod_ip, http_get("api.example.com", after)),
        timeout=90,
        evidence=agent.evidence,
    )

    def shipped_paths() -> set[object]:
        return {record.get("path") for record in server.shipped() if record["kind"] == "request"}

    wait_until("records shipped", lambda: {marker, after} <= shipped_paths(), timeout=60)
    node_ids = {
        json.loads(line)["id"]
        for path in sorted(agent.state_dir.glob("audit.jsonl*"))
        for line in path.read_text().splitlines()
        if line.strip()
    }
    wait_until("every node record shipped", lambda: node_ids <= {r["id"] for r in server.shipped()}, 60)
    verdict = verify_chain(server.audit_log)
    assert not verdict.problems and verdict.chained == verdict.lines, verdict


@up_to_a_build
def test_no_secret_in_the_cluster_or_on_the_nodes_disk(
    client: Client, agent: Agent, server: Server, sandbox_pod: PodPlacement
) -> None:
    """The secret reached the origin (test above) but lives nowhere the cluster or the node keeps."""
    objects = [
        *client.list(Pod, namespace="*"),
        *client.list(Secret, namespace="*"),
        *client.list(ConfigMap, namespace="*"),
    ]
    assert objects
    for item in objects:
        assert SECRET not in json.dumps(item.to_dict()), item.metadata
    for path in agent.state_dir.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    assert SECRET.encode() not in agent.log.read_bytes()
    assert server.shipped() and SECRET not in server.audit_log.read_text()


# -- through the runtime's server: `sandgate serve --runtime kubernetes` with the node agents -------

E2E_PATH = "/echo/through-the-server"


@contextlib.contextmanager
def server_with_the_secret(
    cluster: Cluster, client: Client, agents: NodeAgents, workdir: Path
) -> Iterator[SandgateServer]:
    """The server of serving.py with the bound value in its vault (`sandgate vault put`)."""
    with kubernetes_server(
        cluster, client, agents, workdir, {"SANDGATE_IMAGE_PULL_POLICY": "never"}
    ) as server:
        put = subprocess.run(
            [*SANDGATE, "vault", "put", "node-api-token"], input=SECRET, capture_output=True, text=True,
            env=server.server_env(), timeout=60,
        )  # fmt: skip
        assert put.returncode == 0, put.stderr
        yield server


@pytest.fixture(scope="module")
def runtime_server(
    cluster: Cluster, client: Client, agent: Agent, server: Server, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SandgateServer]:
    # One server per node agents: the test's own NodeProxies above (Pods of "default") would prune
    # the entries of this server's Pods (in SANDBOX_NAMESPACE, which it cannot see) from the node.
    server.nodes.close()
    with server_with_the_secret(
        cluster, client, agent.agents, tmp_path_factory.mktemp("k8s-server")
    ) as server:
        yield server


@up_to_a_build
def test_a_sandbox_of_the_runtime_gets_out_only_through_its_nodes_proxy(
    runtime_server: SandgateServer, client: Client, internet: Internet, agent: Agent
) -> None:
    """Created through the API (a Pod of the busybox image whose entrypoint asks the origin every
    few seconds): nothing arrives under the default policy; after the sandgate policy with its
    binding is set through the API, the requests arrive with the injected credential; after the
    delete the node holds no entry and no value for it."""
    request = f"GET {E2E_PATH} HTTP/1.1\\r\\nHost: api.example.com\\r\\nConnection: close\\r\\n\\r\\n"
    loop = (
        f"while true; do {{ busybox printf '{request}'; busybox sleep 2; }} "
        f"| busybox nc -w 5 {ORIGIN_V4} 80; busybox sleep 1; done"
    )
    body = {
        "image": {"uri": BUSYBOX_IMAGE},
        "entrypoint": ["/bin/busybox", "sh", "-c", loop],
        "resourceLimits": {},
    }
    with runtime_server.client(timeout=300) as api:
        created = api.post("/v1/sandboxes", json=body)
        assert created.status_code == 202, created.text
        sandbox_id = created.json()["id"]
        try:
            pods = list(
                client.list(Pod, namespace=SANDBOX_NAMESPACE, labels={"sandgate/sandbox": sandbox_id})
            )
            assert len(pods) == 1
            pod_ip = pods[0].status.podIP if pods[0].status else None
            with agent.client() as node:  # ready only once its node holds it
                assert {"sandbox_id": sandbox_id, "address": pod_ip} in node.sandboxes()
            mark = len(internet.origin_requests())
            wait_until(
                "the entrypoint's requests were judged (node audit)",
                lambda: f'"client":"{pod_ip}:' in (agent.state_dir / "audit.jsonl").read_text(),
                timeout=60,
            )
            assert [r for r in origin_requests_from(internet, mark) if r.get("path") == E2E_PATH] == []

            answer = api.put(f"/v1/sandboxes/{sandbox_id}/egress/sandgate-policy", json={"policy": POLICY})
            assert answer.status_code == 200, answer.text

            def arrived() -> list[dict[str, object]]:
                return [r for r in origin_requests_from(internet, mark) if r.get("path") == E2E_PATH]

            wait_until("the sandbox's request at the origin", lambda: bool(arrived()), timeout=60)
            headers = arrived()[0]["headers"]
            assert isinstance(headers, dict) and headers["authorization"] == f"Bearer {SECRET}"
            assert str(arrived()[0]["client"]).startswith(f"{NODE_IP}:")
        finally:
            deleted = api.delete(f"/v1/sandboxes/{sandbox_id}")
            assert deleted.status_code in (200, 204), deleted.text
    with agent.client() as node:
        assert sandbox_id not in {entry["sandbox_id"] for entry in node.sandboxes()}
    for item in client.list(Pod, namespace="*"):
        assert SECRET not in json.dumps(item.to_dict())


HELD_PATH = "/held/"


@up_to_a_build
def test_a_request_held_on_a_node_is_answered_through_the_server(
    runtime_server: SandgateServer, client: Client, internet: Internet, agent: Agent
) -> None:
    """Under a policy that asks (`defaultAction: ask`), a Pod's requests are held by its node's
    proxy; the server lists them, and each reviewer's answer reaches that node: the request
    denied never arrives at the origin, the one allowed once does, and after "allow for the
    sandbox" (a policy change the node gets too) later requests arrive without being held."""
    request = f"GET {HELD_PATH}$i HTTP/1.1\\r\\nHost: api.example.com\\r\\nConnection: close\\r\\n\\r\\n"
    loop = (  # one request every 2 s, each on its own connection, each waiting up to 150 s
        "i=0; while [ $i -lt 60 ]; do i=$((i+1)); "
        f'{{ {{ busybox printf "{request}"; busybox sleep 150; }} | busybox nc -w 150 {ORIGIN_V4} 80; }} '
        ">/dev/null 2>&1 & busybox sleep 2; done; busybox sleep 600"
    )
    body = {
        "image": {"uri": BUSYBOX_IMAGE},
        "entrypoint": ["/bin/busybox", "sh", "-c", loop],
        "resourceLimits": {},
    }
    asking = {"version": 1, "defaultAction": "ask", "askTimeout": 150, "egress": []}
    with runtime_server.client(timeout=300) as api:
        created = api.post("/v1/sandboxes", json=body)
        assert created.status_code == 202, created.text
        sandbox_id = created.json()["id"]
        try:
            put = api.put(f"/v1/sandboxes/{sandbox_id}/egress/sandgate-policy", json={"policy": asking})
            assert put.status_code == 200, put.text
            mark = len(internet.origin_requests())

            def held() -> list[dict[str, Any]]:
                listed = api.get("/v1/approvals")
                assert listed.status_code == 200, listed.text
                return [h for h in listed.json() if h["sandbox"] == sandbox_id]

            wait_until("two requests held on the node, listed by the server", lambda: len(held()) >= 2, 90)
            first, second = sorted(held(), key=lambda h: h["requested_at"])[:2]
            assert first["host"] == "api.example.com" and first["path"].startswith(HELD_PATH), first
            with agent.client() as node:  # held by the node's proxy, not the server's
                assert first["id"] in {h["id"] for h in node.approvals()}

            def arrived(path: str) -> bool:
                return any(r.get("path") == path for r in origin_requests_from(internet, mark))

            denied = api.post(f"/v1/approvals/{first['id']}", json={"decision": "deny"})
            assert denied.status_code == 200 and denied.json()["answered"], denied.text
            allowed = api.post(f"/v1/approvals/{second['id']}", json={"decision": "allow-once"})
            assert allowed.status_code == 200 and allowed.json()["answered"], allowed.text
            wait_until("the request allowed once at the origin", lambda: arrived(second["path"]), 60)
            assert str(next(
                r for r in origin_requests_from(internet, mark) if r.get("path") == second["path"]
            )["client"]).startswith(f"{NODE_IP}:")  # fmt: skip
            again = api.post(f"/v1/approvals/{first['id']}", json={"decision": "allow-once"})
            assert again.status_code == 404, again.text  # answered: not held any more

            server_log = lambda: runtime_server.log_path.read_text()[-4000:]  # noqa: E731
            wait_until("a later request held", lambda: bool(held()), 60, server_log)
            third = max(held(), key=lambda h: h["requested_at"])
            number = int(third["path"].removeprefix(HELD_PATH))
            for_sandbox = api.post(f"/v1/approvals/{third['id']}", json={"decision": "allow-sandbox"})
            assert for_sandbox.status_code == 200, for_sandbox.text
            assert for_sandbox.json()["policy_revision"] is not None

            def never_held() -> list[str]:  # a later request let through by the node's new policy
                later = [str(r.get("path")) for r in origin_requests_from(internet, mark)]
                return [p for p in later if p.startswith(HELD_PATH) and int(p[len(HELD_PATH) :]) > number + 2]

            wait_until("a later request at the origin without a hold", lambda: bool(never_held()), 60)
            later = never_held()[0]

            def shipped(path: str) -> list[tuple[str, str]]:  # (decision, reason) in the server's log
                records = audit_records(runtime_server.state_dir, sandbox_id)
                return [(r["decision"], r["reason"]) for r in records if r.get("path") == path]

            wait_until(
                "the node's records shipped", lambda: bool(shipped(first["path"]) and shipped(later)), 60
            )
            assert ("deny", "approval-denied") in shipped(first["path"])
            assert ("allow", "approved") in shipped(second["path"])
            assert [d for d, reason in shipped(later) if d == "allow" and reason != "approved"], shipped(
                later
            )
            assert not arrived(first["path"])
        finally:
            deleted = api.delete(f"/v1/sandboxes/{sandbox_id}")
            assert deleted.status_code in (200, 204), deleted.text
    assert not arrived(first["path"])
