"""Confinement of Kubernetes Pods: the cluster's network places each Pod (its CNI gives it an
address), and the proxy that confines it runs on the Pod's node.

Stage 1 (this file): nothing is built on this host and `proxy` is the server's own proxy, which
no Pod can reach: a sandbox Pod has no egress at all (the node drops Pod traffic leaving it:
fail closed). The node agent (issue 36, node proxy) replaces `proxy` with a client that pushes
each entry to the node that runs the sandbox and returns once that node holds it.
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
