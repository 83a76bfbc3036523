"""Configuration of one proxy process and the sandbox entries lifecycle pushes into it (part of the
proxy's contract: mitmproxy-free).

Rules: these are the proxy's boundary models. The proxy never reads sandgate settings itself;
lifecycle builds a `ProxyConfig`, writes it as JSON, and starts `python -m sandgate.proxy
--config FILE`. Sandbox entries arrive over the control socket as `SandboxEntry` JSON. An entry's
policy is the typed `sandgate.policy.Policy` lifecycle validated where the policy entered (with
its limits): written once as its document (`to_document`), loaded by the same validation.
The file holds no secret: `vault` says which store and where, and the secrets that open it
(`vault_secrets`, never serialised) reach the process through a pipe (`--secrets-fd`), so they
exist only in the memory of the control plane and the proxy.
"""

from __future__ import annotations

import ipaddress
import re
from ipaddress import IPv4Address
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    field_serializer,
    field_validator,
    model_validator,
)

from sandgate.policy import Policy, policy_from_dict, to_document
from sandgate.proxy.contract.names import audit_path, control_socket
from sandgate.vault import StoreSecrets, StoreSettings

DNS_PORT = 53
EchMode = Literal["refuse", "intercept", "passthrough"]  # what an ECH hello means (proxy/clienthello.py)
RESOLVER_FORMS = "an IP address with an optional port: 192.0.2.53, 192.0.2.53:5353, [2001:db8::53]:5353"


def resolver_address(text: str) -> tuple[str, int]:
    """(address, port) of a resolver written `ip`, `ip:port`, `v6`, `[v6]` or `[v6]:port` (port 53
    when none is given); ValueError naming the accepted forms otherwise."""
    entry = text.strip()
    host, port = entry, str(DNS_PORT)
    if entry.startswith("["):
        host, bracket, rest = entry[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            host = ""
        port = rest[1:] if rest else port
    elif entry.count(":") == 1:
        host, _, port = entry.partition(":")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"{text!r} is not a resolver address; use {RESOLVER_FORMS}") from None
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"{text!r} has no valid port (1-65535); use {RESOLVER_FORMS}")
    return str(address), int(port)


def _canonical_resolver(text: str) -> str:
    address, port = resolver_address(text)
    if port == DNS_PORT:
        return address
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def system_servers() -> list[str]:
    """The system's resolvers (/etc/resolv.conf), as the proxy asks them when none are configured."""
    import mitmproxy_rs  # the proxy's own reader of resolv.conf (a small native module, not mitmproxy)

    try:
        return mitmproxy_rs.dns.get_system_dns_servers()
    except RuntimeError as exc:
        raise RuntimeError(
            f"no upstream DNS configured and none found in the system ({exc}); "
            "set upstream_dns in the proxy config"
        ) from exc


# A resolver address as settings and the proxy config hold it, checked and in canonical form.
ResolverAddress = Annotated[str, AfterValidator(_canonical_resolver)]


class ConnectionLimits(BaseModel):
    """How much of the proxy one sandbox may take: open TCP connections and new connections per
    second (a token bucket: `accept_burst` at once, refilled at `accept_rate` per second). A
    connection over either limit is reset at accept, before any byte is read."""

    model_config = ConfigDict(extra="forbid")

    max_connections: int = Field(default=256, ge=1, description="TCP connections one sandbox may hold open")
    accept_rate: float = Field(default=50.0, gt=0, description="new connections per second, sustained")
    accept_burst: int = Field(
        default=200, ge=1, description="new connections accepted at once after a quiet spell"
    )


HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP token (RFC 9110 5.1)
RESERVED_CONNECT_HEADERS = frozenset({"host", "proxy-authorization", "content-length", "transfer-encoding"})


