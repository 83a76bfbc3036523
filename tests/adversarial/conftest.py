"""The adversarial suite's world: one real `sandgate serve`, one test internet, one canary
namespace, and one attacker sandbox created through the API, shared by the whole package.

Rules:
1. Attacks run INSIDE the attacker sandbox (the SDK's `commands.run`, or `attacks.py`, which is
   uploaded into the sandbox). Every byte a command prints is checked for the secret in every
   form it could travel in, at once (`Attacker.sh`), so a leak fails the test that caused it.
2. The attacker's policy denies by default and allows: `api.example.com` (credential bound,
   injected by the proxy; TLS intercepted), `open.example.com` (no credential: TLS passes
   through) and `*.rebind.example.com` (an allowed name whose DNS "the attacker" controls).
3. Targets that must never be reached live in namespaces this package creates: the canary
   namespace holds the metadata address and an RFC1918 address, a loopback canary listens on
   127.0.0.1 in the test's host namespace, so a failed defence lands there and is recorded,
   never on anything outside the test's own namespaces.
4. Proxy ports are random per run, so this server never collides with another test server.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import secrets
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from ipaddress import IPv4Network
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from opensandbox import SandboxSync
from opensandbox.config.connection_sync import ConnectionConfigSync
from opensandbox.models.execd import RunCommandOpts
from opensandbox.models.sandboxes import CredentialProxyConfig, NetworkPolicy, NetworkRule

from tests.support.audit import audit_records, wait_records
from tests.support.internet import DNS_ADDR, ORIGIN_V4, ORIGIN_V6, Internet, start_internet
from tests.support.netns import Netns, ip, unique
from tests.support.registry import Registry
from tests.support.server import SANDGATE, SandgateServer, free_port, sandgate_server

SECRET = f"sk-adv-{secrets.token_hex(12)}"
PLACEHOLDER = "SANDGATE_PLACEHOLDER_API_TOKEN"
BOUND_HOST = "api.example.com"
OPEN_HOST = "open.example.com"
DENIED_HOST = "denied.example.com"
REBIND_ZONE = "rebind.example.com"
EXFIL_ZONE = "exfil.example.test"
METADATA_ADDR = "169.254.169.254"
PRIVATE_ADDR = "172.16.99.1"
CANARY_PORTS = (53, 80, 443, 853)
ATTACKS = Path(__file__).with_name("attacks.py")
IN_SANDBOX_ATTACKS = "/workspace/attacks.py"
IN_SANDBOX_TEST_CA = "/workspace/internet-ca.pem"
COMMAND_TIMEOUT = 60
# The suite's sandboxes live as long as their package or module: past the SDK's default of ten
# minutes when the suite runs on gvisor, where the attacker outlives the slow whole-root scans,
# and under load (18 minutes at load average 10 to 15, scripts/adversarial-under-burn.sh).
SANDBOX_LIFETIME = timedelta(hours=2)
# Long-lived secrets and minted tokens of the modules that use their own (AWS keys, OAuth2
# client secrets, refresh tokens, keys, every token a test server issued): added as each module
# ends, hunted in every log line and state file by test_zz_nothing_leaked.
LONG_LIVED_AND_MINTED: list[str] = []

NETWORK_POLICY = NetworkPolicy(
    defaultAction="deny",
    egress=[
        NetworkRule(action="allow", target=BOUND_HOST),
        NetworkRule(action="allow", target=OPEN_HOST),
        NetworkRule(action="allow", target=f"*.{REBIND_ZONE}"),
    ],
)
# One credential, two bindings on disjoint paths (two bindings matching one request is refused
# as ambiguous): a bearer header everywhere but /echo/placeholder, where the workload's
# placeholder is substituted instead.
BEARER_PATHS = ["/", "/echo", "/redirect", "/sse", "/bytes", "/ws"]
VAULT = {
    "credentials": [{"name": "api-token", "source": {"type": "inline", "value": SECRET}}],
    "bindings": [
        {
            "name": "api",
            "match": {"hosts": [BOUND_HOST], "paths": BEARER_PATHS},
            "auth": {"type": "bearer", "credential": "api-token"},
        },
        {
            "name": "api-placeholder",
            "match": {"hosts": [BOUND_HOST], "paths": ["/echo/placeholder"]},
            "auth": {
                "type": "passthrough",
                "substitutions": [
                    {"credential": "api-token", "placeholder": PLACEHOLDER, "in": ["header", "query"]}
                ],
            },
        },
    ],
}


def secret_forms(secret: str = SECRET) -> list[str]:
    """The secret as it could appear in output: raw, URL-encoded, JSON-escaped, base64 at every
    alignment (its stable middle), and a long middle slice (a partial leak is a leak)."""
    forms = {secret, quote(secret, safe=""), json.dumps(secret)[1:-1], secret[3:-3]}
    for pad in range(3):
        encoded = base64.b64encode(b"\0" * pad + secret.encode()).decode()
        forms.add(encoded[4 : len(encoded) - 4])
    return sorted(forms)


def find_leak(text: str | bytes) -> str | None:
    data = text.decode("latin-1") if isinstance(text, bytes) else text
    return next((form for form in secret_forms() if form in data), None)


# ------------------------------------------------------------------------------ canary targets

CANARY_SERVER = r"""
import json, socket, sys, threading
log_path, addresses, ports = sys.argv[1], sys.argv[2].split(","), [int(p) for p in sys.argv[3].split(",")]
lock = threading.Lock()
def record(kind, local, peer, data):
    with lock, open(log_path, "a") as fh:
        fh.write(json.dumps({"kind": kind, "local": f"{local[0]}:{local[1]}", "peer": f"{peer[0]}:{peer[1]}",
                             "data": data[:200].decode("latin-1")}) + "\n")
