"""The local runtime: bubblewrap inside the sandbox's netns, an overlay root, cgroup limits.

Rules:
1. Host files are never written. A sandbox's `/` is an overlay whose upper layer lives in
   `<state_dir>/sandboxes/<id>/`; the image's rootfs (for `sandgate/host`, the skeleton of
   `ImageStore.host_root`) is only ever its lower layer. The overlay is mounted with
   /proc/self/fd paths, so the sandbox's mountinfo names no host directory. `/workspace` is in
   the overlay and lives as long as the sandbox.
2. Files the runtime puts into a sandbox root (resolv.conf, the CA bundle, Java's keystore with
   the proxy CA (runtime/java_trust.py), execd's env file) are written by
   runtime/sandbox_root.py, never through a path an image's symlink can bend.
3. How a sandbox's processes start (cgroup first, capabilities, seccomp, environment, execd's
   token, the binds of execd's Python) is runtime/launch.py; this runtime adds a seccomp filter
   that denies syslog(2) (`seccomp.DENY_KERNEL_LOG`). Delete = kill the cgroup, unmount, remove
   the dir.
4. `sandgate/host` is an allowlist, never the host's root minus masks: the host's system dirs
   read-only, a curated /etc, private /tmp, /home, /root, /run, /var, /opt, /srv, /mnt
   (see lifecycle/images.py).
5. Sandboxes outlive the server (own session, no die-with-parent); `adopt` finds them again by
   their state directories and cgroups and removes the rest.
6. With `disks` (runtime/sandbox_disk.py), the upper and work layers and output.log live on the
   sandbox's own filesystem at `<state_dir>/sandboxes/<id>/disk`, so what a sandbox writes is
   capped and never lands on the state dir's filesystem; every sandbox gets a pids limit
   (`default_pids_max` unless its spec has one).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from pydantic import BaseModel

from sandgate.lifecycle.cgroups import Limits, SandboxCgroup
from sandgate.lifecycle.confinement import SandboxNet
from sandgate.lifecycle.images import HOST_IMAGE, HostRoot, Image, ImageStore
from sandgate.lifecycle.kernel import instance_tag, mount, umount
from sandgate.lifecycle.runtime.base import BindMount, RuntimeError_, SandboxSpec, placed, wait_for_execd
from sandgate.lifecycle.runtime.claim_disks import ClaimDisks
from sandgate.lifecycle.runtime.claims import DirectoryClaims, close_held
from sandgate.lifecycle.runtime.gvisor import Gvisor, Platform, find_runsc, require
from sandgate.lifecycle.runtime.java_trust import JavaTrust
from sandgate.lifecycle.runtime.launch import Launch, hand_over_token, python_paths, start_chain
from sandgate.lifecycle.runtime.sandbox_disk import SandboxDisks
from sandgate.lifecycle.runtime.sandbox_root import (
    EXECD_ENV_FILE,
    RESOLVER_OPTIONS,
    SANDBOX_HOSTS,
    ensure_dir,
    env_file_value,
    image_env,
    install_ca,
    write_file,
)
from sandgate.lifecycle.runtime.seccomp import DENY_KERNEL_LOG, deny_syscalls, filter_fd

DEFAULT_PIDS_MAX = 1024  # Docker's and Kubernetes' usual cap; a fork bomb stops there


class LocalSandboxState(BaseModel):
    """What the runtime keeps on disk per sandbox (`state.json`), for adopt after a restart."""

    sandbox_id: str
    image: str
    netns: str
    address: str
    created: float
    lower: str | None = None  # the overlay's top lower layer, kept while the sandbox runs
    lowers: list[str] = []  # all of them, top first (an image's layers stay while it runs)
    isolation: str = "standard"  # or "gvisor" (runtime/gvisor.py)


class LocalRuntime:
    name = "local"

    def __init__(
        self,
        state_dir: Path,
        images: ImageStore,
        *,
        execd_python: str = sys.executable,
        instance: str | None = None,
        seccomp_bpf: Path | None = None,
        binds: Sequence[BindMount] = (),
        disks: SandboxDisks | None = None,
        claim_disks: ClaimDisks | None = None,
        default_pids_max: int = DEFAULT_PIDS_MAX,
        runsc: str = "runsc",
        gvisor_platform: Platform = "systrap",
        gvisor_events: Path | None = None,
    ) -> None:
        self.state_dir = state_dir.resolve()
        self.disks = disks
        self.default_pids_max = default_pids_max
        self.sandboxes_dir = self.state_dir / "sandboxes"
        self.images = images
        self.execd_python = execd_python
        self.instance = instance or instance_tag(self.state_dir)
        self.seccomp_bpf = seccomp_bpf
        self.binds = list(binds)
        self.claims = DirectoryClaims(self.state_dir, claim_disks)
        self._kernel_log_filter = deny_syscalls(DENY_KERNEL_LOG)
        self.execd_paths = python_paths(execd_python)
        self.execd_in_image = self.execd_paths.in_image(execd_python)
        self.java_trust = JavaTrust(self.state_dir / "java-trust")
        self._processes: dict[str, subprocess.Popen[bytes]] = {}
        runsc_path = find_runsc(runsc)
        self.gvisor = Gvisor(runsc_path, gvisor_platform, gvisor_events) if runsc_path else None
        self.isolations: tuple[str, ...] = ("standard", "gvisor") if runsc_path else ("standard",)

    # -- the Runtime protocol ---------------------------------------------------------------

    def create(self, spec: SandboxSpec, net: SandboxNet | None) -> str:
        """Start the entrypoint and execd; returns once launched (see `wait_ready`)."""
        net = placed(net, self.name)
        if self.alive(spec.sandbox_id):
            return net.address
        image = self.images.get(spec.image)
        require(spec.isolation, self.gvisor.runsc if self.gvisor else None)
        self.delete(spec.sandbox_id)
        box = self._dir(spec.sandbox_id)
        box.mkdir(parents=True, exist_ok=True)  # counts the sandbox as a claim user (`_users`)
        try:
            held = self.claims.attach(spec.sandbox_id, spec.claims)
        except BaseException:
            self.delete(spec.sandbox_id)
            raise
        spec = replace(spec, binds=(*spec.binds, *held))
        host = self.images.host_root() if image.name == HOST_IMAGE or image.host_base else None
        lowers = self.images.lowers(image)
        try:
            env = self._prepare_root(box, image, lowers, spec, net)
            cgroup = self._cgroup(spec.sandbox_id)
            cgroup.create(Limits(spec.memory_bytes, spec.pids_max or self.default_pids_max, spec.cpu_quota))
            record = LocalSandboxState(
                sandbox_id=spec.sandbox_id,
                image=spec.image,
                netns=net.netns,
                address=net.address,
                created=time.time(),
                lower=str(lowers[0]),
                lowers=[str(lower) for lower in lowers],
                isolation=spec.isolation,
            )
            (box / "state.json").write_text(record.model_dump_json(), encoding="utf-8")
            self._launch(spec, net, host, env, box, cgroup)
        except BaseException:
            self.delete(spec.sandbox_id)
            raise
        finally:
            close_held(held)  # the launcher has its copies
        return net.address

    def delete(self, sandbox_id: str) -> None:
        process = self._processes.pop(sandbox_id, None)
        if process is not None and process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)  # the launch chain, in case it has not joined yet
        self._cgroup(sandbox_id).remove()
        if process is not None:
            process.wait(timeout=5)
        box = self._dir(sandbox_id)
        root = box / "root"
        try:
            umount(root)
        except OSError:
            umount(root, lazy=True)
        if self.disks is not None:
            self.disks.remove(sandbox_id, box / "disk")
        shutil.rmtree(box, ignore_errors=True)
        self.claims.release(sandbox_id, live=self._users())

    def pause(self, sandbox_id: str) -> None:
        self._existing_cgroup(sandbox_id).freeze()

    def resume(self, sandbox_id: str) -> None:
        self._existing_cgroup(sandbox_id).thaw()

    def alive(self, sandbox_id: str) -> bool:
        process = self._processes.get(sandbox_id)
        return (process is not None and process.poll() is None) or bool(self._cgroup(sandbox_id).pids())

    def paused(self, sandbox_id: str) -> bool:
        return self._existing_cgroup(sandbox_id).frozen()

    def adopt(self) -> list[str]:
        """Sandboxes still running from a previous server; everything else of ours is removed."""
        running: list[str] = []
        lowers: set[Path] = set()
        if self.sandboxes_dir.is_dir():
            for state in sorted(self.sandboxes_dir.glob("*/state.json")):
                sandbox_id = state.parent.name
                if self.alive(sandbox_id):
                    running.append(sandbox_id)
                    lowers.update(sandbox_lowers(state))
                else:
                    self.delete(sandbox_id)
            for box in self.sandboxes_dir.iterdir():
                if box.name not in running and not (box / "state.json").exists():
                    self.delete(box.name)
        for sandbox_id in (self.disks.leftover_ids() if self.disks else set()) - set(running):
            self.delete(sandbox_id)  # an image whose sandbox directory is gone
        prefix = self._cgroup_name("")
        for name in SandboxCgroup.names(prefix):
            if name[len(prefix) :] not in running:
                SandboxCgroup(name).remove()
        self.images.prune_host_roots(keep=lowers)
        return running

    # -- beyond the protocol ----------------------------------------------------------------

    def wait_ready(self, sandbox_id: str, net: SandboxNet, timeout: float = 10.0) -> None:
        """Wait until execd answers GET /ping with 200; fail early if the sandbox died."""
        wait_for_execd(self, sandbox_id, net.address, timeout, poll=0.002)

    def configure(self, sandbox_id: str, env: dict[str, str], limits: Limits) -> None:
        """Give a running sandbox (a claimed warm-pool member) its limits and its env: the env
        goes to execd's env file, so every command (and the entrypoint execd starts) sees it."""
        self._existing_cgroup(sandbox_id).create(limits)
        lines = "".join(f"{key}={env_file_value(value)}\n" for key, value in env.items())
        root_fd = os.open(self.root_path(sandbox_id), os.O_PATH | os.O_DIRECTORY)
        try:
            write_file(root_fd, EXECD_ENV_FILE, lines.encode())
        finally:
            os.close(root_fd)

    def log_tail(self, sandbox_id: str, limit: int = 2000) -> str:
        """The end of the sandbox's output (entrypoint and execd), for error messages."""
        try:
            data = (self._layers(sandbox_id) / "output.log").read_bytes()
        except FileNotFoundError:
            return "(no output)"
        return data[-limit:].decode(errors="replace").strip() or "(no output)"

    def copy_upper(self, sandbox_id: str, target: Path) -> None:
        """Copy what the sandbox changed (its overlay upper dir, whiteouts and xattrs as they are)
        to `target`, frozen meanwhile so the copy is one moment of it (a snapshot's layer)."""
        cgroup = self._existing_cgroup(sandbox_id)
        was_frozen = cgroup.frozen()
        cgroup.freeze()
        try:
            result = subprocess.run(
                ["cp", "-a", "--", f"{self._layers(sandbox_id) / 'upper'}/.", str(target)],
                capture_output=True, text=True, timeout=600,
            )  # fmt: skip
        finally:
            if not was_frozen:
                cgroup.thaw()
        if result.returncode != 0:
            raise RuntimeError_(f"cannot copy sandbox {sandbox_id}'s files: {result.stderr.strip()}")

    def root_path(self, sandbox_id: str) -> Path:
        """The sandbox's merged root as seen from the host (the server's view, not the sandbox's)."""
        return self._dir(sandbox_id) / "root"

    # -- internals --------------------------------------------------------------------------

    def _dir(self, sandbox_id: str) -> Path:
        if "/" in sandbox_id or sandbox_id in ("", ".", ".."):
            raise ValueError(f"sandbox id {sandbox_id!r} cannot name a directory")
        return self.sandboxes_dir / sandbox_id

    def _users(self) -> set[str]:
        """Sandboxes that may hold a claim: every one whose directory is still here."""
        return {box.name for box in self.sandboxes_dir.iterdir()} if self.sandboxes_dir.is_dir() else set()

    def _layers(self, sandbox_id: str) -> Path:
        """Where the overlay's upper/work dirs and output.log live (rule 6)."""
        box = self._dir(sandbox_id)
        return box / "disk" if self.disks is not None else box

    def process_lists(self, sandbox_id: str) -> list[Path]:
        """The files listing the sandbox's processes (its cgroup's `cgroup.procs`)."""
        return self._cgroup(sandbox_id).procs_files()

    def _cgroup_name(self, sandbox_id: str) -> str:
        return f"sandgate-{self.instance}-{sandbox_id}"

    def _cgroup(self, sandbox_id: str) -> SandboxCgroup:
        return SandboxCgroup(self._cgroup_name(sandbox_id))

    def _existing_cgroup(self, sandbox_id: str) -> SandboxCgroup:
        cgroup = self._cgroup(sandbox_id)
        if not cgroup.exists():
            raise RuntimeError_(f"sandbox {sandbox_id} is not running in the local runtime")
        return cgroup

    def _prepare_root(
        self, box: Path, image: Image, lowers: list[Path], spec: SandboxSpec, net: SandboxNet
    ) -> dict[str, str]:
        """Mount the overlay root and write what the sandbox needs; returns its environment."""
        layers = self._layers(spec.sandbox_id)
        if self.disks is not None:
            self.disks.create(spec.sandbox_id, spec.disk_bytes, layers)
        for path in (layers / "upper", layers / "work", box / "root"):
            path.mkdir(parents=True, exist_ok=True)
        _mount_overlay(lowers, layers, box / "root")
        env = image_env(image)
        root_fd = os.open(box / "root", os.O_PATH | os.O_DIRECTORY)
        try:
            os.close(ensure_dir(root_fd, "workspace"))  # an open fd would pin the overlay after delete
            write_file(
                root_fd,
                "etc/resolv.conf",
                f"nameserver {net.gateway}\noptions {' '.join(RESOLVER_OPTIONS)}\n".encode(),
            )
            write_file(root_fd, "etc/hosts", SANDBOX_HOSTS.encode())
            if spec.ca_cert is not None:
                ca = spec.ca_cert.read_bytes()
                env.update(install_ca(root_fd, ca))
                self.java_trust.install(root_fd, ca, env)
        finally:
            os.close(root_fd)
        env["EXECD_ENVS"] = "/" + EXECD_ENV_FILE
        env.update(spec.env)
        env["SANDGATE_SANDBOX_ID"] = spec.sandbox_id
        return env

    def _launch(
        self,
        spec: SandboxSpec,
        net: SandboxNet,
        host: HostRoot | None,
        env: dict[str, str],
        box: Path,
        cgroup: SandboxCgroup,
    ) -> None:
        gvisor = self.gvisor if spec.isolation == "gvisor" else None
        filters = [] if gvisor else [filter_fd(self._kernel_log_filter)]
        try:
            if self.seccomp_bpf and not gvisor:
                filters.append(os.open(self.seccomp_bpf, os.O_RDONLY))
            launch = Launch(
                root=box / "root",
                env=env,
                ro_binds=host.binds if host is not None else (),
                binds=(*self.binds, *spec.binds),
                seccomp_fds=filters,
                execd_python=self.execd_python,
                execd=self.execd_paths if host is not None else self.execd_in_image,
            )
            log = self._layers(spec.sandbox_id) / "output.log"
            isolator = gvisor.isolator(spec, net, launch, box) if gvisor else None
            process = start_chain(spec, net, launch, cgroup.procs_files(), log, isolator)
            self._processes[spec.sandbox_id] = process
            hand_over_token(process, spec.execd_token or "")
        finally:
            for fd in filters:
                os.close(fd)


