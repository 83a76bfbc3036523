"""Configuration of one proxy process and the sandbox entries lifecycle pushes into it.

Rules: these are the proxy's boundary models. The proxy never reads sandgate settings itself;
lifecycle builds a `ProxyConfig`, writes it as JSON, and starts `python -m sandgate.proxy
--config FILE`. Sandbox entries arrive over the control socket as `SandboxEntry` JSON.
"""

from __future__ import annotations

from ipaddress import IPv4Address
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator


class SandboxEntry(BaseModel):
    """One sandbox as the proxy knows it: its source address names it, its policy decides."""

    model_config = ConfigDict(extra="forbid")

    sandbox_id: str = Field(min_length=1)
    address: str = Field(description="the sandbox end of its veth (IPv4); its identity at the proxy")
    policy: dict[str, Any] = Field(description="the sandbox's sandgate policy document, bindings included")
    credentials: dict[str, str] = Field(
        default_factory=dict,
        description="binding credential name -> vault entry name; names missing here are used as-is",
    )

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
    upstream_dns: list[str] = Field(
        default_factory=list, description="resolvers the proxy asks itself (default: /etc/resolv.conf)"
    )
    upstream_ca: Path | None = Field(None, description="extra PEM bundle trusted upstream, added to certifi")
    control_socket: Path | None = Field(
        None, description="control API socket (default <state_dir>/proxy.sock)"
    )
    header_timeout: float = Field(
        default=30.0, gt=0, description="seconds a connection has to finish its first request's headers"
    )
    audit_max_bytes: int = Field(100 * 1024 * 1024, ge=1024, description="rotate audit.jsonl past this size")
    audit_backups: int = Field(10, ge=0, description="rotated audit files kept (audit.jsonl.1 ...)")
    vault: dict[str, Any] = Field(
        default_factory=dict,
        description="how to open the secret store (see sandgate.vault); empty = no vault",
    )
    sandboxes: list[SandboxEntry] = Field(
        default_factory=list, description="entries loaded at start (lifecycle normally pushes them instead)"
    )

    @property
    def socket_path(self) -> Path:
        return self.control_socket or self.state_dir / "proxy.sock"

    @property
    def audit_path(self) -> Path:
        return self.state_dir / "audit.jsonl"
