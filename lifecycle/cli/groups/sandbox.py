"""`sandgate sandbox`: Create, list, inspect, run commands in and remove sandboxes."""

from __future__ import annotations

import click


@click.group("sandbox")
def group() -> None:
    """Create, list, inspect, run commands in and remove sandboxes."""