def tcp(sock):
    while True:
        conn, peer = sock.accept()
        conn.settimeout(1)
        try:
            data = conn.recv(4096)
        except OSError:
            data = b""
        record("tcp", conn.getsockname(), peer, data)
        conn.close()
def udp(sock):
    while True:
        data, peer = sock.recvfrom(4096)
        record("udp", sock.getsockname(), peer, data)
for address in addresses:
    for port in ports:
        t = socket.socket(); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        t.bind((address, port)); t.listen(64)
        threading.Thread(target=tcp, args=(t,), daemon=True).start()
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind((address, port))
        threading.Thread(target=udp, args=(u,), daemon=True).start()
open(log_path + ".ready", "w").close()
threading.Event().wait()
"""


@dataclass
class Canaries:
    """Listeners on addresses a sandbox must never reach; `hits()` is everything they saw."""

    log: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def hits(self) -> list[dict[str, str]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line]


def _start_canary(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    ready = Path(f"{log}.ready")
    ready.unlink(missing_ok=True)
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 10
    while not ready.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"canary did not start: {process.communicate()[1].decode(errors='replace')}")
        time.sleep(0.02)
    return process


@pytest.fixture(scope="package")
def canaries(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Canaries]:
    """Metadata and RFC1918 addresses in a namespace of our own (routed from the test's host
    namespace over one veth), plus loopback in the host namespace, all listening and recording."""
    workdir = tmp_path_factory.mktemp("canary")
    canaries = Canaries(workdir / "hits.jsonl")
    ns = Netns("sga")
    host_if = unique("tva")
    ports = ",".join(map(str, CANARY_PORTS))
    try:
        ip("link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", ns.name)
        ip("addr", "add", "203.0.113.1/24", "dev", host_if)
        ip("link", "set", host_if, "up")
        ip("addr", "add", "203.0.113.2/24", "dev", "eth0", netns=ns.name)
        for address in (METADATA_ADDR, PRIVATE_ADDR):
            ip("addr", "add", f"{address}/32", "dev", "eth0", netns=ns.name)
            ip("route", "add", f"{address}/32", "via", "203.0.113.2", "dev", host_if)
        ip("link", "set", "eth0", "up", netns=ns.name)
        ip("route", "add", "default", "via", "203.0.113.1", netns=ns.name)
        script = [sys.executable, "-c", CANARY_SERVER, str(canaries.log)]
        canaries.processes.append(
            _start_canary(ns.cmd([*script, f"{METADATA_ADDR},{PRIVATE_ADDR}", ports]), canaries.log)
        )
        canaries.processes.append(_start_canary([*script, "127.0.0.1", ports], canaries.log))
        yield canaries
    finally:
        for process in canaries.processes:
            process.kill()
            process.wait(5)
        subprocess.run(["ip", "link", "del", host_if], capture_output=True)
        ns.delete()


# ------------------------------------------------------------------------------ internet and server


# The runtime and isolation the suite's sandboxes run on (docs/runtime.md has the commands):
# SANDGATE_TEST_RUNTIME `local` (default), `docker` (the session's private dockerd) or
# `kubernetes` (the test cluster with the node agent, tests/kubernetes/serving.py),
# SANDGATE_TEST_ISOLATION `standard` (default) or `gvisor`.
TEST_RUNTIME = os.environ.get("SANDGATE_TEST_RUNTIME", "local")
TEST_ISOLATION = os.environ.get("SANDGATE_TEST_ISOLATION", "standard")
# The Python that runs the suite's scripts inside a sandbox: on the local runtime the host's own
# (`sandgate/host` shows the host's root, read-only), elsewhere the image's (the same Python as the
# test venv's) with the venv's libraries the scripts import (TEST_SITE_PACKAGES: h2 and wsproto for
# the HTTP/2 and WebSocket attacks and hold_connections.py, boto3 for test_aws_sigv4) at TEST_SITE:
# bound read-only by the Docker servers' `binds`, a layer of the Pods' image on Kubernetes (a Pod
# has no binds).
TEST_SITE = "/opt/sandgate-test-site"
TEST_SITE_PACKAGES = (
    "h2", "hpack", "hyperframe", "h11", "wsproto",
    "boto3", "botocore", "s3transfer", "jmespath", "dateutil", "six.py", "urllib3",
)  # fmt: skip
SANDBOX_PYTHON = sys.executable if TEST_RUNTIME == "local" else f"PYTHONPATH={TEST_SITE} python3"
# What the suite's sandboxes are made from: a Pod's image is pulled by the node from the session's
# test registry (`kubernetes_image`: python:3.12, with Python, curl and a shell as the attacks need,
# and TEST_SITE, and SANDBOX_TOOLS with the libraries they load: the host's dig, which the DNS
# tests ask the sandbox's resolver with, as on the local runtime).
SANDBOX_IMAGE = "python:3.12-adversarial" if TEST_RUNTIME == "kubernetes" else "sandgate/host"
SANDBOX_TOOLS = [Path("/usr/bin/dig")]
RUNTIMES = ("local", "docker", "kubernetes")


def runtime_settings(request: pytest.FixtureRequest) -> dict[str, str]:
    """The server settings for TEST_RUNTIME and TEST_ISOLATION; on Docker, the session's private
    dockerd with the sandbox images built into it; on Kubernetes, the test cluster's."""
    if TEST_RUNTIME not in RUNTIMES:
        raise ValueError(f"SANDGATE_TEST_RUNTIME={TEST_RUNTIME!r}: use one of {', '.join(RUNTIMES)}")
    settings = {"SANDGATE_ISOLATION": TEST_ISOLATION}
    if TEST_RUNTIME == "kubernetes":
        settings |= request.getfixturevalue("kubernetes_node").settings
    if TEST_RUNTIME == "docker":
        request.getfixturevalue("sandbox_images")
        settings |= {
            "SANDGATE_RUNTIME": "docker",
            "SANDGATE_DOCKER_HOST": request.getfixturevalue("dockerd").url,
            "SANDGATE_BINDS": json.dumps([f"{sysconfig.get_paths()['purelib']}:{TEST_SITE}:ro"]),
        }
    return settings


