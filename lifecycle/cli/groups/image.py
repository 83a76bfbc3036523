"""`sandgate image`: Manage the local runtime's image store."""

from __future__ import annotations

import click


@click.group("image")
def group() -> None:
    """Manage the local runtime's image store."""
