"""`sandgate logs`: query and follow the audit log."""

from __future__ import annotations

import click


@click.command("logs")
def command() -> None:
    """Query and follow the audit log."""
    raise click.ClickException("logs is not implemented yet (issue 10)")
