"""`sandgate image`: Manage the local runtime's image store (`<state_dir>/images`).

`import` works offline: it reads `docker save` archives, OCI image layouts and plain root
filesystem tarballs (see lifecycle/images.py). Exit code 2 when the archive cannot be imported.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from sandgate.lifecycle.images import ImageError, ImageStore


def _store(ctx: click.Context) -> ImageStore:
    return ImageStore(ctx.obj.settings().state_dir / "images")


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
