"""`pvc` volumes on the local and the Docker runtime, through a real `sandgate serve` and real
sandboxes: a file written by one sandbox is read by a later one, readOnly is enforced inside, a
claim made with deleteOnSandboxTermination is gone (from the state dir; from the engine's volume
list) once its last user ends, two sandboxes share a claim read-write, a write past a claim's size
fails inside the sandbox (its image seen on the host), and bad input is a 400 or 404 with nothing
created."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from opensandbox import SandboxSync
from opensandbox.models.sandboxes import PVC, Volume

from sandgate.lifecycle.kernel import mount_points
from sandgate.lifecycle.runtime.sandbox_disk import loop_devices
from tests.conformance.test_sdk import connection
from tests.support.server import SandgateServer, sandgate_server

pytestmark = pytest.mark.root


@dataclass
class Claims:
    """A server and where its claims live, seen from the host (never through sandgate)."""

    server: SandgateServer
    engine: Any = None  # the private dockerd's client on the Docker runtime

    def dir(self, name: str) -> Path | None:
        if self.engine is None:
            path = self.server.state_dir / "volumes" / name
            return path if path.exists() else None
        found = [v for v in self.engine.volumes.list() if v.name.endswith(f"-{name}")]
        return Path(found[0].attrs["Mountpoint"]) if found else None

    def image(self, name: str) -> Path:
        """The claim's size-capped filesystem image (runtime/claim_disks.py), on both runtimes."""
        return self.server.state_dir / "volume-disks" / f"{name}.img"

    def mounted(self, name: str) -> bool:
        """Whether the claim's filesystem is mounted or its loop device still attached."""
        where = self.dir(name)
        return bool(loop_devices(str(self.image(name)))) or str(where) in mount_points()

    def read(self, name: str, path: str) -> str | None:
        """A file of the claim, from the host: through its directory while its filesystem is
        mounted (or it has none), else from its image with debugfs, without mounting it."""
        where, image = self.dir(name), self.image(name)
        if where is not None and (self.mounted(name) or not image.exists()):
            return (where / path).read_text() if (where / path).exists() else None
        done = subprocess.run(["debugfs", "-R", f"cat /{path}", str(image)], capture_output=True, text=True)
        return None if "not found" in done.stderr else done.stdout

    def names(self) -> list[str]:
        if self.engine is None:
            return sorted(p.name for p in (self.server.state_dir / "volumes").glob("*"))
        return sorted(v.name for v in self.engine.volumes.list())


@pytest.fixture(scope="module", params=["local", "docker"])
def claims(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Claims]:
    env, engine = {"SANDGATE_PVC_VOLUMES": "true", "SANDGATE_VOLUME_DEFAULT_SIZE": "48Mi"}, None
    if request.param == "docker":
        request.getfixturevalue("sandbox_images")
        dockerd = request.getfixturevalue("dockerd")
        env |= {"SANDGATE_RUNTIME": "docker", "SANDGATE_DOCKER_HOST": dockerd.url}
        engine = dockerd.client
    with sandgate_server(tmp_path_factory.mktemp(f"pvc-{request.param}"), env) as running:
        yield Claims(running, engine)


