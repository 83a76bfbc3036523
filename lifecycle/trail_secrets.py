"""What a sandbox's exec and process records must never hold: every value its credential vault
has held here, its execd and egress tokens, and the API key. One redactor per sandbox, rebuilt
when its vault changes; a value once held stays in it (an old value is still a secret)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from sandgate.lifecycle.sandbox_store import SandboxRecord
from sandgate.vault import Redactor

# (sandbox id, the revision already known) -> (its vault revision, its values; None: unchanged)
VaultValues = Callable[[str, int], tuple[int, frozenset[str] | None]]


class Secrets:
    """Per sandbox, the redactor of what must never appear in its records."""

    def __init__(self, vault_values: VaultValues, api_key: str) -> None:
        self.vault_values = vault_values
        self.api_key = api_key
        self._cache: dict[str, tuple[int, frozenset[str], Redactor]] = {}
        self._lock = threading.Lock()

    def redact(self, record: SandboxRecord) -> Callable[[str], str]:
        """The sandbox's redactor; the vault is read only when its revision changed."""
        with self._lock:
            cached = self._cache.get(record.id)
        revision, values = self.vault_values(record.id, cached[0] if cached else -1)
        if cached is None or values is not None:
            known = (cached[1] if cached else frozenset()) | (values or frozenset())
            known |= {s for s in (self.api_key, record.execd_token, record.egress_token) if s}
            cached = (revision, known, Redactor(known))
            with self._lock:
                self._cache[record.id] = cached
        return cached[2].redact_text
