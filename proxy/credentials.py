"""One sandbox's credentials: revealing them for injection, and the scrubber that removes them.

Rules: values are revealed only here, only from the vault store, and only for the credentials
the sandbox's own bindings name (mapped through `SandboxEntry.credentials`). The scrubber holds
exactly those values, so a sandbox without bindings pays nothing for scrubbing; it is rebuilt
when a reveal returns a value it has not seen (a rotated secret). Nothing here logs a value.
"""

from __future__ import annotations

import logging
from typing import Any

from sandgate.proxy.scrubbing import Scrubber
from sandgate.vault import Injection, VaultError, render, reveal_via

log = logging.getLogger(__name__)


class SandboxCredentials:
    def __init__(self, store: Any, bindings: dict[str, Any], names: dict[str, str]) -> None:
        self._store = store
        self._bindings = bindings
        self._names = names
        self._known: frozenset[str] = frozenset()
        self.scrubber: Scrubber | None = None
        self._reveal = reveal_via(self._reveal_and_track, names) if store is not None else None
        if store is not None and bindings:
            self._refresh()

    def render(self, binding_name: str) -> Injection:
        """The binding's headers and placeholders; VaultError if the vault cannot give its values."""
        if self._reveal is None:
            raise VaultError("the proxy has no vault configured (ProxyConfig.vault); cannot inject")
        return render(self._bindings[binding_name], self._reveal)

    def _reveal_and_track(self, vault_name: str) -> str:
        value: str = self._store.reveal(vault_name)
        if value not in self._known:
            self._known = self._known | {value}
            self.scrubber = Scrubber(self._known)
        return value

    def _refresh(self) -> None:
        """Reveal every bound credential now, so scrubbing works before the first injection."""
        for binding in self._bindings.values():
            for credential in binding.credential_names():
                try:
                    self._reveal_and_track(self._names.get(credential, credential))
                except VaultError as exc:  # not stored yet: injection reports it when it is needed
                    log.info("credential %r not available yet: %s", credential, type(exc).__name__)
