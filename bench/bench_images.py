"""Pulled images on the local runtime, through the HTTP API: the first create of `python:3.12`
(pull, verify, unpack, start) and cached create-to-ready against `sandgate/host`.

Runs as root in a network namespace of its own (re-executed after unshare), with the test
registry (tests/support/registry.py: docker-registry in a namespace of its own, filled by skopeo)
as the only registry, named by `registry_mirrors`. Bounded: PULLS cold creates, each against a
fresh `sandgate serve` (an empty state dir, so an empty image store), then SEQUENTIAL creates of
each image against the last one, interleaved (`POST /v1/sandboxes` until its 202, then
`DELETE`). The servers delete whatever is left; everything is removed in `finally`.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import sized
from bench.sandbox_rig import create_timed, delete_timed, enter_own_netns, row, run_as_root_child

if TYPE_CHECKING:
    from tests.support.server import SandgateServer

PULLS = sized(3, 1)
SEQUENTIAL = sized(20, 1)
CHILD_FLAG = "SANDGATE_BENCH_IMAGES_CHILD"
IMAGE = "python:3.12"


def main() -> None:
    run_as_root_child("bench.bench_images", CHILD_FLAG, "netns, registry, mounts, cgroups")


def _body(image: str) -> dict[str, Any]:
    return {"image": {"uri": image}, "entrypoint": ["sleep", "3600"], "resourceLimits": {}}


def _child() -> None:
    enter_own_netns()
    from tests.support.registry import fill, start_registry
    from tests.support.server import sandgate_server

    with tempfile.TemporaryDirectory(prefix="sandgate-bench-images-") as temp:
        work = Path(temp)
        with start_registry(work / "registry") as registry:
            fill(registry)
            env = {
                "SANDGATE_REGISTRY_MIRRORS": registry.mirror,
                "SANDGATE_REGISTRY_MIRROR_ONLY": "true",  # no public name is looked up
                "SANDGATE_IMAGE_PULL_TIMEOUT": "120",
            }
            pulls, grown = [], 0.0
            for index in range(PULLS):
                (work / f"serve{index}").mkdir()
                with sandgate_server(work / f"serve{index}", env) as server:
                    took, grown = _first_create(server)
                    pulls.append(took)
                    if index == PULLS - 1:  # the last server has the image: the cached rows
                        print(f"first create of {IMAGE} against an empty store, {PULLS}x:")
                        row("pull + verify + unpack + start", pulls)
                        print(f"  state dir grew by {grown:.1f} MiB (the image, as the store keeps it)")
                        _cached(server)


def _first_create(server: SandgateServer) -> tuple[float, float]:
    """The create's wall time, and how much the state dir grew (measured after the delete)."""
    before = _state_mib(server)
    created, took = create_timed(server, _body(IMAGE))
    delete_timed(server, created["id"])
    return took, _state_mib(server) - before


def _cached(server: SandgateServer) -> None:
    timings: dict[str, list[float]] = {IMAGE: [], "sandgate/host": []}
    for _ in range(SEQUENTIAL):
        for image, seconds in timings.items():
            created, took = create_timed(server, _body(image))
            seconds.append(took)
            delete_timed(server, created["id"])
    print(f"cached create-to-ready through the API, {SEQUENTIAL} each, interleaved:")
    for image, seconds in timings.items():
        row(image, seconds)


def _state_mib(server: SandgateServer) -> float:
    du = subprocess.run(
        ["du", "-sx", "-B1", str(server.state_dir)], capture_output=True, text=True, check=True
    )
    return int(du.stdout.split()[0]) / 2**20


if __name__ == "__main__" and os.environ.get(CHILD_FLAG) == "1":
    _child()
