"""Where a sandbox's confinement is built, and how the proxy that confines it learns who it is.

A small contract at a seam (CNI style): every runtime's sandboxes are confined by one of these,
and the service drives them in one order. A runtime never builds a network or talks to a proxy.

The contract (`Confinement`):
1. `prepare(sandbox_id) -> SandboxNet | None`, before the runtime starts. The host confinement
   builds the sandbox's netns (address, gateway) and returns it; the runtime starts the sandbox
   inside it. A confinement whose network is the runtime's own (Kubernetes: the Pod network)
   returns None; the runtime's `create` then returns the address its network gave the sandbox.
2. Admission: `proxy.put_sandbox(entry)` (`ProxyControlClient`). `entry.address` is the
   sandbox's identity at the proxy (its source address). The call returns only once the proxy
   that confines the sandbox holds the entry (its policy, and later its vault entry names);
   it raises otherwise. Until then that proxy refuses everything from the address (fail
   closed). The service admits as soon as the address is known: before the runtime starts when
   `prepare` placed the sandbox (its first packet is already governed), right after the
   runtime's `create` otherwise; the sandbox is reported ready only after admission and execd's
   `/ping`. Every later change (policy patch, vault binding, revocation) is a `put_sandbox`
   again; a proxy that restarted is fed every live sandbox again (`EgressControl.repush`).
3. `proxy.drop_sandbox(address)` then `release(sandbox_id)` at delete: no error if already gone.
4. `adopt(keep) -> set[str]` once at server start, before any `prepare`: the ids of `keep`
   whose confinement survived; everything else the confinement built is removed.

Implementations: `HostConfinement` (local and Docker: a netns per sandbox built by network.py,
and the server's own proxy) and `PodConfinement` (Kubernetes: the Pod network places the
sandbox; the node agent's proxy on the Pod's node confines it, see pods.py).
"""

from sandgate.lifecycle.confinement.contract import Confinement, ProxyControlClient, SandboxNet
from sandgate.lifecycle.confinement.host import HostConfinement
from sandgate.lifecycle.confinement.network import RUN_NETNS, NetworkError, ProxyPorts, SandboxNetworks
from sandgate.lifecycle.confinement.pods import PodConfinement

__all__ = [
    "RUN_NETNS",
    "Confinement",
    "HostConfinement",
    "NetworkError",
    "PodConfinement",
    "ProxyControlClient",
    "ProxyPorts",
    "SandboxNet",
    "SandboxNetworks",
]
