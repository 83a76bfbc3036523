"""Images by name, as a user meets them: `osb sandbox create --image python:3.12` against a real
registry (Debian's docker-registry in its own namespace, tests/support/registry.py) named in
`registry_mirrors`; a private image with `ImageSpec.auth` through the OpenSandbox SDK; every bad
input answered with a 4xx that names the reference and the registry, and nothing left behind.
"""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
import time
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from opensandbox import SandboxSync
from opensandbox.config.connection_sync import ConnectionConfigSync
from opensandbox.models.sandboxes import SandboxImageAuth, SandboxImageSpec
from opensandbox_cli.main import cli

from sandgate.lifecycle.images import ImageNotFound, ImageStore
from sandgate.lifecycle.registry import Platform, RegistryConfig
from tests.images.conftest import PULL_TIMEOUT
from tests.support.registry import OciLayout, Registry, tar_layer, tools_layer
from tests.support.server import SandgateServer

pytestmark = pytest.mark.root


def osb(server: SandgateServer, *args: str) -> str:
    argv = ["--no-color", "--config", "/dev/null/none.toml", *args]
    result = CliRunner().invoke(cli, argv, env=server.env(), catch_exceptions=False)
    assert result.exit_code == 0, f"osb {' '.join(args)}: {result.exit_code}\n{result.output}"
    return result.output


def create_error(server: SandgateServer, image: dict[str, object], **fields: object) -> httpx.Response:
    body = {"image": image, "entrypoint": ["sleep", "infinity"], "resourceLimits": {}, **fields}
    with server.client(timeout=60) as client:
        return client.post("/v1/sandboxes", json=body)


def store_state(server: SandgateServer) -> tuple[set[str], set[str]]:
    """(image records, unpacked layers) in the server's store."""
    images = server.state_dir / "images"
    records = {path.read_text() for path in images.glob("*/image.json")}
    layers = {path.name for path in (images / "layers").glob("*")} if (images / "layers").is_dir() else set()
    return records, layers


def test_osb_creates_python_3_12_and_runs_python(server: SandgateServer) -> None:
    """The guide's first session: the image comes from the mirror, `python` is the image's own."""
    created = json.loads(
        osb(server, "sandbox", "create", "--image", "python:3.12", "--timeout", "30m", "-o", "json")
    )
    sandbox_id = created["id"]
    out = osb(server, "command", "run", sandbox_id, "-o", "raw", "--", "python", "-c", "print(1 + 1)")
    assert out.strip() == "2"
    which = server.run(sandbox_id, "command -v python; python -c 'import sys; print(sys.prefix)'")
    assert which.stdout.split() == ["/usr/local/bin/python", "/usr/local"]
    names = [
        json.loads(path.read_text())["name"] for path in (server.state_dir / "images").glob("*/image.json")
    ]
    assert "docker.io/library/python:3.12" in names
    with server.client() as client:
        assert client.delete(f"/v1/sandboxes/{sandbox_id}").status_code == 204


def test_private_image_with_image_auth_through_the_sdk(server: SandgateServer, registry: Registry) -> None:
    """ImageSpec.auth reaches the pull; the password is in no log, state file, argv or sandbox."""
    connection = ConnectionConfigSync(
        domain=server.domain, api_key=server.api_key, protocol="http",
        request_timeout=timedelta(seconds=60), disable_metrics=True,
    )  # fmt: skip
    image = SandboxImageSpec(
        f"{registry.private}/team/agent:1.4",
        auth=SandboxImageAuth(username=registry.username, password=registry.password),
    )
    sandbox = SandboxSync.create(
        image,
        entrypoint=["sleep", "infinity"],
        connection_config=connection,
        ready_timeout=timedelta(seconds=30),
    )
    try:
        execution = sandbox.commands.run("cat /etc/sandgate-test; env; cat /proc/1/cmdline")
        output = "".join(m.text for m in execution.logs.stdout)
        assert "private image" in output
        assert registry.password not in output
        leaked = subprocess.run(
            ["grep", "-rl", "--", registry.password, str(server.state_dir), str(server.log_path)],
            capture_output=True, text=True,
        )  # fmt: skip
        assert leaked.stdout == "", f"the registry password is in {leaked.stdout}"
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                assert registry.password.encode() not in cmdline.read_bytes()
            except OSError:
                continue
    finally:
        sandbox.kill()


