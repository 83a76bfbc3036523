"""The one-node cluster of scripts/cluster for tests: started per module in the test's network
namespace with a state directory of its own, torn down (down.sh) also when a test fails.

The cluster builds once per version (scripts/cluster/build.sh; a cold build takes long, see
docs/kubernetes.md): a module that uses it calls `skip_unless_built()` at import, so it runs when
the build is cached or SANDGATE_TEST_KUBERNETES=1 asks for the build.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Pod

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts" / "cluster"
BUSYBOX_IMAGE = "sandgate.example.test/busybox:1"  # imported by up.sh; Pods say imagePullPolicy Never
KUBELET_SYSCTLS = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops")
# A cold build of every program runs for a long time on two cores (docs/kubernetes.md); the
# module's first test sets the cluster up, so each test may take that long.
BUILD_TIMEOUT = 2 * 3600
START_TIMEOUT = 600
up_to_a_build = pytest.mark.timeout(BUILD_TIMEOUT + START_TIMEOUT + 300)


def cached_build() -> bool:
    return (
        subprocess.run(["bash", str(SCRIPTS / "build.sh"), "--cached"], capture_output=True).returncode == 0
    )


def skip_unless_built() -> None:
    if not (os.environ.get("SANDGATE_TEST_KUBERNETES") == "1" or cached_build()):
        pytest.skip(
            "the cluster's programs are not built: `make cluster-build`, or SANDGATE_TEST_KUBERNETES=1",
            allow_module_level=True,
        )


def sysctls() -> dict[str, str]:
    return {key: Path(f"/proc/sys/{key}").read_text().strip() for key in KUBELET_SYSCTLS}


def run_script(
    name: str, state_dir: Path, timeout: float, **env_overrides: str
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SANDGATE_CLUSTER_DIR": str(state_dir), **env_overrides}
    return subprocess.run(
        ["bash", str(SCRIPTS / name)], env=env, capture_output=True, text=True, timeout=timeout
    )


@dataclass
class Cluster:
    state_dir: Path
    kubeconfig: Path
    cluster_id: str
    sysctls_before: dict[str, str]
    removed: bool = False

    @property
    def netns(self) -> str:
        return f"sgk8s-{self.cluster_id}"

    @property
    def cgroup(self) -> str:
        return f"sandgate-k8s-{self.cluster_id}"

    def pid(self, daemon: str) -> int:
        return int((self.state_dir / "pids" / daemon).read_text())

    def down(self) -> subprocess.CompletedProcess[str]:
        self.removed = True
        return run_script("down.sh", self.state_dir, timeout=300)


@contextlib.contextmanager
def running_cluster(state_dir: Path, **env: str) -> Iterator[Cluster]:
    """up.sh with `env` (e.g. SANDGATE_CLUSTER_MIRROR); down.sh afterwards, whatever happened."""
    sysctls_before = sysctls()
    started = run_script("up.sh", state_dir, timeout=BUILD_TIMEOUT + START_TIMEOUT, **env)
    assert started.returncode == 0, f"up.sh failed:\n{started.stderr[-6000:]}"
    kubeconfig = Path(started.stdout.strip().splitlines()[-1])
    handle = Cluster(state_dir, kubeconfig, (state_dir / "id").read_text().strip(), sysctls_before)
    try:
        yield handle
    finally:
        if not handle.removed:
            handle.down()


def wait_for_pod(client: Client, name: str, phases: tuple[str, ...], timeout: float) -> Pod:
    """The Pod once in one of `phases` (or as it is when the time is up: the caller's assertion
    then shows its status)."""
    deadline = time.monotonic() + timeout
    while True:
        pod = client.get(Pod, name, namespace="default")
        assert pod.status is not None
        if pod.status.phase in phases or time.monotonic() > deadline:
            return pod
        time.sleep(0.5)
