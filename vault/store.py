"""The store interface and the factory lifecycle uses.

Rules: a store is write-only from the outside. Names, versions and timestamps may be listed;
`reveal` exists only for the proxy's injection path and `values` only to build a redactor.
Nothing here logs, prints or puts a value into an error message.
"""

from __future__ import annotations

import builtins
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from sandgate.vault.errors import VaultError
from sandgate.vault.local import LocalStore, decode_master_key
from sandgate.vault.models import SecretInfo
from sandgate.vault.openbao import OpenBaoStore

LOCAL_VAULT_FILE = "vault.enc"
LOCAL_KEY_FILE = "vault.key"


@runtime_checkable
class SecretStore(Protocol):
    def put(self, name: str, value: str) -> SecretInfo:
        """Create the secret (version 1) or rotate it (version + 1)."""
        ...

    def delete(self, name: str) -> bool:
        """Remove the secret and all its versions; False when there was none."""
        ...

    def list(self) -> builtins.list[SecretInfo]:
        """Every secret's metadata, sorted by name; never a value."""
        ...

    def reveal(self, name: str) -> str:
        """The current value, for the proxy's injection path only; SecretNotFound if absent."""
        ...

    def values(self) -> builtins.list[str]:
        """Every current value, to build a Redactor; never for display."""
        ...


def open_store(
    backend: Literal["local", "openbao"],
    state_dir: Path,
    vault_key: str | None = None,
    openbao_addr: str | None = None,
    openbao_token: str | None = None,
    openbao_role_id: str | None = None,
    openbao_secret_id: str | None = None,
    openbao_mount: str = "secret",
    openbao_prefix: str = "sandgate",
    cache_ttl: float = 30.0,
) -> SecretStore:
    """The store the settings describe; lifecycle passes the settings' plain values."""
    if backend == "local":
        master = decode_master_key(vault_key) if vault_key else None
        return LocalStore(Path(state_dir) / LOCAL_VAULT_FILE, master, Path(state_dir) / LOCAL_KEY_FILE)
    if backend == "openbao":
        if not openbao_addr:
            raise VaultError("vault_backend is openbao but no address is set: set SANDGATE_OPENBAO_ADDR")
        return OpenBaoStore(
            openbao_addr,
            token=openbao_token,
            role_id=openbao_role_id,
            secret_id=openbao_secret_id,
            mount=openbao_mount,
            prefix=openbao_prefix,
            cache_ttl=cache_ttl,
        )
    raise VaultError(f"unknown vault backend {backend!r}: use 'local' or 'openbao'")
