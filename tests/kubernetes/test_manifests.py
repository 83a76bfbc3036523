"""The install manifests (deploy/, kustomize) on the test cluster: `kubectl apply -k` makes every
object, the API server's own authorizer holds the server and the node proxy to least privilege,
and `kubectl delete -k` leaves nothing of them.

The server and node-proxy Pods running from the sandgate image, and the quickstart through them:
tests/kubernetes/test_in_cluster.py.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.kubernetes.cluster import SCRIPTS, Cluster, skip_unless_built, up_to_a_build

pytestmark = pytest.mark.root
skip_unless_built()

DEPLOY = SCRIPTS.parents[1] / "deploy"
SERVER = "system:serviceaccount:sandgate-system:sandgate-server"
NODE_PROXY = "system:serviceaccount:sandgate-system:sandgate-node-proxy"
GONE_TIMEOUT = 120.0


# (who, verb, resource [--subresource=...] or kind/name, namespace or None, allowed)
RIGHTS = [
    (SERVER, "create", "pods", "sandgate", True),
    (SERVER, "delete", "pods", "sandgate", True),
    (SERVER, "get", "pods --subresource=log", "sandgate", True),
    (SERVER, "create", "secrets", "sandgate", True),
    (SERVER, "create", "persistentvolumeclaims", "sandgate", True),
    (SERVER, "get", "namespaces/sandgate", None, True),
    (SERVER, "get", "runtimeclasses.node.k8s.io/gvisor", None, True),
    (SERVER, "create", "pods", "default", False),
    (SERVER, "create", "pods", "sandgate-system", False),
    (SERVER, "get", "secrets", "sandgate-system", False),
    (SERVER, "get", "secrets", "kube-system", False),
    (SERVER, "create", "pods --subresource=exec", "sandgate", False),
    (SERVER, "get", "pods --subresource=exec", "sandgate", False),
    (SERVER, "patch", "pods", "sandgate", False),
    (SERVER, "create", "persistentvolumes", None, False),
    (SERVER, "get", "namespaces/default", None, False),
    (SERVER, "list", "nodes", None, False),
    (SERVER, "create", "rolebindings", "sandgate", False),
    (NODE_PROXY, "get", "pods", "sandgate", False),
    (NODE_PROXY, "list", "pods", None, False),
    (NODE_PROXY, "get", "nodes", None, False),
    (NODE_PROXY, "get", "secrets", "sandgate-system", False),
]


def kubectl(cluster: Cluster, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    built = subprocess.run(["bash", str(SCRIPTS / "build.sh"), "--cached"], capture_output=True, text=True)
    command = [str(Path(built.stdout.strip()) / "kubectl"), "--kubeconfig", str(cluster.kubeconfig), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert not check or done.returncode == 0, done.stderr
    return done


def installed(cluster: Cluster) -> set[str]:
    """kind/namespace/name of every object that carries the manifests' label."""
    kinds = "namespaces,serviceaccounts,roles,rolebindings,clusterroles,clusterrolebindings,deployments,"
    kinds += "daemonsets,services,configmaps,persistentvolumeclaims,networkpolicies"
    each = "{range .items[*]}{.kind}/{.metadata.namespace}/{.metadata.name}{'\\n'}{end}"
    listed = kubectl(
        cluster, "get", kinds, "-A", "-l", "app.kubernetes.io/part-of=sandgate", "-o", f"jsonpath={each}"
    )
    return set(listed.stdout.split())


@up_to_a_build
def test_install_least_privilege_and_uninstall(cluster: Cluster) -> None:
    kubectl(cluster, "apply", "-k", str(DEPLOY))
    objects = installed(cluster)
    for expected in [
        "Namespace//sandgate",
        "Namespace//sandgate-system",
        "Deployment/sandgate-system/sandgate-server",
        "DaemonSet/sandgate-system/sandgate-node-proxy",
        "Role/sandgate/sandgate-server",
        "ClusterRole//sandgate-server",
        "PersistentVolumeClaim/sandgate-system/sandgate-state",
        "NetworkPolicy/sandgate/sandboxes-from-the-server-only",
    ]:
        assert expected in objects, objects
    for who, verb, resource, namespace, allowed in RIGHTS:
        where = ["-n", namespace] if namespace else []
        asked = ["auth", "can-i", verb, *resource.split(), *where, "--as", who]
        answer = kubectl(cluster, *asked, check=False)
        assert answer.stdout.strip() == ("yes" if allowed else "no"), (who, verb, resource, namespace, answer)

    bound = "--for=jsonpath={.status.phase}=Bound"
    kubectl(cluster, "wait", bound, "pvc/sandgate-state", "-n", "sandgate-system", "--timeout=120s")
    state_dirs = kubectl(cluster, "get", "pv", "-o", "jsonpath={.items[*].spec.hostPath.path}").stdout.split()
    assert state_dirs and all(Path(path).is_dir() for path in state_dirs)  # the server's state, on the node
    kubectl(cluster, "delete", "-k", str(DEPLOY), "--wait=true", "--timeout=120s")
    # the namespaces' contents go first, and the state volume after its claim (reclaim Delete)
    deadline = time.monotonic() + GONE_TIMEOUT
    while (left := installed(cluster) | volumes(cluster)) and time.monotonic() < deadline:
        time.sleep(1)
    assert not left
    assert not any(Path(path).exists() for path in state_dirs)


def volumes(cluster: Cluster) -> set[str]:
    return set(kubectl(cluster, "get", "pv", "-o", "name").stdout.split())
