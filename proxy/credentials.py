"""The proxy's copy of its sandboxes' credential values: loaded off the event loop, used from memory.

Rules:
1. No vault call on the event loop. `SecretValues` holds the current value of every vault entry
   a sandbox's bindings name. It is filled by blocking reads (`load`) made only from threads:
   the control API's handler thread when an entry is pushed, and again when the control plane
   signals a vault change (`sandgate vault put/rm`, the credential-vault API). Injection renders
   from memory; a value missing there (stored after the push, never signalled) is loaded with
   `asyncio.to_thread` by the injection hook, which awaits without blocking other sandboxes.
2. Secrets enter the redactor when they are stored or rotated (a minted token when it is
   minted, `remember`), not at first use: every value a
   name has had since the proxy started stays in that sandbox's scrubber (a rotated-out value is
   still a secret an origin may reflect), and the scrubber is rebuilt when a load saw a new one.
3. The audit writer redacts with every value any name has had (`SecretValues.redact_text`).
4. Values are revealed only for the credentials the sandbox's own bindings name (mapped through
   `SandboxEntry.credentials`); a sandbox without bindings holds none and pays nothing for
   scrubbing. Nothing here logs a value.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from sandgate.policy import OAuth2Auth
from sandgate.proxy.scrubbing import Scrubber
from sandgate.vault import Injection, Redactor, SecretNotFound, VaultError, minted_name, render, reveal_via

log = logging.getLogger(__name__)


class SecretValues:
    """vault entry name -> current value (and every value it has had), shared by all sandboxes."""

    def __init__(self, store: Any) -> None:
        self.store = store  # a sandgate.vault SecretStore, or None (no vault configured)
        self._lock = threading.Lock()
        self._current: dict[str, str] = {}
        self._seen: dict[str, frozenset[str]] = {}
        self._tracked: set[str] = set()  # names some pushed sandbox binds
        self.version = 0  # bumped whenever a value the scrubbers do not know yet arrives
        self._redactor: tuple[int, Redactor | None] = (-1, None)  # (version, every value seen)

    def load(self, names: Iterable[str]) -> None:
        """Read `names` from the vault now. Blocking: call it from a thread, never the event loop."""
        if self.store is None:
            return
        for name in names:
            with self._lock:
                self._tracked.add(name)
            try:
                value: str | None = self.store.reveal(name)
            except VaultError as exc:  # not stored (yet), or removed: injection reports it
                log.info("credential %r not available: %s", name, type(exc).__name__)
                value = None
            self._set(name, value)

    def refresh(self, names: Iterable[str] | None = None) -> int:
        """Re-read the tracked names among `names` (all tracked ones for None); how many were read."""
        with self._lock:
            wanted = set(self._tracked) if names is None else self._tracked & set(names)
        self.load(sorted(wanted))
        return len(wanted)

    def current(self, name: str) -> str | None:
        return self._current.get(name)

    def known(self, names: Iterable[str]) -> frozenset[str]:
        """Every value these names have had: what the scrubber removes."""
        seen = self._seen
        return frozenset(value for name in names for value in seen.get(name, ()))

    def redact_text(self, text: str) -> str:
        """`text` without any value any name ever had here (the audit writer's redactor: a
        superset of every sandbox's own scrubber)."""
        built_for, redactor = self._redactor
        current = self.version  # read first: the values gathered next include at least these
        if built_for != current:
            with self._lock:
                values = {value for seen in self._seen.values() for value in seen}
            redactor = Redactor(values) if values else None
            self._redactor = (current, redactor)
        return redactor.redact_text(text) if redactor else text

    def remember(self, name: str, value: str) -> None:
        """A value the proxy made itself (a minted token): used and scrubbed like a vault value,
        never read from or refreshed against the vault."""
        self._set(name, value)

    def _set(self, name: str, value: str | None) -> None:
        with self._lock:
            if value is None:
                self._current.pop(name, None)
                return
            self._current[name] = value
            seen = self._seen.get(name, frozenset())
            if value not in seen:
                self._seen[name] = seen | {value}
                self.version += 1


class SandboxCredentials:
    """One sandbox's view: render its bindings from memory, and its scrubber."""

    def __init__(self, values: SecretValues, bindings: Mapping[str, Any], names: Mapping[str, str]) -> None:
        self._values = values
        self._bindings = bindings
        self._names = names
        self.vault_names = frozenset(
            names.get(credential, credential)
            for binding in bindings.values()
            for credential in binding.credential_names()
        )
        self.minted_names = frozenset(
            minted_name(binding.auth) for binding in bindings.values() if isinstance(binding.auth, OAuth2Auth)
        )
        self._scrubber: Scrubber | None = None
        self._scrubber_version = -1

    @property
    def holds_secrets(self) -> bool:
        return bool(self.vault_names or self.minted_names) and self._values.store is not None

    @property
    def scrubber(self) -> Scrubber | None:
        """The scrubber of every value this sandbox's names have had; None if there are none."""
        version = self._values.version
        if version != self._scrubber_version:
            known = self._values.known(self.vault_names | self.minted_names)
            self._scrubber = Scrubber(known) if known else None
            self._scrubber_version = version
        return self._scrubber

    def missing(self, binding_name: str) -> list[str]:
        """Vault names this binding needs that are not in memory (to load off the loop first)."""
        needed = (self._names.get(c, c) for c in self._bindings[binding_name].credential_names())
        return [name for name in needed if self._values.current(name) is None]

    def load_missing(self, binding_name: str) -> None:
        """Blocking: for `asyncio.to_thread`."""
        self._values.load(self.missing(binding_name))

    def render(self, binding_name: str) -> Injection:
        """The binding's headers and placeholders from memory; VaultError if a value is not there."""
        if self._values.store is None:
            raise VaultError("the proxy has no vault configured (ProxyConfig.vault); cannot inject")
        return render(self._bindings[binding_name], reveal_via(self._from_memory, self._names))

    def reveal(self, credential: str) -> str:
        """A binding credential's value from memory (SecretNotFound if it is not there)."""
        return reveal_via(self._from_memory, self._names)(credential)

    def _from_memory(self, vault_name: str) -> str:
        value = self._values.current(vault_name)
        if value is None:
            raise SecretNotFound(vault_name, "the vault (as the proxy last read it)")
        return value
