"""The OpenSandbox SDK conformance scenarios, unchanged, against `sandgate serve --runtime docker`.

The flows live in tests/conformance/test_sdk.py and the shared client scenario list in
tests/conformance/scenarios.py, run here by every client in both modes (the same drivers as on
the local runtime) with a server whose runtime is the private dockerd's, so both runtimes pass
the same scenarios.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conformance import test_sdk as sdk_scenarios
from tests.conformance.clients import CASES, results_once
from tests.conformance.conftest import API_HOST
from tests.conformance.scenarios import Result, check
from tests.conformance.test_examples import run_the_guides_example
from tests.conformance.test_image_layout import check_image
from tests.docker.conftest import load_image_builder
from tests.lifecycle.test_execd_token import check_execd_needs_the_sandboxs_token
from tests.support.dockerd import PrivateDockerd
from tests.support.internet import DNS_ADDR, ORIGIN_V4, Internet, start_internet
from tests.support.server import SandgateServer, sandgate_server

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def internet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Internet]:
    with start_internet(tmp_path_factory.mktemp("internet")) as net:
        net.set_names({API_HOST: [ORIGIN_V4]})
        yield net


@pytest.fixture(scope="module")
def docker_server(
    tmp_path_factory: pytest.TempPathFactory, internet: Internet, dockerd: PrivateDockerd, sandbox_images: str
) -> Iterator[SandgateServer]:
    extra = {
        "SANDGATE_RUNTIME": "docker",
        "SANDGATE_DOCKER_HOST": dockerd.url,
        "SANDGATE_UPSTREAM_DNS": json.dumps([DNS_ADDR]),
        "SANDGATE_UPSTREAM_CA": str(internet.ca_cert),
    }
    with sandgate_server(Path(tmp_path_factory.mktemp("sandgate-docker")), extra) as running:
        yield running


def test_sdk_create_run_files_egress_vault_kill_on_docker(docker_server: SandgateServer) -> None:
    sdk_scenarios.test_sdk_create_run_files_egress_vault_kill(docker_server)


def test_sdk_through_server_proxy_on_docker(docker_server: SandgateServer) -> None:
    sdk_scenarios.test_sdk_through_server_proxy(docker_server)


@pytest.mark.timeout(1800)  # it may build the image (several minutes on a loaded 2-core machine)
def test_the_guides_code_interpreter_example_on_docker(
    docker_server: SandgateServer, dockerd: PrivateDockerd, sandbox_images: str
) -> None:
    """opensandbox/code-interpreter:v1.1.0 in the private dockerd (loaded from the build cache or
    built), then the guide's example verbatim, as on the local runtime."""
    load_image_builder().build_code_interpreter(dockerd.client, sandbox_images)
    run_the_guides_example(docker_server)


@pytest.mark.timeout(1800)  # it may build the image
def test_the_images_have_the_standard_layout_on_docker(
    docker_server: SandgateServer, dockerd: PrivateDockerd, sandbox_images: str
) -> None:
    """sandgate/host (the base image on Docker) and the code-interpreter image, each with a
    read-only root: /var/tmp is a tmpfs like /tmp."""
    load_image_builder().build_code_interpreter(dockerd.client, sandbox_images)
    check_image(docker_server, "sandgate/host", ["sleep", "infinity"])
    check_image(
        docker_server, "opensandbox/code-interpreter:v1.1.0", ["/opt/code-interpreter/code-interpreter.sh"]
    )


def test_execd_needs_the_sandboxs_token_on_docker(docker_server: SandgateServer) -> None:
    sandbox_id = docker_server.create_sandbox()["id"]
    check_execd_needs_the_sandboxs_token(docker_server, sandbox_id)


@pytest.fixture(scope="module")
def docker_results(docker_server: SandgateServer) -> Callable[[str, str], dict[str, Result]]:
    return results_once(docker_server)


@pytest.mark.parametrize(("client", "mode", "scenario"), CASES)
def test_client_scenarios_on_docker(
    docker_results: Callable[[str, str], dict[str, Result]], client: str, mode: str, scenario: str
) -> None:
    check(client, lambda: docker_results(client, mode), scenario)
