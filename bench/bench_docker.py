"""Docker sandboxes: create-to-ready (execd /ping 200) next to the local runtime, same machine, one run.

Runs as root in a network namespace of its own (the module re-executes itself after unshare),
with a private dockerd (tests/support/dockerd.py) and the sandbox images built or loaded from the
build cache first (not timed). Bounded: SEQUENTIAL sandboxes per runtime, one after another,
each with a timeout; everything is torn down in `finally`. Set SANDGATE_BENCH_DOCKER_RUNS to
change SEQUENTIAL.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.sandbox_rig import own_network, row, run_as_root_child
from sandgate.lifecycle.images import ImageStore
from sandgate.lifecycle.network import SandboxNetworks
from sandgate.lifecycle.runtime.base import SandboxSpec
from sandgate.lifecycle.runtime.docker import DockerRuntime
from sandgate.lifecycle.runtime.local import LocalRuntime

SEQUENTIAL = int(os.environ.get("SANDGATE_BENCH_DOCKER_RUNS", "20"))
READY_TIMEOUT = 60.0
CHILD_FLAG = "SANDGATE_BENCH_DOCKER_CHILD"
REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    run_as_root_child("bench.bench_docker", CHILD_FLAG, "netns, nftables, dockerd")


def _child() -> None:
    networks = own_network("sgd")
    sys.path.insert(0, str(REPO))
    from tests.support.dockerd import private_dockerd

    state_dir = Path(tempfile.mkdtemp(prefix="sandgate-bench-docker-"))
    try:
        local = LocalRuntime(state_dir, ImageStore(state_dir / "images"), instance=networks.instance)
        _measure("local runtime (sandgate/host)", networks, local, "sandgate/host")
        with private_dockerd() as daemon:
            started = time.perf_counter()
            _image_builder().build_images(daemon.client)
            print(
                f"(images ready in the private dockerd after {time.perf_counter() - started:.1f} s, untimed)"
            )
            docker = DockerRuntime(daemon.client, instance=networks.instance)
            _measure("docker runtime (sandgate/base)", networks, docker, "sandgate/base")
    finally:
        networks.remove_table()
        subprocess.run(["rm", "-rf", str(state_dir)], check=False)


def _measure(
    label: str, networks: SandboxNetworks, runtime: LocalRuntime | DockerRuntime, image: str
) -> None:
    launched, ready, teardowns = [], [], []
    for index in range(SEQUENTIAL):
        sandbox_id = f"bd{index}-{secrets.token_hex(2)}"
        start = time.perf_counter()
        net = networks.create(sandbox_id)
        try:
            runtime.create(SandboxSpec(sandbox_id, image, ["sleep", "3600"]), net)
            launched.append(time.perf_counter() - start)
            runtime.wait_ready(sandbox_id, net, timeout=READY_TIMEOUT)
            ready.append(time.perf_counter() - start)
        finally:
            stop = time.perf_counter()
            runtime.delete(sandbox_id)
            networks.destroy(sandbox_id)
            teardowns.append(time.perf_counter() - stop)
    print(f"{label}, {SEQUENTIAL} sandboxes one after another (execd + sleep):")
    row("network + launch", launched)
    row("create-to-ready", ready)
    row("teardown", teardowns)


def _image_builder():
    spec = importlib.util.spec_from_file_location(
        "sandgate_image_build", REPO / "sandbox-images" / "build.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__" and os.environ.get(CHILD_FLAG) == "1":
    _child()
