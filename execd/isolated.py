"""`/v1/isolated/*` (OpenSandbox 1.1.1, OSEP-0013): isolated sessions are not provided here.

Rules:
1. `GET /v1/isolated/capabilities` answers 200 and says so truthfully: `available: false`, no
   `uid_mode` works, no commit or diff, and a message naming what sandgate does instead (the
   whole sandbox is the isolation boundary). `hardening` (OSEP-0018) reports what the kernel
   says about execd's own process (`/proc/self/status`), never what was merely configured.
2. Every other `/v1/isolated` route answers the spec's 503 `NOT_SUPPORTED` with the same message,
   before reading the body: nothing is created or changed.
"""

from __future__ import annotations

import os
from typing import Any

from .errors import ApiError
from .web import Request, Response, json_response

NOT_SUPPORTED = "NOT_SUPPORTED"
WHY = (
    "isolated sessions (/v1/isolated, OSEP-0013) are not available in a sandgate sandbox: the whole "
    "sandbox is the isolation boundary (its own namespaces under bubblewrap or Docker, every "
    "connection through sandgate's egress gateway); run code with /command, /session or /code instead"
)
DEFAULT_LAST_CAP = 40  # CAP_CHECKPOINT_RESTORE, if the kernel's cap_last_cap cannot be read


async def capabilities(request: Request) -> Response:
    return json_response(
        {
            "available": False,
            "message": WHY,
            "setpriv_available": False,
            "userns_available": False,
            "commit_supported": False,
            "diff_supported": False,
            "hardening": hardening(read_status(), last_capability()),
        }
    )


async def unsupported(request: Request) -> Response:
    raise ApiError(503, NOT_SUPPORTED, WHY)


def read_status() -> dict[str, str]:
    with open("/proc/self/status", encoding="ascii", errors="replace") as handle:
        fields = (line.partition(":") for line in handle)
        return {name: value.strip() for name, _, value in fields}


def last_capability() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap", encoding="ascii") as handle:
            return int(handle.read())
    except (OSError, ValueError):
        return DEFAULT_LAST_CAP


def hardening(status: dict[str, str], last_cap: int) -> dict[str, Any]:
    """OSEP-0018's layers as this process has them (`status` is /proc/self/status)."""
    pid1 = os.getpid() == 1
    seccomp = status.get("Seccomp", "0")
    bounding = int(status.get("CapBnd", "0"), 16)
    all_caps = (1 << (last_cap + 1)) - 1
    return {
        "init_mode": "pid1" if pid1 else "none",
        "signal_shield": pid1,
        "cap_drop": layer(
            bounding & all_caps != all_caps,
            f"capability bounding set is {bounding:#x}",
            "execd keeps the full capability bounding set (the sandbox runtime confines it)",
        ),
        "seccomp": layer(
            seccomp == "2",
            "a seccomp filter is installed on execd",
            f"execd has no seccomp filter of its own (Seccomp: {seccomp})",
        ),
        "landlock": layer(False, "", "sandgate's execd does not apply Landlock"),
        "ebpf": layer(False, "", "sandgate's execd does not load eBPF programs"),
    }


def layer(active: bool, active_message: str, disabled_message: str) -> dict[str, str]:
    if active:
        return {"state": "active", "message": active_message}
    return {"state": "disabled", "message": disabled_message}
