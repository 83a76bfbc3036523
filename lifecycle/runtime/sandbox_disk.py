"""A sandbox's own filesystem: what it writes is capped, and never fills the state dir's disk.

Rules:
1. Everything a local sandbox writes lands on an ext4 filesystem of its own: the overlay's upper
   and work dirs (its `/`, /workspace included) and its output log. The filesystem lives in a
   sparse image file `<directory>/sandgate-<instance>-<id>.img` whose size is the sandbox's
   quota, on a loop device with autoclear (unmounting the filesystem detaches the device), mounted
   at the mount point the runtime names (the local runtime: in the sandbox's directory; Docker,
   which binds it at /workspace: `mount_point`, beside the image). A write past the quota fails
   with ENOSPC inside the sandbox: the kernel enforces the cap, nothing polls.
2. The state dir's filesystem keeps `reserve_bytes` free whatever sandboxes write. When the
   images share that filesystem, a create is admitted only if the unwritten remainder of every
   image (its size minus the blocks it holds) plus the new quota fits into the free space minus
   the reserve; each image can grow by at most its remainder, so the reserve holds by
   construction. Images on a filesystem of their own may be overcommitted: a full disk there
   fails sandboxes (ENOSPC or I/O errors), never the control plane.
3. Every operation is idempotent; `remove` undoes `create` from any point it reached (mount, loop
   device, image), and `leftover_ids` names what a killed server left, by the image file names.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import struct
import subprocess
import threading
import time
from pathlib import Path

from sandgate.lifecycle.kernel import mount, umount
from sandgate.lifecycle.runtime.base import RuntimeError_

log = logging.getLogger(__name__)
MIN_DISK_BYTES = 16 << 20  # smaller, and ext4's own metadata leaves the sandbox next to nothing
MS_NOSUID, MS_NODEV = 2, 4
# <linux/loop.h>
LOOP_CTL_GET_FREE = 0x4C82
LOOP_CONFIGURE = 0x4C0A
LOOP_CLR_FD = 0x4C01
LO_FLAGS_AUTOCLEAR = 4
LO_FLAGS_DIRECT_IO = 16
# struct loop_config: fd, block_size, struct loop_info64 (5 u64, 4 u32, 64+64+32 bytes, 2 u64), 8 u64.
_LOOP_CONFIG = struct.Struct("<II5Q4I64s64s32s2Q8Q")
# 4 KiB blocks (the loop device's logical block size, for direct I/O: no second copy of every
# block in the page cache), no journal (the filesystem dies with its sandbox), nothing reserved
# for root (the sandbox is root), inode tables left uninitialised (mounted with noinit_itable:
# a background thread would otherwise write them out and grow the sparse image by tens of MiB).
MKFS = (
    "mkfs.ext4",
    "-q",
    "-F",
    "-b",
    "4096",
    "-O",
    "^has_journal",
    "-m",
    "0",
    "-E",
    "lazy_itable_init=1,nodiscard",
)
MOUNT_OPTIONS = "noinit_itable"


class DiskAdmission(RuntimeError_):
    """A create would let sandboxes fill the state dir's filesystem; the message says by how much."""


