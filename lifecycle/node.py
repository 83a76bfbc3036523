"""The node agent (`sandgate node-proxy`): the egress guarantee on one Kubernetes node.

Rules:
1. It runs as root in the node's network namespace (a DaemonSet with hostNetwork, or `nsenter
   --net`), and before anything else installs ONE nft table pair (`node_ruleset`) that makes the
   proxy each Pod's only way out: from the Pod bridge every TCP connect is redirected to the
   proxy's transparent port, DNS (UDP and TCP 53, to any address) to its resolver; everything
   else is dropped and counted (named counters, `COUNTERS`): IPv6, spoofed sources, metadata
   addresses, the API server and kubelet ports, every other port of the node, other Pods (routed,
   and switched on the bridge: a `bridge`-family table, no br_netfilter needed), other UDP, ICMP.
   The bridge table drops every frame any bridge of the node forwards between two of its ports
   (this kernel has no `meta ibrname` to name cni0): the node's Pods are sandboxes only, and a
   Pod still reaches the node itself (bridge input), where the inet table judges it.
   The rules name no Pod: they hold before any Pod exists and whatever the agent does next.
2. Fail closed. The table is never removed by the agent (not at stop either): with the agent or
   its proxy down the redirect points at a port nobody listens on and Pods have no egress. The
   proxy child dies with the agent (PR_SET_PDEATHSIG), so a killed agent leaves no proxy serving.
3. Identity is the Pod IP. The proxy (the ordinary one, under the ordinary supervisor) holds an
   entry per sandbox keyed by its Pod IP; a Pod with no entry is denied everything.
4. Secrets in memory only: the proxy's vault is a `memory` store, fed over its control socket
   with the values the server pushed alongside each entry (`NodeEntry`); the agent keeps them in
   its own memory to feed a restarted proxy, drops them with the last entry that named them, and
   never writes them anywhere.
5. The server talks to the agent over TLS (the platform's certificate) with a bearer token
   (`NodeControl`): push and drop entries, read the node's audit file from a cursor (`read_audit`),
   and read the certificate of the node's own CA (`GET /v1/ca`), which the server hands each Pod
   on this node to trust: the CA's key is made on the node and never leaves it.
   It also lists the requests the node's proxy holds for a reviewer (`GET /v1/approvals`) and
   carries a reviewer's answer to one (`POST /v1/approvals/{id}`): the server lists every node's
   with its own and sends each answer to the node that holds the request.
   The proxy writes every record ahead into the node's own audit file; the server ships them into
   its one audit log and keeps the cursor, so a killed agent loses nothing (lifecycle/node_client.py).
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import os
import subprocess
import threading
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Header, HTTPException, Response
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from sandgate.lifecycle.confinement import ProxyPorts
from sandgate.lifecycle.proxy_supervisor import Listeners, ProxySupervisor
from sandgate.proxy import (
    ApprovalAnswer,
    ProxyConfig,
    ProxyControl,
    ProxyControlError,
    SandboxEntry,
    VaultValues,
    audit_files,
    audit_path,
    config_path,
    control_socket,
    ensure_ca,
    log_path,
)
from sandgate.vault import StoreSettings

log = logging.getLogger(__name__)

NODE_TABLE = "sandgate_node"
API_PREFIX = "/v1"
# How long the control API keeps an idle keep-alive connection: longer than its one client, the
# server's NodeClient (httpx: 5 s, uvicorn's default too), so a call sent as the agent closed is
# never lost (docs/operations.md, "What clients rely on").
IDLE_KEEP_ALIVE = 60
# What the node drops from Pods, each with a counter the tests (and an operator) read.
COUNTERS = (
    "ipv6",  # any IPv6 packet from the bridge
    "spoofed",  # a source that is not in the Pod range
    "metadata",  # 169.254.0.0/16, the cloud metadata service among them
    "apiserver",  # a node address, TCP 6443
    "kubelet",  # a node address, TCP 10250
    "node_ports",  # any other port of the node (the agent's control port among them)
    "pods",  # another Pod, routed
    "bridged",  # another Pod on the same bridge (switched: seen only by the bridge family)
    "other",  # UDP that is not DNS, ICMP, any other protocol
    "forwarded",  # anything the node would route on (nothing leaves but through the proxy)
)
API_SERVER_PORT = 6443
KUBELET_PORT = 10250
METADATA_RANGE = "169.254.0.0/16"


class NodeError(RuntimeError):
    """The node agent could not set up or change something; the message says what."""


@dataclass(frozen=True)
class PodNetwork:
    """The node's Pod bridge (the CNI bridge plugin's) and the range its Pods get addresses from."""

    bridge: str = "cni0"
    cidr: IPv4Network = field(default_factory=lambda: IPv4Network("10.232.0.0/24"))

    @property
    def gateway(self) -> IPv4Address:
        """The bridge's own address (host-local IPAM's gateway: the range's first address)."""
        return self.cidr.network_address + 1