def create(server: SandgateServer, *volumes: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    body = {"image": {"uri": "sandgate/host"}, "entrypoint": ["sleep", "infinity"], "volumes": list(volumes)}
    with server.client() as client:
        answer = client.post("/v1/sandboxes", json=body)
    return answer.status_code, answer.json()


def delete(server: SandgateServer, sandbox_id: str) -> None:
    with server.client() as client:
        assert client.delete(f"/v1/sandboxes/{sandbox_id}").status_code == 204


def pvc(claim: str, mount: str = "/mnt/data", **fields: Any) -> dict[str, Any]:
    pvc_fields = {
        key: fields.pop(key)
        for key in ("createIfNotExists", "deleteOnSandboxTermination", "storage")
        if key in fields
    }
    return {"name": "data", "pvc": {"claimName": claim, **pvc_fields}, "mountPath": mount, **fields}


def test_a_file_written_by_one_sandbox_is_read_by_a_later_one(claims: Claims) -> None:
    server = claims.server
    status, first = create(server, pvc("work", subPath="agent/a"))
    assert status == 202, first
    wrote = server.run(first["id"], "echo kept > /mnt/data/note && echo ok")
    assert wrote.stdout.strip() == "ok", wrote
    delete(server, first["id"])
    assert claims.read("work", "agent/a/note") == "kept\n"  # outlives its sandbox
    status, later = create(server, pvc("work", createIfNotExists=False), pvc("work", "/ro", readOnly=True))
    assert status == 202, later
    read = server.run(later["id"], "cat /mnt/data/agent/a/note; touch /ro/x 2>&1; ls /ro/agent/a")
    lines = read.stdout.splitlines()
    assert lines[0] == "kept" and "Read-only file system" in lines[1] and lines[2] == "note", read
    assert claims.read("work", "x") is None
    delete(server, later["id"])


def test_delete_on_termination_removes_the_claim_after_its_last_user(claims: Claims) -> None:
    server = claims.server
    status, maker = create(server, pvc("scratch", createIfNotExists=True, deleteOnSandboxTermination=True))
    assert status == 202, maker
    status, sharer = create(server, pvc("scratch", createIfNotExists=False))
    assert status == 202, sharer
    server.run(maker["id"], "echo shared > /mnt/data/f")
    assert server.run(sharer["id"], "cat /mnt/data/f").stdout.strip() == "shared"
    server.run(sharer["id"], "echo back > /mnt/data/g")  # both read-write at once: the backends share
    assert server.run(maker["id"], "cat /mnt/data/g").stdout.strip() == "back"
    claim = claims.dir("scratch")
    delete(server, maker["id"])
    assert claim is not None and (claim / "f").exists()  # the second sandbox still uses it
    delete(server, sharer["id"])
    assert claims.dir("scratch") is None and not claim.exists()


def test_a_write_past_the_claims_size_fails_inside_and_the_size_stays(claims: Claims) -> None:
    """pvc.storage caps the claim (the setting, 48Mi here, when a create names none); the cap
    holds for a later sandbox too, whose `storage` does not resize the claim."""
    server = claims.server
    status, first = create(server, pvc("capped", storage="32Mi"), pvc("plain", "/mnt/plain"))
    assert status == 202, first
    assert claims.image("capped").stat().st_size == 32 << 20
    assert claims.image("plain").stat().st_size == 48 << 20
    assert claims.mounted("capped")
    wrote = server.run(first["id"], "dd if=/dev/zero of=/mnt/data/big bs=1M count=40 2>&1; echo rc=$?")
    assert "No space left on device" in wrote.stdout and "rc=1" in wrote.stdout, wrote
    delete(server, first["id"])
    assert not claims.mounted("capped")  # no sandbox uses it: its filesystem is put away
    status, later = create(server, pvc("capped", storage="1Gi"))
    assert status == 202, later
    read = server.run(later["id"], "rm /mnt/data/big; dd if=/dev/zero of=/mnt/data/b bs=1M count=40 2>&1")
    assert "No space left on device" in read.stdout, read
    assert claims.image("capped").stat().st_size == 32 << 20
    delete(server, later["id"])


def test_a_claim_still_held_elsewhere_is_mounted_again_not_twice(claims: Claims) -> None:
    """A loop device that still backs a claim's image when the next sandbox comes (held here by
    an open fd, as a mount namespace that has not died yet would) is mounted again: a second
    device would put two superblocks on one image."""
    server = claims.server
    status, first = create(server, pvc("held"))
    assert status == 202, first
    server.run(first["id"], "echo one > /mnt/data/f")
    devices = list(loop_devices(str(claims.image("held"))))
    assert len(devices) == 1, devices
    holder = os.open(devices[0], os.O_RDONLY)
    try:
        delete(server, first["id"])
        status, later = create(server, pvc("held"))
        assert status == 202, later
        assert server.run(later["id"], "cat /mnt/data/f").stdout.strip() == "one"
        assert list(loop_devices(str(claims.image("held")))) == devices
        delete(server, later["id"])
    finally:
        os.close(holder)


def test_a_planted_symlink_never_leads_out_of_the_claim(claims: Claims) -> None:
    server = claims.server
    status, first = create(server, pvc("links"))
    assert status == 202, first
    server.run(first["id"], "ln -s / /mnt/data/out")
    delete(server, first["id"])
    status, answer = create(server, pvc("links", subPath="out/etc"))
    assert status == 400 and "symlinks are not followed" in answer["message"], answer


@pytest.mark.parametrize(
    ("volume", "status", "says"),
    [
        (pvc("Bad_Name"), 400, "DNS-1123 label"),
        (pvc("../etc"), 400, "DNS-1123 label"),
        (pvc("ok", subPath="../../etc"), 400, "without '..'"),
        (pvc("ok", subPath="/etc"), 400, "without '..'"),
        (pvc("never-made", createIfNotExists=False), 404, "do not exist"),
        (pvc("ok", storage="lots"), 400, "must be a size"),
        (pvc("ok", storage="8Mi"), 400, "below 16Mi"),
        (pvc("ok", "/usr/lib/x"), 400, "the target may not be /"),
        (pvc("ok", "/"), 400, "the target may not be /"),
    ],
)
def test_bad_claims_are_refused_and_create_nothing(
    claims: Claims, volume: dict[str, Any], status: int, says: str
) -> None:
    server = claims.server
    before = claims.names()
    answer_status, answer = create(server, volume)
    assert answer_status == status and says in answer["message"], answer
    assert claims.names() == before
    with server.client() as client:
        assert client.get("/v1/sandboxes").json()["items"] == []


def sdk_sandbox(server: SandgateServer, volume: Volume) -> SandboxSync:
    return SandboxSync.create(
        "sandgate/host",
        entrypoint=["sleep", "infinity"],
        volumes=[volume],
        connection_config=connection(server),
        ready_timeout=timedelta(seconds=60),
    )


def test_the_official_sdk_volume_and_pvc_models(claims: Claims) -> None:
    """OpenSandbox's 1.1.1 SDK (`Volume`, `PVC`): one sandbox writes, a later one reads it back
    read-only, and the claim made with delete_on_sandbox_termination goes with its maker."""
    made = PVC(claim_name="sdk-work", create_if_not_exists=True, delete_on_sandbox_termination=True)
    writer = sdk_sandbox(claims.server, Volume(name="w", pvc=made, mount_path="/mnt/w", sub_path="run-1"))
    try:
        wrote = writer.commands.run("echo from-the-sdk > /mnt/w/out && echo done")
        assert "".join(m.text for m in wrote.logs.stdout).strip() == "done"
    finally:
        writer.kill()
    kept = claims.dir("sdk-work")
    assert kept is None  # the writer made it and was its only user
    again = PVC(claim_name="sdk-keep")
    first = sdk_sandbox(claims.server, Volume(name="k", pvc=again, mount_path="/mnt/k"))
    try:
        first.commands.run("echo kept-by-the-sdk > /mnt/k/f")
    finally:
        first.kill()
    reader = sdk_sandbox(claims.server, Volume(name="k", pvc=again, mount_path="/mnt/k", read_only=True))
    try:
        read = reader.commands.run("cat /mnt/k/f; touch /mnt/k/g 2>&1; true")
        lines = [m.text.strip() for m in read.logs.stdout]
        assert lines[0] == "kept-by-the-sdk" and "Read-only file system" in lines[1], lines
    finally:
        reader.kill()
