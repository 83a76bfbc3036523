"""A `pvc` claim's size cap on the local and the Docker runtime: an ext4 image per claim.

Rules:
1. A claim made while the cap is on gets the sparse image `<directory>/<claim>.img`, of the
   create's `pvc.storage` (the spec's field, a Kubernetes quantity) or else the `pvc_volume_size`
   setting. The size is fixed when the claim is made: a later create's `storage` does not resize
   it (as a PersistentVolumeClaim without volume expansion). A write past it fails with ENOSPC
   inside the sandbox: the kernel enforces the cap, as for the sandboxes' own disks
   (runtime/sandbox_disk.py).
2. The image is mounted over the claim's directory (local: `<state_dir>/volumes/<claim>`; Docker:
   the named volume's directory, which the engine binds recursively) while a sandbox uses the
   claim, and unmounted once its last user is gone: a stopped server leaves no mount behind, and
   the next user mounts it again (also after a reboot).
3. A claim made before the cap (or with it off) has no image and stays an uncapped directory.
   Removing a claim removes its image.
"""

from __future__ import annotations

import os
from pathlib import Path

from sandgate.lifecycle.runtime.sandbox_disk import make_filesystem, mount_image, unmount_image


class ClaimDisks:
    def __init__(self, directory: Path, default_bytes: int) -> None:
        self.directory = directory
        self.default_bytes = default_bytes  # a claim's size when its create names no `storage`

    def image(self, claim: str) -> Path:
        return self.directory / f"{claim}.img"

    def make(self, claim: str, size_bytes: int | None, where: Path) -> None:
        """A new claim's filesystem (rule 1), mounted at `where` and writable by any user inside."""
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        image = self.image(claim)
        with open(image, "wb") as handle:
            handle.truncate(size_bytes or self.default_bytes)
        make_filesystem(image)
        mount_image(image, where)
        (where / "lost+found").rmdir()  # the claim starts empty, as a directory would
        where.chmod(0o777)

    def mount(self, claim: str, where: Path) -> None:
        """Mount the claim's filesystem at `where` unless it has none or is mounted (rule 2)."""
        if self.image(claim).exists() and not os.path.ismount(where):
            mount_image(self.image(claim), where)

    def unmount(self, claim: str, where: Path) -> None:
        if os.path.ismount(where):
            unmount_image(self.image(claim), where)

    def remove(self, claim: str, where: Path) -> None:
        self.unmount(claim, where)
        self.image(claim).unlink(missing_ok=True)
