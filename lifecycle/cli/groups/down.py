"""`sandgate down`: clean up after a server of this state dir (see lifecycle/teardown.py)."""

from __future__ import annotations

from typing import Any

import click

from sandgate.lifecycle.cli import Refused


@click.command("down")
@click.option("--sandboxes", is_flag=True, help="Also stop the sandboxes that still run (and forget them).")
@click.pass_obj
def command(obj: Any, sandboxes: bool) -> None:
    """Remove what a stopped or killed server left in the kernel.

    The nft table, namespaces, veths, mounts, cgroups, proxy child and gvisor sandboxes' runsc
    processes of this state dir.

    Refused while a server of this state dir runs (stop it first). Sandboxes that still run keep
    their networks and the nft table unless --sandboxes stops them.
    """
    from sandgate.lifecycle import statelock
    from sandgate.lifecycle.teardown import tear_down

    settings = obj.settings()
    if not settings.state_dir.is_dir():
        click.echo(f"nothing to remove: there is no state dir {settings.state_dir}")
        return
    try:
        report = tear_down(settings, stop_sandboxes=sandboxes)
    except statelock.AlreadyRunning as exc:
        raise Refused(f"{exc}: stop that server first (SIGTERM, or systemctl stop sandgate)") from None
    for line in report.lines(settings.state_dir):
        click.echo(line)
