"""The `gvisor` isolation of the local runtime: the sandbox's processes run on gVisor's
user-space kernel (runsc) instead of sharing the host's kernel under bubblewrap.

Everything but the last hop is the standard launch (runtime/launch.py): the same overlay root,
cgroup, limits, environment, CA files, binds and the same launcher that becomes execd. Only
`bwrap ...` is replaced by `runsc ... run --bundle <box>/bundle <id>`.

Rules:
1. runsc starts inside the sandbox's netns (sh joins the cgroup -> nsenter --net -> runsc) with
   `--network=host`: gVisor reads the interfaces once, at boot, so the veth must already be there,
   and its sockets are then host sockets in that netns, behind the same nft rules at the host
   end of the veth. gVisor's own netstack is never used (packaged releases before 2024-08 fail
   with "cannot run with network enabled in root network namespace" on this kernel).
2. Every process runsc makes (runsc itself, the sandbox's "boot" process, the gofer, ptrace
   stubs) descends from the launch shell, so it is in the sandbox's cgroup from its first
   instruction: killing the cgroup ends them all, also after a failed start or a killed server.
   runsc manages no cgroup of its own (`--ignore-cgroups`, no cgroupsPath) and keeps its state
   (`--root`) and the bundle in the sandbox's directory, which delete removes.
3. The container's process is the standard launcher (uid 0, `SANDBOX_CAPS` only, no new
   privileges, the sandbox's env and nothing else, execd's token over stdin, non-dumpable).
   Writes go through to the overlay (`--overlay2=none`) and gVisor revalidates what it cached
   (`--file-access=shared`: the host may write into the root too, as a warm-pool claim does; no
   measurable cost at start-up here), so the host's and the sandbox's view of the root agree.
   syslog(2) is gVisor's own (its boot lines), so the host kernel log filter of the standard
   isolation is not needed.
4. /tmp is the root's own /tmp, bound explicitly: without a /tmp mount in the spec, runsc puts
   an internal tmpfs there, outside the sandbox's disk quota (a filler wrote 12 GiB of host
   memory into it), where `standard` keeps /tmp on the overlay, under the quota.
5. With `exec_audit = "processes"` runsc is started with a pod-init config (`<box>/trace.json`)
   that sends its Sentry's execve and clone events to the server's runtime monitoring sink
   (lifecycle/gvisor_events.py): the host kernel sees none of the sandbox's programs.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from sandgate.lifecycle.confinement import SandboxNet
from sandgate.lifecycle.gvisor_events import trace_config
from sandgate.lifecycle.runtime.base import RuntimeError_, SandboxSpec
from sandgate.lifecycle.runtime.launch import LAUNCH_ENV, SANDBOX_CAPS, Launch, launcher_argv
from sandgate.lifecycle.runtime.sandbox_root import SANDBOX_HOSTNAME

Platform = Literal["ptrace", "systrap", "kvm"]
RUNSC_STATE = "runsc"  # runsc's --root, inside the sandbox's directory
TRACE_CONFIG = "trace.json"  # runsc's --pod-init-config: runtime monitoring (rule 5)
BUNDLE = "bundle"  # the OCI bundle (config.json only: its root is the overlay at <box>/root)
# The kernel's own file systems inside: gVisor's proc, a /dev with its devices and a pts.
KERNEL_MOUNTS: list[dict[str, Any]] = [
    {"destination": "/proc", "type": "proc", "source": "proc"},
    {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "mode=755"]},
    {
        "destination": "/dev/pts",
        "type": "devpts",
        "source": "devpts",
        "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"],
    },
    {"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "mode=1777"]},
]


def find_runsc(name: str = "runsc") -> str | None:
    """runsc's path (`name` on the launch chain's own PATH, or a path), or None."""
    return shutil.which(name, path=LAUNCH_ENV["PATH"])


class Gvisor:
    """Builds the OCI bundle and the runsc argv of one sandbox."""

    def __init__(self, runsc: str, platform: Platform = "systrap", events: Path | None = None) -> None:
        self.runsc = runsc
        self.platform = platform
        self.events = events  # gVisor's runtime monitoring sink (rule 5); None: no process records

    def isolator(self, spec: SandboxSpec, net: SandboxNet, launch: Launch, box: Path) -> list[str]:
        """Write the bundle into `box` and return the argv that runs it (after nsenter)."""
        bundle = box / BUNDLE
        bundle.mkdir(exist_ok=True)
        tmp = launch.root / "tmp"
        tmp.mkdir(exist_ok=True)  # a pulled image may have none; runsc needs the mount point
        tmp.chmod(0o1777)
        config = oci_config(spec, net, launch)
        (bundle / "config.json").write_text(json.dumps(config), encoding="utf-8")
        flags = [
            f"--root={box / RUNSC_STATE}",
            f"--platform={self.platform}",
            "--network=host",
            "--ignore-cgroups",
            "--overlay2=none",
            "--file-access=shared",
        ]
        if self.events is not None:
            trace = box / TRACE_CONFIG
            trace.write_text(json.dumps(trace_config(self.events)), encoding="utf-8")
            flags.append(f"--pod-init-config={trace}")
        return [self.runsc, *flags, "run", f"--bundle={bundle}", spec.sandbox_id]


def oci_config(spec: SandboxSpec, net: SandboxNet, launch: Launch) -> dict[str, Any]:
    """The container the launcher runs in (rule 3); no network namespace: runsc's (rule 1)."""
    caps = list(SANDBOX_CAPS)
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": launcher_argv(spec, net, launch),
            "env": [f"{key}={value}" for key, value in launch.env.items()],
            "cwd": "/workspace",
            "capabilities": {"bounding": caps, "effective": caps, "permitted": caps},
            "noNewPrivileges": True,
        },
        "root": {"path": str(launch.root), "readonly": False},
        "hostname": SANDBOX_HOSTNAME,
        "mounts": [*KERNEL_MOUNTS, own_tmp(launch), *bind_mounts(launch)],
        "linux": {"namespaces": [{"type": kind} for kind in ("pid", "ipc", "uts", "mount")]},
    }


