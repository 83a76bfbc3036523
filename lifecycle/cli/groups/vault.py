"""`sandgate vault`: Manage credentials in the vault (write-only: values are never shown)."""

from __future__ import annotations

import click


@click.group("vault")
def group() -> None:
    """Manage credentials in the vault (write-only: values are never shown)."""
