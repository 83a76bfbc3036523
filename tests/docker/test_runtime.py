"""What only the Docker runtime has to prove: hardened containers, limits, pause/resume by the
engine, re-adoption by label after a restart, idempotent delete, and the image build cache."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from sandgate.lifecycle.runtime.base import RuntimeError_, ping_execd
from sandgate.lifecycle.runtime.docker import DockerRuntime
from sandgate.lifecycle.runtime.sandbox_disk import SandboxDisks, loop_devices
from tests.docker.conftest import DockerHarness, load_image_builder
from tests.support.dockerd import PrivateDockerd

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def boxes(
    dockerd: PrivateDockerd, sandbox_images: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DockerHarness]:
    harness = DockerHarness(tmp_path_factory.mktemp("docker-state"), dockerd.client)
    try:
        yield harness
    finally:
        harness.close()


def container(boxes: DockerHarness, sandbox_id: str) -> docker.models.containers.Container:
    found = boxes.runtime._container(sandbox_id)  # type: ignore[attr-defined]
    assert found is not None
    return found


def run_inside(boxes: DockerHarness, sandbox_id: str, script: str) -> tuple[int, str]:
    result = container(boxes, sandbox_id).exec_run(["sh", "-c", script])
    return result.exit_code, result.output.decode(errors="replace")


def test_containers_are_hardened(boxes: DockerHarness) -> None:
    sandbox_id, _ = boxes.start(["sleep", "3600"])
    host_config = container(boxes, sandbox_id).attrs["HostConfig"]
    assert host_config["NetworkMode"] == "none"
    assert host_config["CapDrop"] == ["ALL"] and not host_config["CapAdd"]
    assert host_config["ReadonlyRootfs"] is True
    code, status = run_inside(
        boxes, sandbox_id, "grep -E '^(CapEff|CapBnd|NoNewPrivs)' /proc/1/status /proc/self/status"
    )
    assert code == 0
    for line in status.splitlines():
        assert line.split()[-1] in ("0000000000000000", "1"), line
    assert "NoNewPrivs:\t1" in status
    code, _ = run_inside(boxes, sandbox_id, "touch /etc/x")
    assert code != 0  # read-only root
    code, out = run_inside(boxes, sandbox_id, "echo kept > /workspace/f && cat /workspace/f && touch /tmp/t")
    assert (code, out.strip()) == (0, "kept")


def test_the_netns_name_is_the_containers_namespace(boxes: DockerHarness) -> None:
    sandbox_id, net = boxes.start(["sleep", "3600"])
    init_pid = boxes.runtime.root_path(sandbox_id).parent.name
    assert os.stat(net.netns_path).st_ino == os.stat(f"/proc/{init_pid}/ns/net").st_ino


def test_pids_and_memory_limits_from_the_spec_hold(boxes: DockerHarness) -> None:
    # 128 MiB, not less: runc's init for `docker exec` is charged to the container's cgroup too,
    # and at 64 MiB beside execd it was itself OOM-killed on a loaded machine ("read init-p").
    sandbox_id, _ = boxes.start(["sleep", "3600"], pids_max=24, memory_bytes=128 * 1024 * 1024, cpu_quota=0.5)
    host_config = container(boxes, sandbox_id).attrs["HostConfig"]
    assert host_config["PidsLimit"] == 24
    assert host_config["Memory"] == 128 * 1024 * 1024
    assert host_config["NanoCpus"] == 500_000_000
    code, out = run_inside(boxes, sandbox_id, "for i in $(seq 40); do sleep 5 & done 2>&1; wait")
    assert "can't fork" in out or "Resource temporarily unavailable" in out, (code, out)
    hog = container(boxes, sandbox_id).exec_run(
        ["python3", "-c", "b = bytearray(512 * 1024 * 1024); print('survived')"]
    )
    assert hog.exit_code == 137 and b"survived" not in hog.output  # OOM-killed


def test_pause_stops_execd_and_resume_brings_it_back(boxes: DockerHarness) -> None:
    sandbox_id, net = boxes.start(["sleep", "3600"])
    boxes.runtime.pause(sandbox_id)
    boxes.runtime.pause(sandbox_id)  # idempotent
    assert boxes.runtime.paused(sandbox_id) and boxes.runtime.alive(sandbox_id)
    assert not ping_execd(net.address)
    boxes.runtime.resume(sandbox_id)
    assert not boxes.runtime.paused(sandbox_id)
    boxes.runtime.wait_ready(sandbox_id, net, timeout=10)


def test_a_restarted_server_adopts_its_live_containers_and_removes_dead_ones(
    boxes: DockerHarness, dockerd: PrivateDockerd
) -> None:
    live_id, _ = boxes.start(["sleep", "3600"])
    paused_id, _ = boxes.start(["sleep", "3600"])
    boxes.runtime.pause(paused_id)
    dead_id, _ = boxes.start(["sleep", "3600"])
    container(boxes, dead_id).kill()
    other = DockerRuntime(dockerd.client, instance="someoneelse")
    restarted = DockerRuntime(dockerd.client, instance=boxes.networks.instance)
    adopted = restarted.adopt()
    assert {live_id, paused_id} <= set(adopted) and dead_id not in adopted
    assert not restarted.alive(dead_id) and restarted._container(dead_id) is None  # removed
    assert other.adopt() == []  # another instance sees none of ours ...
    assert restarted.alive(live_id)  # ... and removes none of them
    boxes.runtime.resume(paused_id)


def test_delete_is_idempotent_and_removes_the_container(
    boxes: DockerHarness, dockerd: PrivateDockerd
) -> None:
    sandbox_id, net = boxes.start(["sleep", "3600"])
    volumes_before = {v.name for v in dockerd.client.volumes.list()}
    workspace_volume = next(
        m["Name"] for m in container(boxes, sandbox_id).attrs["Mounts"] if m["Destination"] == "/workspace"
    )
    assert workspace_volume in volumes_before
    boxes.runtime.delete(sandbox_id)
    boxes.runtime.delete(sandbox_id)
    assert not boxes.runtime.alive(sandbox_id)
    assert (
        dockerd.client.containers.list(all=True, filters={"label": f"io.sandgate.sandbox={sandbox_id}"}) == []
    )
    assert workspace_volume not in {v.name for v in dockerd.client.volumes.list()}
    assert not ping_execd(net.address)
    with pytest.raises(RuntimeError_, match="has no container"):
        boxes.runtime.pause(sandbox_id)


def test_an_unknown_image_is_refused_with_what_the_engine_has(boxes: DockerHarness) -> None:
    with pytest.raises(RuntimeError_, match=r"not in the Docker engine; it has: .*sandgate/base:latest"):
        boxes.start(["sleep", "1"], image="nosuch/image:1")


# Busy loops that end by themselves: a loaded host widens the gap between the veth move and the
# netns name (the container exits as soon as its address appears when the entrypoint is bad).
CPU_HOG = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass"


@contextlib.contextmanager
def busy_cpus(count: int, seconds: float) -> Iterator[None]:
    hogs = [subprocess.Popen([sys.executable, "-c", CPU_HOG.format(seconds=seconds)]) for _ in range(count)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def test_a_container_that_dies_at_start_is_reported_with_its_output(boxes: DockerHarness) -> None:
    """Every time, also on a busy host: the entrypoint's error, never a half-made netns."""
    with busy_cpus(count=3, seconds=60):
        for _ in range(8):
            with pytest.raises(RuntimeError_, match="no-such-command"):
                boxes.start(["no-such-command"])


