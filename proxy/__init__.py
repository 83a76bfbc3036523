"""sandgate.proxy: the egress proxy (embedded mitmproxy): enforcement, injection, DNS, audit.

Public face for lifecycle: `ProxyConfig` + `run_proxy` (or `python -m sandgate.proxy --config
FILE.json`), `SandboxEntry` + `ProxyControl` (push and drop sandboxes over the control socket),
`ensure_ca` (the deployment CA; `.cert` goes into sandboxes), the audit schema (`AuditRecord`,
`AUDIT_FILE`, `audit_path`; lifecycle writes policy_change records with `append_record`). See
docs/proxy.md and docs/audit.md.

Names are imported when first used (PEP 562): the audit schema needs only pydantic, and the CLI
reads audit records without loading mitmproxy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> the module that defines it
_PUBLIC = {
    "AUDIT_FILE": "audit",
    "AuditLog": "audit",
    "AuditRecord": "audit",
    "INCOMPLETE": "audit",
    "append_record": "audit",
    "audit_path": "audit",
    "redact_path": "audit",
    "CaFiles": "ca",
    "ensure_ca": "ca",
    "ProxyConfig": "config",
    "SandboxEntry": "config",
    "ProxyControl": "control",
    "ProxyControlError": "control",
    "run_proxy": "server",
}

if TYPE_CHECKING:
    from sandgate.proxy.audit import (
        AUDIT_FILE,
        INCOMPLETE,
        AuditLog,
        AuditRecord,
        append_record,
        audit_path,
        redact_path,
    )
    from sandgate.proxy.ca import CaFiles, ensure_ca
    from sandgate.proxy.config import ProxyConfig, SandboxEntry
    from sandgate.proxy.control import ProxyControl, ProxyControlError
    from sandgate.proxy.server import run_proxy


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'sandgate.proxy' has no attribute {name!r}")
    return getattr(importlib.import_module(f"sandgate.proxy.{_PUBLIC[name]}"), name)


__all__ = [
    "AUDIT_FILE",
    "INCOMPLETE",
    "AuditLog",
    "AuditRecord",
    "CaFiles",
    "ProxyConfig",
    "ProxyControl",
    "ProxyControlError",
    "SandboxEntry",
    "append_record",
    "audit_path",
    "ensure_ca",
    "redact_path",
    "run_proxy",
]
