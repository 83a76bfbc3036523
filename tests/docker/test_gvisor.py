"""The Docker runtime's `gvisor` isolation: containers of the private dockerd under its
`sandgate-runsc` runtime (runsc booted inside the sandbox's netns by lifecycle/runtime/
runsc_wrapper.py), with the same guarantees as runc containers, and no runsc, shim or gofer
left behind by a delete or a failed start."""

from __future__ import annotations

import platform
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandgate.lifecycle.runtime.base import RuntimeError_, SandboxSpec, ping_execd
from tests.docker.conftest import DockerHarness
from tests.runtime.harness import (
    Listeners,
    assert_egress_fails_closed_when_the_proxy_is_down,
    assert_two_sandboxes_cannot_reach_each_other,
)
from tests.support.dockerd import PrivateDockerd

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def boxes(
    dockerd: PrivateDockerd, sandbox_images: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DockerHarness]:
    harness = DockerHarness(tmp_path_factory.mktemp("docker-gvisor"), dockerd.client, isolation="gvisor")
    assert harness.runtime.isolations == ("standard", "gvisor")
    try:
        yield harness
    finally:
        harness.close()


def runsc_processes(dockerd: PrivateDockerd) -> list[int]:
    """runsc, its sandboxes and gofers under this engine (their argv names its exec root)."""
    marker = str(dockerd.root).encode()
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                argv = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if b"runsc" in argv.split(b"\0")[0] and marker in argv:
                found.append(int(proc.name))
    return found


def test_gvisors_kernel_serves_the_container(boxes: DockerHarness) -> None:
    sandbox_id, net = boxes.start(["sleep", "3600"])
    container = boxes.runtime._container(sandbox_id)  # type: ignore[attr-defined]
    assert container.attrs["HostConfig"]["Runtime"] == "sandgate-runsc"
    result = container.exec_run(["sh", "-c", "uname -r; cat /proc/version; dmesg; ip -o -4 addr"])
    out = result.output.decode(errors="replace")
    release = out.splitlines()[0]
    assert result.exit_code == 0 and release != platform.release(), out
    assert "Starting gVisor" in out and f"inet {net.address}/30" in out  # booted inside the netns
    # The wrapper took the netns name out of the spec (only `docker exec` still shows Docker's env).
    environ = container.exec_run(["cat", "/proc/1/environ"]).output.decode(errors="replace")
    assert "SANDGATE_SANDBOX_ID" in environ and "SANDGATE_NETNS" not in environ
    assert ping_execd(net.address)
    boxes.stop(sandbox_id)


def test_egress_fails_closed_when_the_proxy_is_down(boxes: DockerHarness) -> None:
    assert_egress_fails_closed_when_the_proxy_is_down(boxes)


def test_two_sandboxes_cannot_reach_each_other(boxes: DockerHarness) -> None:
    with Listeners(boxes.ports):
        assert_two_sandboxes_cannot_reach_each_other(boxes)


def test_delete_leaves_no_runsc_shim_or_gofer(boxes: DockerHarness, dockerd: PrivateDockerd) -> None:
    before = set(runsc_processes(dockerd))
    sandbox_id, _ = boxes.start(["sleep", "3600"])
    assert len(set(runsc_processes(dockerd)) - before) >= 2  # its sandbox and gofer at least
    boxes.stop(sandbox_id)
    assert set(runsc_processes(dockerd)) <= before


def test_a_failed_start_leaves_nothing(boxes: DockerHarness, dockerd: PrivateDockerd) -> None:
    """A netns name the wrapper refuses: runsc never starts, the container is removed."""
    before = set(runsc_processes(dockerd))
    sandbox_id = "gvfailed"
    net = boxes.networks.create(sandbox_id)
    broken = type(net)("../escape", net.address, net.gateway)
    try:
        with pytest.raises(Exception, match="not a netns name"):
            boxes.runtime.create(
                SandboxSpec(sandbox_id, "sandgate/host", ["sleep", "1"], isolation="gvisor"), broken
            )
        assert boxes.runtime._container(sandbox_id) is None  # type: ignore[attr-defined]
        assert set(runsc_processes(dockerd)) <= before
    finally:
        boxes.networks.destroy(sandbox_id)


def test_an_engine_without_the_runtime_refuses_gvisor(boxes: DockerHarness) -> None:
    from sandgate.lifecycle.runtime.docker import DockerRuntime

    plain = DockerRuntime(boxes.runtime.client, instance="gvnone", gvisor_runtime="not-registered")  # type: ignore[attr-defined]
    assert plain.isolations == ("standard",)
    with pytest.raises(RuntimeError_, match="sandgate-runsc"):
        plain.create(
            SandboxSpec("x", "sandgate/host", [], isolation="gvisor"), boxes.networks.create("gvnone")
        )
    boxes.networks.destroy("gvnone")
