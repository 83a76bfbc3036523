"""A store that lives only in the memory of the process that holds it (a node proxy's vault).

Rules: the values arrive from the control plane with the sandbox entries that bind them (the
node agent pushes them into its proxy over the proxy's control socket) and are dropped with the
last entry that named them. Nothing is written anywhere: a restarted process starts empty and is
fed again by whoever pushed the values. Like every store, it never hands a value to a log.
"""

from __future__ import annotations

import builtins
import threading
from datetime import UTC, datetime

from sandgate.vault.errors import SecretNotFound, VaultError
from sandgate.vault.models import SecretInfo, check_name


class MemoryStore:
    """A `SecretStore` in a dict, guarded by a lock (handler threads put, injection reveals)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, tuple[str, SecretInfo]] = {}

    def __repr__(self) -> str:
        return f"MemoryStore({len(self._values)} values)"

    def put(self, name: str, value: str) -> SecretInfo:
        check_name(name)
        if not value:
            raise VaultError(f"refusing to store an empty value for {name!r}")
        now = datetime.now(UTC)
        with self._lock:
            old = self._values.get(name)
            info = SecretInfo(
                name=name,
                version=old[1].version + 1 if old else 1,
                created_at=old[1].created_at if old else now,
                updated_at=now,
            )
            self._values[name] = (value, info)
        return info

    def delete(self, name: str) -> bool:
        with self._lock:
            return self._values.pop(check_name(name), None) is not None

    def list(self) -> builtins.list[SecretInfo]:
        with self._lock:
            return [self._values[name][1] for name in sorted(self._values)]

    def reveal(self, name: str) -> str:
        with self._lock:
            found = self._values.get(check_name(name))
        if found is None:
            raise SecretNotFound(name, "memory")
        return found[0]
