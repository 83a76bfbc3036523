"""The control plane as a client of a sandbox's execd.

Rules:
1. Every sandbox's execd requires an access token of its own: random (`new_token`), made with the
   sandbox (a pooled one's when it is built), persisted in its record like the egress token, so
   it holds across restarts. The control plane sends it (`execd_headers`) on its own calls to
   execd; the API hands it to clients only in the 44772 endpoint's headers.
2. Waiting for execd to answer `/ping` is the runtimes' `runtime.base.wait_for_execd`, not here.
"""

from __future__ import annotations

import secrets

import httpx

from sandgate.lifecycle.errors import LifecycleError
from sandgate.lifecycle.runtime.base import EXECD_PORT, EXECD_TOKEN_HEADER
from sandgate.lifecycle.sandbox_store import SandboxRecord

ENTRYPOINT_TIMEOUT = 10.0


def new_token() -> str:
    """A fresh random token (execd access, egress API)."""
    return secrets.token_urlsafe(24)


def execd_headers(record: SandboxRecord) -> dict[str, str]:
    """What a request to this sandbox's execd must carry (nothing for a pre-token sandbox)."""
    return {EXECD_TOKEN_HEADER: record.execd_token} if record.execd_token else {}


def start_entrypoint(record: SandboxRecord, entrypoint: list[str]) -> None:
    """Start the entrypoint through the sandbox's execd, in the background (cwd /workspace,
    execd's env plus the env file a warm-pool claim wrote)."""
    url = f"http://{record.address}:{EXECD_PORT}/command"
    with httpx.Client(timeout=ENTRYPOINT_TIMEOUT, headers=execd_headers(record)) as client:
        answer = client.post(url, json={"argv": entrypoint, "background": True})
    if answer.status_code != 200 or b'"execution_complete"' not in answer.content:
        raise LifecycleError(
            "invalid", f"execd refused to start the entrypoint {entrypoint!r}: {answer.text[:300]}"
        )
