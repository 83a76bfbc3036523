"""The server's side of the node agents (lifecycle/node.py): push and drop entries, ship audit.

Rules:
1. How the server finds a node's agent: the node's InternalIP (a Pod's `status.hostIP`, from the
   API server's watch) and one port for the whole cluster (`NodeAgents.port`); TLS verified
   against one CA file, and one bearer token read from a file. The platform team provides the
   three (docs/kubernetes.md, "The node proxy").
2. A sandbox is admitted on its node (`admit`) only once the agent answered that its proxy holds
   the entry: until then the node denies the Pod everything (it has no entry), so "ready" never
   runs ahead of the policy.
3. Audit: each node's records are pulled from a cursor (file inode, byte offset) kept in the
   server's state dir, appended to the server's one audit log, and only then is the cursor moved
   on (`AuditShipper.ship`). A crash between the two ships a line twice; readers keep the last
   line of an id, so a repeat changes nothing. A killed agent loses nothing: its proxy wrote every
   record ahead into the node's file, which the next pull reads from the cursor.
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from sandgate.lifecycle.node import API_PREFIX, AuditChunk, NodeEntry, read_token
from sandgate.proxy import AuditRecord, SandboxEntry, append_records

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

    def audit(self, file: int, offset: int, max_bytes: int = 1 << 20) -> AuditChunk:
        params = {"file": file, "offset": offset, "max_bytes": max_bytes}
        return AuditChunk.model_validate(self._call("GET", f"{API_PREFIX}/audit", params=params).json())

    def health(self) -> dict[str, Any]:
        return dict(self._call("GET", f"{API_PREFIX}/health").json())

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


def placement(pod: Any) -> PodPlacement | None:
    """From a Pod as the API server reports it (lightkube's model); None until it has both IPs."""
    status = getattr(pod, "status", None)
    if status is None or not status.podIP or not status.hostIP:
        return None
    return PodPlacement(pod_ip=status.podIP, node_ip=status.hostIP)


def admit(agents: NodeAgents, where: PodPlacement, entry: SandboxEntry, secrets: dict[str, str]) -> None:
    """Push the sandbox's entry (its address set to the Pod IP) to its node (rule 2)."""
    client = agents.client(where.node_ip)
    try:
        client.put(entry.model_copy(update={"address": where.pod_ip}), secrets)
    finally:
        client.close()


class AuditShipper:
    """Pulls one node's audit records into the server's audit log from a kept cursor (rule 3)."""

    def __init__(self, client: NodeClient, audit_log: Path, cursor_file: Path, interval: float = 1.0) -> None:
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
            records = [(record, None) for line in chunk.lines if (record := _record(line)) is not None]
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
        while not self._stopping.is_set():
            try:
                self.ship()
            except (NodeAgentError, OSError) as exc:  # the agent down: the cursor waits for it
                log.warning("shipping audit from %s: %s", self.client.base_url, exc)
            self._stopping.wait(self.interval)

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
