"""The confinement contract's types (the package's face, `__init__.py`, says the rules)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from sandgate.proxy import SandboxEntry


@dataclass(frozen=True)
class SandboxNet:
    """A sandbox network built on this host (`HostConfinement.prepare`), before its runtime starts."""

    netns: str  # name under /run/netns
    address: str  # the sandbox's IPv4 address (its identity at the proxy)
    gateway: str  # host end of the veth; the sandbox's only route and its resolver
    prefixlen: int = 30

    @property
    def netns_path(self) -> Path:
        return Path("/run/netns") / self.netns


class ProxyControlClient(Protocol):
    """What reaches the proxy that confines a sandbox (`sandgate.proxy.ProxyControl` on one host).

    `put_sandbox` is admission: it returns only once that proxy holds the entry (policy, vault
    entry names, identity = `entry.address`), and raises when it could not make it hold it."""

    def put_sandbox(self, entry: SandboxEntry) -> object: ...
    def drop_sandbox(self, address: str) -> object: ...
    def metrics(self) -> str: ...
    def approvals(self) -> list[dict[str, Any]]: ...
    def answer_approval(self, approval_id: str, allow: bool, by: str) -> bool: ...


class Confinement(Protocol):
    name: str
    proxy: ProxyControlClient

    def prepare(self, sandbox_id: str) -> SandboxNet | None:
        """Before the runtime starts: the network built for the sandbox on this host, or None
        when the runtime's own network places it (its address is known once it runs)."""

    def release(self, sandbox_id: str) -> None:
        """Remove what `prepare` built; no error if already gone."""

    def adopt(self, keep: set[str]) -> set[str]:
        """At server start, before any `prepare`: the ids of `keep` whose confinement survived;
        everything else this confinement built is removed."""