@pytest.mark.parametrize(
    ("image", "status", "words"),
    [
        (
            {"uri": "{open}/team/nowhere:1.0"},
            400,
            ["{open}/team/nowhere:1.0", "not found", "registry {open}"],
        ),
        ({"uri": "{private}/team/other:1.0"}, 400, ["registry {private}", "wants credentials"]),
        (
            {"uri": "{private}/team/other:1.0", "auth": {"username": "puller", "password": "wrong-password"}},
            400,
            ["refused the credentials of user 'puller'", "{private}"],
        ),
        ({"uri": "{open}/team/arm-only:1.0"}, 400, ["linux/amd64", "{open}/team/arm-only:1.0"]),
        ({"uri": "{silent}/team/other:1.0"}, 503, ["{silent}"]),
        ({"uri": "Not A Reference"}, 400, ["Not A Reference"]),
    ],
    ids=[
        "unknown-tag",
        "no-credentials",
        "wrong-credentials",
        "platform-mismatch",
        "registry-hangs",
        "invalid",
    ],
)
def test_bad_images_are_answered_clearly_and_leave_nothing(
    server: SandgateServer, registry: Registry, image: dict[str, str], status: int, words: list[str]
) -> None:
    where = {"open": registry.open, "private": registry.private, "silent": registry.silent}
    image = {key: value.format(**where) if key == "uri" else value for key, value in image.items()}
    before = store_state(server)
    started = time.monotonic()
    response = create_error(server, image)
    assert time.monotonic() - started < PULL_TIMEOUT + 30
    assert response.status_code == status, response.text
    message = response.json()["message"]
    for word in words:
        assert word.format(**where) in message, message
    assert "wrong-password" not in message and "wrong-password" not in server.log()
    assert store_state(server) == before
    assert not list((server.state_dir / "images").glob(".pull-*"))


def test_platform_spec_picks_the_variant_from_the_index(
    server: SandgateServer, registry: Registry, tmp_path: Path
) -> None:
    """The host's variant of a multi-arch index runs; PlatformSpec arm64 picks the arm64 manifest
    in the store, and a create for a platform the host cannot run is a 400 saying so."""
    uri = f"{registry.open}/team/multi:1.0"
    sandbox = server.create_sandbox(image={"uri": uri}, platform={"os": "linux", "arch": "amd64"})
    assert server.run(sandbox["id"], "cat /etc/arch").stdout == "amd64"
    response = create_error(server, {"uri": uri}, platform={"os": "linux", "arch": "arm64"})
    assert response.status_code == 400
    assert "platform linux/arm64 was asked for; this host runs linux/amd64" in response.text
    mirrored = RegistryConfig(mirrors=(registry.mirror,), mirror_only=True)
    store = ImageStore(tmp_path / "images", registry=mirrored)
    image = store.pull(uri, platform=Platform("linux", "arm64"))
    assert image.platform == "linux/arm64"
    assert (store.lowers(image)[0] / "etc/arch").read_text() == "arm64"


def test_digest_mismatch_is_refused_and_nothing_kept(server: SandgateServer, registry: Registry) -> None:
    layout = OciLayout(registry.workdir / "corrupt")
    descriptor = layout.image([tools_layer(), tar_layer({"etc/corrupt": b"the original bytes\n"})])
    layout.tag("corrupt", descriptor)
    registry.push(layout, "corrupt", "team/corrupt:1.0")
    manifest = json.loads((layout.path / "blobs/sha256" / str(descriptor["digest"])[7:]).read_bytes())
    blob = registry.blob_file(manifest["layers"][1]["digest"])
    blob.write_bytes(blob.read_bytes()[:-8] + b"tampered")
    before = store_state(server)
    response = create_error(server, {"uri": f"{registry.open}/team/corrupt:1.0"})
    assert response.status_code in (400, 503), response.text
    assert "digest" in response.json()["message"]
    assert store_state(server) == before


