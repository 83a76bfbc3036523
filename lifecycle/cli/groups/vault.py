"""`sandgate vault`: Manage credentials in the vault (write-only: values are never shown).

Rules: a value enters only through stdin or a hidden prompt, never argv (argv is visible in
`ps` and shell history); no command prints a value; vault errors become one clear line.
A running proxy is told about every put and rm (`ProxyControl.vault_changed`), and a server that
pushes values to Kubernetes nodes pushes them again before the command returns
(lifecycle/vault_notices.py), so a stored or rotated value is scrubbed from every sandbox bound to
it at once, not from its first use, and a removed one is gone on every node.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import click

from sandgate.lifecycle.settings import Settings
from sandgate.lifecycle.wiring import open_vault
from sandgate.vault import LocalStore, VaultError, VaultKeyError, decode_master_key, generate_master_key


@contextlib.contextmanager
def _vault_errors() -> Iterator[None]:
    try:
        yield
    except VaultError as exc:
        raise click.ClickException(str(exc)) from None


def _read_secret_input(prompt: str) -> str:
    """All of stdin when it is not a terminal (one trailing newline dropped), else a hidden prompt."""
    if sys.stdin.isatty():
        return str(click.prompt(prompt, hide_input=True, confirmation_prompt=True))
    text = sys.stdin.read()
    return text.removesuffix("\n").removesuffix("\r")


def _tell_proxy(settings: Settings, name: str) -> None:
    """Have a running proxy re-read `name`, and a server that pushes values to its nodes' proxies
    (Kubernetes) push them again; without either there is nothing to tell (a proxy reads the
    vault when lifecycle pushes its sandboxes)."""
    from sandgate.lifecycle.vault_notices import VaultNoticeError, tell_server
    from sandgate.proxy import ProxyControl, ProxyControlError, control_socket

    try:
        tell_server(settings.state_dir, [name])
    except (VaultNoticeError, OSError, ValueError) as exc:
        click.echo(
            f"warning: the server did not push {name} to its nodes ({exc or type(exc).__name__}); "
            "their proxies get the new value with each sandbox's next policy push or restart",
            err=True,
        )
    socket_path = control_socket(settings.state_dir)
    if not socket_path.exists():
        return
    import httpx

    try:
        with ProxyControl(socket_path) as control:
            control.vault_changed([name])
    except (ProxyControlError, OSError, httpx.HTTPError) as exc:
        click.echo(
            f"warning: the running proxy was not told about {name} ({exc or type(exc).__name__}); "
            "it scrubs and injects the new value after its next restart",
            err=True,
        )


@click.group("vault")
def group() -> None:
    """Manage credentials in the vault (write-only: values are never shown)."""


@group.command("put")
@click.argument("name")
@click.argument("stray", nargs=-1, metavar="")
@click.pass_obj
def put(obj: Any, name: str, stray: tuple[str, ...]) -> None:
    """Store or rotate NAME; the value comes from stdin or a hidden prompt."""
    if stray:  # click would echo the stray words (maybe the value) back in its usage error
        raise click.UsageError(
            "put takes only NAME: the value is read from stdin or a hidden prompt, never from the "
            f"command line, where `ps` and shell history see it (e.g. `sandgate vault put {name} < file`)"
        )
    with _vault_errors():
        store = open_vault(obj.settings())
        value = _read_secret_input(f"value for {name}")
        if not value:
            raise click.ClickException(
                f"empty value for {name}: pipe the value on stdin or type it at the prompt"
            )
        info = store.put(name, value)
    click.echo(f"stored {info.name} (version {info.version})")
    _tell_proxy(obj.settings(), name)


@group.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.pass_obj
def list_(obj: Any, as_json: bool) -> None:
    """Names, versions and times of the stored credentials (never values)."""
    with _vault_errors():
        infos = open_vault(obj.settings()).list()
    if as_json:
        for info in infos:
            click.echo(info.model_dump_json())
        return
    if not infos:
        click.echo("the vault is empty; add a credential with `sandgate vault put NAME`")
        return
    width = max(len("NAME"), *(len(info.name) for info in infos))
    click.echo(f"{'NAME':<{width}}  VERSION  UPDATED")
    for info in infos:
        click.echo(
            f"{info.name:<{width}}  {info.version:>7}  {info.updated_at.isoformat(timespec='seconds')}"
        )


@group.command("rm")
@click.argument("name")
@click.option("--missing-ok", is_flag=True, help="Succeed when NAME is not in the vault.")
@click.pass_obj
def rm(obj: Any, name: str, missing_ok: bool) -> None:
    """Delete NAME and all its versions."""
    with _vault_errors():
        removed = open_vault(obj.settings()).delete(name)
    if removed:
        click.echo(f"removed {name}")
        _tell_proxy(obj.settings(), name)
    elif not missing_ok:
        raise click.ClickException(f"no credential named {name!r} in the vault (see `sandgate vault list`)")


@group.command("rotate-key")
@click.option(
    "--generate", is_flag=True, help="With SANDGATE_VAULT_KEY: generate the new key and print it once."
)
@click.pass_obj
def rotate_key(obj: Any, generate: bool) -> None:
    """Re-encrypt the local vault under a new master key.

    With a key file (the default) a new key is written into it. With SANDGATE_VAULT_KEY the
    new key is read from stdin or a hidden prompt (or generated with --generate); set
    SANDGATE_VAULT_KEY to it afterwards.
    """
    settings = obj.settings()
    with _vault_errors():
        store = open_vault(settings)
        if not isinstance(store, LocalStore):
            raise VaultKeyError(
                "rotate-key applies to the local vault; OpenBao keeps its own keys (`bao operator rotate`)"
            )
        if settings.vault_key is None:
            store.rotate_key()
            click.echo(f"rotated the master key; the new key is in {store.key_file}")
            return
        new_key = generate_master_key() if generate else _read_secret_input("new master key (base64)")
        store.rotate_key(decode_master_key(new_key, "the new master key"))
    if generate:
        click.echo(new_key)
    click.echo(
        "rotated the master key; set SANDGATE_VAULT_KEY to the new key before the next start", err=True
    )
