"""The Kubernetes runtime: each sandbox one Pod, in one namespace, on the cluster's Pod network.

Rules:
1. A Pod is named `sg-<instance>-<sandbox id>` and labelled with both (`sandgate/sandbox`,
   `sandgate/instance`); its annotations hold the image asked for and the create's metadata. A
   server only ever touches Pods of its own instance tag, and after a restart `adopt()` finds
   them by their labels: running ones are kept, every other one is deleted, so no Pod is left
   without a record (the service deletes those it has no record of).
2. The confinement is the Pod network (`PodConfinement`): `create` takes no host network and
   returns the Pod's IP, the sandbox's identity at its proxy and where execd listens. The
   server reaches Pod IPs through the cluster's route (docs/kubernetes.md).
3. The user's image runs unchanged, by reference (the local runtime's rules: `python:3.12` is
   `docker.io/library/python:3.12`), pulled by the node as `image_pull_policy` says. execd comes
   from the execd image through an init container and an emptyDir, and gets its token after the
   start, never through the API server (runtime/kubernetes_execd.py). A registry login from
   `ImageSpec.auth` becomes a Secret of the Pod's imagePullSecrets that is deleted as soon as
   the sandbox container started (its image is pulled) or the create failed.
4. Hardened like the Docker runtime's containers: every capability dropped, no privilege
   escalation, the runtime's default seccomp profile, no service account token, no service
   links; memory, CPU and disk (`ephemeral-storage`) are the Pod's limits. Requests are small
   (`REQUEST_MILLICPU`, `REQUEST_MEMORY`, or the limit when lower), so a node holds as many
   sandboxes as their real use allows. The pids limit is the node's (kubelet's `podPidsLimit`):
   a Pod spec has no field for one.
   The CA a Pod trusts is its node's: each node's proxy signs with a CA of its own, whose
   certificate `node_ca` reads by the node's InternalIP (the node agents' client, set by the
   wiring); without node agents it is the spec's `ca_cert` (the server's proxy, no Pod's egress).
5. A create fails fast, with the node's own words, when the image cannot be pulled or the Pod
   ends; `start_timeout` bounds the rest (scheduling, pull). Whatever it made is deleted then.
6. `gvisor` isolation is the cluster's RuntimeClass `gvisor_runtime_class`, offered only when
   the cluster has it. Pause and resume are refused: the API cannot freeze a Pod.
7. Every operation is idempotent; a delete waits until the API server no longer has the Pod.
8. `pvc` volumes are PersistentVolumeClaims in the namespace (runtime/kubernetes_claims.py),
   made before the Pod, mounted by it; a delete removes the claims made to die with it.
9. Every Pod carries the settings' `node_selector` and `tolerations`: a platform team labels and
   taints its sandbox nodes, and sandboxes run there only. A Pod no node accepts stays Pending
   (an autoscaler may yet add a node), so its create fails at `start_timeout` with the
   scheduler's words. A Pod on a node without an agent never runs its entrypoint: the hand-over
   needs that node's proxy CA, read from the node's agent (rule 4), and the create fails.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2
from lightkube import Client, KubeConfig
from lightkube.core.exceptions import ApiError, ConfigError
from lightkube.models.core_v1 import (
    Capabilities,
    Container,
    ContainerStatus,
    EmptyDirVolumeSource,
    EnvVar,
    LocalObjectReference,
    PodDNSConfig,
    PodSecurityContext,
    PodSpec,
    ResourceRequirements,
    SeccompProfile,
    SecurityContext,
    Toleration,
    Volume,
    VolumeMount,
)
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Pod, Secret
from lightkube.resources.node_v1 import RuntimeClass

from sandgate.lifecycle.confinement import SandboxNet
from sandgate.lifecycle.errors import LifecycleError, quietly
from sandgate.lifecycle.registry import Credentials, Platform, Reference
from sandgate.lifecycle.runtime.base import EXECD_PORT, RuntimeError_, SandboxSpec
from sandgate.lifecycle.runtime.kubernetes_claims import KubernetesClaims
from sandgate.lifecycle.runtime.kubernetes_execd import (
    CA_DIR,
    EXECD_MOUNT,
    copy_command,
    hand_over,
    launch_command,
)

LABEL_SANDBOX = "sandgate/sandbox"
LABEL_INSTANCE = "sandgate/instance"
ANNOTATION_IMAGE = "sandgate/image"
ANNOTATION_METADATA = "sandgate/metadata"
SANDBOX_CONTAINER = "sandbox"
PULL_POLICIES = {"always": "Always", "if-not-present": "IfNotPresent", "never": "Never"}
# A container waiting for one of these will not start by itself: the create fails at once.
IMAGE_FAILURES = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
START_FAILURES = frozenset({"CreateContainerConfigError", "CreateContainerError", "RunContainerError"})
REQUEST_MILLICPU = 10
REQUEST_MEMORY = 32 << 20
API_TIMEOUT = 10.0
DELETE_TIMEOUT = 60.0
POLL_S = 0.05
# The one nameserver of a sandbox's resolv.conf, with no search domains (as on the other runtimes:
# the proxy's resolver answers). The node agent redirects port 53 to any address to its proxy, so
# the address only has to route out of the Pod: a documentation address (RFC 5737) that is no
# host, never the cluster's DNS (whose search path would send every name out suffixed).
POD_NAMESERVER = "192.0.2.53"


def connect(kubeconfig: Path | None, namespace: str) -> Client:
    """A client of the cluster the settings name, or RuntimeError_ saying why there is none:
    no kubeconfig, an API server that does not answer, a namespace that does not exist."""
    try:
        config = KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_env()
    except (ConfigError, OSError, ValueError) as exc:
        where = kubeconfig or "$KUBECONFIG, ~/.kube/config or the Pod's service account"
        raise RuntimeError_(f"kubernetes: no usable cluster configuration in {where}: {exc}") from None
    client = Client(
        config, namespace=namespace, timeout=httpx2.Timeout(API_TIMEOUT), field_manager="sandgate"
    )
    context = config.get()
    server = context.cluster.server if context else "(no cluster in the configuration)"
    try:
        client.get(Namespace, namespace)
    except ApiError as exc:
        if exc.status.code == 404:
            raise RuntimeError_(
                f"kubernetes: namespace {namespace!r} does not exist on {server}: create it "
                f"(kubectl create namespace {namespace}) or set kubernetes.namespace"
            ) from None
        raise RuntimeError_(f"kubernetes: {server} refused to show namespace {namespace!r}: {exc}") from None
    except httpx2.HTTPError as exc:
        raise RuntimeError_(f"kubernetes: the API server at {server} cannot be reached: {exc}") from None
    return client


class KubernetesImages:
    """What a create checks before anything is made: the reference is valid (the node pulls)."""

    def __init__(self, pull_policy: str) -> None:
        self.pull_policy = PULL_POLICIES[pull_policy]

    def ensure(
        self, name: str, *, credentials: Credentials | None = None, platform: Platform | None = None
    ) -> str:
        return str(Reference.parse(name))


class KubernetesRuntime:
    name = "kubernetes"

    def __init__(
        self,
        client: Client,
        *,
        namespace: str,
        instance: str,
        execd_image: str,
        pull_policy: str = "if-not-present",
        gvisor_runtime_class: str = "gvisor",
        start_timeout: float = 180.0,
        login: Callable[[str], Credentials | None] = lambda registry: None,
        claim_bytes: int = 1 << 30,
        storage_class: str | None = None,
        node_selector: dict[str, str] | None = None,
        tolerations: list[dict[str, Any]] | None = None,
    ) -> None:
        """`login`: the vault's login for a registry (setting registry_credentials), used when a
        create brings none in `ImageSpec.auth`; `claim_bytes` and `storage_class`: what a `pvc`
        volume's PersistentVolumeClaim asks for when the create names nothing (rule 8);
        `node_selector` and `tolerations` (a Pod spec's, camelCase): where every Pod may run
        (rule 9)."""
        self.client = client
        self.namespace = namespace
        self.instance = instance
        self.execd_image = execd_image
        self.images = KubernetesImages(pull_policy)
        self.start_timeout = start_timeout
        self.login = login
        self.gvisor_runtime_class = gvisor_runtime_class
        self.node_selector = node_selector or None
        self.tolerations = [Toleration(**toleration) for toleration in tolerations or []] or None
        self.claims = KubernetesClaims(
            client,
            namespace,
            {LABEL_INSTANCE: instance},
            LABEL_SANDBOX,
            default_bytes=claim_bytes,
            storage_class=storage_class,
        )
        self.runtime_class = gvisor_runtime_class if self._has_runtime_class(gvisor_runtime_class) else None
        self.node_ca: Callable[[str], str] | None = None  # node InternalIP -> its proxy's CA (PEM)
        self.isolations: tuple[str, ...] = ("standard", "gvisor") if self.runtime_class else ("standard",)

    # -- the Runtime protocol ---------------------------------------------------------------

    def create(self, spec: SandboxSpec, net: SandboxNet | None) -> str:
        """Start the sandbox's Pod and hand execd its token; returns the Pod's IP."""
        if net is not None:
            raise RuntimeError_(
                "the kubernetes runtime places sandboxes on the Pod network, not a host netns"
            )
        if spec.isolation == "gvisor" and self.runtime_class is None:
            raise RuntimeError_(
                f"isolation 'gvisor' needs the RuntimeClass {self.gvisor_runtime_class!r} in the cluster "
                "(setting kubernetes.gvisor_runtime_class)"
            )
        if not spec.execd_token:
            raise RuntimeError_("the kubernetes runtime needs an execd token to hand over")
        pod = self._pod(spec.sandbox_id)
        if pod is not None and _pod_ip(pod) and self.alive(spec.sandbox_id):
            return _pod_ip(pod)
        self.delete(spec.sandbox_id)
        reference = self.images.ensure(spec.image)
        claim_volumes = self.claims.volumes(spec.sandbox_id, spec.claims)
        secret = self._pull_secret(spec, reference)
        try:
            self.client.create(self._pod_manifest(spec, reference, secret, claim_volumes))
            started = self._wait_started(spec.sandbox_id, reference)
            address = _pod_ip(started)
            quietly(lambda: self._delete_secret(secret))  # pulled: the login leaves the cluster now
            hand_over(address, spec.execd_token, self._trusted_ca(started, spec))
        except BaseException:
            quietly(lambda: self.delete(spec.sandbox_id))
            raise
        finally:
            quietly(lambda: self._delete_secret(secret))
        return address

    def delete(self, sandbox_id: str) -> None:
        name = self._pod_name(sandbox_id)
        try:
            self.client.delete(Pod, name, namespace=self.namespace, grace_period=1)
        except ApiError as exc:
            if exc.status.code != 404:
                raise
        self._delete_secret(self._secret_name(sandbox_id))
        deadline = time.monotonic() + DELETE_TIMEOUT
        while self._pod(sandbox_id) is not None:
            if time.monotonic() > deadline:
                raise RuntimeError_(
                    f"Pod {name} was still in the API server {DELETE_TIMEOUT:.0f} s after its delete"
                )
            time.sleep(POLL_S * 4)
        self.claims.release()

    def pause(self, sandbox_id: str) -> None:
        raise LifecycleError(
            "unsupported", "pause is not offered by the kubernetes runtime: the API cannot freeze a Pod"
        )

    def resume(self, sandbox_id: str) -> None:
        raise LifecycleError(
            "unsupported", "resume is not offered by the kubernetes runtime: the API cannot freeze a Pod"
        )

    def alive(self, sandbox_id: str) -> bool:
        pod = self._pod(sandbox_id)
        if pod is None or pod.status is None or pod.status.phase not in ("Pending", "Running"):
            return False
        status = _container_status(pod)
        return status is None or status.state is None or status.state.terminated is None

    def adopt(self) -> list[str]:
        """Running Pods of this instance; every other Pod of it, and its stray pull Secrets, go."""
        alive: list[str] = []
        for pod in self.client.list(Pod, namespace=self.namespace, labels={LABEL_INSTANCE: self.instance}):
            sandbox_id = (pod.metadata.labels or {}).get(LABEL_SANDBOX, "") if pod.metadata else ""
            if sandbox_id and self.alive(sandbox_id):
                alive.append(sandbox_id)
            elif sandbox_id:
                self.delete(sandbox_id)
        for secret in self.client.list(
            Secret, namespace=self.namespace, labels={LABEL_INSTANCE: self.instance}
        ):
            if secret.metadata and secret.metadata.name:
                self._delete_secret(secret.metadata.name)
        return sorted(alive)

    def log_tail(self, sandbox_id: str, limit: int = 2000) -> str:
        pod = self._pod(sandbox_id)
        if pod is None:
            return "(no Pod)"
        try:
            lines = self.client.log(self._pod_name(sandbox_id), container=SANDBOX_CONTAINER, tail_lines=40)
            text = "".join(lines)[-limit:]
        except ApiError as exc:
            text = f"(no log: {exc.status.message})"
        return f"{text}\n{_describe(pod)}".strip()

    # -- internals --------------------------------------------------------------------------

    def _pod_name(self, sandbox_id: str) -> str:
        return f"sg-{self.instance}-{sandbox_id}"

    def _secret_name(self, sandbox_id: str) -> str:
        return f"{self._pod_name(sandbox_id)}-pull"

    def _pod(self, sandbox_id: str) -> Pod | None:
        try:
            return self.client.get(Pod, self._pod_name(sandbox_id), namespace=self.namespace)
        except ApiError as exc:
            if exc.status.code == 404:
                return None
            raise

    def _has_runtime_class(self, name: str) -> bool:
        try:
            self.client.get(RuntimeClass, name)
        except ApiError:
            return False
        return True

    def _labels(self, sandbox_id: str) -> dict[str, str]:
        return {LABEL_SANDBOX: sandbox_id, LABEL_INSTANCE: self.instance}

    def _pull_secret(self, spec: SandboxSpec, reference: str) -> str | None:
        """The registry login for this pull as a Secret (rule 3), or None without one."""
        registry = Reference.parse(reference).registry
        credentials = spec.pull_auth or self.login(registry)
        if credentials is None:
            return None
        token = base64.b64encode(f"{credentials.username}:{credentials.password}".encode()).decode()
        config = json.dumps({"auths": {registry: {"auth": token}}})
        name = self._secret_name(spec.sandbox_id)
        secret = Secret(
            metadata=ObjectMeta(name=name, namespace=self.namespace, labels=self._labels(spec.sandbox_id)),
            type="kubernetes.io/dockerconfigjson",
            stringData={".dockerconfigjson": config},
        )
        self.client.create(secret)
        return name

    def _delete_secret(self, name: str | None) -> None:
        if name is None:
            return
        try:
            self.client.delete(Secret, name, namespace=self.namespace)
        except ApiError as exc:
            if exc.status.code != 404:
                raise

    def _pod_manifest(
        self,
        spec: SandboxSpec,
        reference: str,
        pull_secret: str | None,
        claims: tuple[list[Volume], list[VolumeMount]] = ([], []),
    ) -> Pod:
        hardened = SecurityContext(allowPrivilegeEscalation=False, capabilities=Capabilities(drop=["ALL"]))
        execd_volume = VolumeMount(name="execd", mountPath=EXECD_MOUNT)
        env = {**spec.env, "SANDGATE_SANDBOX_ID": spec.sandbox_id, "SANDGATE_EXECD_PORT": str(EXECD_PORT)}
        sandbox = Container(
            name=SANDBOX_CONTAINER,
            image=reference,
            imagePullPolicy=self.images.pull_policy,
            command=launch_command(spec.entrypoint),
            env=[EnvVar(name=key, value=value) for key, value in env.items()],
            resources=ResourceRequirements(limits=_limits(spec), requests=_requests(spec)),
            securityContext=hardened,
            volumeMounts=[
                VolumeMount(name="execd", mountPath=EXECD_MOUNT, readOnly=True),
                VolumeMount(name="run", mountPath=CA_DIR),
                VolumeMount(name="workspace", mountPath="/workspace"),
                *claims[1],
            ],
        )
        copier = Container(
            name="execd",
            image=self.execd_image,
            imagePullPolicy="IfNotPresent",
            command=copy_command(),
            securityContext=hardened,
            volumeMounts=[execd_volume],
        )
        disk = str(spec.disk_bytes) if spec.disk_bytes else None
        annotations = {ANNOTATION_IMAGE: spec.image, ANNOTATION_METADATA: json.dumps(spec.metadata)}
        return Pod(
            metadata=ObjectMeta(
                name=self._pod_name(spec.sandbox_id),
                namespace=self.namespace,
                labels=self._labels(spec.sandbox_id),
                annotations=annotations,
            ),
            spec=PodSpec(
                restartPolicy="Never",
                automountServiceAccountToken=False,
                enableServiceLinks=False,
                dnsPolicy="None",
                dnsConfig=PodDNSConfig(nameservers=[POD_NAMESERVER], searches=[]),
                terminationGracePeriodSeconds=1,
                runtimeClassName=self.runtime_class if spec.isolation == "gvisor" else None,
                nodeSelector=self.node_selector,
                tolerations=self.tolerations,
                imagePullSecrets=[LocalObjectReference(name=pull_secret)] if pull_secret else None,
                securityContext=PodSecurityContext(seccompProfile=SeccompProfile(type="RuntimeDefault")),
                initContainers=[copier],
                containers=[sandbox],
                volumes=[
                    Volume(name="execd", emptyDir=EmptyDirVolumeSource()),
                    Volume(name="run", emptyDir=EmptyDirVolumeSource(medium="Memory", sizeLimit="1Mi")),
                    Volume(name="workspace", emptyDir=EmptyDirVolumeSource(sizeLimit=disk)),
                    *claims[0],
                ],
            ),
        )

    def _trusted_ca(self, pod: Pod, spec: SandboxSpec) -> str:
        """The CA certificate the Pod is to trust: its node proxy's (rule 4)."""
        if self.node_ca is None:
            return spec.ca_cert.read_text() if spec.ca_cert else ""
        node_ip = pod.status.hostIP if pod.status else None
        if not node_ip:
            raise RuntimeError_(f"the Pod of sandbox {spec.sandbox_id} runs but has no node address")
        return self.node_ca(node_ip)

    def _wait_started(self, sandbox_id: str, reference: str) -> Pod:
        """The Pod once its sandbox container runs and has its IP; the node's reason when it
        cannot (rule 5)."""
        deadline = time.monotonic() + self.start_timeout
        while True:
            pod = self._pod(sandbox_id)
            if pod is None:
                raise RuntimeError_(f"the Pod of sandbox {sandbox_id} was deleted while it started")
            self._check_failed(pod, reference)
            status = _container_status(pod)
            if status and status.state and status.state.running and _pod_ip(pod):
                return pod
            if time.monotonic() > deadline:
                raise RuntimeError_(
                    f"the Pod of sandbox {sandbox_id} did not start within {self.start_timeout:.0f} s "
                    f"(setting kubernetes.start_timeout): {_describe(pod)}{_placement_hint(pod)}"
                )
            time.sleep(POLL_S)

    def _check_failed(self, pod: Pod, reference: str) -> None:
        status = pod.status
        if status is None:
            return
        for init in status.initContainerStatuses or []:
            waiting = init.state.waiting if init.state else None
            ended = init.state.terminated if init.state else None
            if (waiting and waiting.reason in IMAGE_FAILURES | START_FAILURES) or (ended and ended.exitCode):
                raise RuntimeError_(
                    f"the execd image {self.execd_image} did not run in the Pod: {_describe(pod)} "
                    "(build and import it: scripts/cluster/execd-image.sh, docs/kubernetes.md)"
                )
        container = _container_status(pod)
        waiting = container.state.waiting if container and container.state else None
        if waiting and waiting.reason in IMAGE_FAILURES:
            raise LifecycleError(
                "invalid",
                f"image {reference} cannot be pulled by the node: {waiting.reason}: {waiting.message}",
            )
        if (waiting and waiting.reason in START_FAILURES) or status.phase in ("Failed", "Succeeded"):
            raise RuntimeError_(f"the sandbox's Pod ended or cannot start: {_describe(pod)}")


def _pod_ip(pod: Pod) -> str:
    return (pod.status.podIP if pod.status else None) or ""


def _container_status(pod: Pod) -> ContainerStatus | None:
    statuses = (pod.status.containerStatuses if pod.status else None) or []
    return next((status for status in statuses if status.name == SANDBOX_CONTAINER), None)


def _describe(pod: Pod) -> str:
    """The Pod's phase, conditions and container states, in the API server's words."""
    status = pod.status
    if status is None:
        return "(no status yet)"
    parts: list[str] = [f"phase {status.phase}"]
    parts += [
        f"{c.type}={c.status}" + (f" ({c.reason}: {c.message})" if c.reason else "")
        for c in status.conditions or []
        if c.status != "True"
    ]
    for container in [*(status.initContainerStatuses or []), *(status.containerStatuses or [])]:
        state: Any = container.state
        for kind in ("waiting", "terminated"):
            detail = getattr(state, kind, None) if state else None
            if detail is not None:
                exit_code = f" exit {detail.exitCode}" if kind == "terminated" else ""
                parts.append(
                    f"{container.name} {kind}{exit_code}: {detail.reason} {detail.message or ''}".strip()
                )
    return "; ".join(parts)


def _placement_hint(pod: Pod) -> str:
    """What to check when no node took the Pod: the settings that say where sandboxes run."""
    conditions = (pod.status.conditions if pod.status else None) or []
    if any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in conditions):
        return (
            "; no node accepts the Pod: check the sandbox nodes' labels and taints against the "
            "settings kubernetes.node_selector and kubernetes.tolerations (docs/kubernetes.md)"
        )
    return ""


def _limits(spec: SandboxSpec) -> dict[str, str]:
    limits = {}
    if spec.memory_bytes:
        limits["memory"] = str(spec.memory_bytes)
    if spec.cpu_quota:
        limits["cpu"] = f"{max(1, round(spec.cpu_quota * 1000))}m"
    if spec.disk_bytes:
        limits["ephemeral-storage"] = str(spec.disk_bytes)
    return limits


def _requests(spec: SandboxSpec) -> dict[str, str]:
    millicpu = min(REQUEST_MILLICPU, round(spec.cpu_quota * 1000)) if spec.cpu_quota else REQUEST_MILLICPU
    memory = min(REQUEST_MEMORY, spec.memory_bytes) if spec.memory_bytes else REQUEST_MEMORY
    return {"cpu": f"{max(1, millicpu)}m", "memory": str(memory)}
