"""Confinement of Kubernetes Pods: the cluster's network places each Pod (its CNI gives it an
address), and the proxy that confines it runs on the Pod's node.

`proxy` is `NodeProxies` (lifecycle/node_client.py) when the `[kubernetes]` node-agent
settings are given: it finds the Pod's node through the API server, pushes the entry and its
vault values to that node's agent and returns once the node's proxy holds them. Without them it
is the server's own proxy, which no Pod can reach: a sandbox Pod then has no egress at all (the
node drops Pod traffic leaving it: fail closed).
"""

from __future__ import annotations

from sandgate.lifecycle.confinement.contract import ProxyControlClient


class PodConfinement:
    name = "pods"

    def __init__(self, proxy: ProxyControlClient) -> None:
        self.proxy = proxy

    def prepare(self, sandbox_id: str) -> None:
        return None  # the Pod network places it; admission follows once the Pod has its IP

    def release(self, sandbox_id: str) -> None:
        return None  # the Pod's network goes with the Pod

    def adopt(self, keep: set[str]) -> set[str]:
        return set(keep)  # nothing kept here: the runtime's adopt says which Pods survived