def _mount_overlay(lowers: list[Path], layers: Path, root: Path) -> None:
    """Mount the overlay at root, naming its layers by /proc/self/fd paths: the options are
    what mountinfo shows inside the sandbox, and they must not name host directories."""
    fds = [os.open(path, os.O_PATH | os.O_DIRECTORY) for path in (*lowers, layers / "upper", layers / "work")]
    try:
        *lowerdirs, upperdir, workdir = (f"/proc/self/fd/{fd}" for fd in fds)
        options = f"lowerdir={':'.join(lowerdirs)},upperdir={upperdir},workdir={workdir}"
        mount("overlay", root, "overlay", 0, options)
    finally:
        for fd in fds:
            os.close(fd)


def sandbox_lowers(state: Path) -> set[Path]:
    """The lower directories a sandbox's `state.json` says it uses (kept from GC while it exists)."""
    record = LocalSandboxState.model_validate_json(state.read_text(encoding="utf-8"))
    return {Path(path) for path in [*record.lowers, *([record.lower] if record.lower else [])]}


def lowers_in_use(state_dir: Path) -> set[Path]:
    """Every lower directory a local sandbox of this state dir uses (for `sandgate image prune`)."""
    return {
        path for state in (state_dir / "sandboxes").glob("*/state.json") for path in sandbox_lowers(state)
    }
