"""The Kubernetes runtime's `pvc` backend: a claim is a PersistentVolumeClaim (runtime/claims.py rules).

Rules:
1. Claim `<name>` is the PVC `<name>` in the sandboxes' namespace (the spec: "In Kubernetes this
   is the PVC name"), so a platform team can hand sandboxes a volume it made. A PVC is offered
   to sandboxes only if it carries the label `LABEL_CLAIM` (sandgate made it, or the operator
   labelled it): naming any other PVC of the namespace is a 409, so a create cannot mount a
   volume that was never meant for sandboxes.
2. A PVC made by a create asks for `pvc.storage` (else the setting `volume_default_size`), in
   `pvc.storageClass` (else the setting `kubernetes.storage_class`, else the cluster's default),
   with `pvc.accessModes` (else ReadWriteOnce). What is enforced is the StorageClass's: its
   provisioner binds a volume of at least that size, and caps writes if its driver does.
3. readOnly and subPath are the Pod's volumeMount fields: kubelet mounts the subPath (made when
   missing) after resolving it inside the volume without following a link out of it.
4. Sharing: ReadWriteOnce and ReadWriteMany volumes serve any number of Pods (ReadWriteOnce on
   one node: the scheduler puts later Pods beside the first). A ReadWriteOncePod claim serves
   one Pod: a create naming one that a live sandbox uses is a 409, made before anything else.
5. deleteOnSandboxTermination removes the PVC this create made (label `LABEL_DELETE_WITH`)
   once that sandbox's Pod is gone and no Pod of this instance mounts it; the volume behind it
   then follows the StorageClass's reclaim policy. A PVC made before is never removed.
"""

from __future__ import annotations

from typing import Any

from lightkube import Client, operators
from lightkube.core.exceptions import ApiError
from lightkube.models.core_v1 import (
    PersistentVolumeClaimSpec,
    PersistentVolumeClaimVolumeSource,
    Volume,
    VolumeMount,
    VolumeResourceRequirements,
)
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import PersistentVolumeClaim, Pod

from sandgate.lifecycle.errors import LifecycleError
from sandgate.lifecycle.runtime.base import ClaimMount
from sandgate.lifecycle.runtime.claims import check_claim

LABEL_CLAIM = "sandgate/claim"
LABEL_DELETE_WITH = "sandgate/claim-delete-with"
EXCLUSIVE = "ReadWriteOncePod"


