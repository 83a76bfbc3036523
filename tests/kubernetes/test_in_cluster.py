"""sandgate installed from deploy/ onto the two-node test cluster, twice: `sqlite` (the base: the
state in SQLite on its volume, the local vault) and `external` (components/postgresql and
components/openbao: the state on a real PostgreSQL, the vault on a real OpenBao, their
credentials from Secrets). Each time the server Deployment (as the image's non-root user) and the
node-proxy DaemonSet run from the sandgate image built from local files
(scripts/cluster/sandgate-image.sh); the quickstart and the conformance clients
(tests/conformance/scenarios.py: the Python SDK, the JS SDK, osb and the MCP server, direct and
server-proxy mode) go through the in-cluster server from the host; `kubectl delete -k` then
leaves none of its objects.

What the test cluster needs beyond the base (the overlay below; docs/kubernetes.md): it has no
kube-proxy, so the server runs with hostNetwork on node 1 and is told the API server's address
(a real cluster routes the `kubernetes` Service) and a resolver (the node's resolv.conf is empty,
and the server starts its own proxy, which needs one, on ports apart from the node agent's proxy
beside it); both nodes share this machine's disk, so each agent's state is a subdirectory per
node of a test directory; the node agents get the test internet's resolver and CA; node 2 is
labelled and tainted as the sandbox node and the server's config.toml (deploy/'s, its sandbox-node
placement turned on) sends sandboxes there; the test cluster's
hostPath volumes ignore fsGroup, so the overlay takes components/state-owner. OpenBao (`bao
server -dev`, the `bao` of the test venv) and PostgreSQL (Debian's, tests/support/postgres.py)
listen on node 1's address in node 1's network namespace, where the hostNetwork server reaches
them. The nodes pull `python:3.12` (the conformance clients' image) from the session's test
registry only.

Evidence from the other side: the Pods' phase and node from the API server, the origin's log
(the sandbox's request arrives from its node's address with the credential), the nodes' own
containerd (the image is there, imported, never pulled), OpenBao's own KV (the credential is
there, and in clear nowhere in the server's state volume), the database read from its side (the
sandbox's row in PostgreSQL, or in the SQLite file on the state volume), the server's process as
the node sees it (its uid, its argv).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import secrets
import sqlite3
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import httpx
import hvac
import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Pod
from opensandbox import SandboxSync
from opensandbox.config.connection_sync import ConnectionConfigSync

from tests.conformance.scenarios import MODES, SCENARIOS, Result, check
from tests.kubernetes import test_two_node_proxies as two_nodes
from tests.kubernetes.cluster import (
    SCRIPTS,
    Cluster,
    run_script,
    running_cluster,
    skip_unless_built,
    up_to_a_build,
)
from tests.kubernetes.serving import write_agent_tls
from tests.kubernetes.test_conformance import CLIENTS
from tests.kubernetes.test_manifests import installed, kubectl
from tests.kubernetes.test_node_proxy import POLICY, SECRET, wait_until
from tests.kubernetes.test_two_node_proxies import NODES, has_arrived
from tests.support.internet import DNS_ADDR, ORIGIN_V4, Internet
from tests.support.openbao import OpenBao, openbao_dev_server
from tests.support.postgres import Postgres, postgres_server
from tests.support.registry import Registry
from tests.support.server import SandgateServer

pytestmark = pytest.mark.root
skip_unless_built()

# the client and the test internet routed to both nodes, as in test_two_node_proxies
client, internet = two_nodes.client, two_nodes.internet

DEPLOY = SCRIPTS.parents[1] / "deploy"
IMAGE = "sandgate.example.test/sandgate:1"
SERVER_URL = "10.231.0.2:8080"  # node 1's address: the server's hostNetwork Pod (the overlay)
OPENBAO_LISTEN = "10.231.0.2:18200"  # in node 1's network namespace, beside the server
SERVER_UID = 10001  # the image's user (scripts/cluster/sandgate-image.sh)
SANDBOX_IMAGE = "python:3.12"  # the conformance clients', from the test registry
# Each variant is one install: `sqlite` the base (SQLite on the state volume, the local vault),
# `external` the state on PostgreSQL and the vault on OpenBao. Both take state-owner (hostPath).
VARIANTS = {"sqlite": ("state-owner",), "external": ("state-owner", "postgresql", "openbao")}
API_KEY = secrets.token_urlsafe(24)
RUN_TIMEOUT = 300
# Node 1 is the system node (the server's, with hostNetwork), node 2 the sandbox node, labelled and
# tainted as docs/kubernetes.md "Sandbox nodes" says, with deploy/config.toml's commented
# node_selector and tolerations turned on: sandbox Pods go there only, the node agents are there
# too (the base's toleration of every taint: an agent on each node proves it). A sandbox on the
# server's own node would be out of its reach: the node agent's walls drop what a Pod sends to the
# node's own addresses, the replies to the node's own connections included.
SYSTEM_NODE, SANDBOX_NODE = "sandgate-node", "sandgate-node-2"
SANDBOX_LABEL = SANDBOX_TAINT = "sandgate.example.test/sandboxes"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, registry: Registry) -> Iterator[Cluster]:
    """Two nodes, each pulling docker.io names from the test registry only."""
    state_dir = tmp_path_factory.mktemp("cluster") / "state"
    with (
        running_cluster(
            state_dir, SANDGATE_CLUSTER_NODES="2", SANDGATE_CLUSTER_MIRROR=registry.mirror
        ) as handle,
        registry.reachable_from(handle.pid("containerd")),
        registry.reachable_from(handle.pid("containerd-2")),
    ):
        yield handle


@pytest.fixture(scope="module")
def openbao(cluster: Cluster) -> Iterator[OpenBao]:
    with openbao_dev_server(OPENBAO_LISTEN, netns=cluster.netns) as running:
        yield running


@pytest.fixture(scope="module")
def postgres(cluster: Cluster) -> Iterator[Postgres]:
    """Debian's PostgreSQL on node 1's address, in node 1's network namespace."""
    with postgres_server(NODES[SYSTEM_NODE][0], netns=cluster.netns) as running:
        yield running