class UpstreamProxy(BaseModel):
    """A proxy that allowed traffic leaves through (a company's proxy), instead of dialling the
    origin: CONNECT host:port for everything, TLS or not (proxy/upstreamproxy.py). Its login is a
    vault entry's name, never the login itself; the sandbox id and its tenant go on the CONNECT
    request only (`identity_header`, `tenant_header`), never inside the tunnel."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)  # the URL may hold a login

    url: str = Field(description="http://host:port of the upstream proxy (an IP or a name)")
    hosts: list[str] = Field(
        default_factory=list,
        description="destinations that leave through it: `host.example.com`, `*.example.com` "
        "(subdomains only); empty: every destination",
    )
    credential: str | None = Field(
        default=None, description="name of a vault entry holding 'username:password' (Basic auth)"
    )
    identity_header: str | None = Field(
        default=None,
        description="header on each CONNECT carrying the sandbox id (e.g. X-Sandgate-Sandbox)",
    )
    tenants: list[str] = Field(
        default_factory=list,
        description="tenants whose sandboxes' traffic leaves through it; empty: every tenant's",
    )
    tenant_header: str | None = Field(
        default=None,
        description="header on each CONNECT carrying the sandbox's tenant (e.g. X-Sandgate-Tenant)",
    )

    @field_validator("url")
    @classmethod
    def _http_host_port(cls, value: str) -> str:
        parts = urlsplit(value)
        try:
            port = parts.port
        except ValueError:
            port = None
        if parts.scheme != "http" or not parts.hostname or port is None:
            raise ValueError(f"upstream proxy {value!r}: give it as http://host:port")
        if parts.username or parts.password:
            shown = f"{parts.scheme}://{parts.hostname}:{port}"
            raise ValueError(
                f"upstream proxy {shown} carries a login in its URL: put 'username:password' in "
                "the vault and name that entry in `credential`"
            )
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ValueError(f"upstream proxy {value!r}: only http://host:port, no path")
        return f"http://{parts.netloc}"

    @field_validator("hosts")
    @classmethod
    def _patterns(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            name = pattern.removeprefix("*.")
            if not name or "*" in name or "/" in name or ":" in name:
                raise ValueError(f"upstream proxy host {pattern!r}: use host.example.com or *.example.com")
        return [pattern.lower().rstrip(".") for pattern in patterns]

    @field_validator("identity_header", "tenant_header")
    @classmethod
    def _header(cls, value: str | None) -> str | None:
        reserved = value is not None and value.lower() in RESERVED_CONNECT_HEADERS
        if value is not None and (not HEADER_NAME.fullmatch(value) or reserved):
            raise ValueError(f"{value!r} is not a header name sandgate may set on a CONNECT")
        return value

    @model_validator(mode="after")
    def _two_headers(self) -> UpstreamProxy:
        if self.identity_header and self.identity_header.lower() == (self.tenant_header or "").lower():
            raise ValueError(f"identity_header and tenant_header are both {self.identity_header!r}")
        return self

    @property
    def address(self) -> tuple[str, int]:
        parts = urlsplit(self.url)
        assert parts.hostname is not None and parts.port is not None
        return parts.hostname, parts.port

    def carries(self, host: str, tenant: str | None = None) -> bool:
        """Whether traffic for `host` of a sandbox of `tenant` leaves through this proxy (`*.x` is
        subdomains only; a proxy for some tenants carries no sandbox without one)."""
        if self.tenants and tenant not in self.tenants:
            return False
        host = host.lower().rstrip(".")
        return not self.hosts or any(
            host.endswith(pattern[1:]) if pattern.startswith("*.") else host == pattern
            for pattern in self.hosts
        )


def upstream_proxy_for(
    proxies: list[UpstreamProxy], host: str, tenant: str | None = None
) -> UpstreamProxy | None:
    """The first of `proxies` that carries `host` for `tenant`; None: the proxy dials the origin
    itself."""
    return next((proxy for proxy in proxies if proxy.carries(host, tenant)), None)


class SandboxEntry(BaseModel):
    """One sandbox as the proxy knows it: its source address names it, its policy decides."""

    model_config = ConfigDict(extra="forbid")

    sandbox_id: str = Field(min_length=1)
    address: str = Field(description="the sandbox end of its veth (IPv4); its identity at the proxy")
    policy: Policy = Field(description="the sandbox's sandgate policy document, bindings included")
    credentials: dict[str, str] = Field(
        default_factory=dict,
        description="binding credential name -> vault entry name; names missing here are used as-is",
    )
    limits: ConnectionLimits | None = Field(
        default=None, description="this sandbox's connection limits (default: ProxyConfig.limits)"
    )
    netns: str | None = Field(
        default=None,
        description="the sandbox's network namespace (a path such as /run/netns/NAME), where the proxy "
        "finds which process opened each connection (proxy/origin.py); None: not looked up (gVisor)",
    )
    process_lists: list[str] = Field(
        default_factory=list,
        description="files listing the sandbox's processes (its cgroup's cgroup.procs), where the "
        "proxy looks for a connection's process; empty: every process in `netns`",
    )
    upstream_proxies: list[UpstreamProxy] | None = Field(
        default=None,
        description="this sandbox's upstream proxies, first match wins (default: "
        "ProxyConfig.upstream_proxies)",
    )
    tenant: str | None = Field(
        default=None,
        description="the sandbox's tenant: which upstream proxies carry it (`UpstreamProxy.tenants`) "
        "and what their `tenant_header` says",
    )

    def vault_names(self) -> set[str]:
        """The vault entries the bindings (and the upstream proxies) read."""
        names = {
            self.credentials.get(credential, credential)
            for binding in self.policy.bindings
            for credential in binding.credential_names()
        }
        return names | {proxy.credential for proxy in self.upstream_proxies or () if proxy.credential}

    @model_validator(mode="before")
    @classmethod
    def _load_policy(cls, data: Any) -> Any:
        """The document's JSON is loaded by sandgate.policy's one validation (no limit: it was
        checked where the policy entered), its rules named after the sandbox."""
        if isinstance(data, dict) and not isinstance(data.get("policy"), Policy):
            source = f"<sandbox {data.get('sandbox_id')}>"
            data = {**data, "policy": policy_from_dict(data.get("policy"), source)}
        return data

    @field_serializer("policy")
    def _policy_document(self, policy: Policy) -> dict[str, Any]:
        return to_document(policy)

    @field_validator("address")
    @classmethod
    def _ipv4(cls, value: str) -> str:
        try:
            return str(IPv4Address(value))
        except ValueError as exc:
            raise ValueError(
                f"address {value!r} is not an IPv4 address (the sandbox's veth address)"
            ) from exc


class ProxyConfig(BaseModel):
    """Everything `run_proxy` needs. Paths default to files in `state_dir`."""

    model_config = ConfigDict(extra="forbid")

    state_dir: Path = Field(description="CA, audit log and control socket live here")
    listen_host: str = Field("0.0.0.0", description="address the three listeners bind")
    transparent_port: int = Field(15001, ge=1, le=65535, description="nft-redirected sandbox TCP")
    explicit_port: int = Field(
        15002, ge=1, le=65535, description="HTTP(S)_PROXY listener (CONNECT, absolute-form)"
    )
    dns_port: int = Field(15053, ge=1, le=65535, description="the sandboxes' resolver (UDP)")
    upstream_dns: list[ResolverAddress] = Field(
        default_factory=list,
        description="resolvers the proxy asks: `ip`, `ip:port`, `[v6]:port` (default: /etc/resolv.conf)",
    )
    upstream_ca: Path | None = Field(None, description="extra PEM bundle trusted upstream, added to certifi")
    control_socket: Path | None = Field(
        None, description="control API socket (default: names.CONTROL_SOCKET in the state dir)"
    )
    header_timeout: float = Field(
        default=30.0, gt=0, description="seconds a connection has to finish its first request's headers"
    )
    limits: ConnectionLimits = Field(
        default_factory=lambda: ConnectionLimits(),
        description="per-sandbox limits unless an entry carries its own",
    )
    splice_passthrough: bool = Field(
        default=True,
        description="decide TLS at the front door (ClientHello by MSG_PEEK) and relay pass-through "
        "connections in the kernel (splice), not through mitmproxy",
    )
    ech: EchMode = Field(
        default="intercept",
        description="what a ClientHello carrying ECH (encrypted_client_hello) means: refuse (its SNI is "
        "only the outer name), intercept (TLS terminated here, which takes no ECH; every request judged) "
        "or passthrough (judged and trusted by the outer name)",
    )
    workers: int = Field(
        default=1,
        ge=0,
        description="proxy worker processes sharing the listeners (0: one per core); more than one "
        "runs the worker pool (proxy/workers.py)",
    )
    listen_backlog: int = Field(
        default=4096, ge=16, description="accept queue of each TCP listener (capped by net.core.somaxconn)"
    )
    audit_max_bytes: int = Field(
        100 * 1024 * 1024, ge=1024, description="rotate the audit log past this size"
    )
    audit_backups: int = Field(10, ge=0, description="rotated audit files kept (.1, .2, ...)")
    audit_fsync: bool = Field(
        False,
        description="fsync the audit log after each write (batch): a record then survives a power "
        "loss, not only the death of any process",
    )
    vault: StoreSettings | None = Field(None, description="which secret store and where; None = no vault")
    vault_secrets: StoreSecrets = Field(
        default_factory=StoreSecrets,
        exclude=True,
        description="what opens the store; never written to the config file (read from --secrets-fd)",
    )
    upstream_proxies: list[UpstreamProxy] = Field(
        default_factory=list,
        description="proxies allowed traffic leaves through, first match by host wins; a "
        "destination none carries is dialled directly",
    )
    sandboxes: list[SandboxEntry] = Field(
        default_factory=list, description="entries loaded at start (lifecycle normally pushes them instead)"
    )

    @property
    def socket_path(self) -> Path:
        return self.control_socket or control_socket(self.state_dir)

    @property
    def audit_path(self) -> Path:
        return audit_path(self.state_dir)
