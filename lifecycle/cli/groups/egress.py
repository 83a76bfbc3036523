"""`sandgate egress`: Read and change a running sandbox's egress policy."""

from __future__ import annotations

import click


@click.group("egress")
def group() -> None:
    """Read and change a running sandbox's egress policy."""
