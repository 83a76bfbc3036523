"""The client scenarios (tests/conformance/scenarios.py) of the Python SDK, the JS SDK, `osb` and
the MCP server, unchanged, in direct and server-proxy mode, against `sandgate serve --runtime
kubernetes` with the node agent on the node (serving.py): the same drivers as on the local and
Docker runtimes, so every runtime passes the same scenarios. What the runtime cannot offer
(pause and resume) is skipped with the reason scenarios.py gives.

The sandboxes are Pods of `python:3.12`, which the node pulls from the session's test registry
only (a mirror for docker.io, as in test_runtime.py); one sandbox made first pulls it, so the
scenarios' creates meet a warm node within the clients' own timeouts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from lightkube import Client, KubeConfig
from lightkube.resources.core_v1 import Pod

from tests.conformance.clients import CASES, CLIENTS, results_once
from tests.conformance.conftest import API_HOST
from tests.conformance.scenarios import MODES, Result, check
from tests.kubernetes.cluster import Cluster, skip_unless_built, up_to_a_build
from tests.kubernetes.serving import (
    SANDBOX_NAMESPACE,
    Agent,
    cluster_pulling_from,
    internet_for,
    kubernetes_server,
)
from tests.support.internet import ORIGIN_V4, Internet
from tests.support.registry import Registry
from tests.support.server import SandgateServer

pytestmark = pytest.mark.root
skip_unless_built()

IMAGE = "python:3.12"  # docker.io/library/python:3.12, from the test registry


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, registry: Registry) -> Iterator[Cluster]:
    with cluster_pulling_from(registry, tmp_path_factory.mktemp("cluster") / "state") as handle:
        yield handle


# not conftest's `client`: this module's cases take `client` as a parameter (which client runs)
@pytest.fixture(scope="module")
def admin(cluster: Cluster) -> Client:
    return Client(config=KubeConfig.from_file(cluster.kubeconfig))


@pytest.fixture(scope="module")
def internet(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Internet]:
    with internet_for(cluster, tmp_path_factory.mktemp("internet"), {API_HOST: [ORIGIN_V4]}) as net:
        yield net


@pytest.fixture(scope="module")
def server(
    cluster: Cluster, admin: Client, agent: Agent, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SandgateServer]:
    with kubernetes_server(cluster, admin, agent.agents, tmp_path_factory.mktemp("k8s-server")) as running:
        running.sandbox_image = IMAGE
        with running.client(timeout=300) as api:  # the node's first pull of the image
            created = api.post("/v1/sandboxes", json={"image": {"uri": IMAGE}, "entrypoint": ["sleep", "60"]})
            assert created.status_code == 202, created.text
            assert api.delete(f"/v1/sandboxes/{created.json()['id']}").status_code == 204
        yield running


@pytest.fixture(scope="module")
def results(server: SandgateServer) -> Callable[[str, str], dict[str, Result]]:
    return results_once(server)


@up_to_a_build
@pytest.mark.parametrize(("client", "mode", "scenario"), CASES)
def test_client_scenarios_on_kubernetes(
    results: Callable[[str, str], dict[str, Result]], client: str, mode: str, scenario: str
) -> None:
    check(client, lambda: results(client, mode), scenario, runtime="kubernetes")


def test_every_scenario_pod_is_gone(admin: Client, results: Callable[[str, str], dict[str, Result]]) -> None:
    """After every client's `kill`, the API server holds no Pod of theirs (the warm-up's included)."""
    for client in CLIENTS:
        for mode in MODES:
            results(client, mode)
    assert [pod.metadata.name for pod in admin.list(Pod, namespace=SANDBOX_NAMESPACE) if pod.metadata] == []
