"""Images by name on the Docker runtime: dockerd pulls `python:3.12` from the test registry named in
`registry_mirrors` (tests/support/registry.py, reachable from the private dockerd's namespace),
and a sandbox from that image, which has no execd, runs commands through osb; a private image
pulls with `ImageSpec.auth` and a wrong password is a 400 saying so.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from opensandbox_cli.main import cli

from tests.support.dockerd import PrivateDockerd
from tests.support.registry import Registry
from tests.support.server import SandgateServer, sandgate_server

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def docker_server(
    tmp_path_factory: pytest.TempPathFactory, dockerd: PrivateDockerd, registry: Registry
) -> Iterator[SandgateServer]:
    assert dockerd.process is not None
    extra = {
        "SANDGATE_RUNTIME": "docker",
        "SANDGATE_DOCKER_HOST": dockerd.url,
        "SANDGATE_REGISTRY_MIRRORS": registry.mirror,
        "SANDGATE_REGISTRY_MIRROR_ONLY": "true",
        "SANDGATE_IMAGE_PULL_TIMEOUT": "60",
    }
    with (
        registry.reachable_from(dockerd.process.pid),
        sandgate_server(Path(tmp_path_factory.mktemp("sandgate-docker-images")), extra) as running,
    ):
        yield running


def osb(server: SandgateServer, *args: str) -> str:
    argv = ["--no-color", "--config", "/dev/null/none.toml", *args]
    result = CliRunner().invoke(cli, argv, env=server.env(), catch_exceptions=False)
    assert result.exit_code == 0, f"osb {' '.join(args)}: {result.exit_code}\n{result.output}"
    return result.output


def test_osb_creates_python_3_12_on_docker_and_runs_python(
    docker_server: SandgateServer, dockerd: PrivateDockerd
) -> None:
    created = json.loads(osb(docker_server, "sandbox", "create", "--image", "python:3.12", "-o", "json"))
    out = osb(
        docker_server, "command", "run", created["id"], "-o", "raw", "--", "python", "-c", "print(1 + 1)"
    )
    assert out.strip() == "2"
    assert "python:3.12" in [tag for image in dockerd.client.images.list() for tag in image.tags]
    which = docker_server.run(created["id"], "command -v python")
    assert which.stdout == "/usr/local/bin/python"


def test_private_image_on_docker_with_auth(docker_server: SandgateServer, registry: Registry) -> None:
    uri = f"{registry.private}/team/agent:1.4"
    with docker_server.client(timeout=90) as client:
        wrong = client.post(
            "/v1/sandboxes",
            json={"image": {"uri": uri, "auth": {"username": registry.username, "password": "not-it"}},
                  "entrypoint": ["sleep", "infinity"]},
        )  # fmt: skip
        assert wrong.status_code == 400, wrong.text
        assert "refused the credentials" in wrong.json()["message"] and "not-it" not in wrong.text
    sandbox = docker_server.create_sandbox(
        image={"uri": uri, "auth": {"username": registry.username, "password": registry.password}}
    )
    assert docker_server.run(sandbox["id"], "cat /etc/sandgate-test").stdout == "private image"
    assert registry.password not in docker_server.log()


def test_a_failing_entrypoint_on_docker_is_quoted(docker_server: SandgateServer) -> None:
    """A pulled image's entrypoint that exits non-zero (execd is the foreign launcher's): the
    create's error quotes its stderr and status, never the launcher."""
    failing = ["/bin/sh", "-c", "echo boom-on-stderr >&2; exit 3"]
    body = {"image": {"uri": "python:3.12"}, "entrypoint": failing}
    with docker_server.client(timeout=90) as client:
        failed = client.post("/v1/sandboxes", json=body)
    assert failed.status_code == 503, failed.text
    message = failed.json()["message"]
    assert "boom-on-stderr" in message and "the entrypoint /bin/sh exited with status 3" in message
    assert "Traceback" not in message and "posix_spawnp" not in message
