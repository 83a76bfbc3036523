"""Each sandbox's execd requires the token the control plane made for it: clients get it in the
44772 endpoint's headers (an endpoint on the host by default, the sandbox's address when the
operator opts in), the reverse proxy adds it itself, it survives a restart, and it never shows
in the host's process list (with the local runtime, in no environment either)."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.audit import audit_records
from tests.support.server import SandgateServer, parse_execd_events, sandgate_server

pytestmark = pytest.mark.root
TOKEN_HEADER = "X-EXECD-ACCESS-TOKEN"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[SandgateServer]:
    with sandgate_server(tmp_path) as running:
        yield running


def execd_endpoint(server: SandgateServer, sandbox_id: str, **params: str) -> dict[str, object]:
    with server.client() as client:
        answer = client.get(f"/v1/sandboxes/{sandbox_id}/endpoints/44772", params=params)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def direct_command(endpoint: str, command: str, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(
        f"http://{endpoint}/command", json={"command": command}, headers=headers, timeout=30, trust_env=False
    )


def processes_showing(secret: str, parts: tuple[str, ...] = ("cmdline",)) -> list[str]:
    """Host processes whose argv (the process list anyone may read), or other `parts` of /proc,
    hold `secret`; sandbox processes included: the host sees them in its /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            for part in parts:
                with contextlib.suppress(OSError):
                    if secret.encode() in (entry / part).read_bytes():
                        found.append(f"{entry.name}/{part}")
    return found


def check_execd_needs_the_sandboxs_token(server: SandgateServer, sandbox_id: str) -> str:
    """The checks every runtime must pass; returns the endpoint's token."""
    found = execd_endpoint(server, sandbox_id)
    endpoint, headers = str(found["endpoint"]), dict(found["headers"])  # type: ignore[call-overload]
    token = headers[TOKEN_HEADER]
    assert token.startswith("sgx_")  # bound to the key that asked (api/auth.py rule 4)
    # By default the endpoint is the host's reverse proxy, opened by the token alone (what the
    # SDKs send in direct mode); the sandbox's own address wants the sandbox's own token, which
    # the bound one is not.
    assert endpoint == f"{server.domain}/v1/sandboxes/{sandbox_id}/proxy/44772"
    direct = f"{server.sandbox_address(sandbox_id)}:44772"

    assert httpx.get(f"http://{direct}/ping", timeout=10, trust_env=False).status_code == 200
    for address in (direct, endpoint):
        assert direct_command(address, "echo hi", {}).status_code == 401
        assert direct_command(address, "echo hi", {TOKEN_HEADER: "guess"}).status_code == 401
    assert direct_command(direct, "echo hi", headers).status_code == 401
    allowed = direct_command(endpoint, "echo hi; printenv EXECD_ACCESS_TOKEN SANDGATE_EXECD_TOKEN", headers)
    assert allowed.status_code == 200
    assert parse_execd_events(allowed.text).stdout == "hi"  # and neither variable is set

    # With the API key: the client knows no token, and a wrong one it sends is replaced.
    assert server.run(sandbox_id, "echo proxied").stdout == "proxied"
    with server.client() as client:
        answer = client.post(
            f"/v1/sandboxes/{sandbox_id}/proxy/44772/command",
            json={"command": "echo replaced"},
            headers={TOKEN_HEADER: "guess"},
        )
    assert parse_execd_events(answer.text).stdout == "replaced"
    assert "headers" not in execd_endpoint(server, sandbox_id, use_server_proxy="true")

    return token


def test_execd_needs_the_token_the_endpoint_gives_and_the_proxy_adds(server: SandgateServer) -> None:
    first = server.create_sandbox()["id"]
    second = server.create_sandbox()["id"]
    token = check_execd_needs_the_sandboxs_token(server, first)

    other = execd_endpoint(server, second)
    assert other["headers"] != {TOKEN_HEADER: token}  # one token per sandbox
    for address in (str(other["endpoint"]), f"{server.sandbox_address(second)}:44772"):
        assert direct_command(address, "true", {TOKEN_HEADER: token}).status_code == 401
    # the token opens its sandbox's execd through the host, no other port of it
    port_8000 = f"http://{server.domain}/v1/sandboxes/{first}/proxy/8000/"
    assert httpx.get(port_8000, headers={TOKEN_HEADER: token}, trust_env=False).status_code == 401


def test_direct_execd_endpoints_are_an_opt_in(tmp_path: Path) -> None:
    with sandgate_server(tmp_path, {"SANDGATE_EXECD_ENDPOINT": "direct"}) as direct_server:
        sandbox_id = direct_server.create_sandbox()["id"]
        found = execd_endpoint(direct_server, sandbox_id)
        assert found["endpoint"] == f"{direct_server.sandbox_address(sandbox_id)}:44772"
        own = dict(found["headers"])  # type: ignore[call-overload]
        assert not own[TOKEN_HEADER].startswith("sgx_")  # the sandbox's own: execd checks it
        answer = direct_command(str(found["endpoint"]), "echo direct", own)
        assert parse_execd_events(answer.text).stdout == "direct"
        # local: the sandbox's token is in no process list, not even in an environment
        assert processes_showing(own[TOKEN_HEADER], ("cmdline", "environ")) == []


def test_the_token_survives_a_restart(server: SandgateServer) -> None:
    sandbox_id = server.create_sandbox()["id"]
    before = execd_endpoint(server, sandbox_id)

    server.restart()

    assert execd_endpoint(server, sandbox_id) == before
    answer = direct_command(str(before["endpoint"]), "echo still", dict(before["headers"]))  # type: ignore[call-overload]
    assert parse_execd_events(answer.text).stdout == "still"
    assert server.run(sandbox_id, "echo proxied").stdout == "proxied"


def test_the_bootstrap_keys_endpoint_token_is_its_own_and_ends_with_it(server: SandgateServer) -> None:
    """A call with the endpoint token the bootstrap key was handed is recorded as the bootstrap
    admin's; once the server's key is replaced (a restart with a new one) the token opens nothing."""
    sandbox_id = server.create_sandbox()["id"]
    before = execd_endpoint(server, sandbox_id)
    endpoint, headers = str(before["endpoint"]), dict(before["headers"])  # type: ignore[call-overload]
    assert parse_execd_events(direct_command(endpoint, "echo mine", headers).text).stdout == "mine"
    commands = [r for r in audit_records(server.state_dir, sandbox_id) if r["kind"] == "command"]
    assert [r["principal"]["via"] for r in commands] == ["bootstrap"]

    server.api_key = secrets.token_urlsafe(16)
    server.restart()

    assert direct_command(endpoint, "echo stale", headers).status_code == 401
    after = execd_endpoint(server, sandbox_id)
    assert after["headers"] != before["headers"]
    fresh = direct_command(str(after["endpoint"]), "echo fresh", dict(after["headers"]))  # type: ignore[call-overload]
    assert parse_execd_events(fresh.text).stdout == "fresh"
