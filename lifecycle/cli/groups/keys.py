"""`sandgate keys`: the server's managed API keys (an admin's key: tenants, roles, expiry).

Rules: through the control plane's API (`/keys`), like `sandgate sandbox`, with an admin key
(the server's first key is one). `create` and `rotate` print the new key once, on stdout alone
(`--output json` for the whole row), so `KEY=$(sandgate keys create ...)` works; the key is
stored only as its hash. `revoke` is immediate: the key's open streams and console sessions end.
"""

from __future__ import annotations

from typing import Any

import click

from sandgate.lifecycle.cli.groups.sandbox import client_from, connection_options, emit, guarded

COLUMNS = ("id", "tenant", "role", "name", "state", "expires_at")


@click.group("keys")
def group() -> None:
    """Manage API keys: create, list, rotate, revoke."""


def shown(o: dict[str, Any], answer: dict[str, Any]) -> None:
    if o["output"] == "table":
        click.echo(
            f"key {answer['id']} (tenant {answer['tenant']}, role {answer['role']}); shown once:", err=True
        )
        click.echo(answer["key"])
    else:
        emit(answer, o["output"])


@group.command("create")
@click.option("--tenant", required=True, help="The tenant the key acts for (a-z, 0-9, '-').")
@click.option("--role", required=True, type=click.Choice(["admin", "operator", "reviewer"]))
@click.option("--name", default="", help="What the key is for (shown by `list`).")
@click.option("--expires-in", help="Lifetime: 30m, 12h, 90d (default: none).")
@connection_options
@guarded
def create(**o: Any) -> None:
    """Make a key; it is printed once."""
    body = {
        "tenant": o.pop("tenant"),
        "role": o.pop("role"),
        "name": o.pop("name"),
        "expiresIn": o.pop("expires_in"),
    }
    shown(o, client_from(o).call("POST", "/keys", json=body))


@group.command("list")
@connection_options
@guarded
def list_keys(**o: Any) -> None:
    """Every managed key: id, tenant, role, state (active, expired, revoked), expiry."""
    rows = client_from(o).call("GET", "/keys")
    emit(rows, o["output"], [{c: str(row.get(c) or "-") for c in COLUMNS} for row in rows], COLUMNS)


@group.command("rotate")
@click.argument("key_id")
@connection_options
@guarded
def rotate(**o: Any) -> None:
    """Revoke KEY_ID and make its successor (same tenant, role, lifetime); printed once."""
    shown(o, client_from(o).call("POST", f"/keys/{o.pop('key_id')}/rotate"))


@group.command("revoke")
@click.argument("key_id")
@connection_options
@guarded
def revoke(**o: Any) -> None:
    """Refuse KEY_ID from now on; what it has open is closed."""
    emit(client_from(o).call("DELETE", f"/keys/{o.pop('key_id')}"), o["output"])