def test_concurrent_creates_of_one_image_pull_it_once(server: SandgateServer, registry: Registry) -> None:
    layout = OciLayout(registry.workdir / "once")
    layout.tag("once", layout.image([tools_layer(), tar_layer({"etc/once": b"1\n"})]))
    registry.push(layout, "once", "team/once:1.0")
    log = registry.workdir / "registry.log"
    mark = log.stat().st_size

    uri = {"uri": f"{registry.open}/team/once:1.0"}
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        created = list(pool.map(lambda _: server.create_sandbox(image=uri), range(3)))
    assert len({box["id"] for box in created}) == 3
    with log.open("rb") as handle:
        handle.seek(mark)
        requests = handle.read().decode(errors="replace")
    manifest_gets = [line for line in requests.splitlines() if "GET /v2/team/once/manifests/1.0" in line]
    assert len(manifest_gets) == 1, manifest_gets  # the registry's access log: one line per request


def test_an_image_whose_layer_escapes_is_refused_and_nothing_kept(
    server: SandgateServer, registry: Registry
) -> None:
    layout = OciLayout(registry.workdir / "escape")
    layout.tag("escape", layout.image([tools_layer(), tar_layer({"../../etc/sandgate-escaped": b"out\n"})]))
    registry.push(layout, "escape", "team/escape:1.0")
    before = store_state(server)
    response = create_error(server, {"uri": f"{registry.open}/team/escape:1.0"})
    assert response.status_code == 400, response.text
    assert "climbs out with '..'; refused" in response.json()["message"]
    assert f"{registry.open}/team/escape:1.0" in response.json()["message"]
    assert store_state(server) == before
    assert not Path("/etc/sandgate-escaped").exists()


def test_pull_policies(registry: Registry, tmp_path: Path) -> None:
    """never: the store only; if-not-present: one fetch; always: the manifest each time, the
    unpacked layers reused (the same directory)."""
    uri = f"{registry.open}/team/multi:1.0"
    log = registry.workdir / "registry.log"

    def manifest_gets() -> int:
        return log.read_text(errors="replace").count("GET /v2/team/multi/manifests/1.0")

    config = RegistryConfig(insecure=(registry.open,))
    never = ImageStore(tmp_path / "never", registry=config, pull_policy="never")
    with pytest.raises(ImageNotFound):
        never.ensure(uri)
    assert not list((tmp_path / "never").glob("*/image.json"))
    lazy = ImageStore(tmp_path / "lazy", registry=config)
    first = manifest_gets()
    lazy.ensure(uri)
    lazy.ensure(uri)
    assert manifest_gets() == first + 1
    eager = ImageStore(tmp_path / "lazy", registry=config, pull_policy="always")
    layer = eager.lowers(eager.get(uri))[0]
    inode = layer.stat().st_ino
    eager.ensure(uri)
    assert manifest_gets() == first + 2
    assert layer.stat().st_ino == inode


def test_a_pull_does_not_open_the_registry_to_the_sandbox(server: SandgateServer, registry: Registry) -> None:
    """Pulls are the control plane's traffic: a sandbox from the pulled image, under the default
    deny-all policy, cannot reach the registry it came from; the registry's log shows nothing."""
    sandbox = server.create_sandbox(image={"uri": "python:3.12"})
    log = registry.workdir / "registry.log"
    mark = log.stat().st_size
    probe = (
        "import urllib.request as u\n"
        f"try: u.urlopen('http://{registry.open}/v2/_catalog', timeout=5); print('reached')\n"
        "except Exception as e: print('refused', type(e).__name__)"
    )
    result = server.run(sandbox["id"], f'python -c "{probe}"')
    assert result.stdout.startswith("refused"), result
    with log.open("rb") as handle:
        handle.seek(mark)
        assert b"_catalog" not in handle.read()
