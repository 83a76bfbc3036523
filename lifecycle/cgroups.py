"""Resource limits, freezing and killing for one sandbox through cgroups (v1 here, v2 where pure).

Rules:
1. A sandbox's cgroup is named `sandgate-<instance>-<sandbox id>` directly under each hierarchy,
   so a restarted server finds its own cgroups (and only those) by name.
2. Every process of a sandbox is in its cgroup from its first instruction (the launcher joins
   before it execs anything), so "kill every process of the sandbox" is "kill the cgroup".
3. Killing is freeze, SIGKILL every member, thaw: a frozen process cannot fork a new one between
   listing and killing.

On cgroup v1 the limits live in different hierarchies (memory, pids, cpu, freezer); on a pure
cgroup v2 host there is one directory with all of them. `LIMIT_FILES` maps each limit to its file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
V1_CONTROLLERS = ("memory", "pids", "cpu", "freezer")
CPU_PERIOD_US = 100_000


class CgroupError(Exception):
    """A cgroup operation failed; the message names the cgroup and the file."""


@dataclass(frozen=True)
class Limits:
    memory_bytes: int | None = None
    pids_max: int | None = None
    cpu_quota: float | None = None  # in CPUs
    disk_bytes: int | None = None  # not a cgroup limit: the size of the sandbox's own filesystem


def is_pure_v2(root: Path = CGROUP_ROOT) -> bool:
    return (root / "cgroup.controllers").exists()


class SandboxCgroup:
    """The cgroup(s) of one sandbox; all methods are idempotent."""

    def __init__(self, name: str, root: Path = CGROUP_ROOT) -> None:
        self.name = name
        self.v2 = is_pure_v2(root)
        controllers = ("",) if self.v2 else V1_CONTROLLERS
        self.dirs = {controller: root / controller / name for controller in controllers}

    @classmethod
    def names(cls, prefix: str, root: Path = CGROUP_ROOT) -> set[str]:
        """Names of existing cgroups starting with prefix (in any hierarchy)."""
        parents = [root] if is_pure_v2(root) else [root / c for c in V1_CONTROLLERS]
        found: set[str] = set()
        for parent in parents:
            if parent.is_dir():
                found.update(entry for entry in os.listdir(parent) if entry.startswith(prefix))
        return found

    def create(self, limits: Limits) -> None:
        for directory in self.dirs.values():
            directory.mkdir(exist_ok=True)
        if self.v2:
            self._write_v2_limits(limits)
        else:
            self._write_v1_limits(limits)

    def _write_v1_limits(self, limits: Limits) -> None:
        if limits.memory_bytes is not None:
            self._write("memory", "memory.limit_in_bytes", str(limits.memory_bytes))
            if (self.dirs["memory"] / "memory.memsw.limit_in_bytes").exists():
                self._write("memory", "memory.memsw.limit_in_bytes", str(limits.memory_bytes))
        if limits.pids_max is not None:
            self._write("pids", "pids.max", str(limits.pids_max))
        if limits.cpu_quota is not None:
            self._write("cpu", "cpu.cfs_period_us", str(CPU_PERIOD_US))
            self._write("cpu", "cpu.cfs_quota_us", str(max(1000, round(limits.cpu_quota * CPU_PERIOD_US))))

    def _write_v2_limits(self, limits: Limits) -> None:
        if limits.memory_bytes is not None:
            self._write("", "memory.max", str(limits.memory_bytes))
            self._write("", "memory.swap.max", "0")
        if limits.pids_max is not None:
            self._write("", "pids.max", str(limits.pids_max))
        if limits.cpu_quota is not None:
            self._write(
                "", "cpu.max", f"{max(1000, round(limits.cpu_quota * CPU_PERIOD_US))} {CPU_PERIOD_US}"
            )

    def procs_files(self) -> list[Path]:
        """The files a process writes its PID to, to join the sandbox (every hierarchy)."""
        return [directory / "cgroup.procs" for directory in self.dirs.values()]

    def pids(self) -> set[int]:
        """Members in any hierarchy (a joining process is in some before it is in all)."""
        members: set[int] = set()
        for path in self.procs_files():
            with contextlib.suppress(FileNotFoundError):
                members.update(int(line) for line in path.read_text(encoding="ascii").split())
        return members

    def exists(self) -> bool:
        return any(directory.is_dir() for directory in self.dirs.values())

    def freeze(self) -> None:
        if self.v2:
            self._write("", "cgroup.freeze", "1")
        else:
            self._write("freezer", "freezer.state", "FROZEN")

    def thaw(self) -> None:
        if self.v2:
            self._write("", "cgroup.freeze", "0")
        else:
            self._write("freezer", "freezer.state", "THAWED")

    def frozen(self) -> bool:
        if self.v2:
            return (self.dirs[""] / "cgroup.freeze").read_text(encoding="ascii").strip() == "1"
        return (self.dirs["freezer"] / "freezer.state").read_text(encoding="ascii").strip() != "THAWED"

    def kill_all(self, timeout: float = 5.0) -> None:
        """SIGKILL every member and wait until none is left."""
        if not self.exists():
            return
        deadline = time.monotonic() + timeout
        while members := self.pids():
            if time.monotonic() > deadline:
                raise CgroupError(f"cgroup {self.name}: processes {sorted(members)} survived SIGKILL")
            self.freeze()
            for pid in members:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.thaw()
            time.sleep(0.001)

    def remove(self) -> None:
        """Kill what is left, then remove the directories."""
        self.kill_all()
        for directory in self.dirs.values():
            _rmdir_when_empty(directory)

    def _write(self, controller: str, filename: str, value: str) -> None:
        path = self.dirs[controller] / filename
        try:
            path.write_text(value, encoding="ascii")
        except OSError as exc:
            raise CgroupError(f"cgroup {self.name}: writing {value!r} to {path} failed: {exc}") from exc


def _rmdir_when_empty(directory: Path, timeout: float = 2.0) -> None:
    """rmdir, retrying while the kernel still counts a dying task (EBUSY)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            directory.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                raise CgroupError(f"cannot remove cgroup {directory}: {exc}") from exc
            time.sleep(0.002)
