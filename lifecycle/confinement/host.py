"""Confinement on this host: a netns per sandbox (network.py) and the server's own proxy."""

from __future__ import annotations

from sandgate.lifecycle.confinement.contract import ProxyControlClient, SandboxNet
from sandgate.lifecycle.confinement.network import SandboxNetworks


class HostConfinement:
    """The local and Docker runtimes' confinement: the sandbox's network is built here before
    it starts, so the proxy holds its entry before its first packet."""

    name = "host"

    def __init__(self, networks: SandboxNetworks, proxy: ProxyControlClient) -> None:
        self.networks = networks
        self.proxy = proxy

    def prepare(self, sandbox_id: str) -> SandboxNet:
        return self.networks.create(sandbox_id)

    def release(self, sandbox_id: str) -> None:
        self.networks.destroy(sandbox_id)

    def adopt(self, keep: set[str]) -> set[str]:
        return set(self.networks.cleanup_leftovers(keep))
