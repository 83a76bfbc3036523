"""Snapshots on the local runtime, through the spec's routes: a sandbox's files (a new file, a
changed one, a deleted one) become a layer on its image; a sandbox created with `snapshotId`
sees exactly them; snapshots are listed, survive a server restart, and are deleted with their
layer.
"""

from __future__ import annotations

import pytest

from tests.support.registry import Registry
from tests.support.server import SandgateServer

pytestmark = pytest.mark.root


@pytest.mark.parametrize("image", ["{open}/team/multi:1.0", "sandgate/host"])
def test_a_snapshot_round_trips_and_survives_a_restart(
    server: SandgateServer, registry: Registry, image: str
) -> None:
    source = server.create_sandbox(image={"uri": image.format(open=registry.open)})["id"]
    changes = "echo kept > /workspace/note.txt && echo changed > /etc/motd && rm -f /etc/arch /etc/hostname"
    assert server.run(source, changes).exit_code == 0
    with server.client() as client:
        taken = client.post(f"/v1/sandboxes/{source}/snapshots", json={"name": "after-setup"})
        assert taken.status_code == 202, taken.text
        snapshot = taken.json()
        assert snapshot["sandboxId"] == source and snapshot["status"]["state"] == "Ready"
        assert snapshot["name"] == "after-setup"
        client.delete(f"/v1/sandboxes/{source}")
    server.restart()
    with server.client() as client:
        listed = client.get("/v1/snapshots").json()["items"]
        assert snapshot["id"] in [item["id"] for item in listed]
    copy = server.create_sandbox(snapshotId=snapshot["id"], image=None)["id"]
    seen = server.run(copy, "cat /workspace/note.txt /etc/motd; ls /etc/arch /etc/hostname 2>&1 | wc -l")
    assert seen.stdout.split("\n") == ["kept", "changed", "2"]
    assert server.run(copy, "ls /etc/arch").exit_code != 0
    layers = server.state_dir / "images" / "layers"
    before = set(layers.iterdir())
    with server.client() as client:
        client.delete(f"/v1/sandboxes/{copy}")
        assert client.delete(f"/v1/snapshots/{snapshot['id']}").status_code == 204
        assert client.get(f"/v1/snapshots/{snapshot['id']}").status_code == 404
        missing = client.post(
            "/v1/sandboxes", json={"snapshotId": snapshot["id"], "entrypoint": ["sleep", "1"]}
        )
        assert missing.status_code == 400 and snapshot["id"] in missing.text
    assert len(before - set(layers.iterdir())) == 1  # the snapshot's own layer; the image's stay