def node_ruleset(table: str, pods: PodNetwork, ports: ProxyPorts) -> str:
    """The nft script that (re)defines the node's two tables in one transaction."""
    bridge = f'iifname "{pods.bridge}"'
    counters = "\n".join(f"  counter {name} {{}}" for name in COUNTERS if name != "bridged")
    return f"""\
table inet {table} {{}}
delete table inet {table}
table bridge {table} {{}}
delete table bridge {table}
table inet {table} {{
{counters}
  chain pod_guard {{
    type filter hook prerouting priority mangle; policy accept;
    {bridge} meta nfproto ipv6 counter name ipv6 drop
    {bridge} ip saddr != {pods.cidr} counter name spoofed drop
    {bridge} ip daddr {METADATA_RANGE} counter name metadata drop
    {bridge} meta l4proto {{ tcp, udp }} th dport 53 accept
    {bridge} meta l4proto != tcp counter name other drop
    {bridge} fib daddr type local tcp dport {API_SERVER_PORT} counter name apiserver drop
    {bridge} fib daddr type local tcp dport {KUBELET_PORT} counter name kubelet drop
    {bridge} ip daddr {pods.gateway} tcp dport {ports.explicit} accept
    {bridge} fib daddr type local counter name node_ports drop
    {bridge} ip daddr {pods.cidr} counter name pods drop
  }}
  chain pod_nat {{
    type nat hook prerouting priority dstnat; policy accept;
    {bridge} meta l4proto {{ tcp, udp }} th dport 53 redirect to :{ports.dns}
    {bridge} ip daddr {pods.gateway} tcp dport {ports.explicit} accept
    {bridge} meta l4proto tcp redirect to :{ports.transparent}
  }}
  chain pod_input {{
    type filter hook input priority filter; policy accept;
    {bridge} ct state established,related accept
    {bridge} ct status dnat tcp dport {ports.transparent} accept
    {bridge} ct status dnat meta l4proto {{ tcp, udp }} th dport {ports.dns} accept
    {bridge} ip daddr {pods.gateway} tcp dport {ports.explicit} accept
    {bridge} counter name node_ports drop
  }}
  chain pod_forward {{
    type filter hook forward priority filter; policy accept;
    {bridge} ct state established,related accept
    {bridge} counter name forwarded drop
  }}
}}
table bridge {table} {{
  counter bridged {{}}
  chain pod_to_pod {{
    type filter hook forward priority filter; policy accept;
    counter name bridged drop
  }}
}}
"""


def install_table(table: str, pods: PodNetwork, ports: ProxyPorts) -> None:
    result = subprocess.run(
        ["nft", "-f", "-"], input=node_ruleset(table, pods, ports), capture_output=True, text=True
    )
    if result.returncode != 0:
        raise NodeError(f"nft rejected the node table: {result.stderr.strip()}")


# -- the control API's documents ---------------------------------------------------------------


class NodeEntry(BaseModel):
    """One sandbox as the server pushes it to its node: the proxy's entry (address = the Pod IP)
    and the values of the vault entries its bindings name (never in a repr or an error)."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    entry: SandboxEntry
    secrets: dict[str, SecretStr] = Field(default_factory=dict)

    def revealed_json(self) -> str:
        """The body as sent (`model_dump_json` would write asterisks for the values)."""
        plain = {name: value.get_secret_value() for name, value in self.secrets.items()}
        return f'{{"entry": {self.entry.model_dump_json()}, "secrets": {json.dumps(plain)}}}'


class AuditChunk(BaseModel):
    """Whole lines of the node's audit file from a cursor, and the cursor after them. `file` is
    the inode of the file `offset` is in (the live file or a rotated one); 0 means "from the
    oldest file kept"."""

    file: int
    offset: int
    lines: list[str] = Field(default_factory=list)


# -- the node's audit file, read from a cursor ------------------------------------------------


def read_audit(state_dir: Path, file: int, offset: int, max_bytes: int) -> AuditChunk:
    """Whole lines after the cursor, at most about `max_bytes`. A rotated file read to its end
    moves the cursor to the start of the next newer one; a cursor whose file is gone (rotated
    past the backups kept) restarts at the oldest file kept."""
    files = [(path, path.stat().st_ino) for path in audit_files(audit_path(state_dir))]
    inodes = [inode for _, inode in files]
    if file not in inodes:
        if not files:
            return AuditChunk(file=0, offset=0)
        file, offset = inodes[0], 0
    index = inodes.index(file)
    with files[index][0].open("rb") as handle:
        handle.seek(offset)
        data = handle.read(max_bytes)
    whole = data[: data.rfind(b"\n") + 1]
    if not whole and len(data) == max_bytes:  # one line longer than max_bytes: take it whole
        with files[index][0].open("rb") as handle:
            handle.seek(offset)
            whole = handle.readline()
            whole = whole if whole.endswith(b"\n") else b""
    if not whole and index + 1 < len(files) and not data:  # a rotated file read to its end
        return read_audit(state_dir, inodes[index + 1], 0, max_bytes)
    lines = [line.decode("utf-8", "replace") for line in whole.splitlines() if line]
    return AuditChunk(file=file, offset=offset + len(whole), lines=lines)