def overlay(
    directory: Path, node_state: Path, upstream_ca: Path, variant: str, server_env: list[dict[str, str]]
) -> Path:
    """The test cluster's overlay of deploy/ (see the module's docstring) with the variant's
    components and `server_env` for the server."""
    base = os.path.relpath(DEPLOY, directory)
    components = [os.path.relpath(DEPLOY / "components" / name, directory) for name in VARIANTS[variant]]
    server = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "sandgate-server", "namespace": "sandgate-system"},
        "spec": {"template": {"spec": {
            "hostNetwork": True,
            "nodeSelector": {"kubernetes.io/hostname": "sandgate-node"},
            "containers": [{"name": "server", "env": [
                {"name": "KUBERNETES_SERVICE_HOST", "value": "10.231.0.2"},
                {"name": "KUBERNETES_SERVICE_PORT", "value": "6443"},
                # the server's own proxy needs a resolver; the test node's resolv.conf has none
                {"name": "SANDGATE_UPSTREAM_DNS", "value": json.dumps([DNS_ADDR])},
                # on node 1's network beside the node agent's proxy, which holds 15001/15002/15053
                {"name": "SANDGATE_PROXY_TRANSPARENT_PORT", "value": "16001"},
                {"name": "SANDGATE_PROXY_EXPLICIT_PORT", "value": "16002"},
                {"name": "SANDGATE_PROXY_DNS_PORT", "value": "16053"},
                *server_env,
            ]}],
        }}},
    }  # fmt: skip
    agents = {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "sandgate-node-proxy", "namespace": "sandgate-system"},
        "spec": {"template": {"spec": {
            "containers": [{
                "name": "node-proxy",
                "args": [
                    "node-proxy", "--listen=$(NODE_IP):9443", "--tls-cert=/etc/sandgate-node/tls.crt",
                    "--tls-key=/etc/sandgate-node/tls.key", "--token-file=/etc/sandgate-node/token",
                    "--pod-cidr=10.232.0.0/16", f"--upstream-dns={DNS_ADDR}",
                    "--upstream-ca=/etc/sandgate-upstream/ca.crt",
                ],
                "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
                "volumeMounts": [
                    {"name": "state", "mountPath": "/var/lib/sandgate-node", "subPathExpr": "$(NODE_NAME)"},
                    {"name": "upstream", "mountPath": "/etc/sandgate-upstream", "readOnly": True},
                ],
            }],
            "volumes": [
                {"name": "state", "hostPath": {"path": str(node_state), "type": "DirectoryOrCreate"}},
                {"name": "upstream", "hostPath": {"path": str(upstream_ca.parent), "type": "Directory"}},
            ],
        }}},
    }  # fmt: skip
    (directory / "server.json").write_text(json.dumps(server))
    (directory / "agents.json").write_text(json.dumps(agents))
    (directory / "config.toml").write_text(with_sandbox_nodes((DEPLOY / "config.toml").read_text()))
    kustomization = {
        "resources": [base],
        "components": components,
        "patches": [{"path": "server.json"}, {"path": "agents.json"}],
        "configMapGenerator": [{"name": "sandgate-config", "namespace": "sandgate-system",
                                "behavior": "replace", "files": ["config.toml"]}],
    }  # fmt: skip
    (directory / "kustomization.yaml").write_text(json.dumps(kustomization))
    return directory