class SandboxDisks:
    """The per-sandbox filesystems of one server instance (rule 1) and their admission (rule 2)."""

    def __init__(
        self, directory: Path, instance: str, state_dir: Path, *, default_bytes: int, reserve_bytes: int
    ) -> None:
        self.directory = directory.resolve()
        self.default_bytes = default_bytes  # a sandbox's quota when its request names none
        self.prefix = image_prefix(instance)
        self.state_dir = state_dir
        self.reserve_bytes = reserve_bytes
        self._admission = threading.Lock()

    def image(self, sandbox_id: str) -> Path:
        return self.directory / f"{self.prefix}{sandbox_id}.img"

    def mount_point(self, sandbox_id: str) -> Path:
        """A mount point beside the image, for a runtime with no directory of its own per sandbox."""
        return self.directory / f"{self.prefix}{sandbox_id}"

    def create(self, sandbox_id: str, size_bytes: int | None, mount_point: Path) -> None:
        """Make, attach and mount the sandbox's filesystem of `size_bytes` (None: the default) at
        `mount_point`, which is created."""
        size_bytes = size_bytes or self.default_bytes
        if size_bytes < MIN_DISK_BYTES:
            raise RuntimeError_(f"a sandbox disk of {size_bytes} bytes is too small; give at least 16Mi")
        image = self.image(sandbox_id)
        self.directory.mkdir(parents=True, exist_ok=True)
        mount_point.mkdir(parents=True, exist_ok=True)
        with self._admission:
            self._admit(size_bytes)
            with open(image, "wb") as handle:
                handle.truncate(size_bytes)
        make_filesystem(image)
        mount_image(image, mount_point)

    def remove(self, sandbox_id: str, mount_point: Path, timeout: float = 5.0) -> None:
        """Unmount, detach the loop device, delete the image. A killed sandbox's mount namespace
        dies a moment after its last process and holds the filesystem (through the overlay)
        until then: wait for it, bounded, then unmount lazily (autoclear detaches the device
        when the last user goes) and say so."""
        image = self.image(sandbox_id)
        unmount_image(image, mount_point, timeout)
        image.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # absent, or still busy (then lazily unmounted, not empty)
            mount_point.rmdir()

    def leftover_ids(self) -> set[str]:
        """Sandbox ids that still have an image file in this instance's directory."""
        if not self.directory.is_dir():
            return set()
        names = (entry.name for entry in self.directory.iterdir())
        return {
            name[len(self.prefix) : -4]
            for name in names
            if name.startswith(self.prefix) and name.endswith(".img")
        }

    def _admit(self, size_bytes: int) -> None:
        """Rule 2, under the admission lock (two creates must not both take the last room)."""
        if os.stat(self.directory).st_dev != os.stat(self.state_dir).st_dev:
            return
        filesystem = os.statvfs(self.directory)
        free = filesystem.f_bavail * filesystem.f_frsize
        promised = sum(_unwritten(self.image(sandbox_id)) for sandbox_id in self.leftover_ids())
        room = free - promised - self.reserve_bytes
        if size_bytes > room:
            raise DiskAdmission(
                f"no room for a {_mib(size_bytes)} sandbox disk in {self.directory}: the filesystem "
                f"has {_mib(free)} free, running sandboxes may still write {_mib(promised)}, and "
                f"{_mib(self.reserve_bytes)} stay reserved for the state dir (setting "
                "state_disk_reserve); ask for a smaller resourceLimits.disk, delete sandboxes, or "
                "put sandbox_disk_dir on a filesystem of its own"
            )


def image_prefix(instance: str) -> str:
    """How the image files of one server instance begin (rule 1)."""
    return f"sandgate-{instance}-"