@pytest.fixture(scope="package")
def internet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Internet]:
    with start_internet(tmp_path_factory.mktemp("internet")) as net:
        net.set_names(ZONE)
        yield net


@dataclass
class KubernetesNode:
    """The test cluster's node as the suite uses it: a server's settings, the node's network
    namespace (where its proxy connects from) and its agent (whose nft counters are evidence)."""

    settings: dict[str, str]
    netns: str
    agent: Any  # tests.kubernetes.serving.Agent, imported only on this runtime


@pytest.fixture(scope="package")
def kubernetes_node(
    tmp_path_factory: pytest.TempPathFactory, internet: Internet, canaries: Canaries, registry: Registry
) -> Iterator[KubernetesNode]:
    """The test cluster (its node pulls docker.io names from the session's test registry, where
    SANDBOX_IMAGE is pushed), the test internet and the canaries routed to the node, the node
    agent on it. Imported here so other runtimes need no cluster build."""
    from lightkube import Client, KubeConfig

    from tests.kubernetes.cluster import skip_unless_built
    from tests.kubernetes.serving import (
        HOST_LINK_IP,
        cluster_pulling_from,
        kubernetes_settings,
        node_agent,
        route_internet,
    )
    from tests.support.registry import host_program_trees, push_python_with

    skip_unless_built()
    site = Path(sysconfig.get_paths()["purelib"])
    trees = {f"{TEST_SITE}/{name}": site / name for name in TEST_SITE_PACKAGES}
    trees |= host_program_trees(SANDBOX_TOOLS)
    push_python_with(registry, trees, SANDBOX_IMAGE)
    with cluster_pulling_from(registry, tmp_path_factory.mktemp("cluster") / "state") as cluster:
        route_internet(cluster, internet)
        for address in (METADATA_ADDR, PRIVATE_ADDR):  # a failed defence lands on a canary
            ip("route", "add", f"{address}/32", "via", HOST_LINK_IP, netns=cluster.netns)
        admin = Client(config=KubeConfig.from_file(cluster.kubeconfig))
        with node_agent(cluster, internet, tmp_path_factory.mktemp("node-agent")) as agent:
            yield KubernetesNode(kubernetes_settings(cluster, admin, agent.agents), cluster.netns, agent)


