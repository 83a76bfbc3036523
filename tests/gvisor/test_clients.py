"""The OpenSandbox clients' conformance scenarios (tests/conformance/scenarios.py), unchanged, on
gvisor sandboxes: every client on the local runtime, the Python SDK and osb on Docker too (the engine's
sandgate-runsc runtime). Like tests/docker/test_conformance.py, with SANDGATE_ISOLATION=gvisor."""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conformance.clients import CLIENTS
from tests.conformance.conftest import API_HOST
from tests.conformance.scenarios import SCENARIOS, Result, check
from tests.support.internet import DNS_ADDR, ORIGIN_V4, Internet, start_internet
from tests.support.server import SandgateServer, sandgate_server

pytestmark = pytest.mark.root

# (runtime, client, mode): every client through the server's proxy, the SDK's direct mode too,
# and the SDK and osb on Docker; enough to prove the guarantees without the whole matrix twice.
RUNS = [
    ("local", "python", "direct"),
    ("local", "python", "server_proxy"),
    ("local", "js", "server_proxy"),
    ("local", "osb", "server_proxy"),
    ("local", "mcp", "server_proxy"),
    ("docker", "python", "server_proxy"),
    ("docker", "osb", "server_proxy"),
]


@pytest.fixture(scope="module")
def internet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Internet]:
    with start_internet(tmp_path_factory.mktemp("internet")) as net:
        net.set_names({API_HOST: [ORIGIN_V4]})
        yield net


@pytest.fixture(scope="module")
def gvisor_servers(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, internet: Internet
) -> Iterator[Callable[[str], SandgateServer]]:
    """A gvisor server per runtime, started on first use."""
    with contextlib.ExitStack() as stack:

        @functools.cache
        def server(runtime: str) -> SandgateServer:
            extra = {
                "SANDGATE_ISOLATION": "gvisor",
                "SANDGATE_UPSTREAM_DNS": json.dumps([DNS_ADDR]),
                "SANDGATE_UPSTREAM_CA": str(internet.ca_cert),
            }
            if runtime == "docker":
                request.getfixturevalue("sandbox_images")
                extra |= {
                    "SANDGATE_RUNTIME": "docker",
                    "SANDGATE_DOCKER_HOST": request.getfixturevalue("dockerd").url,
                }
            state = Path(tmp_path_factory.mktemp(f"sandgate-gvisor-{runtime}"))
            return stack.enter_context(sandgate_server(state, extra))

        yield server


@pytest.fixture(scope="module")
def results(gvisor_servers: Callable[[str], SandgateServer]) -> Callable[[str, str, str], dict[str, Result]]:
    """One client's results in one mode on one runtime, run once on first use."""
    return functools.cache(lambda runtime, client, mode: CLIENTS[client](gvisor_servers(runtime), mode))


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize(("runtime", "client", "mode"), RUNS)
def test_client_on_gvisor(
    results: Callable[[str, str, str], dict[str, Result]], runtime: str, client: str, mode: str, scenario: str
) -> None:
    check(client, lambda: results(runtime, client, mode), scenario)
