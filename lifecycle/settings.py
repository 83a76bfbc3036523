"""One settings model for the whole server and CLI.

Precedence, highest first: command-line flags (passed as init values), environment variables
(`SANDGATE_*`), a TOML config file (`--config`, `SANDGATE_CONFIG`, or /etc/sandgate/config.toml
when it exists), then the defaults below. Components never read settings themselves: lifecycle
builds them and passes plain values down, so policy/vault/proxy stay free of global state.
"""

from __future__ import annotations

import os
import re
import tomllib
from contextvars import ContextVar
from ipaddress import IPv4Network
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from sandgate.lifecycle.errors import LifecycleError
from sandgate.lifecycle.quantities import parse_quantity
from sandgate.policy import DEFAULT_MAX_RULES, Policy, Presets, load_policy
from sandgate.proxy import ResolverAddress, UpstreamProxy, audit_path

DEFAULT_CONFIG_FILE = Path("/etc/sandgate/config.toml")
_config_flag: ContextVar[Path | None] = ContextVar("config_flag", default=None)


def _byte_quantity(value: str) -> str:
    try:
        parse_quantity(value, "")
    except LifecycleError:
        raise ValueError(f"{value!r} is not a size (use e.g. '2Gi', '512Mi', '0')") from None
    return value


ByteQuantity = Annotated[str, AfterValidator(_byte_quantity)]


class SecureRuntime(BaseModel):
    """OpenSandbox's `[secure_runtime]` TOML table, read where it maps onto `isolation`."""

    model_config = ConfigDict(extra="forbid")

    type: str = Field("", description="'' (none) or 'gvisor'; kata and firecracker have no mapping here")
    docker_runtime: str | None = None  # OpenSandbox's runtime name; sandgate registers its own
    k8s_runtime_class: str | None = None  # kubernetes.gvisor_runtime_class, unless that is set

    @model_validator(mode="after")
    def _maps(self) -> SecureRuntime:
        self.isolation()
        return self

    def isolation(self) -> Literal["standard", "gvisor"]:
        if self.type in ("", "none"):
            return "standard"
        if self.type == "gvisor":
            return "gvisor"
        raise ValueError(
            f"[secure_runtime] type = {self.type!r} has no sandgate isolation: use 'gvisor' or '' "
            "(Kata and Firecracker need VMX, which sandgate does not use)"
        )


# Kubernetes' syntax of a label key or taint key (an optional DNS subdomain prefix and `/`, then a
# name of at most 63 characters) and of a label value (at most 63, may be empty).
_K8S_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_K8S_PREFIX = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_K8S_KEY = re.compile(rf"^(({_K8S_PREFIX})/)?{_K8S_NAME}$")
_K8S_VALUE = re.compile(rf"^({_K8S_NAME})?$")


def _k8s_key(key: str) -> str:
    prefix = key.rpartition("/")[0]
    if not _K8S_KEY.fullmatch(key) or len(prefix) > 253:
        raise ValueError(
            f"{key!r} is not a Kubernetes label or taint key ([prefix/]name: a DNS subdomain of at most "
            "253 characters, then at most 63 of letters, digits, '-', '_', '.', alphanumeric at both ends)"
        )
    return key


def _k8s_value(value: str) -> str:
    if not _K8S_VALUE.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a Kubernetes label or taint value (at most 63 letters, digits, '-', '_', '.', "
            "alphanumeric at both ends, or empty)"
        )
    return value


K8sKey = Annotated[str, AfterValidator(_k8s_key)]
K8sValue = Annotated[str, AfterValidator(_k8s_value)]


class Toleration(BaseModel):
    """One toleration every sandbox Pod carries: a Pod spec's, with `toleration_seconds` for its
    `tolerationSeconds` (docs/kubernetes.md, "Sandbox nodes")."""

    model_config = ConfigDict(extra="forbid")

    key: K8sKey | None = Field(None, description="the taint's key; unset (with operator Exists): every taint")
    operator: Literal["Equal", "Exists"] = Field("Equal", description="Equal: key and value; Exists: key")
    value: K8sValue | None = Field(None, description="the taint's value (operator Equal)")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="the taint's effect; unset: every effect"
    )
    toleration_seconds: int | None = Field(
        None, ge=0, description="with effect NoExecute: how long the Pod stays once the taint is set"
    )

    @model_validator(mode="after")
    def _as_kubernetes_accepts(self) -> Toleration:
        # The API server's own rules, so a bad toleration stops the start, not every create.
        if self.operator == "Exists" and self.value:
            raise ValueError(f"toleration of {self.key!r}: operator Exists takes no value")
        if self.operator == "Equal" and self.key is None:
            raise ValueError("a toleration without a key needs operator Exists (it tolerates every taint)")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError(f"toleration of {self.key!r}: toleration_seconds needs effect NoExecute")
        return self

    def pod_spec(self) -> dict[str, Any]:
        """This toleration in a Pod spec's words (camelCase)."""
        return {
            "key": self.key,
            "operator": self.operator,
            "value": self.value,
            "effect": self.effect,
            "tolerationSeconds": self.toleration_seconds,
        }


