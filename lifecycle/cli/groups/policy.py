"""`sandgate policy`: Check, explain and format egress policy files."""

from __future__ import annotations

import click


@click.group("policy")
def group() -> None:
    """Check, explain and format egress policy files."""