class KubernetesClaims:
    def __init__(
        self,
        client: Client,
        namespace: str,
        instance_labels: dict[str, str],
        sandbox_label: str,
        *,
        default_bytes: int,
        storage_class: str | None,
    ) -> None:
        """`instance_labels`: the labels every Pod of this server's instance carries;
        `sandbox_label`: the Pod label naming its sandbox."""
        self.client = client
        self.namespace = namespace
        self.instance_labels = instance_labels
        self.sandbox_label = sandbox_label
        self.default_bytes = default_bytes
        self.storage_class = storage_class

    def volumes(
        self, sandbox_id: str, claims: tuple[ClaimMount, ...]
    ) -> tuple[list[Volume], list[VolumeMount]]:
        """The Pod's volumes and the sandbox container's mounts for `claims`, making the PVCs
        allowed to be made; nothing is made unless every claim can be served."""
        for claim in claims:
            check_claim(claim.name, claim.sub_path)
        names = sorted({claim.name for claim in claims})
        existing = {name: self._claim(name) for name in names}
        missing = [c.name for c in claims if not c.create and existing[c.name] is None]
        if missing:
            raise LifecycleError("not_found", f"volume claim(s) {', '.join(sorted(set(missing)))} do not "
                                 "exist and createIfNotExists is false")  # fmt: skip
        for name, pvc in existing.items():
            if pvc is not None:
                self._check_offered(name, pvc)
        for claim in claims:
            if existing[claim.name] is None:
                existing[claim.name] = self._make(sandbox_id, claim)
        volumes = [
            Volume(name=f"claim-{i}", persistentVolumeClaim=PersistentVolumeClaimVolumeSource(claimName=name))
            for i, name in enumerate(names)
        ]
        mounts = [
            VolumeMount(
                name=f"claim-{names.index(claim.name)}",
                mountPath=claim.target,
                readOnly=claim.read_only,
                subPath=claim.sub_path.strip("/") or None,
            )
            for claim in claims
        ]
        return volumes, mounts

    def release(self) -> list[str]:
        """Remove the PVCs made to die with a sandbox whose Pod is gone, once no Pod of this
        instance mounts them (rule 5). Returns the removed names."""
        pods = self._pods()
        live = {(pod.metadata.labels or {}).get(self.sandbox_label, "") for pod in pods if pod.metadata}
        mounted = {name for pod in pods for name in _claim_names(pod)}
        removed = []
        made_to_die = self.client.list(
            PersistentVolumeClaim,
            namespace=self.namespace,
            labels={LABEL_DELETE_WITH: operators.exists(), **self.instance_labels},
        )
        for pvc in made_to_die:
            name = pvc.metadata.name if pvc.metadata else None
            owner = (pvc.metadata.labels or {}).get(LABEL_DELETE_WITH) if pvc.metadata else None
            if not name or owner in live or name in mounted:
                continue
            try:
                self.client.delete(PersistentVolumeClaim, name, namespace=self.namespace)
                removed.append(name)
            except ApiError as exc:
                if exc.status.code != 404:
                    raise
        return removed

    def _pods(self) -> list[Pod]:
        labels: dict[str, Any] = dict(self.instance_labels)
        return list(self.client.list(Pod, namespace=self.namespace, labels=labels))

    def _claim(self, name: str) -> PersistentVolumeClaim | None:
        try:
            return self.client.get(PersistentVolumeClaim, name, namespace=self.namespace)
        except ApiError as exc:
            if exc.status.code == 404:
                return None
            raise

    def _check_offered(self, name: str, pvc: PersistentVolumeClaim) -> None:
        """Rules 1 and 4, for a PVC that exists."""
        if LABEL_CLAIM not in ((pvc.metadata.labels or {}) if pvc.metadata else {}):
            raise LifecycleError("conflict", f"the PersistentVolumeClaim {name} is not offered to sandboxes: "
                                 f"sandgate mounts only PVCs labelled {LABEL_CLAIM} (kubectl label pvc "
                                 f"{name} {LABEL_CLAIM}={name})")  # fmt: skip
        modes = (pvc.spec.accessModes if pvc.spec else None) or []
        if modes == [EXCLUSIVE]:
            users = [
                (pod.metadata.labels or {}).get(self.sandbox_label, "?")
                for pod in self._pods()
                if pod.metadata and name in _claim_names(pod)
            ]
            if users:
                raise LifecycleError("conflict", f"volume claim {name} is {EXCLUSIVE}: sandbox {users[0]} "
                                     "uses it; one sandbox at a time")  # fmt: skip

    def _make(self, sandbox_id: str, claim: ClaimMount) -> PersistentVolumeClaim:
        labels = {LABEL_CLAIM: claim.name, **self.instance_labels}
        if claim.delete_on_end:
            labels[LABEL_DELETE_WITH] = sandbox_id
        pvc = PersistentVolumeClaim(
            metadata=ObjectMeta(name=claim.name, namespace=self.namespace, labels=labels),
            spec=PersistentVolumeClaimSpec(
                accessModes=list(claim.access_modes) or ["ReadWriteOnce"],
                storageClassName=claim.storage_class or self.storage_class,
                resources=VolumeResourceRequirements(
                    requests={"storage": str(claim.size_bytes or self.default_bytes)}
                ),
            ),
        )
        try:
            return self.client.create(pvc)
        except ApiError as exc:
            if exc.status.code == 409:  # another create made it a moment ago: share it
                made = self._claim(claim.name)
                if made is not None:
                    self._check_offered(claim.name, made)
                    return made
            raise


def _claim_names(pod: Pod) -> set[str]:
    volumes = (pod.spec.volumes if pod.spec else None) or []
    return {v.persistentVolumeClaim.claimName for v in volumes if v.persistentVolumeClaim}
