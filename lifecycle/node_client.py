"""The server's side of the node agents (lifecycle/node.py): push and drop entries, ship audit.

Rules:
1. How the server finds a node's agent: the node's InternalIP (a Pod's `status.hostIP`, from the
   API server's watch) and one port for the whole cluster (`NodeAgents.port`); TLS verified
   against one CA file, and one bearer token read from a file. The platform team provides the
   three (docs/kubernetes.md, "The node proxy").
2. A sandbox is admitted on its node (`NodeProxies.put_sandbox`) only once the agent answered
   that its proxy holds the entry: until then the node denies the Pod everything (it has no
   entry), so "ready" never runs ahead of the policy. The service admits right after the
   runtime's create returned the Pod IP, before it waits for execd (confinement rule 2).
3. Audit: each node's records are pulled from a cursor (file inode, byte offset) kept in the
   server's state dir, appended to the server's one audit log, and only then is the cursor moved
   on (`AuditShipper.ship`). A crash between the two ships a line twice; readers keep the last
   line of an id, so a repeat changes nothing. A killed agent loses nothing: its proxy wrote every
   record ahead into the node's file, which the next pull reads from the cursor.
4. `NodeProxies` is the Kubernetes confinement's proxy client (`ProxyControlClient` of
   sandgate.lifecycle.confinement): `put_sandbox(entry)` finds the node that runs the Pod whose IP
   is `entry.address` (`locate`, from the API server), reads from the server's vault the values
   of the entries the policy's bindings name, pushes both, and returns once that node's proxy
   holds them. Every policy patch or binding change is a `put_sandbox` again, so the node's values
   are read anew each time; a drop removes the node's values no other sandbox there names.
5. Converge: an agent that restarted holds nothing (its `boot` id changed). The shipper of its
   node sees the new id at its next poll and calls `on_restart` (the server's `repush` of every
   live sandbox); until then the node denies the restarted agent's Pods everything. The other
   way round, an entry whose Pod is gone from that node (evicted by a drain, deleted behind the
   server's back) is dropped at the shipper's next prune (`NodeProxies.prune`, every
   `PRUNE_EVERY` polls): a later Pod given the same IP never inherits its policy or its values.
6. Trust: each node's proxy signs intercepted connections with a CA made on that node (its key
   never leaves it). The runtime hands a Pod the certificate of its own node's CA
   (`NodeProxies.ca_cert`, wired as the Kubernetes runtime's `node_ca`), not the server's.
7. Held requests (`action: ask`) are held by the node proxy that judged them. `approvals` asks
   every node the server pushed to, at each call (a listing is never stale), and notes which node
   holds each id; `answer_approval` sends the answer to that node. A node that does not answer is
   left out of the listing (said in the log), not an error: the others' held requests still show.
   An "allow for this sandbox" answer is a policy change first (lifecycle/approvals.py), which
   reaches the sandbox's node as every change does (`put_sandbox`), before the answer is sent.
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from sandgate.lifecycle.node import API_PREFIX, AuditChunk, NodeEntry, read_token
from sandgate.proxy import ApprovalAnswer, AuditRecord, SandboxEntry, append_records
from sandgate.vault import SecretNotFound, SecretStore

log = logging.getLogger(__name__)


class NodeAgentError(RuntimeError):
    """A node agent refused or could not be reached; the message says which node and why."""


class NodeClient:
    """One node agent's API over TLS with the bearer token."""

    def __init__(self, base_url: str, ca_file: Path, token: str, timeout: float = 10.0) -> None:
        self.base_url = base_url
        context = ssl.create_default_context(cafile=str(ca_file))
        self._client = httpx.Client(
            base_url=base_url,
            verify=context,
            timeout=timeout,
            headers={"authorization": f"Bearer {token}"},
        )

    def put(self, entry: SandboxEntry, secrets: dict[str, str]) -> dict[str, Any]:
        """Push the entry and its values; returns once the node's proxy holds them."""
        body = NodeEntry.model_validate({"entry": entry, "secrets": secrets}).revealed_json()
        path = f"{API_PREFIX}/sandboxes/{entry.address}"
        response = self._call("PUT", path, content=body, headers={"content-type": "application/json"})
        return dict(response.json())

    def drop(self, address: str) -> bool:
        """True if the node held it; dropping an unknown address is not an error."""
        response = self._client.delete(f"{API_PREFIX}/sandboxes/{address}")
        if response.status_code == 404:
            return False
        self._ok(response)
        return True

    def sandboxes(self) -> list[dict[str, str]]:
        return list(self._call("GET", f"{API_PREFIX}/sandboxes").json())

    def approvals(self) -> list[dict[str, Any]]:
        """The requests the node's proxy holds for a reviewer."""
        return list(self._call("GET", f"{API_PREFIX}/approvals").json())

    def answer_approval(self, approval_id: str, allow: bool, by: str) -> bool:
        """False if the node does not hold it (answered, timed out, sandbox gone)."""
        body = ApprovalAnswer(allow=allow, by=by).model_dump_json()
        headers = {"content-type": "application/json"}
        response = self._client.post(f"{API_PREFIX}/approvals/{approval_id}", content=body, headers=headers)
        if response.status_code == 404:
            return False
        self._ok(response)
        return True

    def audit(self, file: int, offset: int, max_bytes: int = 1 << 20) -> AuditChunk:
        params = {"file": file, "offset": offset, "max_bytes": max_bytes}
        return AuditChunk.model_validate(self._call("GET", f"{API_PREFIX}/audit", params=params).json())

    def health(self) -> dict[str, Any]:
        return dict(self._call("GET", f"{API_PREFIX}/health").json())

    def ca_cert(self) -> str:
        """The certificate (PEM) of the CA the node's proxy signs intercepted connections with."""
        return self._call("GET", f"{API_PREFIX}/ca").text

    def close(self) -> None:
        self._client.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise NodeAgentError(f"node agent {self.base_url}: {method} {path} failed: {exc}") from exc
        return self._ok(response)

    def _ok(self, response: httpx.Response) -> httpx.Response:
        if response.is_success:
            return response
        where = f"{response.request.method} {response.request.url.path}"
        raise NodeAgentError(
            f"node agent {self.base_url}: {where} -> {response.status_code}: {response.text}"
        )


