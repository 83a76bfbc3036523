"""`sandgate tenants`: the tenants the server knows and each one's ceiling (an admin's key).

Rules: through the control plane's API (`/tenants`), like `sandgate keys`. `ceiling set TENANT
FILE` reads a sandgate policy file (YAML or JSON, the format `sandgate policy check` checks) and
sends its document; the server validates it as every policy and answers which running sandboxes
of the tenant are already beyond it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import yaml

from sandgate.lifecycle.cli import Refused
from sandgate.lifecycle.cli.groups.sandbox import client_from, connection_options, emit, guarded


@click.group("tenants")
def group() -> None:
    """List tenants; show, set and clear a tenant's ceiling."""


@group.command("list")
@connection_options
@guarded
def list_tenants(**o: Any) -> None:
    """The tenants of keys, sandboxes and ceilings."""
    names = client_from(o).call("GET", "/tenants")
    emit(names, o["output"], [{"tenant": name} for name in names], ("tenant",))


@group.group("ceiling")
def ceiling() -> None:
    """A tenant's ceiling: every policy of its sandboxes must be within it."""


@ceiling.command("show")
@click.argument("tenant")
@connection_options
@guarded
def show(**o: Any) -> None:
    """The ceiling of TENANT."""
    emit(client_from(o).call("GET", f"/tenants/{o.pop('tenant')}/ceiling"), o["output"])


@ceiling.command("set")
@click.argument("tenant")
@click.argument("policy_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@connection_options
@guarded
def set_ceiling(**o: Any) -> None:
    """Make POLICY_FILE the ceiling of TENANT."""
    path: Path = o.pop("policy_file")
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise Refused(f"{path}: {exc}") from None
    answer = client_from(o).call("PUT", f"/tenants/{o.pop('tenant')}/ceiling", json={"policy": document})
    for beyond in answer["beyond"] if o["output"] == "table" else ():
        click.echo(f"sandbox {beyond['sandbox']} is beyond it already: {beyond['refused']}", err=True)
    emit(answer, o["output"])


@ceiling.command("clear")
@click.argument("tenant")
@connection_options
@guarded
def clear(**o: Any) -> None:
    """Remove the ceiling of TENANT."""
    client_from(o).call("DELETE", f"/tenants/{o.pop('tenant')}/ceiling")
