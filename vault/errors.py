"""Vault errors. Rule: a message names the secret, the file or the server, never a value."""

from __future__ import annotations


class VaultError(Exception):
    """Any vault failure; the message says what was wrong, where, and how to fix it."""


class SecretNotFound(VaultError, KeyError):
    """No secret of that name in the store."""

    def __init__(self, name: str, where: str) -> None:
        super().__init__(f"no secret named {name!r} in {where}; add it with `sandgate vault put {name}`")
        self.name = name

    def __str__(self) -> str:  # KeyError would quote the whole message again
        return str(self.args[0])


class VaultTampered(VaultError):
    """The vault file was modified, truncated or is not a vault file; nothing of it was used."""


class VaultKeyError(VaultError):
    """The master key is missing, malformed, or not the one the vault was written with."""


class InvalidSecretName(VaultError, ValueError):
    """A secret name outside the allowed alphabet or length."""
