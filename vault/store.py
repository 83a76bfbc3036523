"""The store interface and the factory lifecycle uses.

Rules: a store is write-only from the outside. Names, versions and timestamps may be listed;
`reveal` exists only for the proxy's injection path and `values` only to build a redactor.
Nothing here logs, prints or puts a value into an error message.
How to open a store travels in two parts: `StoreSettings` (what may be written to a config file)
and `StoreSecrets` (the master key and OpenBao credentials: handed over in memory or through a
pipe, never written by sandgate; their repr hides the values).
"""

from __future__ import annotations

import builtins
import json
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, SecretStr

from sandgate.vault.errors import VaultError
from sandgate.vault.local import LocalStore, decode_master_key
from sandgate.vault.memory import MemoryStore
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


class StoreSettings(BaseModel):
    """Which store and where: everything `open_store` needs except the secrets."""

    model_config = ConfigDict(extra="forbid")

    backend: Literal["local", "openbao", "memory"] = "local"  # memory: a node proxy's (vault/memory.py)
    state_dir: Path
    openbao_addr: str | None = None
    openbao_role_id: str | None = None
    openbao_mount: str = "secret"
    openbao_prefix: str = "sandgate"
    cache_ttl: float = 30.0


class StoreSecrets(BaseModel):
    """What opens the store: the local vault's master key (else `vault.key` is used) and the
    OpenBao token or AppRole secret id."""

    model_config = ConfigDict(extra="forbid")

    vault_key: SecretStr | None = None
    openbao_token: SecretStr | None = None
    openbao_secret_id: SecretStr | None = None

    def revealed(self) -> dict[str, str | None]:
        return {name: value.get_secret_value() if value else None for name, value in self}

    def revealed_json(self) -> bytes:
        """The values themselves as JSON (`model_dump_json` would write asterisks), for a pipe."""
        return json.dumps(self.revealed()).encode()


def open_configured(settings: StoreSettings, secrets: StoreSecrets) -> SecretStore:
    """The store `settings` names, opened with `secrets`."""
    revealed = secrets.revealed()
    return open_store(
        settings.backend,
        settings.state_dir,
        vault_key=revealed["vault_key"],
        openbao_addr=settings.openbao_addr,
        openbao_token=revealed["openbao_token"],
        openbao_role_id=settings.openbao_role_id,
        openbao_secret_id=revealed["openbao_secret_id"],
        openbao_mount=settings.openbao_mount,
        openbao_prefix=settings.openbao_prefix,
        cache_ttl=settings.cache_ttl,
    )


def open_store(
    backend: Literal["local", "openbao", "memory"],
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
    if backend == "memory":
        return MemoryStore()
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
    raise VaultError(f"unknown vault backend {backend!r}: use 'local', 'openbao' or 'memory'")