def with_sandbox_nodes(config: str) -> str:
    """deploy/config.toml with its commented sandbox-node placement turned on, as a platform team
    would; checked, so a change of that comment fails here."""
    placed = re.sub(r'(?m)^# (\[kubernetes\.|\[\[kubernetes\.|"|key =|operator =|effect =)', r"\1", config)
    kubernetes = tomllib.loads(placed)["kubernetes"]
    assert kubernetes["node_selector"] == {SANDBOX_LABEL: "true"}, placed
    assert kubernetes["tolerations"] == [{"key": SANDBOX_TAINT, "operator": "Exists", "effect": "NoSchedule"}]
    return placed


def cluster_bin() -> Path:
    built = subprocess.run(["bash", str(SCRIPTS / "build.sh"), "--cached"], capture_output=True, text=True)
    return Path(built.stdout.strip())


def kubectl_command(cluster: Cluster) -> list[str]:
    return [str(cluster_bin() / "kubectl"), "--kubeconfig", str(cluster.kubeconfig)]


def node_image_listing(node_root: Path) -> str:
    ctr = [str(cluster_bin() / "ctr"), "--address", str(node_root / "containerd" / "containerd.sock")]
    return subprocess.run(
        [*ctr, "-n", "k8s.io", "images", "list", "-q"], capture_output=True, text=True
    ).stdout


@dataclass
class Installed:
    """One install of the module: its overlay, and the external parts of the `external` variant."""

    overlay: Path
    variant: str
    openbao: OpenBao | None = None
    postgres: Postgres | None = None


@pytest.fixture(scope="module")
def images(cluster: Cluster) -> None:
    """Both images built from local files and imported into every node's containerd."""
    for script in ("sandgate-image.sh", "execd-image.sh"):
        imported = run_script(script, cluster.state_dir, timeout=1200, PYTHON=sys.executable)
        assert imported.returncode == 0, imported.stderr
    for node_root in (cluster.state_dir, cluster.state_dir / "nodes" / "2"):
        assert IMAGE in node_image_listing(node_root)


