"""Fixtures the Kubernetes suites share; a module overrides any of them with its own (a cluster
of two nodes, or one that pulls from the test registry: `cluster_pulling_from`): a one-node
cluster and a client of its API server, the test internet routed to the cluster's node with
NODE_ZONE's names, and the node agent on it (serving.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from lightkube import Client, KubeConfig

from tests.kubernetes.cluster import Cluster, running_cluster
from tests.kubernetes.serving import NODE_ZONE, Agent, internet_for, node_agent
from tests.support.internet import Internet


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("cluster") / "state") as handle:
        yield handle


@pytest.fixture(scope="module")
def client(cluster: Cluster) -> Client:
    return Client(config=KubeConfig.from_file(cluster.kubeconfig))


@pytest.fixture(scope="module")
def internet(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Internet]:
    with internet_for(cluster, tmp_path_factory.mktemp("internet"), NODE_ZONE) as net:
        yield net


@pytest.fixture(scope="module")
def agent(cluster: Cluster, internet: Internet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    with node_agent(cluster, internet, tmp_path_factory.mktemp("node-agent")) as handle:
        yield handle
