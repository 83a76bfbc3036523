"""Fixtures for the Docker runtime tests (the session's private dockerd and the sandbox images
built into it, `dockerd` and `sandbox_images`, live in tests/conftest.py, shared with the
other suites that run a Docker runtime): a `sandboxes` harness parametrized over the
runtimes, so the same scenario runs on `local` (bubblewrap) and `docker`.

The docker harness reuses the local-runtime engineer's `tests.runtime.harness.Harness` (networks,
probe, phases) with a DockerRuntime in place of the LocalRuntime.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import docker
import pytest

from sandgate.lifecycle.confinement import ProxyPorts, SandboxNet
from sandgate.lifecycle.runtime.docker import DockerRuntime
from tests.runtime.harness import PROBE, Harness, Listeners
from tests.support.dockerd import GVISOR_RUNTIME

REPO = Path(__file__).resolve().parents[2]
RUNTIMES = ["local", "docker"]


def load_image_builder() -> ModuleType:
    """sandbox-images/build.py is a script in a folder that is not a package: load it by path."""
    name = "sandgate_image_build"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "sandbox-images" / "build.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


class DockerHarness(Harness):
    """The same harness with sandboxes as containers of the private dockerd."""

    def __init__(
        self,
        state_dir: Path,
        client: docker.DockerClient,
        ports: ProxyPorts | None = None,
        isolation: str = "standard",
    ) -> None:
        super().__init__(state_dir, ports, isolation)
        self.runtime = DockerRuntime(  # type: ignore[assignment]
            client, instance=self.networks.instance, gvisor_runtime=GVISOR_RUNTIME
        )

    def workspace(self, sandbox_id: str) -> Path:
        """The /workspace volume on the host (a gVisor container's files are not under its
        init's /proc/<pid>/root: that is runsc's sandbox process)."""
        if self.isolation != "gvisor":
            return super().workspace(sandbox_id)
        container = self.runtime._container(sandbox_id)  # type: ignore[attr-defined]
        [mount] = [m for m in container.attrs["Mounts"] if m["Destination"] == "/workspace"]
        return Path(mount["Source"])

    def probe(self, phases: list[list[tuple[str, str, int]]], **spec: object) -> tuple[str, SandboxNet]:
        # The image's entry script is a shell, so `/proc/self/exe` would name busybox: say python3.
        return self.start(["python3", "-I", "-c", PROBE, json.dumps(phases)], **spec)  # type: ignore[arg-type]


def make_harness(runtime: str, state_dir: Path, request: pytest.FixtureRequest) -> Harness:
    if runtime == "docker":
        request.getfixturevalue("sandbox_images")
        return DockerHarness(state_dir, request.getfixturevalue("dockerd").client)
    return Harness(state_dir)


@pytest.fixture(scope="module", params=RUNTIMES)
def sandboxes(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    with make_harness(request.param, tmp_path_factory.mktemp(f"state-{request.param}"), request) as harness:
        yield harness


@pytest.fixture(scope="module")
def listeners(sandboxes: Harness) -> Iterator[Listeners]:
    with Listeners(sandboxes.ports) as listeners:
        yield listeners
