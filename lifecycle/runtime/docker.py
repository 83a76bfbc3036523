"""The Docker runtime: each sandbox one container, on sandgate's network and nothing else.

Rules:
1. A container is created with network mode `none` (Docker builds no interface, bridge or NAT
   for it) and, once started, the sandbox's veth end is moved from the sandgate netns into the
   container's network namespace and configured there (address, default route via the gateway).
   Then the netns name (/run/netns/<name>) is re-pointed at the container's namespace, so
   lifecycle's network module finds and removes the same namespace by the same name. Both steps
   use one fd of that namespace, opened before the move: a sandbox whose entrypoint fails exits
   as soon as its address appears, and its namespace must still get the name. The
   container's only route is therefore the proxy via the sandgate veth, never Docker's bridge.
2. Hardened by default: every capability dropped (`cap_add` is empty unless the operator adds
   some), no-new-privileges, IPv6 disabled inside, a pids limit always, memory and CPU limits from
   the spec, a read-only root with tmpfs /tmp, /var/tmp and /run and a volume at /workspace, an init process
   as PID 1, no restart policy (a restarted container would get a fresh, empty netns).
3. The image's entry script (sandbox-images/base) waits for the address, trusts the proxy CA
   (mounted read-only from the spec's `ca_cert`), starts execd on <address>:44772 and then runs
   the entrypoint. An image not built FROM `sandgate/base` runs execd from the host, bound in
   read-only (runtime/docker_images.py, which also pulls images by reference).
4. Containers carry labels (sandbox id, instance tag, netns name), so `adopt()` re-finds them
   after a server restart; a server only ever touches containers with its own instance tag.
5. Every operation is idempotent: deleting a missing sandbox, pausing a paused one, do nothing.
6. With `disks` (runtime/sandbox_disk.py), /workspace is the sandbox's own filesystem, bound in,
   instead of a Docker volume (which no dockerd option can size): writes past its quota fail
   with ENOSPC. The root is read-only and /tmp, /var/tmp, /run are sized tmpfs, so that caps every
   write.
7. A `gvisor` sandbox runs under the engine's `gvisor_runtime` (sandgate-runsc, registered in
   daemon.json: runtime/runsc_wrapper.py), which boots runsc inside the sandbox's netns itself
   (the container's env names it), so rule 1's move is skipped: gVisor reads the interfaces
   only at boot. The isolation is offered only when the engine has that runtime.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import docker
import docker.errors
from docker.models.containers import Container
from docker.types import Mount
from pyroute2 import IPRoute

from sandgate.lifecycle.confinement import SandboxNet
from sandgate.lifecycle.kernel import MS_BIND, in_fresh_thread, mount, umount
from sandgate.lifecycle.registry import RegistryConfig
from sandgate.lifecycle.runtime.base import (
    EXECD_PORT,
    BindMount,
    RuntimeError_,
    SandboxSpec,
    placed,
    wait_for_execd,
)
from sandgate.lifecycle.runtime.claim_disks import ClaimDisks
from sandgate.lifecycle.runtime.docker_claims import DockerClaims
from sandgate.lifecycle.runtime.docker_images import DockerImages
from sandgate.lifecycle.runtime.runsc_wrapper import NETNS_VAR
from sandgate.lifecycle.runtime.sandbox_disk import SandboxDisks
from sandgate.lifecycle.runtime.sandbox_root import RESOLVER_OPTIONS

LABEL_SANDBOX = "io.sandgate.sandbox"
LABEL_INSTANCE = "io.sandgate.instance"
LABEL_NETNS = "io.sandgate.netns"
CA_PATH_INSIDE = "/etc/sandgate/proxy-ca.crt"
# Names the local runtime knows, mapped so the same requests work on both runtimes.
DEFAULT_IMAGE_ALIASES = {"sandgate/host": "sandgate/base:latest"}
DEFAULT_PIDS_MAX = 1024
# Writable in a read-only root, each its own sized tmpfs: what programs write scratch files to
TMPFS_DIRS = ("/tmp", "/var/tmp", "/run")
LIVE_STATES = frozenset({"running", "paused"})


class DockerRuntime:
    name = "docker"
    isolations: tuple[str, ...] = ("standard",)

    def __init__(
        self,
        client: docker.DockerClient | str | None = None,
        *,
        images: Mapping[str, str] | None = None,
        oci_runtime: str | None = None,
        instance: str = "default",
        read_only: bool = True,
        cap_add: tuple[str, ...] = (),
        default_pids_max: int = DEFAULT_PIDS_MAX,
        tmpfs_size: str = "256m",
        binds: Sequence[BindMount] = (),
        disks: SandboxDisks | None = None,
        claim_disks: ClaimDisks | None = None,
        registry: RegistryConfig | None = None,
        pull_policy: str = "if-not-present",
        gvisor_runtime: str | None = None,
    ) -> None:
        self.client = _client(client)
        self.disks = disks
        self.binds = list(binds)  # the operator's, in every sandbox (checked by the caller)
        aliases = {**DEFAULT_IMAGE_ALIASES, **(images or {})}
        self.images = DockerImages(self.client, aliases, registry=registry, pull_policy=pull_policy)
        self.oci_runtime = oci_runtime
        self.instance = instance
        self.claims = DockerClaims(self.client, instance, (LABEL_INSTANCE, LABEL_SANDBOX), claim_disks)
        self.read_only = read_only
        self.cap_add = list(cap_add)
        self.default_pids_max = default_pids_max
        self.tmpfs_size = tmpfs_size
        engine_runtimes = self.client.info().get("Runtimes", {}) if gvisor_runtime else {}
        self.gvisor_runtime = gvisor_runtime if gvisor_runtime in engine_runtimes else None
        self.isolations = ("standard", "gvisor") if self.gvisor_runtime else ("standard",)

    # -- the Runtime protocol ---------------------------------------------------------------

    def create(self, spec: SandboxSpec, net: SandboxNet | None) -> str:
        """Start the container and join it to `net`; returns once launched (see `wait_ready`)."""
        net = placed(net, self.name)
        existing = self._container(spec.sandbox_id)
        if existing is not None:
            if existing.status in LIVE_STATES:
                return net.address
            self.delete(spec.sandbox_id)  # the container and its filesystem
        if spec.isolation == "gvisor" and self.gvisor_runtime is None:
            raise RuntimeError_(
                "isolation 'gvisor' needs the engine to know the runtime sandgate-runsc (register it "
                "in daemon.json, see docs/runtime.md) and runsc installed (`apt-get install runsc`)"
            )
        try:
            workspace = self._make_workspace(spec)
            container = self.client.containers.create(**self._container_args(spec, net, workspace))
        except BaseException:
            self.delete(spec.sandbox_id)
            raise
        try:
            container.start()
            if spec.isolation == "gvisor":
                return net.address  # booted inside net by the runtime wrapper (rule 7)
            container.reload()
            container_ns = self._open_netns(spec.sandbox_id, container)
            try:
                in_fresh_thread(lambda: _move_veth_into(container_ns, net))
                _repoint_netns_name(container_ns, net)
            finally:
                os.close(container_ns)
        except BaseException:
            self.delete(spec.sandbox_id)
            raise
        return net.address

    def delete(self, sandbox_id: str) -> None:
        container = self._container(sandbox_id)
        if container is not None:
            self._remove(container)
        if self.disks is not None:
            self.disks.remove(sandbox_id, self.disks.mount_point(sandbox_id))
        self.claims.release(self._containers())

    def pause(self, sandbox_id: str) -> None:
        container = self._existing(sandbox_id)
        if container.status == "running":
            container.pause()

    def resume(self, sandbox_id: str) -> None:
        container = self._existing(sandbox_id)
        if container.status == "paused":
            container.unpause()

    def alive(self, sandbox_id: str) -> bool:
        container = self._container(sandbox_id)
        return container is not None and container.status in LIVE_STATES

    def adopt(self) -> list[str]:
        """Sandboxes of this instance still running (or paused); stopped containers are removed."""
        alive: list[str] = []
        for container in self._containers():
            if container.status in LIVE_STATES:
                alive.append(container.labels[LABEL_SANDBOX])
            else:
                self._remove(container)
        for sandbox_id in (self.disks.leftover_ids() if self.disks else set()) - set(alive):
            self.delete(sandbox_id)
        return sorted(alive)

    # -- beyond the protocol ----------------------------------------------------------------

    def paused(self, sandbox_id: str) -> bool:
        return self._existing(sandbox_id).status == "paused"

    def wait_ready(self, sandbox_id: str, net: SandboxNet, timeout: float = 10.0) -> None:
        """Wait until execd answers GET /ping with 200; fail early if the container died."""
        wait_for_execd(self, sandbox_id, net.address, timeout, poll=0.005)

    def log_tail(self, sandbox_id: str, limit: int = 2000) -> str:
        container = self._container(sandbox_id)
        if container is None:
            return "(no container)"
        state = container.attrs.get("State", {})
        if state.get("Status") != "exited":
            return self._logs(container, limit)
        return f"{self._logs(container, limit)}\n(the container exited with status {state.get('ExitCode')})"

    def root_path(self, sandbox_id: str) -> Path:
        """The container's root as the host sees it (through its init's /proc entry)."""
        container = self._existing(sandbox_id)
        container.reload()
        return Path(f"/proc/{container.attrs['State']['Pid']}/root")

    # -- internals --------------------------------------------------------------------------

    def _make_workspace(self, spec: SandboxSpec) -> Mount:
        """/workspace: the sandbox's own filesystem (rule 6), else a Docker volume."""
        if self.disks is None:
            return Mount(target="/workspace", source=None, type="volume")
        mount_point = self.disks.mount_point(spec.sandbox_id)
        self.disks.create(spec.sandbox_id, spec.disk_bytes, mount_point)
        (mount_point / "workspace").mkdir(exist_ok=True)  # not the filesystem's root: no lost+found
        return Mount(target="/workspace", source=str(mount_point / "workspace"), type="bind")

    def _container_args(self, spec: SandboxSpec, net: SandboxNet, workspace: Mount) -> dict[str, Any]:
        env = {
            **spec.env,
            "SANDGATE_SANDBOX_ID": spec.sandbox_id,
            "SANDGATE_ADDRESS": net.address,
            "SANDGATE_EXECD_PORT": str(EXECD_PORT),
        }
        if spec.execd_token:
            env["SANDGATE_EXECD_TOKEN"] = spec.execd_token
        tmpfs_options = f"rw,nosuid,nodev,size={self.tmpfs_size}"
        args: dict[str, Any] = {
            "image": self.images.get(spec.image),
            "command": spec.entrypoint or None,
            "name": f"sandgate-{self.instance}-{spec.sandbox_id}",
            "hostname": spec.sandbox_id[:63],
            "labels": {LABEL_SANDBOX: spec.sandbox_id, LABEL_INSTANCE: self.instance, LABEL_NETNS: net.netns},
            "environment": env,
            "network_mode": "none",
            "dns": [net.gateway],  # any resolver works: the netns redirects port 53 to the proxy
            "dns_opt": list(RESOLVER_OPTIONS),
            "sysctls": {"net.ipv6.conf.all.disable_ipv6": "1", "net.ipv6.conf.default.disable_ipv6": "1"},
            "cap_drop": ["ALL"],
            "cap_add": self.cap_add or None,
            "security_opt": ["no-new-privileges:true"],
            "read_only": self.read_only,
            "tmpfs": {path: tmpfs_options for path in TMPFS_DIRS},
            "mounts": [
                workspace,
                *(
                    Mount(b.target, b.source, type="bind", read_only=b.read_only)
                    for b in (*self.binds, *spec.binds)
                ),
                *self.claims.mounts(spec.sandbox_id, spec.claims),
            ],
            "pids_limit": spec.pids_max or self.default_pids_max,
            "init": True,
            "restart_policy": {"Name": "no"},
            "runtime": self.oci_runtime,
        }
        if spec.isolation == "gvisor":
            env[NETNS_VAR] = net.netns  # read and removed by sandgate-runsc (rule 7)
            args |= {"runtime": self.gvisor_runtime, "sysctls": None}  # the netns has IPv6 off already
        if spec.memory_bytes:
            args["mem_limit"] = args["memswap_limit"] = spec.memory_bytes
        if spec.cpu_quota:
            args["nano_cpus"] = int(spec.cpu_quota * 1e9)
        if not self.images.brings_execd(args["image"]):
            foreign = self.images.foreign_args(spec.entrypoint, net.address, EXECD_PORT)
            args.update(entrypoint=foreign["entrypoint"], command=foreign["command"])
            args["mounts"] += foreign["mounts"]
        if spec.ca_cert is not None:
            args["volumes"] = {str(Path(spec.ca_cert).resolve()): {"bind": CA_PATH_INSIDE, "mode": "ro"}}
        return args

    def _open_netns(self, sandbox_id: str, container: Container) -> int:
        """An fd of the container's network namespace. The fd, not the PID, is what the veth move
        and the netns name use: the sandbox may exit as soon as its address appears (a bad
        entrypoint), and the fd keeps the namespace there until the name is pinned to it."""
        pid = int(container.attrs["State"]["Pid"])
        try:
            if pid:
                return os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
        except FileNotFoundError:
            pass
        raise RuntimeError_(f"container of sandbox {sandbox_id} exited at start: {self._logs(container)}")

    def _containers(self, sandbox_id: str | None = None) -> list[Container]:
        labels = [f"{LABEL_INSTANCE}={self.instance}"]
        labels.append(f"{LABEL_SANDBOX}={sandbox_id}" if sandbox_id else LABEL_SANDBOX)
        return list(self.client.containers.list(all=True, filters={"label": labels}))

    def _container(self, sandbox_id: str) -> Container | None:
        found = self._containers(sandbox_id)
        return found[0] if found else None

    def _existing(self, sandbox_id: str) -> Container:
        container = self._container(sandbox_id)
        if container is None:
            raise RuntimeError_(f"sandbox {sandbox_id} has no container (instance {self.instance})")
        return container

    def _remove(self, container: Container) -> None:
        with contextlib.suppress(docker.errors.NotFound):
            container.reload()
            if container.status == "paused":
                container.unpause()  # a paused container cannot be killed
            container.remove(force=True, v=True)

    @staticmethod
    def _logs(container: Container, limit: int = 2000) -> str:
        try:
            data: bytes = container.logs(tail=50)
        except docker.errors.APIError as exc:
            return f"(logs unavailable: {exc})"
        return data[-limit:].decode(errors="replace").strip() or "(no output)"


