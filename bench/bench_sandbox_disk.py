"""A sandbox's own filesystem (lifecycle/runtime/sandbox_disk.py): what it adds to a create and a
delete, and what it costs to write through it (root).

30 disks of the default 2 GiB, one after another, in a temporary directory: `SandboxDisks.create`
(sparse image, mkfs.ext4, loop device, mount) and `remove` (unmount, detach, delete), p50/p95;
then 256 MiB written with fsync into one disk and into the directory that holds the images, MB/s.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from sandgate.lifecycle.runtime.sandbox_disk import SandboxDisks

RUNS = 30
SIZE = 2 << 30
WRITE = 256 << 20
CHUNK = 1 << 20


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def write_rate(path: Path) -> float:
    block = os.urandom(CHUNK)
    start = time.perf_counter()
    with open(path, "wb") as out:
        for _ in range(WRITE // CHUNK):
            out.write(block)
        out.flush()
        os.fsync(out.fileno())
    elapsed = time.perf_counter() - start
    path.unlink()
    return WRITE / elapsed / 1e6


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="sandgate-bench-disk-"))
    disks = SandboxDisks(root / "disks", "bench", root, default_bytes=SIZE, reserve_bytes=0)
    creates, removes = [], []
    try:
        for index in range(RUNS):
            mount_point = root / f"m{index}"
            start = time.perf_counter()
            disks.create(f"b{index}", None, mount_point)
            created = time.perf_counter()
            disks.remove(f"b{index}", mount_point)
            creates.append(created - start)
            removes.append(time.perf_counter() - created)
        disks.create("w", None, root / "w")
        through_disk = write_rate(root / "w" / "data")
        disks.remove("w", root / "w")
        direct = write_rate(root / "data")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"{RUNS} disks of {SIZE >> 30} GiB one after another, load average {os.getloadavg()[0]:.1f}:")
    for name, times in (("create (image, mkfs, loop, mount)", creates), ("remove", removes)):
        p50, p95 = statistics.median(times) * 1e3, percentile(times, 0.95) * 1e3
        print(f"  {name:<36} p50 {p50:7.1f} ms   p95 {p95:7.1f} ms")
    print(
        f"  write {WRITE >> 20} MiB + fsync: through a disk {through_disk:.0f} MB/s, direct {direct:.0f} MB/s"
    )
