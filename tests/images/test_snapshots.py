"""Snapshots on the local runtime, through the spec's routes: a sandbox's files (a new file, a
changed one, a deleted one) become a layer on its image; a sandbox created with `snapshotId`
sees exactly them; snapshots are listed (with the spec's filters and pages), survive a server
restart, and are deleted with their layer.
"""

from __future__ import annotations

import pytest
from opensandbox import SandboxManagerSync
from opensandbox.models.sandboxes import SnapshotFilter

from tests.conformance.test_sdk import connection
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


def test_the_snapshot_list_takes_the_specs_filters_and_pages(server: SandgateServer) -> None:
    """sandboxId, name, state (an open set: a state no snapshot is in matches nothing), page and
    pageSize, as the 1.1.1 SDK's SnapshotFilter sends them; before, every snapshot came back."""
    first, second = (server.create_sandbox()["id"] for _ in range(2))
    with server.client() as client:
        taken = [
            client.post(f"/v1/sandboxes/{sandbox}/snapshots", json={"name": name}).json()["id"]
            for sandbox, name in ((first, "one"), (first, "two"), (second, "one"))
        ]
    manager = SandboxManagerSync.create(connection(server))
    try:

        def listed(**options: object) -> list[str]:
            return [s.id for s in manager.list_snapshots(SnapshotFilter(**options)).snapshot_infos]

        assert sorted(listed(sandbox_id=first)) == sorted(taken[:2])
        assert listed(sandbox_id=first, name="one") == [taken[0]]
        assert sorted(listed(name="one")) == sorted([taken[0], taken[2]])
        assert sorted(listed(sandbox_id=second, states=["Creating", "ready"])) == [taken[2]]
        assert listed(states=["Failed", "Deleting"]) == []  # sandgate's snapshots are Ready at once
        paged = manager.list_snapshots(SnapshotFilter(sandbox_id=first, page_size=1, page=2))
        assert len(paged.snapshot_infos) == 1 and paged.snapshot_infos[0].id in taken[:2]
        assert (paged.pagination.total_items, paged.pagination.total_pages) == (2, 2)
        assert not paged.pagination.has_next_page
    finally:
        manager.close()
    with server.client() as client:
        unknown = client.get("/v1/snapshots", params={"state": ["Archived"], "sandboxId": first})
        assert unknown.status_code == 200 and unknown.json()["items"] == []
        assert client.get("/v1/snapshots", params={"pageSize": 0}).status_code == 422
        for snapshot in taken:
            assert client.delete(f"/v1/snapshots/{snapshot}").status_code == 204
