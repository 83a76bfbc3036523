"""sandgate.proxy: the egress proxy (embedded mitmproxy): enforcement, injection, DNS, audit.

Public face for lifecycle: `ProxyConfig` + `run_proxy` (or `python -m sandgate.proxy --config
FILE.json`), `SandboxEntry` + `ProxyControl` (push and drop sandboxes over the control socket),
`ensure_ca` (the deployment CA; `.cert` goes into sandboxes), `AuditRecord`/`AuditLog` (the
audit schema; lifecycle writes policy_change records with the same model). See docs/proxy.md.
"""

from sandgate.proxy.audit import AuditLog, AuditRecord, redact_path
from sandgate.proxy.ca import CaFiles, ensure_ca
from sandgate.proxy.config import ProxyConfig, SandboxEntry
from sandgate.proxy.control import ProxyControl, ProxyControlError
from sandgate.proxy.server import run_proxy

__all__ = [
    "AuditLog",
    "AuditRecord",
    "CaFiles",
    "ProxyConfig",
    "ProxyControl",
    "ProxyControlError",
    "SandboxEntry",
    "ensure_ca",
    "redact_path",
    "run_proxy",
]
