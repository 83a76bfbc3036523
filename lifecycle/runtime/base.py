"""What a runtime is given and what it must do.

A runtime starts a sandbox's processes (its entrypoint and execd) inside the network its
confinement placed it in (`sandgate.lifecycle.confinement`: a netns built on this host, or the
runtime's own network, e.g. a Pod's); it never touches routes, nftables or the proxy, so every
runtime inherits the same egress guarantees. All operations are idempotent.
"""

from __future__ import annotations

import http.client
import os
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Protocol

from sandgate.lifecycle.errors import RuntimeError_

if TYPE_CHECKING:  # the netns builder behind the confinement's face loads netlink
    from sandgate.lifecycle.confinement import SandboxNet
    from sandgate.lifecycle.registry import Credentials

EXECD_PORT = 44772
# execd refuses every route but /ping without it (when it was started with a token).
EXECD_TOKEN_HEADER = "X-EXECD-ACCESS-TOKEN"


# Host paths no bind may show a sandbox, nor contain (the control plane's files, kernel and
# device views, engine sockets, host keys); the state dir is added by the caller.
UNSAFE_BIND_SOURCES = (
    "/proc", "/sys", "/dev", "/boot", "/run", "/var/run", "/etc/sandgate", "/etc/ssh",
    "/etc/shadow", "/etc/gshadow", "/etc/sudoers", "/var/lib/sandgate", "/var/lib/docker",
    "/var/lib/containerd", "/root/.ssh",
)  # fmt: skip
# Places inside a sandbox a bind may not cover: the kernel's views and the read-only system.
RESERVED_BIND_TARGETS = ("/proc", "/dev", "/sys", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64")


class UnsafeBind(ValueError):
    """A bind the runtime refuses; the message says which path and why."""


def check_target(where: str, text: str) -> PurePosixPath:
    """`text` normalized, or UnsafeBind unless it is a place inside a sandbox a mount may cover."""
    target = PurePosixPath(os.path.normpath(text))
    reserved = any(target.is_relative_to(t) for t in RESERVED_BIND_TARGETS)
    if reserved or target == PurePosixPath("/") or ".." in PurePosixPath(text).parts:
        raise UnsafeBind(
            f"{where}: the target may not be /, contain '..' or lie in {', '.join(RESERVED_BIND_TARGETS)}"
        )
    return target


@dataclass(frozen=True)
class BindMount:
    """A host path shown inside a sandbox (read-only unless `read_only` is False)."""

    source: str  # absolute, resolved (no symlink left) by `checked`
    target: str
    read_only: bool = True
    fd: int | None = None  # the source held open: bwrap binds it (--bind-fd), never re-resolving

    def checked(self, unsafe: Iterable[str | Path] = ()) -> BindMount:
        """This bind with its source resolved, or UnsafeBind saying what is wrong with it."""
        where = f"bind {self.source} -> {self.target}"
        if not (self.source.startswith("/") and self.target.startswith("/")):
            raise UnsafeBind(f"{where}: source and target must be absolute paths")
        target = check_target(where, self.target)
        source = Path(os.path.realpath(self.source))
        if not source.exists():
            raise UnsafeBind(f"{where}: {source} does not exist on the host")
        if stat.S_ISSOCK(source.stat().st_mode):
            raise UnsafeBind(f"{where}: {source} is a socket (an engine or control socket is never bound)")
        for path in (*UNSAFE_BIND_SOURCES, *map(str, unsafe)):
            danger = Path(os.path.realpath(path))
            if source == Path("/") or source.is_relative_to(danger) or danger.is_relative_to(source):
                raise UnsafeBind(f"{where}: {source} is or holds {danger}, which no sandbox may see")
        return BindMount(str(source), str(target), self.read_only)

    @classmethod
    def parse(cls, text: str) -> BindMount:
        """`source:target[:ro|rw]` (read-only unless `:rw`), as the `binds` setting writes them."""
        parts = text.split(":")
        mode = parts.pop() if len(parts) == 3 else "ro"
        if len(parts) != 2 or mode not in ("ro", "rw"):
            raise UnsafeBind(f"bind {text!r}: write source:target, source:target:ro or source:target:rw")
        return cls(parts[0], parts[1], read_only=mode == "ro")

    def under(self, prefixes: Iterable[str | Path]) -> bool:
        """Whether the (resolved) source lies under one of `prefixes`."""
        return any(Path(self.source).is_relative_to(os.path.realpath(p)) for p in prefixes)

    def bwrap_args(self) -> list[str]:
        if self.fd is not None:
            return ["--ro-bind-fd" if self.read_only else "--bind-fd", str(self.fd), self.target]
        return ["--ro-bind" if self.read_only else "--bind", self.source, self.target]


@dataclass(frozen=True)
class ClaimMount:
    """A `pvc` volume of a create: claim `name` shown at `target` (its `sub_path` only, if set)."""

    name: str
    target: str
    read_only: bool = False
    sub_path: str = ""
    create: bool = True  # createIfNotExists
    delete_on_end: bool = False  # deleteOnSandboxTermination
    size_bytes: int | None = None  # pvc.storage: the claim's size cap when this create makes it
    storage_class: str | None = None  # pvc.storageClass (kubernetes)
    access_modes: tuple[str, ...] = ()  # pvc.accessModes (kubernetes)


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
    disk_bytes: int | None = None  # what the sandbox may write (the runtime's default when None)
    # execd's access token. Runtimes hand it over outside argv (never in the host's process
    # list) and keep it from the entrypoint's environment.
    execd_token: str | None = None
    ca_cert: Path | None = None  # the proxy CA certificate (never the key) to trust inside
    binds: tuple[BindMount, ...] = ()  # checked binds of this sandbox (besides the runtime's)
    claims: tuple[ClaimMount, ...] = ()  # its `pvc` volumes (runtime/claims.py)
    isolation: str = "standard"  # "gvisor": on gVisor's kernel (runtime/gvisor.py)
    metadata: dict[str, str] = field(default_factory=dict)  # the create's, for runtimes that label
    # ImageSpec.auth, for runtimes whose node pulls at start (Kubernetes); local and Docker pulled
    # before the create, when the image was checked.
    pull_auth: Credentials | None = None


class Runtime(Protocol):
    name: str
    isolations: tuple[str, ...]  # what `SandboxSpec.isolation` may ask of it on this host

    def create(self, spec: SandboxSpec, net: SandboxNet | None) -> str:
        """Start entrypoint and execd inside `net` (None: in the runtime's own network); returns
        the sandbox's address, where execd listens (EXECD_PORT) and its identity at the proxy."""

    def delete(self, sandbox_id: str) -> None:
        """Stop every process, remove mounts/cgroups/containers; no error if already gone."""

    def pause(self, sandbox_id: str) -> None: ...

    def resume(self, sandbox_id: str) -> None: ...

    def alive(self, sandbox_id: str) -> bool: ...

    def adopt(self) -> list[str]:
        """Ids of sandboxes still running from before a restart (the rest is cleaned up)."""

    def log_tail(self, sandbox_id: str, limit: int = 2000) -> str:
        """The end of the sandbox's output (for errors that say why it did not start)."""


def placed(net: SandboxNet | None, runtime: str) -> SandboxNet:
    """`net`, or RuntimeError_ when the confinement built none (this runtime needs one)."""
    if net is None:
        raise RuntimeError_(f"the {runtime} runtime starts sandboxes in a network built on this host")
    return net


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


def wait_for_execd(runtime: Runtime, sandbox_id: str, address: str, timeout: float, poll: float) -> None:
    """Wait until execd answers GET /ping with 200; fail early if the sandbox died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ping_execd(address):
            return
        if not runtime.alive(sandbox_id):
            raise RuntimeError_(
                f"sandbox {sandbox_id} exited before execd was ready: {runtime.log_tail(sandbox_id)}"
            )
        time.sleep(poll)
    raise RuntimeError_(
        f"execd of sandbox {sandbox_id} did not answer /ping on {address}:{EXECD_PORT} "
        f"within {timeout}s: {runtime.log_tail(sandbox_id)}"
    )
