"""`sandgate serve --runtime kubernetes` on the one-node cluster, through the OpenSandbox SDK.

One cluster for the module (tests/kubernetes/cluster.py), whose node pulls docker.io images
from the session's test registry only (SANDGATE_CLUSTER_MIRROR and a route from the node's
namespace to the registry's), the execd image built from this checkout and imported, and one
real server. Proof from the other side: Pods, Secrets and their specs are read from the API
server with the cluster's admin client; what a command printed comes from execd in the Pod.
Until the node proxy lands, a sandbox Pod has no egress at all (the node drops Pod traffic
leaving it): nothing here needs any.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from lightkube import Client, KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Pod, Secret
from opensandbox import SandboxSync
from opensandbox.config.connection_sync import ConnectionConfigSync

from tests.conformance.test_osb_mcp import osb, osb_json
from tests.kubernetes.cluster import Cluster, run_script, running_cluster, skip_unless_built, up_to_a_build
from tests.support.registry import Registry
from tests.support.server import SANDGATE, SandgateServer, free_port, sandgate_server

pytestmark = pytest.mark.root
skip_unless_built()

NAMESPACE = "sandgate"
IMAGE = "python:3.12"  # docker.io/library/python:3.12, which the node gets from the test registry
GONE_TIMEOUT = 90.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, registry: Registry) -> Iterator[Cluster]:
    state_dir = tmp_path_factory.mktemp("cluster") / "state"
    with running_cluster(state_dir, SANDGATE_CLUSTER_MIRROR=registry.mirror) as handle:
        imported = run_script("execd-image.sh", state_dir, timeout=600, PYTHON=sys.executable)
        assert imported.returncode == 0, imported.stderr
        with registry.reachable_from(handle.pid("containerd")):
            yield handle


@pytest.fixture(scope="module")
def admin(cluster: Cluster) -> Client:
    client = Client(config=KubeConfig.from_file(cluster.kubeconfig))
    client.create(Namespace(metadata=ObjectMeta(name=NAMESPACE)))
    return client


def kubernetes_env(kubeconfig: Path) -> dict[str, str]:
    settings = {"kubeconfig": str(kubeconfig), "namespace": NAMESPACE}
    return {"SANDGATE_RUNTIME": "kubernetes", "SANDGATE_KUBERNETES": json.dumps(settings)}


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, cluster: Cluster, admin: Client
) -> Iterator[SandgateServer]:
    with sandgate_server(
        tmp_path_factory.mktemp("k8s-server"), kubernetes_env(cluster.kubeconfig)
    ) as running:
        yield running


def connection(server: SandgateServer) -> ConnectionConfigSync:
    return ConnectionConfigSync(
        domain=server.domain,
        api_key=server.api_key,
        protocol="http",
        request_timeout=timedelta(seconds=240),  # a create waits for the Pod: pull, execd copy
        disable_metrics=True,
    )


def create(server: SandgateServer, **options: object) -> SandboxSync:
    return SandboxSync.create(
        IMAGE,
        entrypoint=["sleep", "infinity"],
        connection_config=connection(server),
        ready_timeout=timedelta(seconds=240),
        **options,  # type: ignore[arg-type]
    )


def pod_of(admin: Client, sandbox_id: str) -> Pod | None:
    pods = admin.list(Pod, namespace=NAMESPACE, labels={"sandgate/sandbox": sandbox_id})
    found = list(pods)
    assert len(found) <= 1
    return found[0] if found else None


def wait_gone(admin: Client, sandbox_id: str) -> None:
    deadline = time.monotonic() + GONE_TIMEOUT
    while pod_of(admin, sandbox_id) is not None:
        assert time.monotonic() < deadline, f"the Pod of {sandbox_id} is still in the API server"
        time.sleep(0.2)


def stdout(execution: object) -> str:
    return "".join(message.text for message in execution.logs.stdout)  # type: ignore[attr-defined]


def execd_token(server: SandgateServer, sandbox_id: str) -> str:
    with sqlite3.connect(server.state_dir / "sandgate.db") as db:
        (record,) = db.execute("SELECT record FROM sandboxes WHERE id = ?", (sandbox_id,)).fetchone()
    return str(json.loads(record)["execd_token"])


@up_to_a_build
def test_a_sandbox_is_a_pod_that_runs_commands_and_files(server: SandgateServer, admin: Client) -> None:
    sandbox = create(server, metadata={"team": "evals"}, resource={"cpu": "500m", "memory": "256Mi"})
    try:
        pod = pod_of(admin, sandbox.id)
        assert pod is not None and pod.status is not None and pod.status.phase == "Running"
        assert pod.spec is not None
        (container,) = pod.spec.containers
        assert container.image == "docker.io/library/python:3.12"
        # the sandbox's resolver: one address the node agent redirects, no cluster DNS or search path
        assert pod.spec.dnsPolicy == "None" and pod.spec.dnsConfig is not None
        assert pod.spec.dnsConfig.nameservers == ["192.0.2.53"] and not pod.spec.dnsConfig.searches
        assert container.resources is not None and container.resources.limits == {
            "cpu": "500m",
            "memory": str(256 << 20),
        }
        assert json.loads((pod.metadata.annotations or {})["sandgate/metadata"]) == {"team": "evals"}

        execution = sandbox.commands.run("echo hello-from-$((40+2)) $(hostname)")
        assert execution.exit_code == 0
        assert stdout(execution).split() == ["hello-from-42", pod.metadata.name]  # the Pod's own name
        address = sandbox.commands.run(
            "python3 -c 'import socket; print(socket.gethostbyname(socket.gethostname()))'"
        )
        assert stdout(address).strip() == pod.status.podIP

        sandbox.files.write_file("/workspace/notes.txt", "written through the SDK")
        assert sandbox.files.read_file("/workspace/notes.txt") == "written through the SDK"
        listed = sandbox.commands.run("cat /workspace/notes.txt")
        assert stdout(listed) == "written through the SDK"
    finally:
        sandbox.kill()
        sandbox.close()
    wait_gone(admin, sandbox.id)
    with server.client() as client:
        assert client.get(f"/v1/sandboxes/{sandbox.id}").status_code == 404


@up_to_a_build
def test_the_execd_token_is_in_no_object_of_the_cluster(server: SandgateServer, admin: Client) -> None:
    sandbox = create(server)
    try:
        token = execd_token(server, sandbox.id)
        assert len(token) >= 20
        pod = pod_of(admin, sandbox.id)
        assert pod is not None
        assert token not in json.dumps(pod.to_dict())
        secrets = admin.list(Secret, namespace=NAMESPACE)
        assert all(token not in json.dumps(secret.to_dict()) for secret in secrets)
        # and execd does hold it: a request without it is refused, through the server's with it
        with server.client() as client:
            address = f"http://{pod.status.podIP}:44772"  # type: ignore[union-attr]
            assert client.get(f"{address}/files/info", params={"path": "/"}).status_code == 401
        assert sandbox.commands.run("true").exit_code == 0
    finally:
        sandbox.kill()
        sandbox.close()


@up_to_a_build
def test_renew_sets_the_expiry_and_the_expired_pod_goes(server: SandgateServer, admin: Client) -> None:
    sandbox = create(server, timeout=timedelta(minutes=10))
    try:
        soon = datetime.now(UTC) + timedelta(seconds=4)
        with server.client() as client:
            renewed = client.post(
                f"/v1/sandboxes/{sandbox.id}/renew-expiration", json={"expiresAt": soon.isoformat()}
            )
        assert renewed.status_code == 200, renewed.text
        assert abs(sandbox.get_info().expires_at - soon) < timedelta(seconds=1)
        wait_gone(admin, sandbox.id)  # the server's reaper deleted it at the new expiry
    finally:
        sandbox.close()
    deadline = time.monotonic() + GONE_TIMEOUT  # the reaper forgets the record after the Pod is gone
    with server.client() as client:
        while (answer := client.get(f"/v1/sandboxes/{sandbox.id}")).status_code == 200:
            assert time.monotonic() < deadline, answer.text
            time.sleep(0.1)
    assert answer.status_code == 404, answer.text
    assert "expired" in answer.text


@up_to_a_build
def test_a_restarted_server_adopts_its_pods_and_deletes_strays(server: SandgateServer, admin: Client) -> None:
    sandbox = create(server)
    stray = create(server)
    try:
        sandbox.commands.run("echo before > /workspace/mark")
        server.stop()
        with sqlite3.connect(server.state_dir / "sandgate.db") as db:  # forgotten: its Pod must go
            db.execute("DELETE FROM sandboxes WHERE id = ?", (stray.id,))
        server.start()
        assert stdout(sandbox.commands.run("cat /workspace/mark")).strip() == "before"
        wait_gone(admin, stray.id)
        pods = admin.list(Pod, namespace=NAMESPACE)
        assert [p.metadata.labels["sandgate/sandbox"] for p in pods] == [sandbox.id]  # type: ignore[index,union-attr]
    finally:
        sandbox.kill()
        sandbox.close()
        stray.close()


@up_to_a_build
def test_pause_is_refused_and_a_bad_image_reference_is_a_clear_error(
    server: SandgateServer, admin: Client
) -> None:
    sandbox = create(server)
    try:
        with server.client() as client:
            paused = client.post(f"/v1/sandboxes/{sandbox.id}/pause")
            assert paused.status_code == 400, paused.text
            assert "cannot freeze a Pod" in paused.text
            before = len(list(admin.list(Pod, namespace=NAMESPACE)))
            bad = client.post(
                "/v1/sandboxes",
                json={"image": {"uri": "Bad//Image:Ref"}, "entrypoint": ["true"], "resourceLimits": {}},
            )
            assert bad.status_code == 400, bad.text
            assert "Bad//Image:Ref" in bad.text
            missing = client.post(
                "/v1/sandboxes",
                json={"image": {"uri": "team/absent:1"}, "entrypoint": ["true"], "resourceLimits": {}},
                timeout=240,
            )
            assert missing.status_code == 400, missing.text
            assert "cannot be pulled by the node" in missing.text
        assert len(list(admin.list(Pod, namespace=NAMESPACE))) == before
        assert list(admin.list(Secret, namespace=NAMESPACE)) == []
    finally:
        sandbox.kill()
        sandbox.close()


@up_to_a_build
def test_the_osb_session_of_the_guide(server: SandgateServer, admin: Client) -> None:
    """`osb` 1.1.1, unchanged: create from the test registry's image, command, file, egress, kill."""
    created = osb_json(
        server, "sandbox", "create", "-i", IMAGE, "--entrypoint", "sleep", "--entrypoint", "infinity",
        "-m", "via=osb",
    )  # fmt: skip
    assert isinstance(created, dict)
    sandbox_id = created["id"]
    try:
        assert pod_of(admin, sandbox_id) is not None
        assert "from-osb" in osb(server, "command", "run", sandbox_id, "--", "echo", "from-osb").stdout
        osb(server, "file", "write", sandbox_id, "/tmp/osb.txt", "-c", "osb wrote this")
        assert osb(server, "file", "cat", sandbox_id, "/tmp/osb.txt").stdout.strip() == "osb wrote this"
        osb(server, "egress", "patch", sandbox_id, "--rule", "allow=pypi.example.com")
        assert "pypi.example.com" in json.dumps(osb_json(server, "egress", "get", sandbox_id))
    finally:
        osb(server, "sandbox", "kill", sandbox_id)
    wait_gone(admin, sandbox_id)


@up_to_a_build
def test_serve_refuses_an_unreachable_cluster(tmp_path: Path, cluster: Cluster) -> None:
    config = cluster.kubeconfig.read_text().replace(
        "https://10.231.0.2:6443", f"https://127.0.0.1:{free_port()}"
    )
    kubeconfig = tmp_path / "unreachable.kubeconfig"
    kubeconfig.write_text(config)
    unreachable = SandgateServer(tmp_path / "state", kubernetes_env(kubeconfig))
    result = subprocess.run(
        [*SANDGATE, "serve", "--runtime", "kubernetes"],
        env=unreachable.server_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "the API server at https://127.0.0.1:" in result.stderr and "cannot be reached" in result.stderr


def test_no_pod_is_left(admin: Client) -> None:
    """Last in the module: every test's sandboxes are gone from the API server."""
    assert list(admin.list(Pod, namespace=NAMESPACE)) == []
