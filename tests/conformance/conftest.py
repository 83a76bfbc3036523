"""One real `sandgate serve` (local runtime) and one test internet for this package's tests.

Package scope, not session: the internet's addresses are fixed (198.51.100.0/24), so it must be
gone before another package (tests/docker, tests/adversarial) builds its own in the same
namespace; otherwise their traffic would reach this one's origins, signed by another test CA.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandgate.lifecycle.images import ImageStore
from tests.docker.conftest import load_image_builder
from tests.support.internet import DNS_ADDR, ORIGIN_V4, Internet, start_internet
from tests.support.server import SandgateServer, sandgate_server

API_HOST = "api.example.com"
PATCHED_HOST = "new.example.com"  # resolvable, allowed only once a test patches it in


@pytest.fixture(scope="package")
def internet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Internet]:
    with start_internet(tmp_path_factory.mktemp("internet")) as net:
        net.set_names({API_HOST: [ORIGIN_V4], PATCHED_HOST: [ORIGIN_V4]})
        yield net


def upstream(internet: Internet) -> dict[str, str]:
    return {"SANDGATE_UPSTREAM_DNS": json.dumps([DNS_ADDR]), "SANDGATE_UPSTREAM_CA": str(internet.ca_cert)}


@pytest.fixture(scope="package")
def server(tmp_path_factory: pytest.TempPathFactory, internet: Internet) -> Iterator[SandgateServer]:
    # A key that starts with '-' (token_urlsafe gives one in 64): every client must take it as a value.
    key = "-" + secrets.token_urlsafe(16)
    with sandgate_server(
        Path(tmp_path_factory.mktemp("sandgate")), upstream(internet), api_key=key
    ) as running:
        yield running


@pytest.fixture(scope="package")
def direct_execd_server(
    tmp_path_factory: pytest.TempPathFactory, internet: Internet
) -> Iterator[SandgateServer]:
    """A server that hands out each sandbox's own execd address (`execd_endpoint = "direct"`):
    a client's direct mode then talks to execd itself, not through the host's reverse proxy."""
    extra = {**upstream(internet), "SANDGATE_EXECD_ENDPOINT": "direct"}
    with sandgate_server(Path(tmp_path_factory.mktemp("sandgate-direct")), extra) as running:
        yield running


def set_policy(server: SandgateServer, sandbox_id: str, policy: dict[str, object] | str) -> None:
    with server.client() as client:
        answer = client.put(f"/v1/sandboxes/{sandbox_id}/egress/sandgate-policy", json={"policy": policy})
    assert answer.status_code == 200, answer.text


def curl_status(server: SandgateServer, sandbox_id: str, curl_args: str) -> str:
    """The HTTP status curl gets inside the sandbox ("000" when it got no answer at all)."""
    command = f"curl -sS --max-time 15 -o /dev/null -w '%{{http_code}}' {curl_args}"
    return server.run(sandbox_id, command, timeout=60).stdout.strip()


@contextlib.contextmanager
def sandbox_meeting_the_proxy_ca(server: SandgateServer, **create: object) -> Iterator[str]:
    """A sandbox (created with `create`) that may reach API_HOST only, with TLS intercepted so
    its HTTP clients meet the proxy's CA; deleted after."""
    sandbox_id = server.create_sandbox(**create)["id"]
    try:
        egress = [{"action": "allow", "target": API_HOST, "inspect": "always"}]
        set_policy(server, sandbox_id, {"version": 1, "defaultAction": "deny", "egress": egress})
        yield sandbox_id
    finally:
        with server.client() as api:
            api.delete(f"/v1/sandboxes/{sandbox_id}")


CODE_INTERPRETER_IMAGE = "opensandbox/code-interpreter:v1.1.0"


@pytest.fixture(scope="module")
def code_interpreter(server: SandgateServer, request: pytest.FixtureRequest) -> str:
    """The code-interpreter image (sandbox-images/build.py) in the server's local store, from the
    build cache or built once (several minutes on a loaded 2-core machine)."""
    builder = load_image_builder()
    digest = builder.input_digest(builder.rootfs_entries())
    archive = builder.code_interpreter_archive(builder.DEFAULT_CACHE, digest)
    if not archive.exists():
        client = request.getfixturevalue("dockerd").client
        builder.build_images(client)
        builder.build_code_interpreter(client, digest)
    ImageStore(server.state_dir / "images").import_tarball(archive, CODE_INTERPRETER_IMAGE)
    return CODE_INTERPRETER_IMAGE
