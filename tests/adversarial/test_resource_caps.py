"""One sandbox cannot exhaust the host: a fork bomb stops at the pids cap, a disk filler at its
quota, and neither leaves anything behind.

Proven from the host's side: the cgroup's pids.max and pids.events, the free space of the state
dir's filesystem, /sys/block/loop*/loop/backing_file, /proc/self/mountinfo. The server here is
its own (not the package's shared one): its state dir sits on a small tmpfs of its own, so the
free space measured is the state dir's alone, and the sandboxes' disk images on another
(`sandbox_disk_dir`), as docs/operations.md tells an operator to do.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sandgate.lifecycle.cgroups import SandboxCgroup
from sandgate.lifecycle.kernel import mount, mount_points, umount
from sandgate.lifecycle.runtime.gvisor import processes as gvisor_processes
from sandgate.lifecycle.runtime.sandbox_disk import loop_devices
from tests.adversarial.conftest import SANDBOX_PYTHON, TEST_RUNTIME
from tests.support.server import SandgateServer, sandgate_server

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(
        TEST_RUNTIME in ("docker", "kubernetes"),
        reason="the local runtime's cgroup, loop-device quota and state dir; Docker's pids and disk "
        "caps are tests/docker/test_runtime.py's, a Pod's are the node's podPidsLimit and its "
        "ephemeral-storage limit (docs/kubernetes.md)",
    ),
]

DISK = "96Mi"
FILL = r"""
import os, sys
written, error = 0, None
for path in sys.argv[1:]:
    try:
        with open(path, "wb") as out:
            while True:
                out.write(b"x" * (1 << 20)); out.flush(); os.fsync(out.fileno())
                written += 1 << 20
    except OSError as exc:
        error = exc.errno
print(written, error)
"""
# A bounded fork bomb: up to 3000 children that become `sleep` at once, then how many started.
BOMB = r"""
import os
started = 0
for _ in range(3000):
    try:
        if os.fork() == 0:
            os.execv("/bin/sleep", ["sleep", "30"])
    except OSError:
        break
    started += 1
print(started)
"""
FORK_BOMB = f"{SANDBOX_PYTHON} -I -c {shlex.quote(BOMB)}"


@pytest.fixture(scope="module")
def capped(
    tmp_path_factory: pytest.TempPathFactory, server_settings: dict[str, str]
) -> Iterator[SandgateServer]:
    root = tmp_path_factory.mktemp("caps")
    state_fs, disk_fs = root / "statefs", root / "diskfs"
    for path, size in ((state_fs, "96m"), (disk_fs, "384m")):
        path.mkdir()
        mount("tmpfs", path, "tmpfs", 0, f"size={size}")
    try:
        with sandgate_server(
            state_fs, {"SANDGATE_SANDBOX_DISK_DIR": str(disk_fs), **server_settings}
        ) as server:
            yield server
    finally:
        for path in (state_fs, disk_fs):
            umount(path, lazy=True)


def instance(server: SandgateServer) -> str:
    return (server.state_dir / "instance-tag").read_text().strip()


def pids_cgroup(server: SandgateServer, sandbox_id: str) -> Path:
    cgroup = SandboxCgroup(f"sandgate-{instance(server)}-{sandbox_id}")
    return cgroup.dirs.get("pids", cgroup.dirs.get(""))  # type: ignore[return-value]


def free_bytes(path: Path) -> int:
    status = os.statvfs(path)
    return status.f_bavail * status.f_frsize


def leftovers(server: SandgateServer) -> dict[str, object]:
    """What the kernel and the disk directory still hold of this server's sandboxes."""
    disk_dir = Path(server.server_env()["SANDGATE_SANDBOX_DISK_DIR"])
    tag = instance(server)
    return {
        "loop devices": loop_devices(str(disk_dir)),
        "mounts": sorted(m for m in mount_points() if m.startswith(f"{server.state_dir}/sandboxes")),
        "images": sorted(path.name for path in disk_dir.glob("*.img")),
        "cgroups": sorted(SandboxCgroup.names(f"sandgate-{tag}-")),
        "runsc processes": gvisor_processes([server.state_dir]),
    }


NOTHING = {"loop devices": {}, "mounts": [], "images": [], "cgroups": [], "runsc processes": []}


def test_a_fork_bomb_stops_at_the_default_pids_cap(capped: SandgateServer) -> None:
    sandbox_id = capped.create_sandbox()["id"]  # no resourceLimits.pids: the default
    assert_a_fork_bomb_stops_at(capped, sandbox_id, cap=1024, floor=950)


def test_resource_limits_pids_sets_a_sandbox_s_own_cap(capped: SandgateServer) -> None:
    sandbox_id = capped.create_sandbox(resourceLimits={"pids": "64"})["id"]
    assert_a_fork_bomb_stops_at(capped, sandbox_id, cap=64, floor=40)