@dataclass(frozen=True)
class NodeAgents:
    """Where every node's agent is: `https://<node InternalIP>:<port>` (rule 1)."""

    port: int
    ca_file: Path
    token_file: Path

    def client(self, node_ip: str) -> NodeClient:
        host = f"[{node_ip}]" if ":" in node_ip else node_ip
        return NodeClient(f"https://{host}:{self.port}", self.ca_file, read_token(self.token_file))


@dataclass(frozen=True)
class PodPlacement:
    """Who a sandbox Pod is to its node: its IP (the proxy's identity) and its node's InternalIP."""

    pod_ip: str
    node_ip: str


def pod_locator(client: Any, namespace: str) -> Locate:
    """`Locate` from the API server (a lightkube Client): the hostIP of the Pod with that podIP."""
    from lightkube.resources.core_v1 import Pod

    def locate(address: str) -> str | None:
        for pod in client.list(Pod, namespace=namespace, fields={"status.podIP": address}):
            found = placement(pod)
            if found is not None and found.pod_ip == address:
                return found.node_ip
        return None

    return locate


def placement(pod: Any) -> PodPlacement | None:
    """From a Pod as the API server reports it (lightkube's model); None until it has both IPs."""
    status = getattr(pod, "status", None)
    if status is None or not status.podIP or not status.hostIP:
        return None
    return PodPlacement(pod_ip=status.podIP, node_ip=status.hostIP)


PRUNE_EVERY = 5  # shipper polls between prunes: each asks the API server once per entry held
Locate = Callable[[str], str | None]  # a Pod IP -> its node's InternalIP (None: no such Pod)


class NodeProxies:
    """Each sandbox's entry to the node agent of its Pod's node (rule 4); ships every node's audit."""

    def __init__(
        self,
        agents: NodeAgents,
        locate: Locate,
        vault: SecretStore | None,
        audit_log: Path,
        cursor_dir: Path,
        on_restart: Callable[[], object] = lambda: None,
    ) -> None:
        self.on_restart = on_restart
        self.agents = agents
        self.locate = locate
        self.vault = vault
        self.audit_log = audit_log
        self.cursor_dir = cursor_dir
        self._lock = threading.Lock()
        self._placed: dict[str, str] = {}  # Pod IP -> node IP, as pushed
        self._shippers: dict[str, AuditShipper] = {}
        self._held_on: dict[str, str] = {}  # approval id -> the node holding it, as last listed

    def put_sandbox(self, entry: SandboxEntry) -> object:
        node_ip = self.locate(entry.address)
        if node_ip is None:
            raise NodeAgentError(f"no Pod has the address {entry.address}: its node is unknown")
        answer = self._on_node(node_ip, lambda client: client.put(entry, self._values(entry)))
        with self._lock:
            self._placed[entry.address] = node_ip
        self._ship_from(node_ip)
        return answer

    def ca_cert(self, node_ip: str) -> str:
        """The CA a Pod on that node must trust (rule 6): its node proxy's own, read over TLS."""
        return self._on_node(node_ip, NodeClient.ca_cert)

    def drop_sandbox(self, address: str) -> bool:
        with self._lock:
            node_ip = self._placed.pop(address, None)
        node_ip = node_ip or self.locate(address)
        if node_ip is None:
            return False
        return self._on_node(node_ip, lambda client: client.drop(address))

    def prune(self, node_ip: str, client: NodeClient) -> list[str]:
        """Drop the node's entries whose Pod no longer runs on that node (rule 5); their addresses."""
        gone = [held["address"] for held in client.sandboxes() if self.locate(held["address"]) != node_ip]
        for address in gone:
            log.warning("node %s held %s, whose Pod is gone: dropping it", node_ip, address)
            client.drop(address)
            with self._lock:
                if self._placed.get(address) == node_ip:
                    del self._placed[address]
        return gone

    def metrics(self) -> str:
        return ""  # each node's proxy has its own /metrics (docs/kubernetes.md)

    def approvals(self) -> list[dict[str, Any]]:
        """Every node's held requests (rule 7), each node's noted for the answer."""
        with self._lock:
            nodes = sorted(set(self._placed.values()) | set(self._shippers))
        held: list[dict[str, Any]] = []
        held_on: dict[str, str] = {}
        for node_ip in nodes:
            try:
                found = self._on_node(node_ip, NodeClient.approvals)
            except NodeAgentError as exc:
                log.warning("listing the requests held on node %s: %s", node_ip, exc)
                continue
            held += found
            held_on.update((str(item["id"]), node_ip) for item in found)
        with self._lock:
            self._held_on = held_on
        return held

    def answer_approval(self, approval_id: str, allow: bool, by: str) -> bool:
        """The answer to the node that holds the request (rule 7); False if none holds it."""
        with self._lock:
            node_ip = self._held_on.get(approval_id)
        if node_ip is None:
            self.approvals()
            with self._lock:
                node_ip = self._held_on.get(approval_id)
        if node_ip is None:
            return False
        return self._on_node(node_ip, lambda client: client.answer_approval(approval_id, allow, by))

    def _on_node[T](self, node_ip: str, call: Callable[[NodeClient], T]) -> T:
        client = self.agents.client(node_ip)
        try:
            return call(client)
        finally:
            client.close()

    def close(self) -> None:
        with self._lock:
            shippers, self._shippers = list(self._shippers.values()), {}
        for shipper in shippers:
            shipper.stop()
            shipper.client.close()

    def _values(self, entry: SandboxEntry) -> dict[str, str]:
        if self.vault is None:
            return {}
        values = {}
        for name in sorted(entry.vault_names()):
            try:
                values[name] = self.vault.reveal(name)
            except SecretNotFound:  # not stored (yet): injection on the node says so
                continue
        return values

    def _ship_from(self, node_ip: str) -> None:
        """Start shipping the node's audit (once per node; its cursor survives restarts)."""
        with self._lock:
            if node_ip in self._shippers:
                return
            self.cursor_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            cursor = self.cursor_dir / f"{node_ip}.json"
            # the callback read at each restart: wiring sets it after construction
            client = self.agents.client(node_ip)
            shipper = AuditShipper(
                client, self.audit_log, cursor, lambda: self.on_restart(), lambda: self.prune(node_ip, client)
            )
            self._shippers[node_ip] = shipper
        shipper.start()