@pytest.fixture(scope="module", params=list(VARIANTS))
def install(
    request: pytest.FixtureRequest,
    cluster: Cluster,
    internet: Internet,
    images: None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Installed]:
    """The Secrets made, the variant's overlay applied; uninstalled afterwards."""
    variant = request.param
    workdir = tmp_path_factory.mktemp(f"install-{variant}")
    write_agent_tls(workdir, tuple(address for address, _, _ in NODES.values()))
    (workdir / "token").write_text(secrets.token_urlsafe(32))
    upstream = workdir / "upstream"
    upstream.mkdir()
    (upstream / "ca.crt").write_bytes(internet.ca_cert.read_bytes())
    installed = Installed(workdir / "overlay", variant)
    server_env = []
    if variant == "external":
        installed.openbao = request.getfixturevalue("openbao")
        installed.postgres = request.getfixturevalue("postgres")
        server_env = [{"name": "SANDGATE_OPENBAO_ADDR", "value": installed.openbao.addr}]
    installed.overlay.mkdir()
    overlay(installed.overlay, workdir / "node-state", upstream / "ca.crt", variant, server_env)
    kubectl(cluster, "create", "namespace", "sandgate-system")
    kubectl(cluster, "-n", "sandgate-system", "create", "secret", "generic", "sandgate-node-proxy",
            f"--from-file=tls.crt={workdir / 'agent.crt'}", f"--from-file=tls.key={workdir / 'agent.key'}",
            f"--from-file=ca.crt={workdir / 'ca.crt'}", f"--from-file=token={workdir / 'token'}")  # fmt: skip
    kubectl(cluster, "-n", "sandgate-system", "create", "secret", "generic", "sandgate-api-key",
            f"--from-literal=api-key={API_KEY}")  # fmt: skip
    if installed.openbao and installed.postgres:  # the credentials go in as files: never on argv
        (workdir / "openbao-token").write_text(installed.openbao.root_token)
        (workdir / "database-url").write_text(installed.postgres.url)
        kubectl(cluster, "-n", "sandgate-system", "create", "secret", "generic", "sandgate-openbao",
                f"--from-file=token={workdir / 'openbao-token'}")  # fmt: skip
        kubectl(cluster, "-n", "sandgate-system", "create", "secret", "generic", "sandgate-database",
                f"--from-file=url={workdir / 'database-url'}")  # fmt: skip
    kubectl(cluster, "label", "node", SANDBOX_NODE, f"{SANDBOX_LABEL}=true", "--overwrite")
    kubectl(cluster, "taint", "node", SANDBOX_NODE, f"{SANDBOX_TAINT}=true:NoSchedule", "--overwrite")
    kubectl(cluster, "apply", "-k", str(installed.overlay))
    try:
        yield installed
    finally:
        kubectl(cluster, "delete", "-k", str(installed.overlay), "--wait=true", "--timeout=180s", check=False)
        kubectl(
            cluster, "delete", "namespace", "sandgate-system", "--wait=true", "--timeout=180s", check=False
        )


def server_processes() -> dict[int, tuple[int, bytes]]:
    """PID -> (real uid, argv) of every process running the in-cluster server's `serve`, read from
    this machine's /proc (the node's view, not the Pod's word)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes()
            status = (entry / "status").read_text()
        except OSError:
            continue  # gone meanwhile
        if b"/etc/sandgate/config.toml\0serve" in argv:
            uid = next(line.split()[1] for line in status.splitlines() if line.startswith("Uid:"))
            found[int(entry.name)] = (int(uid), argv)
    return found


def state_volume(cluster: Cluster) -> Path:
    """The node directory behind the server's state claim (the test StorageClass's hostPath)."""
    volume = kubectl(cluster, "-n", "sandgate-system", "get", "pvc", "sandgate-state",
                     "-o", "jsonpath={.spec.volumeName}").stdout.strip()  # fmt: skip
    return Path(kubectl(cluster, "get", "pv", volume, "-o", "jsonpath={.spec.hostPath.path}").stdout.strip())


def recorded_sandboxes(install: Installed, volume: Path) -> list[str]:
    """The sandbox ids in the variant's database, read from its side."""
    if install.postgres is not None:
        return [str(row[0]) for row in install.postgres.run("SELECT id FROM sandboxes")]
    database = volume / "server" / "sandgate.db"
    with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as db:
        return [str(row[0]) for row in db.execute("SELECT id FROM sandboxes")]


def rollout(cluster: Cluster, what: str) -> None:
    done = kubectl(cluster, "-n", "sandgate-system", "rollout", "status", what, "--timeout=240s", check=False)
    if done.returncode != 0:
        pods = kubectl(cluster, "-n", "sandgate-system", "get", "pods", "-o", "wide", check=False).stdout
        logs = kubectl(cluster, "-n", "sandgate-system", "logs", "--all-containers", "--tail=40",
                       "-l", "app.kubernetes.io/part-of=sandgate", "--prefix", check=False)  # fmt: skip
        pytest.fail(f"{what} did not roll out: {done.stderr}\n{pods}\n{logs.stdout}{logs.stderr}")


