"""Pulled images on the local runtime: cold pull + unpack, and cached create-to-ready against
`sandgate/host`.

Runs as root in a network namespace of its own (re-executed after unshare), with the test
registry (tests/support/registry.py: docker-registry in a namespace of its own, filled by skopeo)
as the only registry. Bounded: PULLS cold pulls of `python:3.12` (each into an empty store, via
`registry_mirrors`), then SEQUENTIAL creates of each image, interleaved, runtime level (network,
overlay, bwrap, execd /ping). Everything is torn down in `finally`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from bench.sandbox_rig import own_network, row, run_as_root_child

PULLS = 3
SEQUENTIAL = 20
READY_TIMEOUT = 60.0
CHILD_FLAG = "SANDGATE_BENCH_IMAGES_CHILD"
IMAGE = "python:3.12"


def main() -> None:
    run_as_root_child("bench.bench_images", CHILD_FLAG, "netns, registry, mounts, cgroups")


def _child() -> None:
    networks = own_network("sgi")
    from sandgate.lifecycle.images import ImageStore
    from sandgate.lifecycle.registry import RegistryConfig
    from sandgate.lifecycle.runtime.base import SandboxSpec
    from sandgate.lifecycle.runtime.local import LocalRuntime
    from tests.support.registry import fill, start_registry

    work = Path(tempfile.mkdtemp(prefix="sandgate-bench-images-"))
    alive: list[str] = []
    try:
        with start_registry(work / "registry") as registry:
            fill(registry)
            config = RegistryConfig(mirrors=(registry.mirror,), mirror_only=True)
            pulls = []
            for index in range(PULLS):
                store = ImageStore(work / f"cold{index}" / "images", registry=config)
                started = time.perf_counter()
                image = store.pull(IMAGE)
                pulls.append(time.perf_counter() - started)
            du = subprocess.run(["du", "-sb", str(store.layers.root)], capture_output=True, text=True)
            size = int(du.stdout.split()[0]) / 2**20
            blob = registry.blob_file(image.layers[0]).stat().st_size / 2**20
            print(f"cold pull + unpack of {IMAGE} ({blob:.1f} MiB gzip, {size:.1f} MiB unpacked), {PULLS}x:")
            row("pull + verify + unpack", pulls)

            state = work / "cold0"
            runtime = LocalRuntime(
                state, ImageStore(state / "images", registry=config), instance=networks.instance
            )
            timings: dict[str, list[float]] = {IMAGE: [], "sandgate/host": []}
            for index in range(SEQUENTIAL):
                for image_name in timings:
                    sandbox_id = f"img{index}-{len(alive)}"
                    started = time.perf_counter()
                    net = networks.create(sandbox_id)
                    alive.append(sandbox_id)
                    runtime.create(SandboxSpec(sandbox_id, image_name, ["sleep", "3600"]), net)
                    runtime.wait_ready(sandbox_id, net, timeout=READY_TIMEOUT)
                    timings[image_name].append(time.perf_counter() - started)
                    runtime.delete(sandbox_id)
                    networks.destroy(sandbox_id)
                    alive.remove(sandbox_id)
            print(f"cached create-to-ready (network, overlay, bwrap, execd), {SEQUENTIAL} each, interleaved:")
            for image_name, seconds in timings.items():
                row(image_name, seconds)
    finally:
        for sandbox_id in alive:
            runtime.delete(sandbox_id)
            networks.destroy(sandbox_id)
        networks.remove_table()
        subprocess.run(["umount", "-R", "-l", str(work)], capture_output=True, check=False)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__" and os.environ.get(CHILD_FLAG) == "1":
    _child()
