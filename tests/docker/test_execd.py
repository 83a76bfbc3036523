"""execd in a real sandbox, reached from the host at <sandbox address>:44772 through the real
OpenSandbox SDK; the same scenarios on every runtime."""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest
from opensandbox.config.connection_sync import ConnectionConfigSync
from opensandbox.models.sandboxes import SandboxEndpoint
from opensandbox.sync.adapters.command_adapter import CommandsAdapterSync

from sandgate.lifecycle.runtime.base import EXECD_PORT
from sandgate.proxy import ensure_ca
from tests.runtime.harness import Harness, Listeners

pytestmark = pytest.mark.root

TOKEN = "-execd-test-token"  # a leading dash, as secrets.token_urlsafe gives one time in 64
CA_VARIABLES = [
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
    "CURL_CA_BUNDLE",
    "AWS_CA_BUNDLE",
]


def sdk_commands(address: str) -> CommandsAdapterSync:
    endpoint = f"{address}:{EXECD_PORT}"
    config = ConnectionConfigSync(domain=endpoint, request_timeout=timedelta(seconds=60))
    return CommandsAdapterSync(
        config, SandboxEndpoint(endpoint=endpoint, headers={"X-EXECD-ACCESS-TOKEN": TOKEN})
    )


def test_execd_is_ready_and_runs_commands_through_the_sdk(sandboxes: Harness, listeners: Listeners) -> None:
    _, net = sandboxes.start(["sleep", "3600"], execd_token=TOKEN)
    assert httpx.get(f"http://{net.address}:{EXECD_PORT}/ping", timeout=5).status_code == 200
    refused = httpx.post(f"http://{net.address}:{EXECD_PORT}/command", json={"command": "true"}, timeout=5)
    assert refused.status_code == 401  # the token is required
    commands = sdk_commands(net.address)
    hello = commands.run("echo hello; echo oops >&2")
    assert hello.exit_code == 0
    assert [m.text for m in hello.logs.stdout] == ["hello"] and [m.text for m in hello.logs.stderr] == [
        "oops"
    ]
    assert commands.run("exit 7").exit_code == 7
    six_by_seven = commands.run(["python3", "-c", "print(6 * 7)"])
    assert [m.text for m in six_by_seven.logs.stdout] == ["42"]


def test_the_proxy_ca_is_trusted_inside(
    sandboxes: Harness, listeners: Listeners, tmp_path_factory: pytest.TempPathFactory
) -> None:
    ca = ensure_ca(tmp_path_factory.mktemp("ca"))
    pem = ca.cert.read_text().strip()
    _, net = sandboxes.start(["sleep", "3600"], execd_token=TOKEN, ca_cert=ca.cert)
    commands = sdk_commands(net.address)
    for variable in CA_VARIABLES:
        bundle = commands.run(f'cat "${variable}"')
        assert bundle.exit_code == 0, (variable, bundle.logs.stderr)
        assert pem in "\n".join(m.text for m in bundle.logs.stdout), f"{variable} does not hold the proxy CA"
    # Python's default context (what requests, httpx and pip build on) loads it too.
    subjects = commands.run(
        [
            "python3",
            "-c",
            "import ssl; print(repr([c['subject'] for c in ssl.create_default_context().get_ca_certs()]))",
        ]
    )
    assert "sandgate egress CA" in "".join(m.text for m in subjects.logs.stdout)
