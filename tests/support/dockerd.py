"""A private, throwaway Docker engine: start it, use it, and leave nothing behind.

Rules:
- Everything it owns has a random name under one temp dir: data root, exec root, pidfile, unix
  socket, and a cgroup parent `sandgate-dk-<hex>` for its containers; nothing is shared with a
  system dockerd or with another test run.
- It runs in a network namespace of its own, with `--bridge=none --iptables=false
  --ip6tables=false --ip-forward=false --ip-masq=false`: no docker0, no iptables rules, no
  forwarding sysctl, anywhere. Sandbox containers use network mode none and get their network
  from sandgate, so the engine needs none.
- It knows sandgate's gVisor runtime, `sandgate-runsc` (the venv's wrapper around runsc, on the
  ptrace platform with host networking inside the sandbox's netns; lifecycle/runtime/runsc_wrapper.py).
- Stop is by PID (SIGTERM, then SIGKILL), after removing every container; then any process still
  holding the temp dir (containerd, shims) is killed by PID, mounts under the temp dir are
  unmounted, the cgroup parent is removed and the temp dir deleted.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors

CGROUP_ROOT = Path("/sys/fs/cgroup")
GVISOR_RUNTIME = "sandgate-runsc"
RUNSC_WRAPPER = Path(sys.executable).with_name("sandgate-runsc")
START_TIMEOUT = 30.0
STOP_TIMEOUT = 15.0
REGISTRY_RANGE = "192.0.2.0/24"  # where tests/support/registry.py puts its registries (plain HTTP)


class PrivateDockerd:
    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="sgdk-", dir="/tmp"))
        self.cgroup_parent = f"sandgate-dk-{secrets.token_hex(4)}"
        self.socket = self.root / "docker.sock"
        self.url = f"unix://{self.socket}"
        self.log_path = self.root / "dockerd.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._client: docker.DockerClient | None = None

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            self._client = docker.DockerClient(base_url=self.url, timeout=120)
        return self._client

    def start(self) -> None:
        config = self.root / "daemon.json"
        runtime = {"path": str(RUNSC_WRAPPER), "runtimeArgs": ["--platform=systrap", "--network=host"]}
        config.write_text(json.dumps({"runtimes": {GVISOR_RUNTIME: runtime}}))
        argv = [
            "unshare", "--net", "--",
            "dockerd",
            f"--data-root={self.root / 'data'}",
            f"--exec-root={self.root / 'exec'}",
            f"--pidfile={self.root / 'dockerd.pid'}",
            f"--config-file={config}",
            f"--host={self.url}",
            f"--cgroup-parent={self.cgroup_parent}",
            "--bridge=none", "--iptables=false", "--ip6tables=false",
            "--ip-forward=false", "--ip-masq=false",
            f"--insecure-registry={REGISTRY_RANGE}",  # the test registry (tests/support/registry.py)
        ]  # fmt: skip
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"dockerd exited with {self.process.returncode}: {self.log_tail()}")
            with contextlib.suppress(docker.errors.DockerException, OSError):
                if self.client.ping():
                    return
            time.sleep(0.05)
        raise RuntimeError(
            f"dockerd did not answer on {self.url} within {START_TIMEOUT} s: {self.log_tail()}"
        )

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """Remove containers, stop the daemon by PID, then remove what it may have left behind."""
        try:
            if self.process is not None and self.process.poll() is None:
                self._remove_containers()
                self._terminate(self.process.pid)
        finally:
            if self._client is not None:
                self._client.close()
            for pid in self._processes_using_root():
                self._terminate(pid)
            self._unmount_under_root()
            self._remove_cgroups()
            shutil.rmtree(self.root, ignore_errors=True)

    def _remove_containers(self) -> None:
        with contextlib.suppress(docker.errors.DockerException):
            for container in self.client.containers.list(all=True):
                if container.status == "paused":
                    container.unpause()
                container.remove(force=True, v=True)

    def _terminate(self, pid: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        while time.monotonic() < deadline and _alive(pid):
            if self.process is not None and self.process.pid == pid:
                self.process.poll()  # reap our child so it stops being alive
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        if self.process is not None and self.process.pid == pid:
            self.process.wait(timeout=STOP_TIMEOUT)

    def _processes_using_root(self) -> list[int]:
        """PIDs whose command line names our temp dir (a leaked containerd or shim)."""
        marker = str(self.root).encode()
        pids = []
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                with contextlib.suppress(OSError):
                    if marker in (proc / "cmdline").read_bytes():
                        pids.append(int(proc.name))
        return pids

    def _unmount_under_root(self) -> None:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
        targets = [line.split()[1] for line in mounts if line.split()[1].startswith(str(self.root))]
        for target in sorted(targets, key=len, reverse=True):
            subprocess.run(["umount", "-l", target], capture_output=True)

    def _remove_cgroups(self) -> None:
        for parent in CGROUP_ROOT.glob(f"*/{self.cgroup_parent}"):
            for directory in sorted(parent.rglob("*"), key=lambda p: len(p.parts), reverse=True):
                if directory.is_dir():
                    with contextlib.suppress(OSError):
                        directory.rmdir()
            with contextlib.suppress(OSError):
                parent.rmdir()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@contextlib.contextmanager
def private_dockerd() -> Iterator[PrivateDockerd]:
    daemon = PrivateDockerd()
    try:
        daemon.start()
        yield daemon
    finally:
        daemon.stop()
