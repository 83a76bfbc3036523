"""A request on a keep-alive connection that has been idle about 5 s is answered on that same
connection, by every HTTP listener a client meets: the API (its execd host endpoint is on it),
execd itself inside a sandbox, the proxy's control socket (lifecycle's own client) and the node
agent's control API (`sandgate node-proxy`, the Kubernetes runtime's; the server's `NodeClient`).

5 s is what httpx (and uvicorn, by default) keep an idle connection: when the server closed at
5 s, a request sent as it closed was lost (`RemoteProtocolError: Server disconnected without
sending a response`), and a later one found the connection gone. Each idle interval runs on a
connection of its own, all at once; the wait is the idle interval itself, to a deadline.

The clients are the OpenSandbox SDK's own transport stack (its connection limits: idle
connections kept 30 s) with its retries off, so the server's behaviour alone is what is tested,
and for the control socket and the node agent httpx's own (as lifecycle's `ProxyControl` and
`NodeClient`) keeping idle connections 30 s.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from opensandbox.config.connection import ConnectionConfig
from opensandbox.transport.retry import RetryPolicy

from sandgate.lifecycle.node import API_PREFIX, read_token
from sandgate.proxy import control_socket
from tests.kubernetes.serving import AGENT_PORT, running_agent
from tests.support.server import SandgateServer

pytestmark = pytest.mark.root
IDLE_SECONDS = (4.9, 5.0, 5.1)

Transport = Callable[[], httpx.AsyncBaseTransport]


def sdk_transport(server: SandgateServer) -> Transport:
    config = ConnectionConfig(
        domain=server.domain,
        api_key=server.api_key,
        protocol="http",
        request_timeout=timedelta(seconds=30),
        disable_metrics=True,
        retry_policy=RetryPolicy.disabled(),
    )
    return config.new_owned_transport


def connection_of(response: httpx.Response) -> Any:
    """The connection (httpcore's network stream) that carried `response`."""
    return response.extensions["network_stream"]


async def after_idle(
    transport: Transport, base_url: str, idle: float, first: dict[str, Any], then: dict[str, Any]
) -> tuple[float, httpx.Response, bool]:
    """Send `first`, wait until the connection has been idle `idle` s, send `then` (no retry).
    Returns how long it really was idle, the answer, and whether the same connection carried it."""
    async with httpx.AsyncClient(transport=transport(), base_url=base_url, timeout=30) as client:
        warm = await client.request(**first)
        await warm.aread()
        idle_since = time.monotonic()
        await asyncio.sleep(max(0.0, idle_since + idle - time.monotonic()))
        sent_at = time.monotonic()
        answer = await client.request(**then)
        return sent_at - idle_since, answer, connection_of(answer) is connection_of(warm)


def check_every_idle(
    transport: Transport, base_url: str, first: dict[str, Any], then: dict[str, Any], status: int
) -> None:
    async def all_at_once() -> list[tuple[float, httpx.Response, bool]]:
        runs = (after_idle(transport, base_url, idle, first, then) for idle in IDLE_SECONDS)
        return await asyncio.gather(*runs)

    for idle, (waited, answer, same_connection) in zip(IDLE_SECONDS, asyncio.run(all_at_once()), strict=True):
        assert idle <= waited < idle + 1.0, (idle, waited)
        assert answer.status_code == status, (idle, answer.status_code, answer.text)
        assert same_connection, f"after {waited:.2f} s idle the server had closed the connection"


@pytest.fixture(scope="module")
def sandbox(server: SandgateServer) -> Iterator[str]:
    sandbox_id = server.create_sandbox()["id"]
    yield sandbox_id
    with server.client() as client:
        client.delete(f"/v1/sandboxes/{sandbox_id}")


def test_api_answers_a_post_after_5s_idle(server: SandgateServer) -> None:
    key = {"OPEN-SANDBOX-API-KEY": server.api_key}
    first = {"method": "GET", "url": "/v1/sandboxes", "headers": key}
    then = {"method": "POST", "url": "/v1/sandboxes", "headers": key, "json": {}}  # refused: no image
    check_every_idle(sdk_transport(server), server.base_url, first, then, 400)


def test_execd_host_endpoint_answers_after_5s_idle(server: SandgateServer, sandbox: str) -> None:
    with server.client() as client:
        endpoint = client.get(f"/v1/sandboxes/{sandbox}/endpoints/44772").json()
    ping = {"method": "GET", "url": "/ping", "headers": endpoint["headers"]}
    check_every_idle(sdk_transport(server), f"http://{endpoint['endpoint']}", ping, ping, 200)


def test_execd_in_the_sandbox_answers_after_5s_idle(direct_execd_server: SandgateServer) -> None:
    server = direct_execd_server
    sandbox_id = server.create_sandbox()["id"]
    try:
        with server.client() as client:
            endpoint = client.get(f"/v1/sandboxes/{sandbox_id}/endpoints/44772").json()
        assert endpoint["endpoint"].startswith(server.sandbox_address(sandbox_id)), endpoint
        ping = {"method": "GET", "url": "/ping", "headers": endpoint["headers"]}
        check_every_idle(sdk_transport(server), f"http://{endpoint['endpoint']}", ping, ping, 200)
    finally:
        with server.client() as client:
            client.delete(f"/v1/sandboxes/{sandbox_id}")


def test_proxy_control_socket_keeps_idle_connections_past_5s(server: SandgateServer) -> None:
    """lifecycle's `ProxyControl` (httpx defaults) drops a connection idle 5 s itself; the
    control socket keeps it longer, so a client that kept it 5 s too never races it."""
    socket_path = str(control_socket(server.state_dir))

    def keeping_30s() -> httpx.AsyncBaseTransport:
        return httpx.AsyncHTTPTransport(uds=socket_path, limits=httpx.Limits(keepalive_expiry=30))

    health = {"method": "GET", "url": "/health"}
    check_every_idle(keeping_30s, "http://proxy", health, health, 200)


def test_node_agent_keeps_idle_connections_past_5s(tmp_path: Path) -> None:
    """The node agent's control API (uvicorn, TLS and a token) in this test's own namespace, on
    loopback: the server's `NodeClient` (httpx defaults) keeps an idle connection 5 s itself."""
    with running_agent(None, "127.0.0.1", tmp_path / "ca.crt", tmp_path) as agent:
        trusted = ssl.create_default_context(cafile=str(agent.agents.ca_file))

        def keeping_30s() -> httpx.AsyncBaseTransport:
            return httpx.AsyncHTTPTransport(verify=trusted, limits=httpx.Limits(keepalive_expiry=30))

        token = {"authorization": f"Bearer {read_token(agent.agents.token_file)}"}
        health = {"method": "GET", "url": f"{API_PREFIX}/health", "headers": token}
        check_every_idle(keeping_30s, f"https://127.0.0.1:{AGENT_PORT}", health, health, 200)