def make_filesystem(image: Path) -> None:
    """An empty ext4 filesystem in `image` (a sparse file of the quota's size)."""
    done = subprocess.run([*MKFS, str(image)], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError_(f"mkfs.ext4 {image} failed: {done.stderr.strip()} (is e2fsprogs installed?)")


def mount_image(image: Path, mount_point: Path) -> None:
    """Attach `image` to a loop device with autoclear and mount its ext4 at `mount_point`. A
    device that still backs the image (its filesystem still held elsewhere, e.g. by a mount
    namespace that has not died yet) is mounted again instead: a second device would mount the
    same filesystem twice, with two superblocks writing to one image."""
    held = [device for device, backing in loop_devices(str(image)).items() if backing == str(image)]
    if held:
        mount(held[0], mount_point, "ext4", MS_NOSUID | MS_NODEV, MOUNT_OPTIONS)
        return
    loop_fd, device = _attach(image)
    try:
        mount(device, mount_point, "ext4", MS_NOSUID | MS_NODEV, MOUNT_OPTIONS)
    finally:
        os.close(loop_fd)  # the mount holds the device now; without it, autoclear detaches it


def unmount_image(image: Path, mount_point: Path, timeout: float = 5.0) -> None:
    """Undo `mount_image`: unmount (lazily once `timeout` has passed busy) and detach."""
    deadline = time.monotonic() + timeout
    _umount_when_free(mount_point, deadline)
    while devices := loop_devices(str(image)):
        for device in devices:
            _detach(device)
        if time.monotonic() > deadline:
            log.warning("loop device(s) %s of %s still busy; detached when released", devices, image)
            break
        time.sleep(0.005)


def loop_devices(backing_prefix: str) -> dict[str, str]:
    """Attached loop devices whose backing file starts with `backing_prefix`: /dev/loopN -> file."""
    found: dict[str, str] = {}
    for entry in Path("/sys/block").glob("loop*"):
        with contextlib.suppress(OSError):
            backing = (entry / "loop" / "backing_file").read_text(encoding="utf-8").strip()
            if backing.startswith(backing_prefix):
                found[f"/dev/{entry.name}"] = backing.removesuffix(" (deleted)")
    return found


def _attach(image: Path) -> tuple[int, str]:
    """A free loop device configured on `image` with autoclear; returns its open fd and path.
    Another process may take the free device first (EBUSY): ask for the next one."""
    image_fd = os.open(image, os.O_RDWR | os.O_CLOEXEC)
    try:
        try:
            control = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            raise RuntimeError_(
                "no /dev/loop-control: this host (or container) has no loop devices for the sandboxes' "
                "filesystems; load the loop module (modprobe loop), or set sandbox_disk = '0' to run "
                "sandboxes without a disk cap"
            ) from None
        try:
            for _ in range(64):
                device = f"/dev/loop{fcntl.ioctl(control, LOOP_CTL_GET_FREE)}"
                loop_fd = os.open(device, os.O_RDWR | os.O_CLOEXEC)
                config = _loop_config(image_fd)
                try:
                    fcntl.ioctl(loop_fd, LOOP_CONFIGURE, config)
                    return loop_fd, device
                except OSError as exc:
                    os.close(loop_fd)
                    if exc.errno != errno.EBUSY:
                        raise RuntimeError_(f"cannot attach {image} to {device}: {exc}") from exc
        finally:
            os.close(control)
    finally:
        os.close(image_fd)
    raise RuntimeError_(f"no free loop device for {image} after 64 tries (see losetup -a)")


def _umount_when_free(mount_point: Path, deadline: float) -> None:
    while True:
        try:
            umount(mount_point)
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                umount(mount_point, lazy=True)
                return
        time.sleep(0.005)


def _loop_config(image_fd: int) -> bytes:
    """struct loop_config for LOOP_CONFIGURE: the image, 4 KiB blocks, autoclear and direct I/O."""
    info = (0, 0, 0, 0, 0, 0, 0, 0, LO_FLAGS_AUTOCLEAR | LO_FLAGS_DIRECT_IO, b"", b"", b"", 0, 0)
    return _LOOP_CONFIG.pack(image_fd, 4096, *info, *[0] * 8)


def _detach(device: str) -> None:
    with contextlib.suppress(OSError):  # gone already, or not bound (ENXIO)
        fd = os.open(device, os.O_RDONLY | os.O_CLOEXEC)
        try:
            fcntl.ioctl(fd, LOOP_CLR_FD)  # on a device still in use this sets autoclear instead
        finally:
            os.close(fd)


def _unwritten(image: Path) -> int:
    try:
        status = image.stat()
    except FileNotFoundError:
        return 0
    return max(0, status.st_size - status.st_blocks * 512)


def _mib(size: int) -> str:
    return f"{size / 2**20:.0f} MiB"