def node_counters(request: pytest.FixtureRequest) -> dict[str, int]:
    """Kubernetes: the node's drop counters by name, where the node counts each kind of packet it
    drops from a Pod before any proxy sees it (the evidence a host-side netns gives elsewhere)."""
    from tests.kubernetes.serving import node_counters as read

    return read(request.getfixturevalue("kubernetes_node").netns)


def sandbox_range(request: pytest.FixtureRequest, server: SandgateServer) -> IPv4Network:
    """Where the server's sandboxes get their addresses: its address pool, or on Kubernetes the
    node's Pod range (the node's proxy itself connects from the node's address, outside it)."""
    if TEST_RUNTIME == "kubernetes":
        return IPv4Network(request.getfixturevalue("kubernetes_node").agent.pod_cidr)
    return server.address_pool


def reach_from_the_node(request: pytest.FixtureRequest, ns: str, host_address: str, *addresses: str) -> None:
    """A module's own origin (`addresses` in namespace `ns`, joined to this namespace where this
    end has `host_address`) as the sandboxes' proxy reaches it: on Kubernetes the node's proxy
    connects from the node's namespace, so route the addresses from the node and the node back
    (the routes go with the two namespaces); elsewhere the proxy runs here and reaches it already."""
    if TEST_RUNTIME != "kubernetes":
        return
    from tests.kubernetes.serving import HOST_LINK_IP, NODE_LINK

    node: KubernetesNode = request.getfixturevalue("kubernetes_node")
    for address in addresses:
        ip("route", "replace", f"{address}/32", "via", HOST_LINK_IP, netns=node.netns)
    ip("route", "replace", NODE_LINK, "via", host_address, netns=ns)


