"""Boundary models of the vault: what may be said about a secret without its value."""

from __future__ import annotations

import re
from datetime import datetime

from pydantic import BaseModel, ConfigDict

from sandgate.vault.errors import InvalidSecretName

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class SecretInfo(BaseModel):
    """A secret's metadata; there is deliberately no field for the value."""

    model_config = ConfigDict(frozen=True)

    name: str
    version: int
    created_at: datetime
    updated_at: datetime


def check_name(name: str) -> str:
    """The name itself, or InvalidSecretName saying what is allowed."""
    if not NAME_PATTERN.fullmatch(name):
        raise InvalidSecretName(
            f"invalid secret name {name!r}: use 1-128 characters from A-Z a-z 0-9 . _ -, "
            "starting with a letter or digit"
        )
    return name
