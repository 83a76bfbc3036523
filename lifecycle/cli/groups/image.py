"""`sandgate image`: Manage the local runtime's image store (`<state_dir>/images`).

`pull` fetches an image by reference with the server's registry settings (registry_mirrors,
insecure_registries, image_pull_timeout), printing skopeo's progress on a terminal; credentials
for a private registry are read from the terminal or stdin (`--username`), never from argv.
`import` works offline: it reads `docker save` archives, OCI image layouts and plain root
filesystem tarballs (see lifecycle/images.py). `rm` forgets an image, `prune` removes the layers
no image and no sandbox uses. Exit code 2 when an image cannot be pulled, imported or found.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from sandgate.lifecycle.images import HOST_IMAGE, ImageError, ImageStore
from sandgate.lifecycle.registry import Credentials, PullError


def _store(ctx: click.Context) -> ImageStore:
    from sandgate.lifecycle.wiring import image_store

    return image_store(ctx.obj.settings())


@click.group("image")
def group() -> None:
    """Manage the local runtime's image store."""


@group.command("import")
@click.argument("archive", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("name")
@click.pass_context
def import_image(ctx: click.Context, archive: Path, name: str) -> None:
    """Import ARCHIVE (docker save, OCI layout or rootfs tarball) as image NAME."""
    try:
        image = _store(ctx).import_tarball(archive, name)
    except ImageError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    click.echo(f"imported {image.name} -> {image.rootfs}")


@group.command("list")
@click.pass_context
def list_images(ctx: click.Context) -> None:
    """List the images sandboxes can use."""
    for image in _store(ctx).list():
        created = time.strftime("%Y-%m-%d %H:%M", time.gmtime(image.created)) if image.created else "built-in"
        click.echo(f"{image.name:<32} {created:<17} {image.source}")


@group.command("pull")
@click.argument("reference")
@click.option("--username", help="registry user; the password is read from the terminal or stdin")
@click.pass_context
def pull_image(ctx: click.Context, reference: str, username: str | None) -> None:
    """Pull REFERENCE (e.g. python:3.12, registry.example.com/team/agent:1.4) into the store."""
    credentials = None
    if username:
        password = click.prompt("password", hide_input=True) if sys.stdin.isatty() else sys.stdin.readline()
        credentials = Credentials(username, password.rstrip("\n"))
    progress = (lambda line: click.echo(line, err=True)) if sys.stderr.isatty() else None
    started = time.monotonic()
    try:
        image = _store(ctx).pull(reference, credentials=credentials, progress=progress)
    except (ImageError, PullError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    took = time.monotonic() - started
    click.echo(f"pulled {image.name} ({image.digest}, {len(image.layers)} layers) in {took:.1f} s")


@group.command("rm")
@click.argument("name")
@click.pass_context
def remove_image(ctx: click.Context, name: str) -> None:
    """Forget image NAME (its layers go at the next `sandgate image prune`)."""
    if name == HOST_IMAGE or not _store(ctx).remove(name):
        click.echo(f"error: no image {name!r} to remove (see `sandgate image list`)", err=True)
        sys.exit(2)
    click.echo(f"removed {name}")


@group.command("prune")
@click.pass_context
def prune_images(ctx: click.Context) -> None:
    """Remove the layers that no image and no sandbox of this state dir uses."""
    from sandgate.lifecycle.runtime.local import lowers_in_use

    removed = _store(ctx).prune(lowers_in_use(ctx.obj.settings().state_dir))
    click.echo(f"removed {len(removed)} layer(s)")