def own_tmp(launch: Launch) -> dict[str, Any]:
    """/tmp on the root's own /tmp, under the disk quota (rule 4), not runsc's internal tmpfs."""
    return {
        "destination": "/tmp",
        "type": "bind",
        "source": str(launch.root / "tmp"),
        "options": ["rbind", "rw"],
    }


def bind_mounts(launch: Launch) -> list[dict[str, Any]]:
    """The standard launch's binds, as OCI mounts: system dirs and execd's Python read-only at the
    same path (or, in a pulled image, the host's /usr where execd's loader finds it), then the
    operator's and the sandbox's binds."""
    same_path = [(path, path, True) for path in (*launch.ro_binds, *launch.execd.binds)]
    moved = [(source, target, True) for source, target in launch.execd.moved]
    binds = same_path + moved + [(b.source, b.target, b.read_only) for b in launch.binds]
    return [
        {"destination": target, "type": "bind", "source": source, "options": ["rbind", "ro" if ro else "rw"]}
        for source, target, ro in binds
    ]


def require(isolation: str, runsc: str | None) -> None:
    """RuntimeError_ when `gvisor` is asked of a host without runsc (never a silent downgrade)."""
    if isolation == "gvisor" and runsc is None:
        raise RuntimeError_(
            "isolation 'gvisor' needs runsc, which this host does not have (setting `runsc`, "
            f"searched {LAUNCH_ENV['PATH']}); install it (`apt-get install runsc`) or ask for "
            "isolation 'standard'"
        )


def processes(roots: Sequence[Path]) -> list[int]:
    """PIDs of runsc processes (runsc, its sandbox, gofer) whose --root lies under one of
    `roots`: what `sandgate down` reports; they die with their sandbox's cgroup (rule 2)."""
    prefixes = tuple(f"--root={root}/" for root in roots)
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [word.decode(errors="replace") for word in argv]
        if words and "runsc" in os.path.basename(words[0]) and any(w.startswith(prefixes) for w in words):
            found.append(int(entry.name))
    return sorted(found)