def assert_a_fork_bomb_stops_at(capped: SandgateServer, sandbox_id: str, cap: int, floor: int) -> None:
    """From the host: the sandbox's cgroup has pids.max `cap`, the kernel refused forks at it
    (pids.events) and pids.current never passed it; then the sandbox is deleted.

    On `standard` the bomb itself says how many children it started: more than `floor` (execd,
    bwrap, the launcher and the shell hold a few of the cap). On `gvisor` the cgroup counts
    runsc's host threads and stub processes, not the sandbox's processes: when gVisor's kernel
    cannot get one more, the whole sandbox goes (the command's stream is cut), and the host's
    PID space still stops at the cap (docs/runtime.md, "Limits")."""
    pids = pids_cgroup(capped, sandbox_id)
    try:
        assert (pids / "pids.max").read_text().strip() == str(cap)
        if capped.extra_env["SANDGATE_ISOLATION"] == "gvisor":
            with contextlib.suppress(httpx.RemoteProtocolError):
                capped.run(sandbox_id, FORK_BOMB, timeout=120)
        else:
            started = capped.run(sandbox_id, FORK_BOMB, timeout=120)
            assert floor < int(started.stdout.split()[-1]) < cap, started
        assert int((pids / "pids.current").read_text()) <= cap
        assert int((pids / "pids.events").read_text().split()[1]) > 0  # "max N": forks refused at the cap
    finally:
        with capped.client() as client:
            client.delete(f"/v1/sandboxes/{sandbox_id}")
    assert leftovers(capped) == NOTHING


def test_a_disk_filler_gets_enospc_at_its_quota_and_the_state_dir_keeps_its_space(
    capped: SandgateServer,
) -> None:
    sandbox_id = capped.create_sandbox(resourceLimits={"disk": DISK})["id"]
    before = free_bytes(capped.state_dir)
    # the writable layer (/root, /tmp) and /workspace share the one quota
    fill = f"{SANDBOX_PYTHON} -I -c {shlex.quote(FILL)} /root/fill /workspace/fill /tmp/fill"
    result = capped.run(sandbox_id, fill, timeout=120)
    written, error = result.stdout.split()
    assert int(error) == errno.ENOSPC, result
    assert 80 << 20 < int(written) <= 96 << 20  # ext4's metadata takes a few MiB of the quota
    # without the cap these bytes land in <state_dir>/sandboxes/<id>/upper, on this filesystem
    assert abs(free_bytes(capped.state_dir) - before) < 2 << 20
    assert capped.run(sandbox_id, "rm /workspace/fill && echo freed > /workspace/after").exit_code == 0
    with capped.client() as client:
        client.delete(f"/v1/sandboxes/{sandbox_id}")
    assert leftovers(capped) == NOTHING


def test_delete_and_a_failed_create_leave_no_loop_device_mount_image_or_cgroup(
    capped: SandgateServer,
) -> None:
    sandbox_id = capped.create_sandbox()["id"]
    disk = capped.state_dir / "sandboxes" / sandbox_id / "disk"
    assert str(disk) in mount_points() and len(leftovers(capped)["loop devices"]) == 1  # type: ignore[arg-type]
    with capped.client() as client:
        client.delete(f"/v1/sandboxes/{sandbox_id}")
        assert leftovers(capped) == NOTHING
        failed = client.post(
            "/v1/sandboxes",
            json={
                "image": {"uri": "sandgate/host"},
                "entrypoint": ["/no/such/entrypoint"],
                "resourceLimits": {},
            },
        )
    assert failed.status_code >= 400
    assert leftovers(capped) == NOTHING


def test_restart_re_adopts_the_mounted_disk_and_down_after_kill_9_removes_it(capped: SandgateServer) -> None:
    sandbox_id = capped.create_sandbox(resourceLimits={"disk": "32Mi"})["id"]
    assert capped.run(sandbox_id, "echo kept > /workspace/kept").exit_code == 0
    capped.restart()
    assert capped.run(sandbox_id, "cat /workspace/kept").stdout.strip() == "kept"
    quota = capped.run(sandbox_id, "head -c 64M /dev/zero > /workspace/big; echo $?")
    assert quota.stdout.strip() != "0" and "No space left" in quota.stderr  # still its own filesystem
    assert len(leftovers(capped)["loop devices"]) == 1  # type: ignore[arg-type]
    assert capped.process is not None
    capped.process.send_signal(signal.SIGKILL)
    capped.process.wait()
    capped.process = None
    report = capped.down("--sandboxes")
    assert report.returncode == 0, report.stderr
    assert "detached loop device" in report.stdout
    assert leftovers(capped) == NOTHING
    capped.start()