class AuditShipper:
    """Pulls one node's audit records into the server's audit log from a kept cursor (rule 3)."""

    def __init__(
        self,
        client: NodeClient,
        audit_log: Path,
        cursor_file: Path,
        on_restart: Callable[[], object] = lambda: None,
        prune: Callable[[], object] = lambda: None,
        interval: float = 1.0,
    ) -> None:
        self.on_restart = on_restart
        self.prune = prune
        self._boot: str | None = None
        self.client = client
        self.audit_log = audit_log
        self.cursor_file = cursor_file
        self.interval = interval
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def cursor(self) -> tuple[int, int]:
        try:
            saved = json.loads(self.cursor_file.read_text())
            return int(saved["file"]), int(saved["offset"])
        except (OSError, ValueError, KeyError):
            return 0, 0

    def ship(self) -> int:
        """Ship everything there is now; how many records went into the server's log."""
        shipped = 0
        while True:
            file, offset = self.cursor()
            chunk = self.client.audit(file, offset)
            records: list[tuple[AuditRecord, Callable[[str], str] | None]] = [
                (record, None) for line in chunk.lines if (record := _record(line)) is not None
            ]
            append_records(self.audit_log, records)
            self._save(chunk.file, chunk.offset)
            shipped += len(records)
            if not chunk.lines and (chunk.file, chunk.offset) == (file, offset):
                return shipped

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="node-audit-shipper", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        polls = 0
        while not self._stopping.is_set():
            try:
                self._notice_restart()
                self.ship()
                if polls % PRUNE_EVERY == 0:
                    self.prune()
                polls += 1
            except (NodeAgentError, OSError) as exc:  # the agent down: the cursor waits for it
                log.warning("shipping audit from %s: %s", self.client.base_url, exc)
            except Exception:  # never let one failure end the node's shipping
                log.exception("shipping audit from %s failed", self.client.base_url)
            self._stopping.wait(self.interval)

    def _notice_restart(self) -> None:
        boot = str(self.client.health()["boot"])
        if self._boot is not None and boot != self._boot:
            log.warning("node agent %s restarted: pushing its sandboxes again", self.client.base_url)
            self.on_restart()
        self._boot = boot

    def _save(self, file: int, offset: int) -> None:
        temporary = self.cursor_file.with_name(self.cursor_file.name + ".tmp")
        temporary.write_text(json.dumps({"file": file, "offset": offset}))
        os.replace(temporary, self.cursor_file)


def _record(line: str) -> AuditRecord | None:
    """A node's line as a record (its `prev` hash is the node file's: the server's log chains it
    anew); a line cut by a killed writer is skipped, and said."""
    try:
        return AuditRecord.model_validate_json(line)
    except ValueError:
        log.warning("skipping a malformed audit line from a node (%d bytes)", len(line))
        return None
