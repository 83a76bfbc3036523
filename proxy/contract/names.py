"""The names of every file and socket the proxy and lifecycle share in a state dir.

Rules: a name is spelled once, here; both sides build paths with these functions. The state dir
is the control plane's alone (sandboxes never see it), so every name here is host-side.
"""

from __future__ import annotations

from pathlib import Path

AUDIT_FILE = "audit.jsonl"  # the live audit log; backups add .1, .2, ...
CONTROL_SOCKET = "proxy.sock"  # the control API (mode 0600)
CONFIG_FILE = "proxy.json"  # the ProxyConfig lifecycle writes (holds no secret)
LOG_FILE = "proxy.log"  # the proxy's stdout and stderr
CA_KEY_AND_CERT = "mitmproxy-ca.pem"  # the CA's key and certificate: never leaves the host
CA_CERT = "mitmproxy-ca-cert.pem"  # the CA's certificate: what sandboxes trust
UPSTREAM_BUNDLE = "upstream-trust.pem"  # certifi plus the operator's extra upstream CAs
CA_LOCK = ".ca.lock"


def audit_path(state_dir: Path) -> Path:
    """The live audit file of a state dir (backups: the same name with .1, .2, ...)."""
    return state_dir / AUDIT_FILE


def control_socket(state_dir: Path) -> Path:
    return state_dir / CONTROL_SOCKET


def config_path(state_dir: Path) -> Path:
    return state_dir / CONFIG_FILE


def log_path(state_dir: Path) -> Path:
    return state_dir / LOG_FILE


def worker_socket(control: Path, index: int) -> Path:
    """Worker `index`'s own control socket beside the pool's (only the pool talks to it)."""
    return control.with_name(f"{control.stem}-worker-{index}.sock")