# -- the agent ------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeAgentConfig:
    state_dir: Path
    listen: tuple[str, int]  # the control API (the node's InternalIP and a port)
    tls_cert: Path
    tls_key: Path
    token_file: Path
    pods: PodNetwork = field(default_factory=PodNetwork)
    ports: ProxyPorts = field(default_factory=ProxyPorts)
    upstream_dns: tuple[str, ...] = ()
    upstream_ca: Path | None = None
    audit_max_bytes: int = 100 * 1024 * 1024
    audit_backups: int = 10
    table: str = NODE_TABLE


class NodeAgent:
    """The proxy under its supervisor, and what the server pushed (to feed a restarted proxy)."""

    def __init__(self, config: NodeAgentConfig) -> None:
        self.config = config
        self.control = ProxyControl(control_socket(config.state_dir))
        self._lock = threading.Lock()
        self._entries: dict[str, NodeEntry] = {}
        self._fed: set[str] = set()  # names whose values the proxy's memory vault holds
        self.boot = os.urandom(8).hex()  # a new one each start: the server re-pushes when it changes
        self.supervisor = ProxySupervisor(
            self._write_proxy_config(),
            is_healthy=self._proxy_answers,
            on_ready=self._repush,
            log_path=log_path(config.state_dir),
            listeners=Listeners(
                tcp=frozenset({config.ports.transparent, config.ports.explicit}),
                udp=frozenset({config.ports.dns}),
            ),
            control_socket=self.control.socket_path,
            die_with_supervisor=True,
        )

    def start(self) -> None:
        """The table first (rule 1), then the proxy; returns once the proxy is ready."""
        self.config.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        install_table(self.config.table, self.config.pods, self.config.ports)
        self.supervisor.start()

    def ca_cert(self) -> str:
        """The certificate (PEM) of the CA the node's proxy signs with (rule 5); made on first use,
        kept in the state dir like the proxy's own, so the proxy and this answer are the same CA."""
        return ensure_ca(self.config.state_dir).cert.read_text()

    def stop(self) -> None:
        """Stops the proxy; the table stays (fail closed, rule 2)."""
        self.supervisor.stop()
        self.control.close()

    def put(self, pushed: NodeEntry) -> dict[str, Any]:
        """Values first, then the entry: the entry is in force with its values in place."""
        with self._lock:
            address = pushed.entry.address
            previous = self._entries.get(address)
            self._entries[address] = pushed
            try:
                self.control.put_values(VaultValues(values=pushed.secrets, removed=self._unbound()))
                return self.control.put_sandbox(pushed.entry)
            except ProxyControlError:
                if previous is None:
                    self._entries.pop(address, None)
                else:
                    self._entries[address] = previous
                raise

    def drop(self, address: str) -> bool:
        """The entry and the values no other entry names; True if the proxy held it."""
        with self._lock:
            self._entries.pop(address, None)
            dropped = self.control.drop_sandbox(address)
            self.control.put_values(VaultValues(removed=self._unbound()))
            return dropped

    def sandboxes(self) -> list[dict[str, str]]:
        with self._lock:
            return [{"sandbox_id": e.entry.sandbox_id, "address": a} for a, e in self._entries.items()]

    def _unbound(self) -> list[str]:
        """Names fed to the proxy's vault that no entry names any more (now forgotten here)."""
        wanted = {name for pushed in self._entries.values() for name in pushed.secrets}
        gone, self._fed = self._fed - wanted, wanted
        return sorted(gone)

    def _repush(self) -> None:
        """After every (re)start of the proxy: every value and entry back, under the lock."""
        with self._lock:
            for pushed in self._entries.values():
                self.control.put_values(VaultValues(values=pushed.secrets))
                self.control.put_sandbox(pushed.entry)

    def _proxy_answers(self) -> bool:
        with contextlib.suppress(Exception):
            return self.control.health().get("status") == "ok"
        return False

    def _write_proxy_config(self) -> Path:
        config = self.config
        proxy = ProxyConfig(
            state_dir=config.state_dir,
            listen_host="0.0.0.0",
            control_socket=control_socket(config.state_dir),
            transparent_port=config.ports.transparent,
            explicit_port=config.ports.explicit,
            dns_port=config.ports.dns,
            workers=1,  # a memory vault is fed to one process (proxy/workers.py refuses it)
            upstream_dns=list(config.upstream_dns),
            upstream_ca=config.upstream_ca,
            audit_max_bytes=config.audit_max_bytes,
            audit_backups=config.audit_backups,
            audit_fsync=True,  # the node's file is the only copy of a record until it is shipped
            vault=StoreSettings(backend="memory", state_dir=config.state_dir),
        )
        config.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = config_path(config.state_dir)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(proxy.model_dump_json(indent=2))
        return path


