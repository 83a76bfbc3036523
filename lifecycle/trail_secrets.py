"""What a sandbox's exec and process records must never hold: every value its credential vault
has held here, its execd and egress tokens, the API key, the caller's own credential, and any
credential of a recognisable form. One redactor per sandbox, rebuilt when its vault changes; a
value once held stays in it (an old value is still a secret).

Rules:
1. Values the server knows (vault values, the sandbox's tokens, the bootstrap key, the key or
   OIDC token the call presented, `presented`) are redacted in every form `Redactor` knows
   (plain, base64, URL and JSON escapes, UTF-16...).
2. A managed key's secret is stored only as a hash (lifecycle/keys.py), so another key than the
   caller's is found by its form: `sgk_<id>_<secret>`, a key-bound endpoint token
   (`sgx_<payload>.<mac>`, api/auth.py rule 4) and a JWT (`eyJ...`, three base64url parts: an
   OIDC token, anyone's) are redacted where they are written out plainly; an encoded one (base64
   of a whole key, a key built from pieces by the shell) is not recognised.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable

from sandgate.lifecycle.keys import KEY_TEXT
from sandgate.lifecycle.sandbox_store import SandboxRecord
from sandgate.vault import REDACTED, Redactor

# (sandbox id, the revision already known) -> (its vault revision, its values; None: unchanged)
VaultValues = Callable[[str, int], tuple[int, frozenset[str] | None]]
CREDENTIAL_FORMS = re.compile(
    "|".join((
        KEY_TEXT.replace("?P<id>", ""),
        r"sgx_[A-Za-z0-9_-]+\.[0-9a-f]{64}",
        r"eyJ[A-Za-z0-9_-]*\.eyJ[A-Za-z0-9_-]*\.[A-Za-z0-9_-]*",
    ))
)  # fmt: skip
CALLERS_CACHED = 256  # presented credentials whose redactor is kept


class Secrets:
    """Per sandbox, the redactor of what must never appear in its records."""

    def __init__(self, vault_values: VaultValues, api_key: str) -> None:
        self.vault_values = vault_values
        self.api_key = api_key
        self._cache: dict[str, tuple[int, frozenset[str], Redactor]] = {}
        self._callers: dict[frozenset[str], Redactor] = {}
        self._lock = threading.Lock()

    def redact(self, record: SandboxRecord, presented: Iterable[str] = ()) -> Callable[[str], str]:
        """The sandbox's redactor, with the caller's `presented` credentials (rule 1) and the
        credential forms (rule 2)."""
        sandbox = self._sandbox(record)
        caller = self._caller(frozenset(presented))
        replacement = REDACTED.decode()

        def redact_text(text: str) -> str:
            text = sandbox.redact_text(text)
            if caller is not None:
                text = caller.redact_text(text)
            return CREDENTIAL_FORMS.sub(replacement, text)

        return redact_text

    def _sandbox(self, record: SandboxRecord) -> Redactor:
        """The vault is read only when its revision changed."""
        with self._lock:
            cached = self._cache.get(record.id)
        revision, values = self.vault_values(record.id, cached[0] if cached else -1)
        if cached is None or values is not None:
            known = (cached[1] if cached else frozenset()) | (values or frozenset())
            known |= {s for s in (self.api_key, record.execd_token, record.egress_token) if s}
            cached = (revision, known, Redactor(known))
            with self._lock:
                self._cache[record.id] = cached
        return cached[2]

    def _caller(self, presented: frozenset[str]) -> Redactor | None:
        presented = frozenset(value for value in presented if value)
        if not presented:
            return None
        with self._lock:
            found = self._callers.get(presented)
        if found is None:
            found = Redactor(presented)
            with self._lock:
                if len(self._callers) >= CALLERS_CACHED:
                    self._callers.pop(next(iter(self._callers)))
                self._callers[presented] = found
        return found
