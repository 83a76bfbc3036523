"""sandgate.proxy: the egress proxy (embedded mitmproxy): enforcement, injection, DNS, audit.

Public face: the proxy's contract (proxy/contract/), which is all lifecycle may use of the proxy
(import-linter holds it to that in `make lint`): `ProxyConfig` (written to `CONFIG_FILE` for
`python -m sandgate.proxy --config FILE`), `SandboxEntry` + `ProxyControl` (push and drop
sandboxes over the control socket), `ensure_ca` (the deployment CA; `.cert` goes into
sandboxes), the audit schema (`AuditRecord`, `Principal`, `append_record`, `RECORD_KINDS`,
`INCOMPLETE`), the audit file's hash chain (`verify_chain`, over `audit_files`) and the names of
every file and socket in the state dir. None of it loads mitmproxy; the engine (every other
module here) is private. See docs/proxy.md and docs/audit.md.

Names are imported when first used (PEP 562): the CLI reads audit records with only pydantic
loaded, and `sandgate vault put` talks to the control socket with httpx, never mitmproxy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> the contract module that defines it
_PUBLIC = {
    **dict.fromkeys(("AUDIT_FILE", "CONFIG_FILE", "CONTROL_SOCKET", "LOG_FILE"), "names"),
    **dict.fromkeys(("audit_path", "config_path", "control_socket", "log_path"), "names"),
    **dict.fromkeys(
        (
            "INCOMPLETE",
            "RECORD_KINDS",
            "REFUSAL_WINDOW",
            "AuditRecord",
            "Principal",
            "RecordKind",
            "RefusalWindows",
            "append_record",
            "append_records",
            "redact_path",
        ),
        "audit",
    ),
    **dict.fromkeys(("audit_files", "verify_chain"), "chain"),
    **dict.fromkeys(("CaFiles", "ensure_ca"), "ca"),
    **dict.fromkeys(
        ("ConnectionLimits", "ProxyConfig", "ResolverAddress", "SandboxEntry", "UpstreamProxy"), "config"
    ),
    "system_servers": "config",
    **dict.fromkeys(("ApprovalAnswer", "ProxyControl", "ProxyControlError", "VaultValues"), "control"),
}

if TYPE_CHECKING:
    from sandgate.proxy.contract.audit import (
        INCOMPLETE,
        RECORD_KINDS,
        REFUSAL_WINDOW,
        AuditRecord,
        Principal,
        RecordKind,
        RefusalWindows,
        append_record,
        append_records,
        redact_path,
    )
    from sandgate.proxy.contract.ca import CaFiles, ensure_ca
    from sandgate.proxy.contract.chain import audit_files, verify_chain
    from sandgate.proxy.contract.config import (
        ConnectionLimits,
        ProxyConfig,
        ResolverAddress,
        SandboxEntry,
        UpstreamProxy,
        system_servers,
    )
    from sandgate.proxy.contract.control import ApprovalAnswer, ProxyControl, ProxyControlError, VaultValues
    from sandgate.proxy.contract.names import (
        AUDIT_FILE,
        CONFIG_FILE,
        CONTROL_SOCKET,
        LOG_FILE,
        audit_path,
        config_path,
        control_socket,
        log_path,
    )


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'sandgate.proxy' has no attribute {name!r}")
    return getattr(importlib.import_module(f"sandgate.proxy.contract.{_PUBLIC[name]}"), name)


__all__ = [
    "AUDIT_FILE",
    "CONFIG_FILE",
    "CONTROL_SOCKET",
    "INCOMPLETE",
    "LOG_FILE",
    "RECORD_KINDS",
    "REFUSAL_WINDOW",
    "ApprovalAnswer",
    "AuditRecord",
    "CaFiles",
    "ConnectionLimits",
    "Principal",
    "ProxyConfig",
    "ProxyControl",
    "ProxyControlError",
    "RecordKind",
    "RefusalWindows",
    "ResolverAddress",
    "SandboxEntry",
    "UpstreamProxy",
    "VaultValues",
    "append_record",
    "append_records",
    "audit_files",
    "audit_path",
    "config_path",
    "control_socket",
    "ensure_ca",
    "log_path",
    "redact_path",
    "system_servers",
    "verify_chain",
]
