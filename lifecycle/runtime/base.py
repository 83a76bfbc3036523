"""What a runtime is given and what it must do.

A runtime starts a sandbox's processes (its entrypoint and execd) inside a network namespace
that lifecycle's network module has already built; it never touches routes or nftables, so
every runtime inherits the same egress guarantees. All operations are idempotent.
"""

from __future__ import annotations

import http.client
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

EXECD_PORT = 44772
# execd refuses every route but /ping without it (when it was started with a token).
EXECD_TOKEN_HEADER = "X-EXECD-ACCESS-TOKEN"


@dataclass(frozen=True)
class SandboxNet:
    """The sandbox's network as built by lifecycle.network."""

    netns: str  # name under /run/netns
    address: str  # the sandbox's IPv4 address (its identity at the proxy)
    gateway: str  # host end of the veth; the sandbox's only route and its resolver
    prefixlen: int = 30

    @property
    def netns_path(self) -> Path:
        return Path("/run/netns") / self.netns


@dataclass(frozen=True)
class SandboxSpec:
    """What the user asked for, already validated."""

    sandbox_id: str
    image: str
    entrypoint: list[str]
    env: dict[str, str] = field(default_factory=dict)
    memory_bytes: int | None = None
    pids_max: int | None = None
    cpu_quota: float | None = None  # in CPUs, e.g. 0.5
    # execd's access token. Runtimes hand it over outside argv (never in the host's process
    # list) and keep it from the entrypoint's environment.
    execd_token: str | None = None
    ca_cert: Path | None = None  # the proxy CA certificate (never the key) to trust inside


class RuntimeError_(Exception):
    """A runtime could not do what was asked; the message says what and how to fix it."""


class Runtime(Protocol):
    name: str

    def create(self, spec: SandboxSpec, net: SandboxNet) -> None:
        """Start entrypoint and execd (listening on net.address:EXECD_PORT) inside net."""

    def delete(self, sandbox_id: str) -> None:
        """Stop every process, remove mounts/cgroups/containers; no error if already gone."""

    def pause(self, sandbox_id: str) -> None: ...

    def resume(self, sandbox_id: str) -> None: ...

    def alive(self, sandbox_id: str) -> bool: ...

    def adopt(self) -> list[str]:
        """Ids of sandboxes still running from before a restart (the rest is cleaned up)."""

    def log_tail(self, sandbox_id: str, limit: int = 2000) -> str:
        """The end of the sandbox's output (for errors that say why it did not start)."""


class Watched(Protocol):
    """What waiting for execd needs of a runtime: whether the sandbox lives, and its log."""

    def alive(self, sandbox_id: str) -> bool: ...

    def log_tail(self, sandbox_id: str, limit: int = 2000) -> str: ...


def ping_execd(address: str) -> bool:
    """True if execd on `address` answers GET /ping with 200 (within a second)."""
    connection = http.client.HTTPConnection(address, EXECD_PORT, timeout=1)
    try:
        connection.request("GET", "/ping")
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


def wait_for_execd(runtime: Watched, sandbox_id: str, net: SandboxNet, timeout: float, poll: float) -> None:
    """Wait until execd answers GET /ping with 200; fail early if the sandbox died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ping_execd(net.address):
            return
        if not runtime.alive(sandbox_id):
            raise RuntimeError_(
                f"sandbox {sandbox_id} exited before execd was ready: {runtime.log_tail(sandbox_id)}"
            )
        time.sleep(poll)
    raise RuntimeError_(
        f"execd of sandbox {sandbox_id} did not answer /ping on {net.address}:{EXECD_PORT} "
        f"within {timeout}s: {runtime.log_tail(sandbox_id)}"
    )
