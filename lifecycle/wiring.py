"""Builds the control plane's real parts from settings: store, vault, proxy, networks, runtime,
egress control, service, proxy supervisor, audit store.

Rules:
1. This is the one place that turns `Settings` into parts and plain values for the other
   components (they never read settings themselves); the `vault` and `logs` commands open their
   vault and audit index here too.
2. Nothing here starts anything; `serve` and the test fixture decide when to start the
   supervisor and the service.
3. Each builder imports the parts it builds when it runs, so a command that opens only the vault
   does not pay for the web stack, mitmproxy, Docker or netlink (tests/unit/test_cli_imports.py).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandgate.lifecycle.settings import Settings

if TYPE_CHECKING:
    from fastapi import APIRouter

    from sandgate.lifecycle.api.auth import Gate
    from sandgate.lifecycle.audit import AuditIndex, AuditStore, Change, PolicyChange
    from sandgate.lifecycle.confinement import Confinement, SandboxNetworks
    from sandgate.lifecycle.gvisor_events import GvisorEvents
    from sandgate.lifecycle.images import ImageStore
    from sandgate.lifecycle.node_client import NodeProxies
    from sandgate.lifecycle.oidc import OidcVerifier
    from sandgate.lifecycle.process_events import ProcessWatcher
    from sandgate.lifecycle.proxy_supervisor import ProxySupervisor
    from sandgate.lifecycle.registry import Credentials, RegistryConfig
    from sandgate.lifecycle.runtime.base import BindMount
    from sandgate.lifecycle.runtime.claim_disks import ClaimDisks
    from sandgate.lifecycle.runtime.docker import DockerRuntime
    from sandgate.lifecycle.runtime.kubernetes import KubernetesRuntime
    from sandgate.lifecycle.runtime.local import LocalRuntime
    from sandgate.lifecycle.runtime.sandbox_disk import SandboxDisks
    from sandgate.lifecycle.sandbox_store import SandboxRecord, SandboxStore
    from sandgate.lifecycle.service import CreateRequest, Service
    from sandgate.lifecycle.trail_secrets import Secrets
    from sandgate.proxy import ProxyControl
    from sandgate.vault import SecretStore, StoreSecrets, StoreSettings


@dataclass
class Components:
    service: Service
    supervisor: ProxySupervisor
    extra_routers: list[APIRouter] = field(default_factory=list)
    open_prefixes: list[str] = field(default_factory=list)
    closers: list[Callable[[], None]] = field(default_factory=list)
    gate: Gate | None = None  # who may call (api/auth.py): keys, console sessions

    def close(self) -> None:
        for close in reversed(self.closers):
            close()


def vault_settings(settings: Settings) -> StoreSettings:
    """Which store the settings name and where (the proxy opens the same store)."""
    from sandgate.vault import StoreSettings

    return StoreSettings(
        backend=settings.vault_backend,
        state_dir=settings.state_dir,
        openbao_addr=settings.openbao_addr,
        openbao_role_id=settings.openbao_role_id,
        openbao_mount=settings.openbao_mount,
        openbao_prefix=settings.openbao_prefix,
        cache_ttl=settings.vault_cache_ttl,
    )


def vault_secrets(settings: Settings) -> StoreSecrets:
    from sandgate.vault import StoreSecrets

    return StoreSecrets(
        vault_key=settings.vault_key,
        openbao_token=settings.openbao_token,
        openbao_secret_id=settings.openbao_secret_id,
    )


def open_vault(settings: Settings) -> SecretStore:
    """The credential store the settings name (the server's, the proxy's and the vault CLI's)."""
    from sandgate.vault import open_configured

    return open_configured(vault_settings(settings), vault_secrets(settings))


def audit_index(settings: Settings) -> AuditIndex:
    """The audit index of the state dir, for a reader outside the server (`sandgate logs`)."""
    from sandgate.lifecycle.audit import AuditIndex
    from sandgate.lifecycle.audit.audit_store import INDEX_FILE

    return AuditIndex(settings.state_dir / INDEX_FILE, settings.audit_log)


def write_proxy_config(settings: Settings) -> Path:
    from sandgate.proxy import ProxyConfig, config_path, control_socket

    config = ProxyConfig(
        state_dir=settings.state_dir,
        listen_host="0.0.0.0",
        control_socket=control_socket(settings.state_dir),
        transparent_port=settings.proxy_transparent_port,
        explicit_port=settings.proxy_explicit_port,
        dns_port=settings.proxy_dns_port,
        workers=settings.proxy_workers,
        ech=settings.proxy_ech,
        upstream_dns=settings.upstream_dns,
        upstream_ca=settings.upstream_ca,
        audit_max_bytes=settings.audit_max_bytes,
        audit_backups=settings.audit_backups,
        audit_fsync=settings.audit_fsync,
        vault=vault_settings(settings),
        upstream_proxies=settings.upstream_proxies,
    )
    path = config_path(settings.state_dir)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(config.model_dump_json(indent=2))
    return path


def proxy_start_timeout(workers: int) -> float:
    """60 s for one proxy process; each further worker is forked from the template and gets
    every entry replayed, which on a busy machine takes some seconds more. Generous on purpose:
    a proxy that cannot start exits and is seen at once, the timeout only catches a hung one, and
    a start costs about 3-4 s of CPU (imports, CA), which at a load of 12 on 2 cores took more
    than 20 s of wall time (serve then refused to start)."""
    return 60.0 + 15.0 * ((workers or os.cpu_count() or 1) - 1)


def policy_change_writer(audit_path: Path) -> Callable[[str, Change, PolicyChange], None]:
    """Appends policy_change records to the proxy's audit log (O_APPEND: safe beside the proxy)."""
    from sandgate.lifecycle.audit import change_record
    from sandgate.proxy import append_record

    def write(sandbox_id: str, what: Change, change: PolicyChange) -> None:
        append_record(audit_path, change_record(sandbox_id, what, change))

    return write


def lifecycle_writer(audit_path: Path) -> Callable[[str, Change, str], None]:
    """Appends `lifecycle` records (sandbox id, what, JSON detail) to the proxy's audit log."""
    from sandgate.lifecycle.audit import control_plane_record
    from sandgate.proxy import append_record

    def write(sandbox_id: str, what: Change, detail: str) -> None:
        append_record(audit_path, control_plane_record("lifecycle", sandbox_id, what, detail))

    return write


def answers(control: ProxyControl) -> bool:
    import httpx

    from sandgate.proxy import ProxyControlError

    try:
        control.health()
    except (ProxyControlError, OSError, httpx.HTTPError):
        return False
    return True


def audit_and_console(service: Service, settings: Settings, gate: Gate) -> tuple[AuditStore, list[APIRouter]]:
    """The audit query API (/v1/audit, behind the auth middleware) and the console (/console,
    its own cookie login, its sessions the gate's), both reading the audit index of the state
    dir, each caller seeing its own tenant's sandboxes (an admin every tenant's)."""
    from sandgate.lifecycle.approvals import ApprovalDesk
    from sandgate.lifecycle.audit import AuditStore, Retention, audit_router
    from sandgate.lifecycle.console import ConsoleSandbox, Sessions, console_router
    from sandgate.lifecycle.principals import acting, caller_sees, sees_every_tenant
    from sandgate.policy import to_document

    retention = Retention(max_age_days=settings.audit_max_age_days, max_rows=settings.audit_max_rows)
    audit = AuditStore(settings.state_dir, retention)

    def scope() -> list[str] | None:
        principal = acting.get()
        if principal is None or sees_every_tenant(principal):
            return None
        return service.store.tenant_sandboxes(principal.tenant)

    audit.index.scope = scope

    def sandboxes() -> list[ConsoleSandbox]:
        return [
            ConsoleSandbox(
                id=r.id,
                status=r.state,
                address=r.address,
                policy=to_document(service.egress.effective_policy(r.id)),
            )
            for r in service.list_sandboxes()
            if caller_sees(r.tenant)
        ]

    sessions = Sessions(still_valid=gate.still_valid)
    gate.session_principal = sessions.login
    desk = TenantDesk(ApprovalDesk(service.egress), service.store.tenant_of)
    routers = [
        audit_router(audit, auth=lambda: None),
        console_router(audit, gate.console_principal, sandboxes, desk, sessions=sessions),
    ]
    return audit, routers


@dataclass
class TenantDesk:
    """The approval desk as the console shows it: the caller's tenant's held requests."""

    desk: Any
    tenant_of: Callable[[str], str | None]

    def pending(self) -> list[Any]:
        from sandgate.lifecycle.principals import caller_sees

        return [held for held in self.desk.pending() if caller_sees(self.tenant_of(held.sandbox) or "")]

    def answer(self, approval_id: str, decision: Any, actor: str) -> Any:
        return self.desk.answer(approval_id, decision, actor)


def oidc_verifier(settings: Settings) -> OidcVerifier | None:
    """The OIDC issuer the settings name (tokens as principals), or None."""
    from sandgate.lifecycle.oidc import OidcVerifier

    if not settings.oidc_issuer or not settings.oidc_audience:
        return None
    return OidcVerifier(
        settings.oidc_issuer,
        settings.oidc_audience,
        tenant_claim=settings.oidc_tenant_claim,
        role_claim=settings.oidc_role_claim,
        ca=settings.oidc_ca,
    )


def make_networks(settings: Settings, instance: str) -> SandboxNetworks:
    from sandgate.lifecycle.confinement import ProxyPorts, SandboxNetworks

    return SandboxNetworks(
        table=settings.nft_table,
        iface_prefix=settings.iface_prefix,
        address_pool=settings.address_pool,
        instance=instance,
        ports=ProxyPorts(
            transparent=settings.proxy_transparent_port,
            dns=settings.proxy_dns_port,
            explicit=settings.proxy_explicit_port,
        ),
    )


def make_confinement(
    settings: Settings, instance: str, proxy: ProxyControl, nodes: NodeProxies | None = None
) -> Confinement:
    """Where sandboxes are confined: on this host (local, Docker), or by the Pod network and
    each node's proxy (`nodes`; without node agents the server's own proxy, which no Pod reaches)."""
    from sandgate.lifecycle.confinement import HostConfinement, PodConfinement

    if settings.runtime == "kubernetes":
        return PodConfinement(nodes or proxy)
    networks = make_networks(settings, instance)
    networks.ensure_table()
    return HostConfinement(networks, proxy)


def node_proxies(
    settings: Settings, runtime: LocalRuntime | DockerRuntime | KubernetesRuntime, vault: SecretStore
) -> NodeProxies | None:
    """The node agents' client (lifecycle/node_client.py) when `[kubernetes]` names them; the
    runtime then hands each Pod its own node proxy's CA (rule 6 of node_client.py)."""
    from sandgate.lifecycle.node_client import NodeAgents, NodeProxies, pod_locator

    options = settings.kubernetes
    if (
        options.node_agent_port is None
        or options.node_agent_ca is None
        or options.node_agent_token_file is None
    ):
        return None
    agents = NodeAgents(options.node_agent_port, options.node_agent_ca, options.node_agent_token_file)
    locate = pod_locator(getattr(runtime, "client"), options.namespace)  # noqa: B009 (the Kubernetes runtime's)
    nodes = NodeProxies(agents, locate, vault, settings.audit_log, settings.state_dir / "node-audit")
    runtime.node_ca = nodes.ca_cert  # type: ignore[union-attr]  # only called with the Kubernetes runtime
    return nodes


def make_runtime(
    settings: Settings, instance: str, login: Callable[[str], Credentials | None] = lambda registry: None
) -> LocalRuntime | DockerRuntime | KubernetesRuntime:
    """The runtime the settings name; `login` is the vault's registry login (Kubernetes pulls
    at start, so it needs it then)."""
    if settings.runtime == "kubernetes":
        return kubernetes_runtime(settings, instance, login)
    binds = operator_binds(settings)
    if settings.runtime == "docker":
        from sandgate.lifecycle.runtime.docker import DockerRuntime

        return DockerRuntime(
            settings.docker_host,
            instance=instance,
            oci_runtime=settings.docker_oci_runtime,
            binds=binds,
            default_pids_max=settings.pids_max,
            disks=make_disks(settings, instance),
            claim_disks=make_claim_disks(settings),
            registry=registry_config(settings),
            pull_policy=settings.image_pull_policy,
            gvisor_runtime=settings.docker_gvisor_runtime,
        )
    from sandgate.lifecycle.gvisor_events import events_endpoint
    from sandgate.lifecycle.runtime.local import LocalRuntime

    images = image_store(settings)
    return LocalRuntime(
        settings.state_dir,
        images,
        instance=instance,
        binds=binds,
        disks=make_disks(settings, instance),
        claim_disks=make_claim_disks(settings),
        default_pids_max=settings.pids_max,
        runsc=settings.runsc,
        gvisor_platform=settings.gvisor_platform,
        gvisor_events=events_endpoint(settings.state_dir) if settings.exec_audit == "processes" else None,
    )


def kubernetes_runtime(
    settings: Settings, instance: str, login: Callable[[str], Credentials | None]
) -> KubernetesRuntime:
    from sandgate.lifecycle.errors import RuntimeError_
    from sandgate.lifecycle.quantities import parse_quantity
    from sandgate.lifecycle.runtime.kubernetes import KubernetesRuntime, connect

    options = settings.kubernetes
    try:
        client = connect(options.kubeconfig, options.namespace)
    except RuntimeError_ as exc:
        raise ValueError(f"setting runtime = kubernetes: {exc}") from None
    return KubernetesRuntime(
        client,
        namespace=options.namespace,
        instance=instance,
        execd_image=options.execd_image,
        pull_policy=settings.image_pull_policy,
        gvisor_runtime_class=options.gvisor_runtime_class,
        start_timeout=options.start_timeout,
        login=login,
        claim_bytes=int(parse_quantity(settings.volume_default_size, "volume_default_size")) or 1 << 30,
        storage_class=options.storage_class,
        node_selector=dict(options.node_selector),
        tolerations=[toleration.pod_spec() for toleration in options.tolerations],
    )


def make_disks(settings: Settings, instance: str) -> SandboxDisks | None:
    """The sandboxes' own filesystems (runtime/sandbox_disk.py); None with sandbox_disk '0'."""
    from sandgate.lifecycle.quantities import parse_quantity
    from sandgate.lifecycle.runtime.sandbox_disk import SandboxDisks

    size = int(parse_quantity(settings.sandbox_disk, "sandbox_disk"))
    if size == 0:
        return None
    reserve = int(parse_quantity(settings.state_disk_reserve, "state_disk_reserve"))
    return SandboxDisks(
        settings.disk_dir, instance, settings.state_dir, default_bytes=size, reserve_bytes=reserve
    )


def make_claim_disks(settings: Settings) -> ClaimDisks | None:
    """The `pvc` claims' size caps (runtime/claim_disks.py); None with volume_default_size '0'."""
    from sandgate.lifecycle.quantities import parse_quantity
    from sandgate.lifecycle.runtime.claim_disks import ClaimDisks

    size = int(parse_quantity(settings.volume_default_size, "volume_default_size"))
    return ClaimDisks(settings.state_dir / "volume-disks", size) if size else None


def image_store(settings: Settings) -> ImageStore:
    """The local image store with the registry settings (server and `sandgate image`)."""
    from sandgate.lifecycle.images import ImageStore

    registry = registry_config(settings)
    return ImageStore(
        settings.state_dir / "images", registry=registry, pull_policy=settings.image_pull_policy
    )


def registry_config(settings: Settings) -> RegistryConfig:
    from sandgate.lifecycle.registry import RegistryConfig

    return RegistryConfig(
        mirrors=tuple(settings.registry_mirrors),
        insecure=tuple(settings.insecure_registries),
        mirror_only=settings.registry_mirror_only,
        timeout=settings.image_pull_timeout,
    )


def registry_login(settings: Settings, vault: SecretStore) -> Callable[[str], Credentials | None]:
    """The vault's login for a registry (setting `registry_credentials`), read at each pull."""
    from sandgate.lifecycle.registry import Credentials, PullError

    def login(registry: str) -> Credentials | None:
        name = settings.registry_credentials.get(registry)
        if name is None:
            return None
        try:
            username, colon, password = vault.reveal(name).partition(":")
        except Exception as exc:  # the store's own error names what is missing
            raise PullError("unauthorized", f"registry {registry}: vault secret {name!r}: {exc}") from None
        if not colon or not username:
            raise PullError(
                "unauthorized", f"registry {registry}: vault secret {name!r} must be 'username:password'"
            )
        return Credentials(username, password)

    return login


def image_check(
    runtime: LocalRuntime | DockerRuntime | KubernetesRuntime,
    login: Callable[[str], Credentials | None] = lambda registry: None,
) -> Callable[[CreateRequest], object]:
    """What a create runs before anything is built: the image is there, or is pulled now (with
    `image.auth`, else the vault's login for the registry)."""
    from sandgate.lifecycle.registry import Platform, PullError, Reference

    def check(request: CreateRequest) -> object:
        registry = ""
        platform = Platform(request.platform["os"], request.platform["arch"]) if request.platform else None
        if platform is not None and str(platform) != str(Platform.host()):
            raise PullError(
                "platform", f"platform {platform} was asked for; this host runs {Platform.host()} images only"
            )
        credentials = request.image_auth
        if credentials is None:
            with contextlib.suppress(PullError):  # not a reference: ensure() says so, or finds it
                registry = Reference.parse(request.image).registry
            credentials = login(registry) if registry else None
        return runtime.images.ensure(request.image, credentials=credentials, platform=platform)

    return check


def operator_binds(settings: Settings) -> list[BindMount]:
    """The `binds` setting, checked (never the state dir); a bad one stops the start with why."""
    from sandgate.lifecycle.runtime.base import BindMount, UnsafeBind

    try:
        return [BindMount.parse(text).checked(unsafe=[settings.state_dir]) for text in settings.binds]
    except UnsafeBind as exc:
        raise ValueError(f"setting `binds` (SANDGATE_BINDS): {exc}") from None


def build_components(settings: Settings, api_key: str) -> Components:
    from sandgate.lifecycle.api.auth import Gate
    from sandgate.lifecycle.egress_control import EgressControl
    from sandgate.lifecycle.kernel import instance_tag
    from sandgate.lifecycle.keys import KeyBook
    from sandgate.lifecycle.policy_book import SandgatePolicies
    from sandgate.lifecycle.proxy_supervisor import Listeners, ProxySupervisor
    from sandgate.lifecycle.sandbox_store import SandboxStore
    from sandgate.lifecycle.service import Service
    from sandgate.lifecycle.vault_notices import VaultNotices
    from sandgate.proxy import ProxyControl, control_socket, ensure_ca, log_path

    ca = ensure_ca(settings.state_dir)
    control = ProxyControl(control_socket(settings.state_dir))
    instance = instance_tag(settings.state_dir)
    vault = open_vault(settings)
    runtime = make_runtime(settings, instance, registry_login(settings, vault))
    nodes = node_proxies(settings, runtime, vault) if runtime.name == "kubernetes" else None
    confinement = make_confinement(settings, instance, control, nodes)
    if settings.isolation not in runtime.isolations:  # every create would be refused
        raise ValueError(
            f"setting `isolation` (SANDGATE_ISOLATION) is {settings.isolation!r}, which this host's "
            f"{runtime.name} runtime cannot give (it offers {', '.join(runtime.isolations)}): install runsc "
            "(`apt-get install runsc`; on Docker, register sandgate-runsc, docs/runtime.md)"
        )
    store = SandboxStore(settings.state_database)
    egress = EgressControl(
        store,
        proxy=confinement.proxy,
        vault=vault,
        policies=SandgatePolicies(
            settings.policy_max_rules,
            settings.load_default_policy(),
            settings.presets,
            settings.load_policy_ceiling(),
        ),
        audit=policy_change_writer(settings.audit_log),
        process_lists=getattr(runtime, "process_lists", None),  # local: its cgroup; Docker: a netns scan
        name_processes=settings.exec_audit == "processes",
    )
    service = Service(
        store,
        confinement=confinement,
        runtime=runtime,
        egress=egress,
        check_image=image_check(runtime, registry_login(settings, vault)),
        ca_cert=ca.cert,
        warm_pool_size=settings.warm_pool_size,
        isolation=settings.isolation,
        renew_max_lifetime=settings.renew_on_access_max_lifetime,
        audit=lifecycle_writer(settings.audit_log),
    )
    supervisor = ProxySupervisor(
        write_proxy_config(settings),
        is_healthy=lambda: answers(control),
        on_ready=egress.repush,
        log_path=log_path(settings.state_dir),
        start_timeout=proxy_start_timeout(settings.proxy_workers),
        listeners=Listeners(
            tcp=frozenset({settings.proxy_transparent_port, settings.proxy_explicit_port}),
            udp=frozenset({settings.proxy_dns_port}),
        ),
        control_socket=control.socket_path,
        secrets=vault_secrets(settings).revealed_json(),
    )
    from sandgate.lifecycle.trail_secrets import Secrets

    notices = None
    if nodes is not None:
        nodes.on_restart = egress.repush  # rule 5 of node_client.py
        notices = VaultNotices(settings.state_dir, lambda names: egress.repush(reading=names))
        notices.start()
    watchers = process_watchers(settings, instance, store, Secrets(egress.vault_values, api_key))
    keys = KeyBook(settings.state_database)
    gate = Gate(api_key, keys, oidc=oidc_verifier(settings))
    audit, routers = audit_and_console(service, settings, gate)
    audit.start()
    return Components(
        service,
        supervisor,
        routers,
        open_prefixes=["/console"],
        closers=[
            store.close,
            keys.close,
            supervisor.stop,
            audit.stop,
            service.stop,
            *(w.stop for w in watchers),
            *([nodes.close] if nodes is not None else []),
            *([notices.stop] if notices is not None else []),
        ],
        gate=gate,
    )


def process_watchers(
    settings: Settings, instance: str, store: SandboxStore, secrets: Secrets
) -> list[ProcessWatcher | GvisorEvents]:
    """With `exec_audit = "processes"`, the started watchers of every program a sandbox runs:
    the kernel's process connector, and gVisor's runtime monitoring sink (gvisor_events.py) for
    gVisor sandboxes; a host that cannot give them (no process connector, the Docker runtime)
    refuses to start, never runs without what was asked for."""
    from sandgate.lifecycle.gvisor_events import GvisorEvents, events_endpoint
    from sandgate.lifecycle.process_events import ProcessWatcher, summary, to_json
    from sandgate.lifecycle.sandbox_store import NotFound
    from sandgate.proxy import AuditRecord, append_records

    if settings.exec_audit != "processes":
        return []
    if settings.runtime != "local":
        raise ValueError(
            "setting `exec_audit` is 'processes', which the local runtime gives (the Docker runtime's "
            "sandboxes are not followed yet: docs/audit.md); use 'execd'"
        )

    def lookup(sandbox_id: str) -> SandboxRecord | None:
        try:
            return store.get_sandbox(sandbox_id)
        except NotFound:
            return None

    def write(batch: list[tuple[SandboxRecord | None, dict[str, Any]]]) -> None:
        sandboxes = {record.id: record for record, _ in batch if record}
        redactors = {sandbox_id: secrets.redact(record) for sandbox_id, record in sandboxes.items()}
        lines = [
            (
                AuditRecord(
                    kind="process",
                    sandbox=record.id if record else "-",
                    client="kernel",
                    decision="allow",
                    reason=summary(facts),
                    method=facts["op"],
                    path=facts.get("exe"),
                    detail=to_json(facts),
                ),
                redactors[record.id] if record else None,
            )
            for record, facts in batch
        ]
        append_records(settings.audit_log, lines)

    sink = GvisorEvents(events_endpoint(settings.state_dir), lookup, write)
    sink.start()  # before any sandbox: runsc cannot start without it
    watcher = ProcessWatcher(instance, lookup, write, settings.process_events_netns)
    try:
        watcher.start()
    except OSError as exc:
        raise ValueError(
            f"setting `exec_audit` is 'processes', but the kernel's process connector cannot be opened "
            f"({exc}); set `process_events_netns` when the server runs outside the initial network "
            "namespace, or use 'execd'"
        ) from None
    return [watcher, sink]
