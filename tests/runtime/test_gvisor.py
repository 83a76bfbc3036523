"""The local runtime's `gvisor` isolation on real runsc: gVisor's kernel serves the sandbox, and
nothing is weaker than under bubblewrap (egress fails closed, no route between sandboxes, execd
out of reach, limits), and nothing of runsc outlives a sandbox, a failed start or a kill."""

from __future__ import annotations

import json
import platform
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandgate.lifecycle.cgroups import SandboxCgroup
from sandgate.lifecycle.confinement import SandboxNet
from sandgate.lifecycle.kernel import mount_points
from sandgate.lifecycle.runtime import RuntimeError_
from sandgate.lifecycle.runtime.base import SandboxSpec, ping_execd
from sandgate.lifecycle.runtime.gvisor import find_runsc, processes
from sandgate.lifecycle.runtime.local import LocalRuntime
from tests.runtime.harness import (
    Harness,
    Listeners,
    assert_egress_fails_closed_when_the_proxy_is_down,
    assert_two_sandboxes_cannot_reach_each_other,
)

pytestmark = pytest.mark.root

KERNEL_PROBE = r"""
import ctypes, json, os, platform, subprocess
libc = ctypes.CDLL(None, use_errno=True)
buffer = ctypes.create_string_buffer(1 << 16)
size = libc.klogctl(3, buffer, len(buffer))
execd = open("/proc/1/cmdline", "rb").read().split(b"\0")
def read(path):
    try:
        return open(path, "rb").read().decode(errors="replace")
    except OSError as exc:
        return exc.strerror
result = {
    "release": platform.release(),
    "version": open("/proc/version").read(),
    "klog": buffer.raw[:max(size, 0)].decode(errors="replace"),
    "dmesg": subprocess.run(["dmesg"], capture_output=True, text=True).stdout,
    "execd_is_pid1": b"sandgate.execd.__main__" in b"".join(execd),
    "execd_environ": read("/proc/1/environ"),
    "execd_mem": read("/proc/1/mem"),
    "execd_attach": os.strerror(ctypes.get_errno()) if libc.ptrace(16, 1, 0, 0) else "attached",
    "cap_eff": [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff")][0],
    "listing": sorted(os.listdir("/")),
    "ls": subprocess.run(["ls", "/etc"], capture_output=True, text=True).returncode,
}
json.dump(result, open("/workspace/.k", "w")); os.rename("/workspace/.k", "/workspace/kernel.json")
"""


# Allocates 16 MiB at a time up to 640 MiB, writing how many chunks it holds.
MEMORY_HOG = """
import time
held = []
for i in range(40):
    held.append(bytearray(16 << 20))
    open("/workspace/allocated", "w").write(str(i + 1))
    time.sleep(0.02)
time.sleep(3600)
"""


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    assert find_runsc(), "runsc is not installed (scripts/bootstrap.sh test installs it)"
    with Harness(tmp_path_factory.mktemp("state"), isolation="gvisor") as harness:
        yield harness


def test_gvisors_kernel_answers_the_syscalls_bubblewrap_passes_to_the_host(harness: Harness) -> None:
    token = "execd-token-" + secrets.token_hex(8)
    sandbox_id, _ = harness.start(["/proc/self/exe", "-I", "-c", KERNEL_PROBE], execd_token=token)
    seen = json.loads(harness.wait_file(sandbox_id, "kernel.json"))
    assert seen["release"] != platform.release()  # uname(2): gVisor's, not the host's 6.x
    assert seen["release"] in seen["version"] and seen["version"] != Path("/proc/version").read_text()
    assert "Starting gVisor" in seen["klog"] and "Starting gVisor" in seen["dmesg"]  # syslog(2)
    assert seen["execd_is_pid1"]
    # The agent (uid 0 without CAP_SYS_PTRACE) can neither read nor trace the non-dumpable execd;
    # gVisor shows its environ (Linux would not), which holds the sandbox's env and never the token.
    assert seen["execd_mem"] == "Permission denied" and seen["execd_attach"] == "Operation not permitted"
    assert token not in json.dumps(seen) and "SANDGATE_SANDBOX_ID" in seen["execd_environ"]
    assert int(seen["cap_eff"], 16) & (1 << 21) == 0  # no CAP_SYS_ADMIN
    assert {"etc", "usr", "workspace"} <= set(seen["listing"]) and seen["ls"] == 0


def test_egress_fails_closed_when_the_proxy_is_down(harness: Harness) -> None:
    assert_egress_fails_closed_when_the_proxy_is_down(harness)