def _client(given: docker.DockerClient | str | None) -> docker.DockerClient:
    if isinstance(given, str):
        return docker.DockerClient(base_url=given)
    return given if given is not None else docker.from_env()


def _move_veth_into(container_ns: int, net: SandboxNet) -> None:
    """Move the sandbox's veth end from the sandgate netns into the container's and configure it.

    Runs in a thread of its own: setns changes only the calling thread's namespace. Moving an
    interface drops its addresses and routes, so they are added again on the other side.
    """
    host_ns = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    sandbox_ns = os.open(net.netns_path, os.O_RDONLY)
    try:
        os.setns(sandbox_ns, os.CLONE_NEWNET)
        with IPRoute() as sandbox:
            links = [link for link in sandbox.get_links() if link.get("ifname") != "lo"]
            if len(links) != 1:
                names = [link.get("ifname") for link in links]
                raise RuntimeError_(f"netns {net.netns} should hold one veth end besides lo; it has {names}")
            name = links[0].get("ifname")
            sandbox.link("set", index=links[0]["index"], net_ns_fd=container_ns)
        os.setns(container_ns, os.CLONE_NEWNET)
        with IPRoute() as inside:
            (index,) = inside.link_lookup(ifname=name)
            inside.addr("add", index=index, address=net.address, prefixlen=net.prefixlen)
            inside.link("set", index=index, state="up")
            inside.route("add", dst="0.0.0.0/0", gateway=net.gateway, oif=index)
    finally:
        os.setns(host_ns, os.CLONE_NEWNET)
        for fd in (host_ns, sandbox_ns):
            os.close(fd)


def _repoint_netns_name(container_ns: int, net: SandboxNet) -> None:
    """Make /run/netns/<name> the container's namespace (the old one, now empty, is freed)."""
    umount(net.netns_path, lazy=True)
    mount(f"/proc/self/fd/{container_ns}", net.netns_path, None, MS_BIND)
