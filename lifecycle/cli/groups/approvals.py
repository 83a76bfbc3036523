"""`sandgate approvals`: the requests a sandbox's `ask` policy holds, and a reviewer's answers.

Rules: through the control plane's API (`/approvals`), like `sandgate sandbox`; `list` shows what
waits (oldest first), `allow ID` lets one request through, `allow ID --for-sandbox` also adds an
allow rule for its host to the sandbox's policy (a policy change with its own revision), `deny ID`
refuses it. Host and path are the sandbox's words: the table escapes them (`visible`).
"""

from __future__ import annotations

import time
from typing import Any

import click

from sandgate.lifecycle.cli.groups.sandbox import client_from, connection_options, emit, guarded
from sandgate.lifecycle.visible import visible


@click.group("approvals", invoke_without_command=True)
@click.pass_context
def group(context: click.Context) -> None:
    """Answer requests held for a reviewer (policy `ask`): list, allow, deny."""
    if context.invoked_subcommand is None:
        context.invoke(list_pending)


COLUMNS = ("id", "sandbox", "request", "waits")


def row(held: dict[str, Any]) -> dict[str, str]:
    port = held["port"]
    target = held["host"] + ("" if port in (80, 443) else f":{port}")
    return {
        "id": held["id"],
        "sandbox": held["sandbox"],
        "request": visible(f"{held['method']} {held['scheme']}://{target}{held['path'] or ''}"),
        "waits": f"{max(0.0, held['expires_at'] - time.time()):.0f}s left",
    }


@group.command("list")
@connection_options
@guarded
def list_pending(**o: Any) -> None:
    """The requests waiting for an answer, oldest first."""
    held = client_from(o).call("GET", "/approvals")
    if not held and o["output"] == "table":
        click.echo("no request waits for an approval", err=True)
        return
    emit(held, o["output"], [row(item) for item in held], COLUMNS)


@group.command("allow")
@click.argument("approval_id")
@click.option("--for-sandbox", is_flag=True, help="Also allow the host for this sandbox from now on.")
@connection_options
@guarded
def allow(**o: Any) -> None:
    """Let the held request APPROVAL_ID through (once, or with --for-sandbox from now on)."""
    decision = "allow-sandbox" if o.pop("for_sandbox") else "allow-once"
    answer(o, decision)


@group.command("deny")
@click.argument("approval_id")
@connection_options
@guarded
def deny(**o: Any) -> None:
    """Refuse the held request APPROVAL_ID (the agent gets the usual 403)."""
    answer(o, "deny")


def answer(o: dict[str, Any], decision: str) -> None:
    approval_id = o.pop("approval_id")
    result = client_from(o).call("POST", f"/approvals/{approval_id}", json={"decision": decision})
    emit(result, o["output"])