@up_to_a_build
@pytest.mark.timeout(1800)
def test_the_server_and_the_node_agents_run_from_the_manifests(
    cluster: Cluster, client: Client, install: Installed
) -> None:
    rollout(cluster, "daemonset/sandgate-node-proxy")
    rollout(cluster, "deployment/sandgate-server")
    agents = [
        pod
        for pod in client.list(Pod, namespace="sandgate-system")
        if pod.metadata and "node-proxy" in str(pod.metadata.name)
    ]
    assert sorted(str(pod.spec.nodeName) for pod in agents if pod.spec) == sorted(NODES)
    assert all(pod.status and pod.status.phase == "Running" for pod in agents)
    deadline = time.monotonic() + RUN_TIMEOUT
    while True:  # the server answers from the host
        try:
            if httpx.get(f"http://{SERVER_URL}/health", timeout=5).status_code < 500:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "the in-cluster server does not answer"
        time.sleep(1)


@up_to_a_build
def test_the_server_runs_as_a_user_and_its_credentials_are_in_no_configmap_or_argv(
    cluster: Cluster, install: Installed
) -> None:
    """The node's /proc: the server's process (and nothing of it) runs as root; the OpenBao token
    and the database URL it reads from Secrets are not on its command line, in the ConfigMap or in
    the Deployment's spec."""
    processes = server_processes()
    assert processes, "no in-cluster server process on this machine"
    assert {uid for uid, _ in processes.values()} == {SERVER_UID}, processes
    if install.openbao is None or install.postgres is None:
        return
    for secret in (install.openbao.root_token, install.postgres.password):
        assert not any(secret.encode() in argv for _, argv in processes.values())
        for kind in ("configmap", "deployment"):
            listed = kubectl(cluster, "-n", "sandgate-system", "get", kind, "-o", "json").stdout
            assert secret not in listed, kind