def test_the_python_image_has_pip_and_a_writable_user_site(boxes: DockerHarness) -> None:
    sandbox_id, _ = boxes.start(["sleep", "3600"], image="sandgate/python")
    code, out = run_inside(
        boxes, sandbox_id, "python3 -m pip --version && python3 -c 'import site; print(site.getuserbase())'"
    )
    assert code == 0 and "pip" in out and "/workspace/.local" in out


def test_the_image_build_is_cached_by_input_digest(
    dockerd: PrivateDockerd, sandbox_images: str, tmp_path: Path
) -> None:
    builder = load_image_builder()
    started = time.monotonic()
    assert builder.build_images(dockerd.client) == sandbox_images  # already there: nothing to do
    assert time.monotonic() - started < 30
    for name in ("sandgate/base", "sandgate/python"):
        tags = dockerd.client.images.get(f"{name}:{sandbox_images}").tags
        assert f"{name}:latest" in tags
    saved = builder.DEFAULT_CACHE / f"sandgate-images-{sandbox_images}.tar"
    with tarfile.open(saved) as archive:
        manifest = json.loads(archive.extractfile("manifest.json").read())  # type: ignore[union-attr]
    assert {tag for image in manifest for tag in image["RepoTags"]} >= {
        f"sandgate/base:{sandbox_images}",
        f"sandgate/python:{sandbox_images}",
    }


def test_workspace_is_the_sandboxs_own_filesystem_capped_at_its_quota(
    boxes: DockerHarness, tmp_path_factory: pytest.TempPathFactory
) -> None:
    disk_dir = tmp_path_factory.mktemp("disks")
    disks = SandboxDisks(disk_dir, boxes.networks.instance, disk_dir, default_bytes=32 << 20, reserve_bytes=0)
    runtime: DockerRuntime = boxes.runtime  # type: ignore[assignment]
    runtime.disks = disks
    sandbox_id, _ = boxes.start(["sleep", "3600"])
    try:
        dd = "dd if=/dev/zero of=/workspace/big bs=1048576 count=64 2>&1; echo rc=$?"
        _code, out = run_inside(boxes, sandbox_id, dd)
        assert "No space left on device" in out and "rc=0" not in out, out
        size = int(run_inside(boxes, sandbox_id, "wc -c < /workspace/big")[1])
        assert 24 << 20 < size <= 32 << 20
        assert container(boxes, sandbox_id).attrs["HostConfig"]["PidsLimit"] == 1024  # the default
    finally:
        boxes.stop(sandbox_id)
        runtime.disks = None
    assert loop_devices(str(disk_dir)) == {} and list(disk_dir.iterdir()) == []