ZONE = {
    BOUND_HOST: [ORIGIN_V4, ORIGIN_V6],
    OPEN_HOST: [ORIGIN_V4],
    DENIED_HOST: [ORIGIN_V4],  # exists, so a request that got out would reach the origin's log
    f"loop.{REBIND_ZONE}": ["127.0.0.1"],
    f"meta.{REBIND_ZONE}": [METADATA_ADDR],
    f"private.{REBIND_ZONE}": [PRIVATE_ADDR],
    f"mixed.{REBIND_ZONE}": [METADATA_ADDR, ORIGIN_V4],
    f"mapped.{REBIND_ZONE}": ["::ffff:a9fe:a9fe"],  # ::ffff:169.254.169.254,
}


@dataclass
class ProxyPorts:
    transparent: int
    explicit: int
    dns: int


@pytest.fixture(scope="package")
def proxy_ports() -> ProxyPorts:
    if TEST_RUNTIME == "kubernetes":  # the node agent's proxy listens on the defaults
        from sandgate.lifecycle.confinement import ProxyPorts as NodePorts

        node = NodePorts()
        return ProxyPorts(node.transparent, node.explicit, node.dns)
    ports = set()
    while len(ports) < 3:
        ports.add(free_port())
    transparent, explicit, dns = sorted(ports)
    return ProxyPorts(transparent, explicit, dns)


@pytest.fixture(scope="package")
def server_settings(request: pytest.FixtureRequest) -> dict[str, str]:
    """The runtime and isolation of the package's servers (tests/gvisor/adversarial: gvisor)."""
    return runtime_settings(request)


@pytest.fixture(scope="package")
def server(
    tmp_path_factory: pytest.TempPathFactory,
    internet: Internet,
    canaries: Canaries,
    proxy_ports: ProxyPorts,
    server_settings: dict[str, str],
) -> Iterator[SandgateServer]:
    with adversarial_server(tmp_path_factory, internet, proxy_ports, server_settings) as running:
        yield running


@contextlib.contextmanager
def adversarial_server(
    tmp_path_factory: pytest.TempPathFactory,
    internet: Internet,
    proxy_ports: ProxyPorts,
    extra: dict[str, str] | None = None,
) -> Iterator[SandgateServer]:
    """The suite's server (`extra`: more settings, the runtime's and isolation's)."""
    env = {
        "SANDGATE_UPSTREAM_DNS": json.dumps([DNS_ADDR]),
        "SANDGATE_UPSTREAM_CA": str(internet.ca_cert),
        "SANDGATE_PROXY_TRANSPARENT_PORT": str(proxy_ports.transparent),
        "SANDGATE_PROXY_EXPLICIT_PORT": str(proxy_ports.explicit),
        "SANDGATE_PROXY_DNS_PORT": str(proxy_ports.dns),
        # A pool of two on any machine: the crash tests kill one worker while the other serves.
        "SANDGATE_PROXY_WORKERS": "2",
        **(extra or {}),
    }
    with sandgate_server(Path(tmp_path_factory.mktemp("sandgate")), env) as running:
        running.sandbox_image = SANDBOX_IMAGE  # what the OpenSandbox clients' scenarios create from
        yield running


@dataclass
class EgressProxy:
    """Where the proxy the sandboxes' traffic goes through runs: the process it is the child of
    (the server, or on Kubernetes the node agent), its state dir (its audit file) and the network
    namespace its sockets are in (None: this test's own)."""

    parent: int
    state_dir: Path
    netns: str | None = None

    def in_netns(self, argv: list[str]) -> list[str]:
        return argv if self.netns is None else ["nsenter", f"--net=/run/netns/{self.netns}", "--", *argv]


