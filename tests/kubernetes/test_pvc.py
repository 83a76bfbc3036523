"""`pvc` volumes on the Kubernetes runtime: PersistentVolumeClaims through a real `sandgate serve
--runtime kubernetes` on the test cluster, whose default StorageClass is kube-controller-manager's
hostPath provisioner (scripts/cluster/up.sh make_storage_class).

Proof from the other side: the claims, their sizes, labels and bound volumes are read from the API
server with the cluster's admin client; the files from the node's disk (the volume's hostPath);
what a sandbox saw from its own commands (execd in the Pod).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.models.core_v1 import PersistentVolumeClaimSpec, VolumeResourceRequirements
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, PersistentVolume, PersistentVolumeClaim, Pod

from tests.kubernetes.cluster import (
    BUSYBOX_IMAGE,
    Cluster,
    run_script,
    skip_unless_built,
    up_to_a_build,
)
from tests.support.server import SandgateServer, sandgate_server

pytestmark = pytest.mark.root
skip_unless_built()

NAMESPACE = "sandgate"
BOUND_TIMEOUT = 120.0


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, cluster: Cluster, client: Client
) -> Iterator[SandgateServer]:
    imported = run_script("execd-image.sh", cluster.state_dir, timeout=600, PYTHON=sys.executable)
    assert imported.returncode == 0, imported.stderr
    client.create(Namespace(metadata=ObjectMeta(name=NAMESPACE)))
    env = {
        "SANDGATE_RUNTIME": "kubernetes",
        "SANDGATE_KUBERNETES": json.dumps({"kubeconfig": str(cluster.kubeconfig), "namespace": NAMESPACE}),
        "SANDGATE_PVC_VOLUMES": "true",
        "SANDGATE_VOLUME_DEFAULT_SIZE": "64Mi",
    }
    with sandgate_server(tmp_path_factory.mktemp("k8s-pvc"), env) as running:
        yield running


def create(server: SandgateServer, *volumes: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    body = {
        "image": {"uri": BUSYBOX_IMAGE},
        "entrypoint": ["/bin/busybox", "sleep", "3600"],
        "volumes": list(volumes),
    }
    with server.client(timeout=240) as http:
        answer = http.post("/v1/sandboxes", json=body)
    return answer.status_code, answer.json()


def delete(server: SandgateServer, sandbox_id: str) -> None:
    with server.client(timeout=120) as http:
        assert http.delete(f"/v1/sandboxes/{sandbox_id}").status_code == 204


def pvc(claim: str, mount: str = "/mnt/data", **fields: Any) -> dict[str, Any]:
    keys = ("createIfNotExists", "deleteOnSandboxTermination", "storage", "accessModes")
    pvc_fields = {key: fields.pop(key) for key in keys if key in fields}
    return {"name": "data", "pvc": {"claimName": claim, **pvc_fields}, "mountPath": mount, **fields}


def claim(client: Client, name: str) -> PersistentVolumeClaim | None:
    found = [c for c in client.list(PersistentVolumeClaim, namespace=NAMESPACE) if c.metadata.name == name]
    return found[0] if found else None


def volume_dir(client: Client, name: str) -> Path:
    """The node's directory behind claim `name`, once the provisioner bound it."""
    deadline = time.monotonic() + BOUND_TIMEOUT
    while True:
        made = claim(client, name)
        assert made is not None and made.spec is not None
        if made.spec.volumeName:
            volume = client.get(PersistentVolume, made.spec.volumeName)
            assert volume.spec is not None and volume.spec.hostPath is not None
            return Path(volume.spec.hostPath.path)
        assert time.monotonic() < deadline, made.status
        time.sleep(0.5)


def sandbox_pods(client: Client) -> list[str]:
    return [pod.metadata.name for pod in client.list(Pod, namespace=NAMESPACE) if pod.metadata]


