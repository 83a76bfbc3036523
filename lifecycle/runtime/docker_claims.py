"""The Docker runtime's `pvc` backend: a claim is a Docker named volume (runtime/claims.py rules).

Rules:
1. Claim `<name>` is the volume `sandgate-<instance>-<name>`: a create can reach only volumes
   sandgate made (or an operator named so), never another volume of the same engine.
2. subPath is made (walked without symlinks) in the volume's directory, which the engine keeps on
   this host (as everything of this runtime), and that directory is bound: the engine's own
   `Subpath` option needs API 1.45, newer than Debian's engine.
3. A volume made with deleteOnSandboxTermination carries the label `LABEL_DELETE_WITH`; once that
   sandbox's container is gone, every sandbox delete removes it unless a container of this
   instance still mounts it (whole, or a subPath of it as a bind the engine does not count).
4. With `ClaimDisks` (runtime/claim_disks.py) a volume made by sandgate gets a size cap: its
   ext4 image is mounted over the volume's directory while a container of this instance uses it
   (the engine binds volumes recursively, so the container sees the capped filesystem), and
   unmounted once none does. The volume's directory is on this host, as for subPath (rule 2).
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Any

import docker
import docker.errors
from docker.models.containers import Container
from docker.types import Mount

from sandgate.lifecycle.errors import LifecycleError
from sandgate.lifecycle.runtime.base import ClaimMount
from sandgate.lifecycle.runtime.claim_disks import ClaimDisks
from sandgate.lifecycle.runtime.claims import check_claim, subdir_path

LABEL_CLAIM = "io.sandgate.claim"
LABEL_DELETE_WITH = "io.sandgate.claim-delete-with"


class DockerClaims:
    def __init__(
        self,
        client: docker.DockerClient,
        instance: str,
        labels: tuple[str, str],
        disks: ClaimDisks | None = None,
    ) -> None:
        """`labels`: the runtime's container labels naming its instance and sandbox."""
        self.client = client
        self.instance = instance
        self.instance_label, self.sandbox_label = labels
        self.disks = disks  # the claims' size caps (rule 4); None: uncapped volumes
        self._lock = threading.Lock()  # a mount or unmount of a claim's filesystem at a time

    def volume_name(self, claim: str) -> str:
        return f"sandgate-{self.instance}-{claim}"

    def mounts(self, sandbox_id: str, claims: tuple[ClaimMount, ...]) -> list[Mount]:
        """The mounts for `claims`, making the volumes allowed to be made; nothing is made unless
        every claim can be served."""
        for claim in claims:
            check_claim(claim.name, claim.sub_path)
        existing = {claim.name for claim in claims if self._volume(claim.name) is not None}
        missing = [c.name for c in claims if not c.create and c.name not in existing]
        if missing:
            raise LifecycleError("not_found", f"volume claim(s) {', '.join(missing)} do not exist "
                                 "and createIfNotExists is false")  # fmt: skip
        with self._lock:
            for claim in claims:
                if claim.name not in existing:
                    self._make(sandbox_id, claim)
                    existing.add(claim.name)
                elif self.disks is not None:
                    self.disks.mount(claim.name, self._directory(claim.name))
            return [self._mount(claim) for claim in claims]

    def _make(self, sandbox_id: str, claim: ClaimMount) -> None:
        labels = {LABEL_CLAIM: claim.name, self.instance_label: self.instance}
        if claim.delete_on_end:
            labels[LABEL_DELETE_WITH] = sandbox_id
        volume = self.client.volumes.create(self.volume_name(claim.name), labels=labels)
        made = Path(volume.attrs["Mountpoint"])
        if self.disks is not None:
            try:
                self.disks.make(claim.name, claim.size_bytes, made)
            except BaseException:
                self.disks.remove(claim.name, made)
                volume.remove()
                raise
        elif made.is_dir():  # on this host: any user inside the sandbox may write, as on local
            made.chmod(0o777)

    def release(self, containers: list[Container]) -> list[str]:
        """Unmount the size-capped filesystem of every claim none of `containers` (this
        instance's) mounts, whole or a subPath of it; of those, remove the volumes made to die
        with a sandbox whose container is gone."""
        live = {c.labels.get(self.sandbox_label) for c in containers}
        mounted = [
            (m.get("Name"), m.get("Source", "")) for c in containers for m in c.attrs.get("Mounts", [])
        ]
        removed = []
        with self._lock:
            for volume in self.client.volumes.list(filters={"label": [LABEL_CLAIM, self.instance_label]}):
                labels = volume.attrs.get("Labels") or {}
                root = Path(volume.attrs["Mountpoint"])
                if labels.get(self.instance_label) != self.instance or any(
                    name == volume.name or Path(source).is_relative_to(root) for name, source in mounted
                ):
                    continue
                if self.disks is not None:
                    self.disks.unmount(labels[LABEL_CLAIM], root)
                owner = labels.get(LABEL_DELETE_WITH)
                if owner is None or owner in live:
                    continue
                with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):  # 409: in use
                    volume.remove()
                    if self.disks is not None:
                        self.disks.remove(labels[LABEL_CLAIM], root)
                    removed.append(labels[LABEL_CLAIM])
        return removed

    def _volume(self, claim: str) -> Any:
        try:
            return self.client.volumes.get(self.volume_name(claim))
        except docker.errors.NotFound:
            return None

    def _directory(self, claim: str) -> Path:
        return Path(self._volume(claim).attrs["Mountpoint"])

    def _mount(self, claim: ClaimMount) -> Mount:
        name = self.volume_name(claim.name)
        if not claim.sub_path.strip("/."):
            return Mount(claim.target, name, type="volume", read_only=claim.read_only)
        where = self._directory(claim.name)
        if not where.is_dir():
            raise LifecycleError("unsupported", f"subPath of claim {claim.name}: the engine's volumes "
                                 "are not on this host (mount the whole claim instead)")  # fmt: skip
        source = subdir_path(where, claim.sub_path)
        return Mount(claim.target, str(source), type="bind", read_only=claim.read_only)
