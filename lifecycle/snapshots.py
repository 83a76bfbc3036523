"""Snapshots: a sandbox's files, kept as an image layer, to create sandboxes from (OpenSandbox's
`/sandboxes/{id}/snapshots`, `/snapshots`, and `snapshotId` on create).

Rules:
1. A snapshot is what the sandbox changed (the local runtime's overlay upper directory, copied
   while the sandbox is frozen) on top of the image it was created from; it is stored as the
   image `sandgate/snapshot:<id>` (lifecycle/images.py rule 7), so it is on disk, survives a
   restart, and a create from it is a create from that image.
2. Taking one holds the sandbox's lock (no delete or pause in between); it answers once the
   snapshot is whole (state `Ready`): there is no `Creating` state to poll.
3. A runtime that cannot copy a sandbox's files (Docker, for now) answers `unsupported`.
4. Deleting a snapshot forgets it at once; its layer goes unless a running sandbox stands on it
   (then `sandgate image prune` removes it once that sandbox is gone).
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Protocol, runtime_checkable

from sandgate.lifecycle.errors import LifecycleError
from sandgate.lifecycle.images import Image, ImageError, ImageStore, SnapshotOf, snapshot_image
from sandgate.lifecycle.service import Service


@runtime_checkable
class SnapshotRuntime(Protocol):
    images: ImageStore
    state_dir: Path

    def copy_upper(self, sandbox_id: str, target: Path) -> None: ...


class Snapshots:
    def __init__(self, service: Service) -> None:
        self.service = service

    def _runtime(self) -> SnapshotRuntime:
        runtime = self.service.runtime
        if not isinstance(runtime, SnapshotRuntime):
            raise LifecycleError(
                "unsupported",
                'snapshots are taken by the local runtime only (runtime = "local"); copy files out '
                "with execd's GET /files/download on this runtime",
            )
        return runtime

    def create(self, sandbox_id: str, name: str | None) -> Image:
        runtime = self._runtime()
        with self.service.egress.locks(sandbox_id):
            record = self.service.get(sandbox_id)
            if record.state not in ("Running", "Paused"):
                raise LifecycleError(
                    "conflict", f"sandbox {sandbox_id} is {record.state}; snapshot a running one"
                )
            base = runtime.images.get(record.image)
            of = SnapshotOf(id=str(uuid.uuid4()), sandbox_id=sandbox_id, name=name)
            runtime.images.layers.root.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=".snapshot-", dir=runtime.images.layers.root))
            try:
                runtime.copy_upper(sandbox_id, staging)
                return runtime.images.add_snapshot(of, base, staging)
            except ImageError as exc:
                raise LifecycleError("invalid", str(exc)) from exc
            finally:
                shutil.rmtree(staging, ignore_errors=True)

    def list(self) -> list[Image]:
        runtime = self.service.runtime
        return runtime.images.snapshots() if isinstance(runtime, SnapshotRuntime) else []

    def get(self, snapshot_id: str) -> Image:
        found = [image for image in self.list() if image.snapshot and image.snapshot.id == snapshot_id]
        if not found:
            raise LifecycleError(
                "not_found", f"snapshot {snapshot_id!r} does not exist (GET /v1/snapshots lists them)"
            )
        return found[0]

    def delete(self, snapshot_id: str) -> None:
        from sandgate.lifecycle.runtime.local import lowers_in_use

        runtime = self._runtime()
        self.get(snapshot_id)
        runtime.images.remove_snapshot(snapshot_id, lowers_in_use(runtime.state_dir))

    def image_of(self, snapshot_id: str) -> str:
        """The image a create with `snapshotId` starts from (a 404 when there is no such snapshot)."""
        self.get(snapshot_id)
        return snapshot_image(snapshot_id)
