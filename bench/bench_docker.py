"""Docker sandboxes: create-to-ready through the HTTP API next to the local runtime, same machine,
one run.

Runs as root in a network namespace of its own (the module re-executes itself after unshare):
one real `sandgate serve` per runtime (tests.support.server), the docker one against a private
dockerd (tests/support/dockerd.py) into which `sandbox-images/build.py` builds the sandbox images
or loads them from its cache first, as the docker tests do (not timed). Bounded: SEQUENTIAL
sandboxes per runtime, one after another (`POST /v1/sandboxes` until its 202, execd ready; then
`DELETE`); the servers delete whatever is left. Set SANDGATE_BENCH_DOCKER_RUNS to change
SEQUENTIAL."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from bench import sized
from bench.sandbox_rig import create_timed, delete_timed, enter_own_netns, row, run_as_root_child

if TYPE_CHECKING:
    from tests.support.server import SandgateServer

SEQUENTIAL = int(os.environ.get("SANDGATE_BENCH_DOCKER_RUNS", sized(20, 2)))
CHILD_FLAG = "SANDGATE_BENCH_DOCKER_CHILD"


def main() -> None:
    run_as_root_child("bench.bench_docker", CHILD_FLAG, "netns, nftables, dockerd")


def _child() -> None:
    enter_own_netns()
    from tests.docker.conftest import load_image_builder
    from tests.support.dockerd import private_dockerd
    from tests.support.server import sandgate_server

    with tempfile.TemporaryDirectory(prefix="sandgate-bench-docker-") as temp:
        for name in ("local", "docker"):
            (Path(temp) / name).mkdir()
        with sandgate_server(Path(temp) / "local") as server:
            _measure("local runtime (sandgate/host)", server, "sandgate/host")
        with private_dockerd() as daemon:
            started = time.perf_counter()
            load_image_builder().build_images(daemon.client)  # sandgate/base, as the docker tests do
            took = time.perf_counter() - started
            print(f"(images ready in the private dockerd after {took:.1f} s, untimed)")
            docker = {"SANDGATE_RUNTIME": "docker", "SANDGATE_DOCKER_HOST": daemon.url}
            with sandgate_server(Path(temp) / "docker", docker) as server:
                _measure("docker runtime (sandgate/base)", server, "sandgate/base")


def _measure(label: str, server: SandgateServer, image: str) -> None:
    ready, teardowns = [], []
    body = {"image": {"uri": image}, "entrypoint": ["sleep", "3600"], "resourceLimits": {}}
    for _ in range(SEQUENTIAL):
        created, took = create_timed(server, body)
        ready.append(took)
        teardowns.append(delete_timed(server, created["id"]))
    print(f"{label}, {SEQUENTIAL} sandboxes one after another through the API (execd + sleep):")
    row("create-to-ready", ready)
    row("teardown", teardowns)


if __name__ == "__main__" and os.environ.get(CHILD_FLAG) == "1":
    _child()