@up_to_a_build
@pytest.mark.timeout(900)
def test_the_quickstart_through_the_in_cluster_server(
    cluster: Cluster, internet: Internet, install: Installed
) -> None:
    """The SDK creates a sandbox, runs a command, writes and reads a file; the policy set through
    the API lets its request reach the origin from its node with the credential; it is deleted.
    The credential goes in with `sandgate vault put` in the server's container (its config is
    the mounted /etc/sandgate/config.toml): in no file of the server's state volume in clear; on
    `sqlite` in the local vault there, on `external` in OpenBao's KV. The sandbox's record is in
    the variant's database, read from its side (the state volume's SQLite file, or PostgreSQL)."""
    connection = ConnectionConfigSync(
        domain=SERVER_URL,
        api_key=API_KEY,
        protocol="http",
        request_timeout=timedelta(seconds=240),
        disable_metrics=True,
    )
    headers = {"OPEN-SANDBOX-API-KEY": API_KEY}
    put = subprocess.run(
        [*kubectl_command(cluster), "-n", "sandgate-system", "exec", "-i", "deploy/sandgate-server", "--",
         "/usr/local/bin/python3", "-m", "sandgate.lifecycle.cli", "vault", "put", "node-api-token"],
        input=SECRET, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert put.returncode == 0, put.stderr
    volume = state_volume(cluster)
    in_volume = [
        path for path in volume.rglob("*") if path.is_file() and SECRET.encode() in path.read_bytes()
    ]
    assert in_volume == [], in_volume
    assert any(volume.rglob("vault.enc")) == (install.openbao is None)
    if install.openbao is not None:
        bao = hvac.Client(url=install.openbao.addr, token=install.openbao.root_token)
        stored = bao.secrets.kv.v2.read_secret_version(path="sandgate/node-api-token", mount_point="secret",
                                                       raise_on_deleted_version=True)  # fmt: skip
        assert stored["data"]["data"] == {"value": SECRET}  # in OpenBao's KV, from the server's vault put
    sandbox = SandboxSync.create(
        "sandgate.example.test/busybox:1",
        entrypoint=["/bin/busybox", "sleep", "3600"],
        connection_config=connection,
        ready_timeout=timedelta(seconds=240),
    )
    try:
        assert sandbox.id in recorded_sandboxes(install, volume)
        assert (volume / "server" / "sandgate.db").exists() == (install.postgres is None)
        said = sandbox.commands.run("echo hello-from-$((40+2))")
        assert said.exit_code == 0
        assert "".join(m.text for m in said.logs.stdout).strip() == "hello-from-42"
        sandbox.files.write_file("/workspace/notes.txt", "written through the SDK")
        assert sandbox.files.read_file("/workspace/notes.txt") == "written through the SDK"
        with httpx.Client(base_url=f"http://{SERVER_URL}", headers=headers, timeout=60) as api:
            answer = api.put(f"/v1/sandboxes/{sandbox.id}/egress/sandgate-policy", json={"policy": POLICY})
            assert answer.status_code == 200, answer.text
        path = f"/echo/in-cluster-{secrets.token_hex(4)}"
        request = f"GET {path} HTTP/1.1\\r\\nHost: api.example.com\\r\\nConnection: close\\r\\n\\r\\n"
        sandbox.commands.run(
            f"{{ busybox printf '{request}'; busybox sleep 3; }} | busybox nc -w 5 {ORIGIN_V4} 80"
        )
        wait_until("the sandbox's request at the origin", lambda: has_arrived(internet, path), timeout=60)
        (seen,) = [r for r in internet.origin_requests() if r.get("path") == path]
        headers_seen = seen["headers"]
        assert isinstance(headers_seen, dict) and headers_seen["authorization"] == f"Bearer {SECRET}"
        assert str(seen["client"]).split(":")[0] == NODES[SANDBOX_NODE][0]  # from the sandbox node
    finally:
        sandbox.kill()
        sandbox.close()


class InClusterServer(SandgateServer):
    """The in-cluster server as the conformance drivers see a SandgateServer: its address, key and
    the image the scenarios create from (nothing of it runs here)."""

    @property
    def domain(self) -> str:
        return SERVER_URL


@pytest.fixture(scope="module")
def in_cluster(install: Installed, tmp_path_factory: pytest.TempPathFactory) -> SandgateServer:
    server = InClusterServer(tmp_path_factory.mktemp("in-cluster"), api_key=API_KEY)
    server.sandbox_image = SANDBOX_IMAGE
    with server.client(timeout=300) as api:  # the sandbox node's first pull of the image, not the clients'
        created = api.post(
            "/v1/sandboxes", json={"image": {"uri": SANDBOX_IMAGE}, "entrypoint": ["sleep", "60"]}
        )
        assert created.status_code == 202, created.text
        assert api.delete(f"/v1/sandboxes/{created.json()['id']}").status_code == 204
    return server


@pytest.fixture(scope="module")
def results(in_cluster: SandgateServer) -> Callable[[str, str], dict[str, Result]]:
    """One client's results in one mode, run once on first use."""
    return functools.cache(lambda client, mode: CLIENTS[client](in_cluster, mode))


@up_to_a_build
@pytest.mark.parametrize(("client", "mode", "scenario"), [
    (client, mode, scenario) for client in CLIENTS for mode in MODES for scenario in SCENARIOS
])  # fmt: skip
def test_client_scenarios_through_the_in_cluster_server(
    results: Callable[[str, str], dict[str, Result]], client: str, mode: str, scenario: str
) -> None:
    check(client, lambda: results(client, mode), scenario, runtime="kubernetes")


@up_to_a_build
def test_uninstall_leaves_none_of_its_objects(cluster: Cluster, install: Installed) -> None:
    kubectl(cluster, "delete", "-k", str(install.overlay), "--wait=true", "--timeout=180s")
    deadline = time.monotonic() + 120
    while (left := installed(cluster)) and time.monotonic() < deadline:
        time.sleep(1)
    assert not left
