"""`sandgate sandbox`: create, list, inspect, run commands in and remove sandboxes."""

from __future__ import annotations

import json
import secrets
import shlex
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TextIO

import click
import yaml

if TYPE_CHECKING:
    from sandgate.lifecycle.api.client import Client

COLUMNS = ("id", "state", "image", "created", "expires")


def connection_options(fn: Any) -> Any:
    """--domain/--api-key/--protocol/-o, as osb has them (flags > env > ~/.opensandbox/config.toml)."""
    for option in (
        click.option("--domain", help="Server host:port (OPEN_SANDBOX_DOMAIN)."),
        click.option("--api-key", help="API key (OPEN_SANDBOX_API_KEY)."),
        click.option("--protocol", type=click.Choice(["http", "https"]), help="(OPEN_SANDBOX_PROTOCOL)"),
        click.option("-o", "--output", type=click.Choice(["table", "json", "yaml"]), default="table"),
    ):
        fn = option(fn)
    return fn


def client_from(options: dict[str, Any]) -> Client:
    from sandgate.lifecycle.api.client import Client, connection  # httpx: only when connecting

    base, key = connection(options.pop("domain"), options.pop("api_key"), options.pop("protocol"))
    return Client(base, key)


def emit(
    data: Any, output: str, rows: list[dict[str, Any]] | None = None, columns: tuple[str, ...] = COLUMNS
) -> None:
    if output == "json":
        click.echo(json.dumps(data, indent=2))
    elif output == "yaml":
        click.echo(yaml.safe_dump(data, sort_keys=False).rstrip())
    elif rows is not None:
        widths = {c: max([len(c), *(len(str(r.get(c, ""))) for r in rows)]) for c in columns}
        click.echo("  ".join(c.upper().ljust(widths[c]) for c in columns))
        for row in rows:
            click.echo("  ".join(str(row.get(c, "")).ljust(widths[c]) for c in columns))
    else:
        click.echo(yaml.safe_dump(data, sort_keys=False).rstrip())


def row(sandbox: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": sandbox["id"],
        "state": sandbox["status"]["state"],
        "image": sandbox.get("image", {}).get("uri", ""),
        "created": sandbox.get("createdAt", ""),
        "expires": sandbox.get("expiresAt", "never"),
    }


def guarded(fn: Any) -> Any:
    def wrapper(**kwargs: Any) -> None:
        from sandgate.lifecycle.api.client import ClientError

        try:
            fn(**kwargs)
        except ClientError as exc:
            raise click.ClickException(str(exc)) from exc

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


@click.group("sandbox")
def group() -> None:
    """Create, list, inspect, run commands in and remove sandboxes."""


@group.command("create")
@click.option("-i", "--image", default="sandgate/host", show_default=True)
@click.option("--entrypoint", multiple=True, help="Argv item (repeat); default: sleep forever.")
@click.option("-t", "--timeout", type=int, help="Seconds until the sandbox expires (>= 60).")
@click.option("-e", "--env", multiple=True, help="KEY=VALUE (repeat).")
@click.option("-m", "--metadata", multiple=True, help="KEY=VALUE (repeat).")
@click.option("--network-policy-file", type=click.File(), help="OpenSandbox networkPolicy JSON/YAML.")
@connection_options
@guarded
def create(**o: Any) -> None:
    """Create a sandbox and wait until it is ready."""
    client = client_from(o)
    body: dict[str, Any] = {
        "image": {"uri": o["image"]},
        "entrypoint": list(o["entrypoint"]) or ["sleep", "infinity"],
        "env": dict(item.split("=", 1) for item in o["env"]),
        "metadata": dict(item.split("=", 1) for item in o["metadata"]),
        "timeout": o["timeout"],
    }
    if o["network_policy_file"]:
        body["networkPolicy"] = yaml.safe_load(o["network_policy_file"])
    created = client.call("POST", "/sandboxes", json={k: v for k, v in body.items() if v is not None})
    emit(created, o["output"], [row(created)] if o["output"] == "table" else None)


@group.command("list")
@click.option("--state", multiple=True, help="Only these states (repeat).")
@connection_options
@guarded
def list_(**o: Any) -> None:
    """List sandboxes."""
    listed = client_from(o).call("GET", "/sandboxes", params={"state": list(o["state"]), "pageSize": 200})
    emit(listed["items"], o["output"], [row(s) for s in listed["items"]])


@group.command("get")
@click.argument("sandbox_id")
@connection_options
@guarded
def get(**o: Any) -> None:
    """Show one sandbox."""
    emit(client_from(o).call("GET", f"/sandboxes/{o['sandbox_id']}"), o["output"])


@group.command("rm")
@click.argument("sandbox_ids", nargs=-1, required=True)
@connection_options
@guarded
def rm(**o: Any) -> None:
    """Delete sandboxes."""
    client = client_from(o)
    for sandbox_id in o["sandbox_ids"]:
        client.call("DELETE", f"/sandboxes/{sandbox_id}")
        click.echo(f"deleted {sandbox_id}")


# Exact mode: the command's stdout goes to a file inside the sandbox, fetched as bytes afterwards
# (execd's event stream carries text lines, which cannot hold arbitrary bytes).
EXACT_WRAPPER = '"$@" >"$SANDGATE_EXEC_OUT"'


@group.command("exec", context_settings={"ignore_unknown_options": True})
@click.argument("sandbox_id")
@click.argument("command", nargs=-1, required=True)
@click.option(
    "--exact/--stream",
    default=None,
    help="Exact stdout bytes (binary safe, printed when the command ends) or lines as they come; "
    "default: exact when stdout is not a terminal.",
)
@connection_options
@guarded
def exec_(**o: Any) -> None:
    """Run COMMAND (its words exactly, no shell) in the sandbox; exits with its exit code.

    Use `sh -c '...'` for shell syntax: `sandgate sandbox exec ID -- sh -c 'ls | wc -l'`.
    """
    client, sandbox_id, argv = client_from(o), o["sandbox_id"], list(o["command"])
    exact = o["exact"] if o["exact"] is not None else not sys.stdout.isatty()
    if not exact:
        sys.exit(stream_events(client.run(sandbox_id, argv), sys.stdout))
    out = f"/tmp/.sandgate-exec-{secrets.token_hex(8)}"
    wrapped = ["/bin/sh", "-c", f"SANDGATE_EXEC_OUT={shlex.quote(out)}; {EXACT_WRAPPER}", "sh", *argv]
    try:
        exit_code = stream_events(client.run(sandbox_id, wrapped), None)
        sys.stdout.buffer.write(client.download(sandbox_id, out))
        sys.stdout.flush()
    finally:
        client.remove(sandbox_id, out)
    sys.exit(exit_code)


def stream_events(events: Iterator[dict[str, Any]], stdout: TextIO | None) -> int:
    """Print execd's line events (stdout's only when `stdout` is given); returns the exit code.

    execd sends one event per line without its line break, and "\n" for an empty line.
    """
    exit_code = 0
    for event in events:
        kind, text = event.get("type"), event.get("text", "")
        stream = stdout if kind == "stdout" else sys.stderr if kind == "stderr" else None
        if stream is not None:
            stream.write(text if text == "\n" else text + "\n")
            stream.flush()
        elif kind == "error":
            value = str((event.get("error") or {}).get("evalue", "1"))
            exit_code = int(value) if value.isdigit() else 1
    return exit_code
