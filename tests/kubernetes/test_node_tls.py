"""HTTPS through the node proxy: a sandbox Pod trusts the CA its own node's proxy signs with.

Each node agent's proxy makes its CA on its node (the key never leaves it); the server reads the
certificate from the Pod's node agent (`GET /v1/ca`) and hands it to the Pod with execd's token.
Proven on the real one-node cluster through `sandgate serve --runtime kubernetes` with the node
agent (serving.py), in a Pod of `python:3.12` from the session's test registry, with the Pod's
own curl and the trust store the hand-over made: an intercepted HTTPS request verifies and
arrives at the origin with the injected credential (the origin's log), the same request checked
against the server's own proxy CA (what a Pod was handed before) fails verification and never
arrives, and a denied HTTPS host is refused by the policy (never at the origin).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator

import pytest
from lightkube import Client, KubeConfig

from sandgate.proxy.contract.names import CA_CERT
from tests.kubernetes.cluster import Cluster, skip_unless_built, up_to_a_build
from tests.kubernetes.serving import NODE_IP, Agent, bearer_policy, cluster_pulling_from, kubernetes_server
from tests.support.internet import Internet
from tests.support.registry import Registry
from tests.support.server import SandgateServer

pytestmark = pytest.mark.root
skip_unless_built()

IMAGE = "python:3.12"  # docker.io/library/python:3.12, from the test registry: curl and a bundle
SECRET = "sk-node-tls-" + secrets.token_hex(12)
POLICY = bearer_policy("node-tls-token", "https")
CURL_SSL_CACERT = 60  # curl: the peer's certificate cannot be verified with the known CAs


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, registry: Registry) -> Iterator[Cluster]:
    with cluster_pulling_from(registry, tmp_path_factory.mktemp("cluster") / "state") as handle:
        yield handle


@pytest.fixture(scope="module")
def server(
    cluster: Cluster, agent: Agent, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SandgateServer]:
    admin = Client(config=KubeConfig.from_file(cluster.kubeconfig))
    with kubernetes_server(cluster, admin, agent.agents, tmp_path_factory.mktemp("k8s-server")) as running:
        running.vault_put("node-tls-token", SECRET)
        yield running


def arrived(internet: Internet, path: str) -> list[dict[str, object]]:
    return [r for r in internet.origin_requests() if r.get("path") == path]


@up_to_a_build
def test_an_intercepted_https_request_verifies_against_the_nodes_ca(
    server: SandgateServer, agent: Agent, internet: Internet
) -> None:
    with server.client(timeout=300) as api:  # the node's first pull of the image
        created = api.post("/v1/sandboxes", json={"image": {"uri": IMAGE}, "entrypoint": ["sleep", "600"]})
        assert created.status_code == 202, created.text
        sandbox_id = created.json()["id"]
        try:
            answer = api.put(f"/v1/sandboxes/{sandbox_id}/egress/sandgate-policy", json={"policy": POLICY})
            assert answer.status_code == 200, answer.text

            allowed = server.run(sandbox_id, "curl -fsS https://api.example.com/echo/node-tls")
            assert allowed.exit_code == 0, f"{allowed}\n{agent.evidence()}"
            (request,) = arrived(internet, "/echo/node-tls")
            headers = request["headers"]
            assert isinstance(headers, dict) and headers["authorization"] == f"Bearer {SECRET}"
            assert str(request["client"]).startswith(f"{NODE_IP}:")
            assert SECRET not in allowed.stdout  # the echoed credential came back scrubbed

            handed = server.run(sandbox_id, "cat /run/sandgate/proxy-ca.crt")
            node_ca = (agent.state_dir / CA_CERT).read_text()
            assert handed.exit_code == 0 and handed.stdout.strip() == node_ca.strip(), handed

            server_ca = (server.state_dir / CA_CERT).read_text()
            against_the_servers_ca = server.run(  # what the Pod was handed before: it fails
                sandbox_id,
                f"cat > /tmp/server-ca.pem <<'PEM'\n{server_ca}PEM\n"
                "curl -fsS --cacert /tmp/server-ca.pem https://api.example.com/echo/unverified",
            )
            assert against_the_servers_ca.exit_code == CURL_SSL_CACERT, against_the_servers_ca
            assert arrived(internet, "/echo/unverified") == []

            denied = server.run(sandbox_id, "curl -fsS https://denied.example.com/echo/denied")
            assert denied.exit_code not in (0, CURL_SSL_CACERT), denied  # refused by the policy
            assert arrived(internet, "/echo/denied") == []
            node_audit = (agent.state_dir / "audit.jsonl").read_text().splitlines()
            assert any(
                "denied.example.com" in line and json.loads(line)["decision"] == "deny" for line in node_audit
            ), agent.evidence()
        finally:
            assert api.delete(f"/v1/sandboxes/{sandbox_id}").status_code == 204