# -- the control API (TLS, bearer token) ----------------------------------------------------------


def node_app(agent: NodeAgent, token: str) -> FastAPI:
    """The API the server calls (lifecycle/node_client.py `NodeClient`); every route needs the token."""

    def authorized(authorization: str = Header(default="")) -> None:
        scheme, _, given = authorization.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(), token.encode()):
            raise HTTPException(401, "a bearer token is required (the node agent's token file)")

    app = FastAPI(
        title="sandgate node agent",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        dependencies=[Depends(authorized)],
    )

    @app.put(f"{API_PREFIX}/sandboxes/{{address}}")
    def put_sandbox(address: str, pushed: NodeEntry) -> Any:
        if pushed.entry.address != address:
            raise HTTPException(
                422, f"path address {address} differs from the entry's {pushed.entry.address}"
            )
        try:
            return agent.put(pushed)
        except ProxyControlError as exc:
            raise HTTPException(422, str(exc)) from exc

    @app.delete(f"{API_PREFIX}/sandboxes/{{address}}", status_code=204)
    def drop_sandbox(address: str) -> Response:
        if not agent.drop(address):
            raise HTTPException(404, f"no sandbox at {address} on this node")
        return Response(status_code=204)

    @app.get(f"{API_PREFIX}/sandboxes")
    def list_sandboxes() -> list[dict[str, str]]:
        return agent.sandboxes()

    @app.get(f"{API_PREFIX}/approvals")
    def list_approvals() -> list[dict[str, Any]]:
        return agent.control.approvals()

    @app.post(f"{API_PREFIX}/approvals/{{approval_id}}")
    def answer_approval(approval_id: str, answer: ApprovalAnswer) -> dict[str, str]:
        if not agent.control.answer_approval(approval_id, answer.allow, answer.by):
            raise HTTPException(404, f"approval {approval_id} is not held on this node")
        return {"answered": approval_id}

    @app.get(f"{API_PREFIX}/audit")
    def audit(file: int = 0, offset: int = 0, max_bytes: int = 1 << 20) -> AuditChunk:
        return read_audit(agent.config.state_dir, file, offset, min(max_bytes, 8 << 20))

    @app.get(f"{API_PREFIX}/ca", response_class=PlainTextResponse)
    def ca_cert() -> str:
        return agent.ca_cert()

    @app.get(f"{API_PREFIX}/health")
    def health() -> dict[str, Any]:
        sandboxes = len(agent.sandboxes())
        return {"status": "ok", "boot": agent.boot, "proxy_pid": agent.supervisor.pid, "sandboxes": sandboxes}

    return app


def read_token(path: Path) -> str:
    """The token file's first line; refused when empty, open to others, or open to a group that is
    not this process's own. A group read is how Kubernetes lets a non-root Pod read a Secret
    (root's file, 0440, its group the Pod's fsGroup: the server's Deployment), so that is taken."""
    info = path.stat()
    mode = info.st_mode & 0o777
    own_group_read = mode & 0o070 == 0o040 and info.st_gid == os.getegid()
    if mode & 0o007 or (mode & 0o070 and not own_group_read):
        raise NodeError(
            f"token file {path} is readable by group or others (mode {mode:o}): chmod 600 "
            "(or 640 with this process's own group)"
        )
    token = path.read_text().strip()
    if len(token) < 16:
        raise NodeError(f"token file {path} holds no token of at least 16 characters")
    return token


def run_agent(config: NodeAgentConfig) -> None:
    """Install the table, start the proxy, serve the control API until SIGTERM/SIGINT."""
    import uvicorn

    token = read_token(config.token_file)
    agent = NodeAgent(config)
    agent.start()
    host, port = config.listen
    server = uvicorn.Server(
        uvicorn.Config(
            node_app(agent, token),
            host=host,
            port=port,
            ssl_certfile=str(config.tls_cert),
            ssl_keyfile=str(config.tls_key),
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=5,  # the server retries what a stop cut; a DaemonSet waits 30 s
            timeout_keep_alive=IDLE_KEEP_ALIVE,
        )
    )
    try:
        server.run()
    finally:
        agent.stop()