class KubernetesSettings(BaseModel):
    """The `[kubernetes]` TOML table (env: SANDGATE_KUBERNETES as JSON), read with runtime = kubernetes."""

    model_config = ConfigDict(extra="forbid")

    kubeconfig: Path | None = Field(
        None,
        description="kubeconfig file; unset: $KUBECONFIG or ~/.kube/config, else the Pod's in-cluster config",
    )
    namespace: str = Field(
        "sandgate", pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", description="where sandbox Pods run"
    )
    execd_image: str = Field(
        "sandgate.example.test/execd:1",
        description="the image whose init container copies execd into each Pod "
        "(scripts/cluster/execd-image.sh builds and imports it; docs/kubernetes.md)",
    )
    gvisor_runtime_class: str = Field(
        "gvisor", description="RuntimeClass of gvisor sandboxes (offered when the cluster has it)"
    )
    start_timeout: float = Field(
        180.0, gt=0, description="seconds a Pod may take to run (its image pulled) before a create fails"
    )
    storage_class: str | None = Field(
        None,
        description="StorageClass of the PersistentVolumeClaims `pvc` volumes make when a create "
        "names none (unset: the cluster's default class)",
    )
    node_agent_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="port of every node's agent (`sandgate node-proxy`) at the node's InternalIP; "
        "unset: no node agents, and sandbox Pods have no egress at all (docs/kubernetes.md)",
    )
    node_agent_ca: Path | None = Field(None, description="PEM CA file the node agents' certificates chain to")
    node_agent_token_file: Path | None = Field(
        None, description="file holding the bearer token every node agent accepts (mode 0600)"
    )
    node_selector: dict[K8sKey, K8sValue] = Field(
        {},
        description="labels a node must have to run sandbox Pods (the Pods' nodeSelector); with "
        "`tolerations`, how a platform team dedicates nodes to sandboxes (docs/kubernetes.md)",
    )
    tolerations: list[Toleration] = Field(
        [],
        description='taints sandbox Pods tolerate, e.g. [{key = "sandgate.example.test/sandboxes", '
        'operator = "Exists", effect = "NoSchedule"}] (docs/kubernetes.md)',
    )

    @model_validator(mode="after")
    def _node_agents_whole(self) -> KubernetesSettings:
        given = [self.node_agent_ca is not None, self.node_agent_token_file is not None]
        if self.node_agent_port is not None and not all(given):
            raise ValueError("node_agent_port needs node_agent_ca and node_agent_token_file")
        if self.node_agent_port is None and any(given):
            raise ValueError("node_agent_ca and node_agent_token_file need node_agent_port")
        return self


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SANDGATE_", extra="forbid")

    # control plane
    host: str = Field("127.0.0.1", description="address the control-plane API listens on")
    port: int = Field(8080, ge=1, le=65535, description="port of the control-plane API")
    api_key: SecretStr | None = Field(
        None, description="OPEN-SANDBOX-API-KEY; generated into the state dir when unset"
    )
    state_dir: Path = Field(Path("/var/lib/sandgate"), description="vault, CA, database, audit log")
    database_url: SecretStr | None = Field(
        None,
        description="the control-plane database on PostgreSQL, postgresql://user:password@host:port/db"
        "[?sslmode=verify-full[&sslrootcert=CA file]] (a secret: env SANDGATE_DATABASE_URL); unset: "
        "SQLite in the state dir",
    )
    runtime: Literal["local", "docker", "kubernetes"] = Field("local", description="sandbox runtime")
    docker_host: str | None = Field(None, description="Docker engine URL (default: DOCKER_HOST)")
    kubernetes: KubernetesSettings = Field(
        KubernetesSettings.model_validate({}), description="the Kubernetes runtime (docs/kubernetes.md)"
    )
    docker_oci_runtime: str | None = Field(None, description="OCI runtime for sandbox containers, e.g. runsc")
    docker_gvisor_runtime: str = Field(
        "sandgate-runsc", description="the engine's runtime name for gvisor sandboxes (docs/runtime.md)"
    )
    isolation: Literal["standard", "gvisor"] = Field(
        "standard",
        description="default sandbox isolation: 'standard' (bubblewrap / runc) or 'gvisor' (runsc); "
        "a create may ask for either with the extension `sandgate.isolation`",
    )
    runsc: str = Field("runsc", description="gVisor's runsc: a name on PATH or a path (gvisor isolation)")
    gvisor_platform: Literal["ptrace", "systrap", "kvm"] = Field(
        "systrap",
        description="runsc --platform for gvisor sandboxes (docs/runtime.md: systrap was the faster here)",
    )
    secure_runtime: SecureRuntime | None = Field(
        None, description="OpenSandbox's [secure_runtime] table; `type` sets `isolation` unless that is set"
    )
    binds: list[str] = Field(
        default_factory=list,
        description="host paths shown in every sandbox, 'source:target[:ro|rw]' (read-only by default)",
    )
    volume_host_prefixes: list[Path] = Field(
        default_factory=list,
        description="host directories under which a create's `volumes[].host.path` may lie "
        "(none: host volumes are refused)",
    )
    pvc_volumes: bool = Field(
        False,
        description="serve a create's `volumes[].pvc` (named volumes that outlive sandboxes); off by "
        "default because claims live beside the state dir, outside its disk admission",
    )
    volume_default_size: ByteQuantity = Field(
        "1Gi",
        description="a `pvc` claim's size cap when its create names no `pvc.storage` (local and "
        "docker: an ext4 image per claim); '0' makes new claims uncapped directories",
    )
    execd_endpoint: Literal["host", "direct"] = Field(
        "host",
        description="execd endpoint handed to clients: 'host' (sandgate's reverse proxy, which strips "
        "control-plane headers) or 'direct' (the sandbox's address; only for clients you trust "
        "to send nothing secret)",
    )
    exec_audit: Literal["off", "execd", "processes"] = Field(
        "execd",
        description="the exec audit trail (docs/audit.md): 'execd' records every execd call the "
        "host's reverse proxy forwards (commands, code cells, file operations) as `command` and "
        "`file` records; 'processes' also every program a sandbox runs (`process` records, from "
        "the kernel's process connector, and on gVisor from gVisor's runtime monitoring; local "
        "runtime); 'off' records none",
    )
    process_events_netns: Path | None = Field(
        None,
        description="a network namespace file (/proc/<pid>/ns/net) to open the kernel's process "
        "connector in, which answers only in the initial network namespace: set it when the "
        "server runs in another one",
    )

    # vault
    vault_backend: Literal["local", "openbao"] = "local"
    vault_key: SecretStr | None = Field(
        None, description="master key (base64, 32 bytes) for the local vault; else a key file"
    )
    openbao_addr: str | None = None
    openbao_token: SecretStr | None = None
    openbao_role_id: str | None = None
    openbao_secret_id: SecretStr | None = None
    openbao_mount: str = "secret"
    openbao_prefix: str = "sandgate"
    vault_cache_ttl: float = Field(30.0, ge=0, description="seconds a backend value is cached")

    # egress proxy
    proxy_transparent_port: int = Field(15001, ge=1, le=65535)
    proxy_explicit_port: int = Field(15002, ge=1, le=65535)
    proxy_dns_port: int = Field(15053, ge=1, le=65535)
    proxy_workers: int = Field(
        0, ge=0, le=256, description="egress proxy worker processes sharing the listeners (0: one per core)"
    )
    proxy_ech: Literal["refuse", "intercept", "passthrough"] = Field(
        "intercept",
        description="a ClientHello carrying ECH: refuse (default: its SNI is not the real destination), "
        "intercept (decrypt; Chromium's GREASE ECH then works) or passthrough (trust the outer name)",
    )
    upstream_dns: list[ResolverAddress] = Field(
        default_factory=list,
        description="resolvers the proxy asks: `ip`, `ip:port` or `[v6]:port` (default: /etc/resolv.conf)",
    )
    upstream_ca: Path | None = Field(None, description="extra CA bundle trusted upstream (adds to certifi)")
    upstream_proxies: list[UpstreamProxy] = Field(
        default_factory=list,
        description="company proxies allowed traffic leaves through (env: JSON list of {url, hosts, "
        "tenants, credential, identity_header, tenant_header}); first match by host and tenant wins; "
        "docs/proxy.md",
    )

    # sandbox networks
    address_pool: IPv4Network = Field(IPv4Network("10.213.0.0/16"), description="sandbox /30s come from here")
    iface_prefix: str = Field("sgv", max_length=6, description="host-side veth name prefix")
    nft_table: str = Field("sandgate", description="the one nftables table for all sandboxes")
    warm_pool_size: int = Field(
        0,
        ge=0,
        le=64,
        description="sandboxes kept pre-built for the default image (local runtime); 2 is a good start",
    )
    # renew on access (lifecycle/renew_on_access.py, docs/operations.md)
    renew_on_access_max_lifetime: int = Field(
        7 * 24 * 3600,
        ge=0,
        description="seconds after its creation past which traffic never extends a sandbox's expiry "
        "(extension access.renew.extend.seconds); 0 refuses that extension",
    )
    renew_on_access_interval: float = Field(
        60.0, gt=0, description="seconds between two renewals on access of one sandbox at most"
    )

    # OIDC bearer tokens as principals (docs/operations.md, "Tenants, roles and keys")
    oidc_issuer: str | None = Field(
        None, description="accept JWTs of this OIDC issuer (its `iss`; JWKS from its discovery document)"
    )
    oidc_audience: str | None = Field(
        None, description="the `aud` a token must name (required with oidc_issuer)"
    )
    oidc_tenant_claim: str = Field("tenant", description="the claim that names the principal's tenant")
    oidc_role_claim: str = Field(
        "role", description="the claim that names its role (admin, operator, reviewer)"
    )
    oidc_ca: Path | None = Field(None, description="CA bundle to verify the issuer's TLS (default: certifi)")

    # per-sandbox caps (docs/runtime.md, "Caps")
    pids_max: int = Field(
        1024,
        ge=16,
        description="processes per sandbox when its resourceLimits names no `pids` (both runtimes)",
    )
    sandbox_disk: ByteQuantity = Field(
        "2Gi",
        description="what a sandbox may write (local: its / and /workspace; docker: /workspace) when its "
        "resourceLimits names no `disk`; '0' turns the per-sandbox filesystems off",
    )
    sandbox_disk_dir: Path | None = Field(
        None,
        description="where the sandboxes' filesystem images are kept (default "
        "<state_dir>/disks); a filesystem of its own keeps sandboxes off the state dir's disk",
    )
    state_disk_reserve: ByteQuantity = Field(
        "1Gi", description="free space on the state dir's filesystem that sandboxes' disks never take"
    )

    # images (docs/images.md): pulls are the control plane's traffic, never a sandbox's
    registry_mirrors: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="mirror URLs tried in order for docker.io images (env: comma-separated), "
        "e.g. https://mirror.example.com; an http:// mirror is spoken to over plain HTTP",
    )
    registry_mirror_only: bool = Field(
        False,
        description="docker.io images come from registry_mirrors only, never from docker.io "
        "(air-gapped or proxied installs: no public name is looked up)",
    )
    insecure_registries: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="registry hosts[:port] allowed over plain HTTP (env: comma-separated); "
        "loopback always is",
    )
    image_pull_policy: Literal["if-not-present", "always", "never"] = Field(
        "if-not-present", description="when a create pulls its image (local runtime and Docker)"
    )
    image_pull_timeout: float = Field(300.0, gt=0, description="seconds one pull may take, then it fails")
    registry_credentials: dict[str, str] = Field(
        default_factory=dict,
        description="registry host[:port] -> name of a vault secret holding 'username:password', "
        "used when a create gives no image.auth (env: JSON object)",
    )

    @field_validator("registry_mirrors", "insecure_registries", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    # policy and audit
    policy_max_rules: int = Field(DEFAULT_MAX_RULES, ge=1)
    preset_dirs: list[Path] = Field(
        default_factory=list,
        description="directories of policy presets (NAME.yaml) a policy may include as preset:NAME",
    )
    default_policy: Path | None = Field(
        None,
        description="policy file a sandbox created without a networkPolicy gets (unset: deny everything)",
    )
    policy_ceiling: Path | None = Field(
        None,
        description="policy file every sandbox policy must stay within, at create and on every change "
        "(docs/policy.md, Ceilings; unset: no ceiling)",
    )
    audit_max_bytes: int = Field(
        100 * 1024 * 1024, ge=1024, description="rotate the audit log past this size"
    )
    audit_backups: int = Field(10, ge=0)
    audit_fsync: bool = Field(
        False, description="the proxy fsyncs audit.jsonl after each write: records survive a power loss"
    )
    audit_max_age_days: float | None = Field(
        None, gt=0, description="the audit index drops records older than this (the JSONL is kept)"
    )
    audit_max_rows: int | None = Field(
        None, ge=1, description="the audit index keeps at most this many newest records"
    )

    @model_validator(mode="after")
    def _mirror_only_has_mirrors(self) -> Settings:
        if self.registry_mirror_only and not self.registry_mirrors:
            raise ValueError(
                "registry_mirror_only is set but registry_mirrors is empty: no docker.io image "
                "could be pulled; name a mirror (e.g. https://mirror.example.com) or unset it"
            )
        return self

    @model_validator(mode="after")
    def _oidc_names_its_audience(self) -> Settings:
        if self.oidc_issuer and not self.oidc_audience:
            raise ValueError(
                "oidc_issuer is set but oidc_audience is not: a token meant for another service of "
                "the issuer would be taken; set oidc_audience to the audience your issuer puts in "
                "tokens for sandgate"
            )
        return self

    @model_validator(mode="after")
    def _isolation_from_secure_runtime(self) -> Settings:
        if self.secure_runtime is not None and "isolation" not in self.model_fields_set:
            self.isolation = self.secure_runtime.isolation()
        return self

    @model_validator(mode="after")
    def _runtime_class_from_secure_runtime(self) -> Settings:
        runtime_class = self.secure_runtime.k8s_runtime_class if self.secure_runtime else None
        if runtime_class and "gvisor_runtime_class" not in self.kubernetes.model_fields_set:
            self.kubernetes = self.kubernetes.model_copy(update={"gvisor_runtime_class": runtime_class})
        return self

    @field_validator("default_policy", "policy_ceiling")
    @classmethod
    def _policy_file_loads(cls, path: Path | None, info: ValidationInfo) -> Path | None:
        """A default policy or ceiling that would refuse every create is refused at start, with
        file:line."""
        if path is not None:
            presets = Presets(tuple(info.data.get("preset_dirs") or ()))
            default_policy(path, info.data.get("policy_max_rules", DEFAULT_MAX_RULES), presets)
        return path

    @property
    def presets(self) -> Presets:
        return Presets(tuple(self.preset_dirs))

    def load_default_policy(self) -> Policy | None:
        """The operator's default policy; None (deny everything) when unset."""
        if self.default_policy is None:
            return None
        return default_policy(self.default_policy, self.policy_max_rules, self.presets)

    def load_policy_ceiling(self) -> Policy | None:
        """The deployment's ceiling (policy_book.py rule 4); None when unset."""
        if self.policy_ceiling is None:
            return None
        return default_policy(self.policy_ceiling, self.policy_max_rules, self.presets)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls, config_file()))

    @property
    def audit_log(self) -> Path:
        return audit_path(self.state_dir)

    @property
    def database(self) -> Path:
        return self.state_dir / "sandgate.db"

    @property
    def state_database(self) -> Path | str:
        """Where the sandboxes, policies and keys are: the PostgreSQL URL, else the SQLite file."""
        return self.database_url.get_secret_value() if self.database_url else self.database

    @property
    def disk_dir(self) -> Path:
        return self.sandbox_disk_dir or self.state_dir / "disks"