@up_to_a_build
def test_a_file_written_by_one_sandbox_is_read_by_a_later_one(server: SandgateServer, client: Client) -> None:
    status, first = create(server, pvc("work", subPath="agent/a", storage="128Mi"))
    assert status == 202, first
    wrote = server.run(first["id"], "echo kept > /mnt/data/note && echo ok")
    assert wrote.stdout.strip() == "ok", wrote
    made = claim(client, "work")
    assert made is not None and made.spec is not None and made.spec.resources is not None
    assert made.spec.resources.requests == {"storage": str(128 << 20)}
    assert made.spec.accessModes == ["ReadWriteOnce"]
    assert made.spec.storageClassName == "sandgate-local"  # the default class, filled in by the API server
    assert (made.metadata.labels or {}).get("sandgate/claim") == "work"
    on_node = volume_dir(client, "work")
    assert (on_node / "agent" / "a" / "note").read_text() == "kept\n"
    delete(server, first["id"])
    assert claim(client, "work") is not None  # outlives its sandbox
    status, later = create(server, pvc("work", createIfNotExists=False), pvc("work", "/ro", readOnly=True))
    assert status == 202, later
    read = server.run(later["id"], "cat /mnt/data/agent/a/note; touch /ro/x 2>&1; ls /ro/agent/a")
    lines = read.stdout.splitlines()
    assert lines[0] == "kept" and "Read-only file system" in lines[1] and lines[2] == "note", read
    assert not (on_node / "x").exists()
    delete(server, later["id"])


@up_to_a_build
def test_delete_on_termination_removes_the_claim_after_its_last_user(
    server: SandgateServer, client: Client
) -> None:
    status, maker = create(server, pvc("scratch", deleteOnSandboxTermination=True))
    assert status == 202, maker
    status, sharer = create(server, pvc("scratch", createIfNotExists=False))
    assert status == 202, sharer
    server.run(maker["id"], "echo shared > /mnt/data/f")
    assert server.run(sharer["id"], "cat /mnt/data/f").stdout.strip() == "shared"
    made = claim(client, "scratch")
    assert made is not None and made.spec is not None and made.spec.resources is not None
    assert made.spec.resources.requests == {"storage": str(64 << 20)}  # volume_default_size
    on_node = volume_dir(client, "scratch")
    delete(server, maker["id"])
    kept = claim(client, "scratch")  # the second sandbox still uses it: not even being deleted
    assert kept is not None and kept.metadata is not None and kept.metadata.deletionTimestamp is None
    delete(server, sharer["id"])
    # deleted now; the API server lets it go once its protection finalizer sees no Pod use it,
    # and the Delete reclaim policy then removes the volume's directory
    deadline = time.monotonic() + BOUND_TIMEOUT
    while (claim(client, "scratch") is not None or on_node.exists()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert claim(client, "scratch") is None and not on_node.exists()


@up_to_a_build
def test_bad_claims_are_refused_and_change_nothing(server: SandgateServer, client: Client) -> None:
    foreign = PersistentVolumeClaim(
        metadata=ObjectMeta(name="not-offered", namespace=NAMESPACE),
        spec=PersistentVolumeClaimSpec(
            accessModes=["ReadWriteOnce"], resources=VolumeResourceRequirements(requests={"storage": "16Mi"})
        ),
    )
    client.create(foreign)
    status, solo = create(server, pvc("solo", accessModes=["ReadWriteOncePod"]))
    assert status == 202, solo
    claims_before = sorted(c.metadata.name for c in client.list(PersistentVolumeClaim, namespace=NAMESPACE))
    pods_before = sandbox_pods(client)
    for volume, code, says in [
        (pvc("never-made", createIfNotExists=False), 404, "do not exist"),
        (pvc("not-offered"), 409, "not offered to sandboxes"),
        (pvc("solo"), 409, "ReadWriteOncePod"),
        (pvc("ok", subPath="../x"), 400, "without '..'"),
        (pvc("ok", accessModes=["Everything"]), 400, "accessModes"),
    ]:
        answer_status, answer = create(server, volume)
        assert answer_status == code and says in answer["message"], answer
    assert (
        sorted(c.metadata.name for c in client.list(PersistentVolumeClaim, namespace=NAMESPACE))
        == claims_before
    )
    assert sandbox_pods(client) == pods_before
    delete(server, solo["id"])