@pytest.fixture(scope="package")
def egress_proxy(request: pytest.FixtureRequest, server: SandgateServer) -> EgressProxy:
    if TEST_RUNTIME == "kubernetes":
        node: KubernetesNode = request.getfixturevalue("kubernetes_node")
        return EgressProxy(node.agent.process.pid, node.agent.state_dir, node.netns)
    assert server.process is not None
    return EgressProxy(server.process.pid, server.state_dir)


def connection(server: SandgateServer) -> ConnectionConfigSync:
    return ConnectionConfigSync(
        domain=server.domain,
        api_key=server.api_key,
        protocol="http",
        request_timeout=timedelta(seconds=90),
        disable_metrics=True,
    )


# ------------------------------------------------------------------------------ the attacker


@dataclass
class Result:
    exit_code: int | None
    stdout: str
    stderr: str


@dataclass
class Attacker:
    """The attacker sandbox, as the tests drive it; every output is checked for the secret."""

    sandbox: SandboxSync
    server: SandgateServer
    internet: Internet
    ports: ProxyPorts
    gateway: str = ""
    address: str = ""

    def sh(self, command: str, timeout: float = COMMAND_TIMEOUT) -> Result:
        execution = self.sandbox.commands.run(
            command, opts=RunCommandOpts(timeout=timedelta(seconds=timeout))
        )
        result = Result(
            execution.exit_code,
            "".join(m.text for m in execution.logs.stdout),
            "".join(m.text for m in execution.logs.stderr),
        )
        leak = find_leak(result.stdout + result.stderr)
        assert leak is None, f"the secret ({leak!r} form) reached the sandbox: {command}"
        return result

    def attack(self, attack: str, /, **arguments: Any) -> Any:
        """Run one attack of attacks.py inside the sandbox; returns what it observed (JSON)."""
        args = json.dumps(arguments).replace("'", "'\\''")
        result = self.sh(f"{SANDBOX_PYTHON} {IN_SANDBOX_ATTACKS} {attack} '{args}'")
        assert result.exit_code == 0, f"attack {attack} crashed:\n{result.stdout}\n{result.stderr}"
        return json.loads(result.stdout.strip().splitlines()[-1])

    def curl(self, *args: str, timeout: int = 10) -> Result:
        return self.sh("curl -sS --max-time {} {}".format(timeout, " ".join(args)))

    # -- what the outside saw ---------------------------------------------------------------

    def audit(self) -> list[dict[str, Any]]:
        """Every record, one per id (tests/support/audit.py), oldest first."""
        return audit_records(self.server.state_dir)

    def wait_audit(
        self, match: Callable[[dict[str, Any]], bool], timeout: float = 15.0, at_least: int = 1
    ) -> list[dict[str, Any]]:
        """Audit records of this sandbox that `match`, waiting (bounded) for `at_least` of them."""
        return wait_records(self.server.state_dir, self.sandbox.id, match, at_least, timeout)

    def origin_requests_since(self, mark: int) -> list[dict[str, Any]]:
        return self.internet.origin_requests()[mark:]

    def isolation(self) -> str:
        """`standard` or `gvisor`, as the server says it made this sandbox."""
        with self.server.client() as client:
            info = client.get(f"/v1/sandboxes/{self.sandbox.id}").json()
        return str(info["extensions"]["sandgate.isolation"])