def config_file() -> Path | None:
    """The TOML file to read: --config, else SANDGATE_CONFIG (either must exist), else the default."""
    named = _config_flag.get() or os.environ.get("SANDGATE_CONFIG")
    if named:
        path = Path(named)
        if not path.is_file():
            raise FileNotFoundError(f"config file {path} does not exist (from --config or SANDGATE_CONFIG)")
        return path
    return DEFAULT_CONFIG_FILE if DEFAULT_CONFIG_FILE.is_file() else None


def default_policy(path: Path, max_rules: int, presets: Presets) -> Policy:
    """The policy file at `path`; ValueError (PolicyError: file:line) if unreadable or invalid, or
    if it has more than `max_rules` rules."""
    return load_policy(path, presets, max_rules)


def load_settings(config: Path | None = None, **flags: Any) -> Settings:
    """Settings from flags > env > TOML file > defaults. Flags that are None were not given."""
    token = _config_flag.set(config)
    try:
        return Settings(**{k: v for k, v in flags.items() if v is not None})
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"config file {config_file()} is not valid TOML: {exc}") from exc
    except ValidationError as exc:
        raise ValueError(one_line(exc)) from None
    finally:
        _config_flag.reset(token)


def one_line(error: ValidationError) -> str:
    """Each problem as `setting <name>: <what is wrong>`, on one line; an unknown name is named
    by its whole path (`kubernetes.tolerations.0.tolerationSeconds`)."""
    problems = []
    for problem in error.errors():
        name = problem["loc"][0] if problem["loc"] else "?"
        message = str(problem["msg"]).removeprefix("Value error, ")
        if problem["type"] == "extra_forbidden":
            message = f"unknown setting {'.'.join(str(part) for part in problem['loc'])}"
        problems.append(f"setting {name}: {message}")
    return "; ".join(problems)