def test_two_sandboxes_cannot_reach_each_other(harness: Harness) -> None:
    with Listeners(harness.ports):
        assert_two_sandboxes_cannot_reach_each_other(harness)


def test_the_memory_limit_holds(harness: Harness) -> None:
    """The limit is on the cgroup every runsc process is in: gVisor's memory is charged to it.
    A workload that outgrows it is OOM-killed by the host (on systrap its stub process, so execd
    lives on; on ptrace gVisor's kernel, so the whole sandbox goes)."""
    limit = 256 << 20
    sandbox_id, _ = harness.start(["/proc/self/exe", "-I", "-c", MEMORY_HOG], memory_bytes=limit)
    cgroup = SandboxCgroup(harness.runtime._cgroup_name(sandbox_id))
    allocated = harness.workspace(sandbox_id) / "allocated"

    def hog_gone() -> bool:
        started = allocated.exists() and int(allocated.read_text() or 0) >= 4
        return started and (not harness.runtime.alive(sandbox_id) or _memory_used(cgroup) < limit // 2)

    for _ in range(300):  # at most 30 s
        if hog_gone():
            break
        time.sleep(0.1)
    assert hog_gone(), harness.runtime.log_tail(sandbox_id)
    assert int(allocated.read_text()) < 16  # it never held 256 MiB of its own
    harness.stop(sandbox_id)


def test_delete_leaves_no_runsc_process_mount_or_cgroup(harness: Harness) -> None:
    sandbox_id, net = harness.start(["sleep", "3600"])
    box = harness.state_dir / "sandboxes" / sandbox_id
    runsc = processes([box])
    assert len(runsc) >= 3, runsc  # runsc, its sandbox and its gofer
    cgroup_pids = set(SandboxCgroup(harness.runtime._cgroup_name(sandbox_id)).pids())
    assert set(runsc) <= cgroup_pids  # every one of them in the sandbox's cgroup
    harness.stop(sandbox_id)
    harness.stop(sandbox_id)  # idempotent
    assert_nothing_left(harness, sandbox_id)
    assert not net.netns_path.exists()


def test_a_failed_start_leaves_nothing(harness: Harness) -> None:
    """runsc on a platform this host cannot run (kvm: no usable VMX) fails at boot."""
    broken = LocalRuntime(
        harness.state_dir, harness.images, instance=harness.runtime.instance, gvisor_platform="kvm"
    )
    sandbox_id = "failedstart"
    net = harness.networks.create(sandbox_id)
    try:
        with pytest.raises(RuntimeError_):
            spec = SandboxSpec(sandbox_id, "sandgate/host", ["sleep", "3600"], isolation="gvisor")
            broken.create(spec, net)
            broken.wait_ready(sandbox_id, net, timeout=20)
        broken.delete(sandbox_id)
        assert_nothing_left(harness, sandbox_id)
    finally:
        harness.networks.destroy(sandbox_id)


def test_adopt_after_the_server_is_gone_keeps_live_gvisor_sandboxes(harness: Harness) -> None:
    sandbox_id, net = harness.start(["sleep", "3600"])
    restarted = LocalRuntime(harness.state_dir, harness.images, instance=harness.runtime.instance)
    assert sandbox_id in restarted.adopt()
    assert ping_execd(net.address)
    restarted.delete(sandbox_id)
    assert_nothing_left(harness, sandbox_id)
    harness.stop(sandbox_id)


def test_a_host_without_runsc_refuses_gvisor(harness: Harness) -> None:
    without = LocalRuntime(
        harness.state_dir, harness.images, instance=harness.runtime.instance, runsc="/nonexistent/runsc"
    )
    assert without.isolations == ("standard",)
    unused = SandboxNet("unused", "192.0.2.2", "192.0.2.1")
    with pytest.raises(RuntimeError_, match="apt-get install runsc"):
        without.create(SandboxSpec("norunsc", "sandgate/host", ["true"], isolation="gvisor"), unused)
    assert not (harness.state_dir / "sandboxes" / "norunsc").exists()


def _memory_used(cgroup: SandboxCgroup) -> int:
    name = "memory.current" if cgroup.v2 else "memory.usage_in_bytes"
    directory = cgroup.dirs[""] if cgroup.v2 else cgroup.dirs["memory"]
    return int((directory / name).read_text())


def assert_nothing_left(harness: Harness, sandbox_id: str) -> None:
    box = harness.state_dir / "sandboxes" / sandbox_id
    assert processes([box]) == []
    assert not SandboxCgroup(harness.runtime._cgroup_name(sandbox_id)).exists()
    assert not [m for m in mount_points() if m.startswith(str(box))]
    assert not box.exists()