@contextlib.contextmanager
def sandbox_with_policy(
    server: SandgateServer, policy: dict[str, Any], env: dict[str, str] | None = None
) -> Iterator[SandboxSync]:
    """A sandbox under a sandgate policy file's JSON (bindings of any kind, which the
    OpenSandbox credential-vault API cannot carry), killed on exit."""
    sandbox = SandboxSync.create(
        SANDBOX_IMAGE,
        entrypoint=["sleep", "infinity"],
        env=env or {},
        network_policy=NetworkPolicy(defaultAction="deny"),
        credential_proxy=CredentialProxyConfig(enabled=True),
        connection_config=connection(server),
        timeout=SANDBOX_LIFETIME,
        ready_timeout=timedelta(seconds=30),
    )
    try:
        with server.client() as client:
            answer = client.put(f"/v1/sandboxes/{sandbox.id}/egress/sandgate-policy", json={"policy": policy})
            assert answer.status_code == 200, answer.text
        yield sandbox
    finally:
        sandbox.kill()
        sandbox.close()


def vault_put(server: SandgateServer, name: str, value: str) -> None:
    """`sandgate vault put NAME` with the value on stdin, as an operator stores a secret."""
    put = subprocess.run(
        [*SANDGATE, "vault", "put", name], input=value, capture_output=True, text=True,
        env=server.server_env(), timeout=60,
    )  # fmt: skip
    assert put.returncode == 0 and "warning" not in put.stderr, put.stderr


def vault_rm(server: SandgateServer, name: str) -> None:
    """`sandgate vault rm NAME`; it returns once a server that pushes values to nodes has pushed."""
    removed = subprocess.run(
        [*SANDGATE, "vault", "rm", name], capture_output=True, text=True, env=server.server_env(), timeout=60
    )
    assert removed.returncode == 0 and "warning" not in removed.stderr, removed.stderr


def sandbox_netns(sandbox_id: str) -> str:
    """The name of a sandbox's netns (/run/netns/<name>), on either runtime."""
    names = [p.name for p in Path("/run/netns").iterdir() if p.name.endswith(f"-{sandbox_id}")]
    assert len(names) == 1, names
    return names[0]


def sandbox_net(server: SandgateServer, sandbox_id: str) -> tuple[str, str]:
    """(sandbox address, gateway) from the host side: the veth of that sandbox's netns; on
    Kubernetes its Pod's IP as the API server has it, and the node's Pod gateway."""
    if TEST_RUNTIME == "kubernetes":
        from tests.kubernetes.serving import pod_net

        return pod_net(server, sandbox_id)
    out = subprocess.run(
        ["ip", "-n", sandbox_netns(sandbox_id), "-4", "-o", "addr", "show", "dev", "eth0"],
        capture_output=True,
        text=True,
    ).stdout
    match = re.search(r"inet (\d+\.\d+\.\d+\.(\d+))/30", out)
    assert match, out
    address = match.group(1)
    gateway = address.rsplit(".", 1)[0] + "." + str(int(match.group(2)) - 1)
    return address, gateway


def create_attacker(server: SandgateServer, internet: Internet, ports: ProxyPorts) -> Attacker:
    sandbox = SandboxSync.create(
        SANDBOX_IMAGE,
        entrypoint=["sleep", "infinity"],
        network_policy=NETWORK_POLICY,
        credential_proxy=CredentialProxyConfig(enabled=True),
        connection_config=connection(server),
        timeout=SANDBOX_LIFETIME,
        ready_timeout=timedelta(seconds=30),
    )
    try:
        sandbox.credential_vault.create(credentials=VAULT["credentials"], bindings=VAULT["bindings"])
        sandbox.files.write_file(IN_SANDBOX_ATTACKS, ATTACKS.read_text())
        sandbox.files.write_file(IN_SANDBOX_TEST_CA, internet.ca_cert.read_text())
        address, gateway = sandbox_net(server, sandbox.id)
        return Attacker(sandbox, server, internet, ports, gateway, address)
    except BaseException:
        sandbox.kill()
        sandbox.close()
        raise


@pytest.fixture(scope="package")
def attacker(server: SandgateServer, internet: Internet, proxy_ports: ProxyPorts) -> Iterator[Attacker]:
    attacker = create_attacker(server, internet, proxy_ports)
    try:
        yield attacker
    finally:
        attacker.sandbox.kill()
        attacker.sandbox.close()
