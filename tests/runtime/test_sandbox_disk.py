"""A sandbox's own filesystem (runtime/sandbox_disk.py) on a small tmpfs that also holds the
"state dir": the quota is the kernel's ENOSPC, the admission keeps the reserve free whatever
the admitted disks write, and remove leaves no mount, loop device or image."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandgate.lifecycle.kernel import mount, mount_points, umount
from sandgate.lifecycle.runtime.sandbox_disk import DiskAdmission, SandboxDisks, loop_devices

pytestmark = pytest.mark.root

MiB = 1 << 20


@pytest.fixture
def shared_fs(tmp_path: Path) -> Iterator[Path]:
    """A 256 MiB filesystem holding the state dir and the disk images, as by default."""
    mount("tmpfs", tmp_path, "tmpfs", 0, "size=256m")
    try:
        yield tmp_path
    finally:
        umount(tmp_path, lazy=True)


def fill(path: Path) -> int:
    """Write until the filesystem refuses; returns the bytes written (ENOSPC asserted)."""
    written = 0
    with open(path, "wb") as out, pytest.raises(OSError) as refused:
        while True:
            out.write(b"x" * MiB)
            out.flush()
            os.fsync(out.fileno())
            written += MiB
    assert refused.value.errno == errno.ENOSPC
    return written


def free(path: Path) -> int:
    status = os.statvfs(path)
    return status.f_bavail * status.f_frsize


def test_sandbox_disks_cannot_take_the_state_dirs_reserve(shared_fs: Path) -> None:
    disks = SandboxDisks(shared_fs / "disks", "t", shared_fs, default_bytes=96 * MiB, reserve_bytes=64 * MiB)
    first, second = shared_fs / "a", shared_fs / "b"
    disks.create("a", None, first)
    with pytest.raises(DiskAdmission, match="reserved for the state dir"):
        disks.create("b", 128 * MiB, second)  # 256 - 96 promised - 64 reserved leaves < 128
    assert not disks.image("b").exists() and loop_devices(str(disks.image("b"))) == {}
    disks.create("b", 64 * MiB, second)

    written = fill(first / "filler") + fill(second / "filler")
    assert 140 * MiB < written <= 160 * MiB  # both quotas, less ext4's metadata
    assert free(shared_fs) >= 64 * MiB  # the reserve survived both disks filling up

    for sandbox_id, point in (("a", first), ("b", second)):
        disks.remove(sandbox_id, point)
    assert loop_devices(str(shared_fs)) == {}
    assert not [m for m in mount_points() if m.startswith(f"{shared_fs}/")]
    assert disks.leftover_ids() == set()


def test_images_on_a_filesystem_of_their_own_are_not_held_to_the_state_dirs_reserve(
    shared_fs: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    state_dir = tmp_path_factory.mktemp("state")  # another filesystem than the tmpfs
    disks = SandboxDisks(shared_fs / "disks", "t", state_dir, default_bytes=200 * MiB, reserve_bytes=1 << 40)
    disks.create("a", None, shared_fs / "a")
    assert disks.leftover_ids() == {"a"}
    disks.remove("a", shared_fs / "a")
    assert loop_devices(str(shared_fs)) == {} and disks.leftover_ids() == set()
