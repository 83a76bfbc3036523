"""Operator binds: host directories in every sandbox (the `binds` setting) and per create (the
OpenSandbox `volumes` with the `host` backend, under `volume_host_prefixes`), read-only or
read-write, on the local and the Docker runtime, through a real `sandgate serve`; and every
refusal a clear 400 naming the field (or, for the setting, a one-line refusal to start)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.server import SandgateServer, sandgate_server

pytestmark = pytest.mark.root


@pytest.fixture(scope="module", params=["local", "docker"])
def bound(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[SandgateServer, Path]]:
    """A server allowing host volumes under its temp dir (which also holds its state dir), with
    one operator bind in every sandbox."""
    tmp_path = tmp_path_factory.mktemp(f"binds-{request.param}")
    (tmp_path / "shared" / "rw").mkdir(parents=True)
    (tmp_path / "shared" / "ro").mkdir()
    (tmp_path / "shared" / "ro" / "given.txt").write_text("from the host")
    (tmp_path / "everywhere").mkdir()
    (tmp_path / "everywhere" / "note").write_text("for every sandbox")
    env = {
        "SANDGATE_BINDS": json.dumps([f"{tmp_path / 'everywhere'}:/opt/operator"]),
        "SANDGATE_VOLUME_HOST_PREFIXES": json.dumps([str(tmp_path)]),
    }
    if request.param == "docker":
        request.getfixturevalue("sandbox_images")
        env |= {"SANDGATE_RUNTIME": "docker", "SANDGATE_DOCKER_HOST": request.getfixturevalue("dockerd").url}
    with sandgate_server(tmp_path, env) as server:
        yield server, tmp_path


def create(server: SandgateServer, volumes: list[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
    body = {"image": {"uri": "sandgate/host"}, "entrypoint": ["sleep", "infinity"], "volumes": volumes}
    with server.client() as client:
        answer = client.post("/v1/sandboxes", json=body)
    return answer.status_code, answer.json()


def test_binds_and_host_volumes_read_only_and_read_write(bound: tuple[SandgateServer, Path]) -> None:
    server, root = bound
    status, created = create(
        server,
        [
            {"name": "work", "host": {"path": str(root / "shared")}, "subPath": "rw",
             "mountPath": "/mnt/work"},
            {"name": "given", "host": {"path": str(root / "shared" / "ro")}, "mountPath": "/mnt/given",
             "readOnly": True},
        ],
    )  # fmt: skip
    assert status == 202, created
    run = server.run(
        created["id"],
        "cat /mnt/given/given.txt; echo; echo made > /mnt/work/made.txt && echo wrote; "
        "touch /mnt/given/x 2>&1; cat /opt/operator/note; echo; touch /opt/operator/y 2>&1; true",
    )
    lines = run.stdout.splitlines()
    assert lines[:2] == ["from the host", "wrote"], run
    assert "Read-only file system" in lines[2] and "Read-only file system" in lines[4], run
    assert lines[3] == "for every sandbox"
    assert (root / "shared" / "rw" / "made.txt").read_text() == "made\n"
    assert not (root / "shared" / "ro" / "x").exists() and not (root / "everywhere" / "y").exists()


@pytest.mark.parametrize(
    ("volume", "field", "says"),
    [
        ({"name": "p", "ossfs": {"bucket": "b", "endpoint": "e"}, "mountPath": "/m"}, "volumes[0]",
         "`host` and `pvc` volumes"),
        ({"name": "p", "pvc": {"claimName": "c"}, "mountPath": "/m"}, "volumes[0].pvc", "pvc_volumes"),
        ({"name": "o", "host": {"path": "/var/tmp"}, "mountPath": "/m"}, "volumes[0].host.path",
         "not under volume_host_prefixes"),
        ({"name": "s", "host": {"path": "STATE"}, "mountPath": "/m"}, "volumes[0]",
         "which no sandbox may see"),
        ({"name": "r", "host": {"path": "ROOT"}, "mountPath": "m"}, "volumes[0].mountPath", "absolute path"),
        ({"name": "r", "host": {"path": "relative"}, "mountPath": "/m"}, "volumes[0].host.path", "absolute"),
        ({"name": "d", "host": {"path": "ROOT"}, "subPath": "../..", "mountPath": "/m"}, "volumes[0].subPath",
         "without '..'"),
        ({"name": "u", "host": {"path": "ROOT"}, "mountPath": "/usr/lib/x"}, "volumes[0]", "may not"),
    ],
)  # fmt: skip
def test_a_bad_volume_is_a_400_naming_the_field(
    bound: tuple[SandgateServer, Path], volume: dict[str, Any], field: str, says: str
) -> None:
    server, root = bound
    text = json.dumps(volume).replace("STATE", str(server.state_dir)).replace("ROOT", str(root / "shared"))
    status, answer = create(server, [json.loads(text)])
    assert status == 400, answer
    assert answer["message"].startswith(field) and says in answer["message"], answer
    with server.client() as client:
        assert all(
            item["status"]["state"] == "Running" for item in client.get("/v1/sandboxes").json()["items"]
        )


def test_a_bind_setting_onto_the_state_dir_stops_the_start(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    env = {"SANDGATE_BINDS": json.dumps([f"{state_dir}:/mnt/state"])}
    with (
        pytest.raises(
            RuntimeError, match=r"setting `binds` \(SANDGATE_BINDS\): bind .* which no sandbox may see"
        ),
        sandgate_server(tmp_path, env),
    ):
        pass
