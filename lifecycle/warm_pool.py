"""A pool of pre-built sandboxes for the default image, so a create can skip the cold start.

Rules:
1. A member is a whole sandbox under its final id (network, runtime, execd answering /ping), but
   with no proxy entry: until it is claimed, the proxy refuses all of its traffic like any
   unknown source. Nothing runs in it but execd: no entrypoint, no user env, no limits.
2. `claim()` hands a member out exactly once; the pool then refills in a background thread.
   A member that fails to build is removed whole (`discard`), and the next try waits longer.
3. `stop()` ends the refill thread and removes every unclaimed member. Members are never
   persisted: after a restart the store does not know them, and `Service.start` removes them.
4. A member's execd token is made when it is built (execd starts with it) and stays with it
   when it is claimed.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from sandgate.lifecycle.confinement import SandboxNet

log = logging.getLogger(__name__)
MAX_BACKOFF_S = 30.0
STOP_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Member:
    """A ready pooled sandbox: its id, its network and the token its execd was started with."""

    sandbox_id: str
    net: SandboxNet
    execd_token: str


class WarmPool:
    def __init__(self, size: int, build: Callable[[str], Member], discard: Callable[[str], None]) -> None:
        self.size = size
        self._build = build
        self._discard = discard
        self._ready: list[Member] = []
        self._changed = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.size > 0 and self._thread is None:
            self._thread = threading.Thread(target=self._refill, name="warm-pool", daemon=True)
            self._thread.start()

    def claim(self) -> Member | None:
        """A ready member, or None when the pool is empty right now."""
        with self._changed:
            if not self._ready:
                return None
            member = self._ready.pop(0)
            self._changed.notify_all()
            return member

    def members(self) -> list[str]:
        with self._changed:
            return [member.sandbox_id for member in self._ready]

    def wait_full(self, timeout: float) -> bool:
        """Wait until `size` members are ready (for start-up and tests)."""
        with self._changed:
            return self._changed.wait_for(lambda: len(self._ready) >= self.size, timeout)

    def stop(self) -> None:
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        if self._thread is not None:
            self._thread.join(STOP_TIMEOUT_S)
        with self._changed:
            left, self._ready = self._ready, []
        for member in left:
            self._remove(member.sandbox_id)

    def _refill(self) -> None:
        backoff = 0.0
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._stopping or len(self._ready) < self.size)
                if self._stopping:
                    return
            sandbox_id = str(uuid.uuid4())
            try:
                member = self._build(sandbox_id)
            except Exception:
                log.exception(
                    "warm pool: building sandbox %s failed; retrying in %.0f s", sandbox_id, backoff
                )
                self._remove(sandbox_id)
                backoff = min(MAX_BACKOFF_S, backoff * 2 or 1.0)
                with self._changed:
                    self._changed.wait_for(lambda: self._stopping, backoff)
                continue
            backoff = 0.0
            with self._changed:
                if self._stopping:
                    keep = False
                else:
                    self._ready.append(member)
                    keep = True
                self._changed.notify_all()
            if not keep:
                self._remove(sandbox_id)

    def _remove(self, sandbox_id: str) -> None:
        try:
            self._discard(sandbox_id)
        except Exception:
            log.exception("warm pool: removing sandbox %s failed", sandbox_id)
