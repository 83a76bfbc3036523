"""The local runtime's image store: root filesystems as directories under `<state_dir>/images`.

Rules:
1. An image is a name and a root filesystem directory. The built-in `sandgate/host` image has no
   directory: it is the host's root, read-only, under each sandbox's overlay (the runtime masks
   host credentials in it). Every other image was imported from a tarball.
2. Import accepts `docker save` archives (manifest.json; layers applied in order with whiteouts),
   OCI image layouts (index.json) and plain root filesystem tarballs. Nothing in an archive may
   write outside the image directory (tarfile's `tar` filter plus whiteout path checks).
3. An import is built in a temporary directory and renamed into place, so a failed import leaves
   nothing and a reader never sees half an image.
4. Asking for an image the store lacks raises `ImageNotFound`, which lists the images it has.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tarfile
import tempfile
import time
from pathlib import Path, PurePosixPath
from typing import IO, Any

from pydantic import BaseModel

from sandgate.lifecycle.runtime.base import RuntimeError_

HOST_IMAGE = "sandgate/host"
IMAGE_NAME = re.compile(r"^[a-z0-9][a-z0-9._/-]{0,126}(:[A-Za-z0-9._-]{1,64})?$")
WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"


class ImageError(RuntimeError_):
    """An image could not be imported or used; the message says why and what to do."""


class ImageNotFound(ImageError):
    def __init__(self, name: str, available: list[str]) -> None:
        self.name = name
        self.available = available
        super().__init__(
            f"image {name!r} is not in the local image store; it has: {', '.join(available)}. "
            "Import one with `sandgate image import FILE NAME`."
        )


class Image(BaseModel):
    """One image: `rootfs` is None for the built-in host image."""

    name: str
    rootfs: Path | None
    created: float
    source: str
    env: list[str] = []
    cmd: list[str] = []


class ImageStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def list(self) -> list[Image]:
        images = [Image(name=HOST_IMAGE, rootfs=None, created=0.0, source="the host's root, read-only")]
        if self.root.is_dir():
            for meta in sorted(self.root.glob("*/image.json")):
                images.append(Image.model_validate_json(meta.read_text(encoding="utf-8")))
        return images

    def get(self, name: str) -> Image:
        if name != HOST_IMAGE:
            meta = self._dir(name) / "image.json"
            if meta.is_file():
                return Image.model_validate_json(meta.read_text(encoding="utf-8"))
        for image in self.list():
            if image.name == name:
                return image
        raise ImageNotFound(name, [image.name for image in self.list()])

    def import_tarball(self, archive: Path, name: str) -> Image:
        """Import a docker-save, OCI-layout or plain rootfs tarball as `name` (replacing it)."""
        if name == HOST_IMAGE or not IMAGE_NAME.fullmatch(name):
            raise ImageError(f"image name {name!r}: use lowercase name[/name][:tag], not {HOST_IMAGE}")
        if not archive.is_file():
            raise ImageError(f"image archive {archive} does not exist")
        self.root.mkdir(parents=True, exist_ok=True)
        target = self._dir(name)
        staging = Path(tempfile.mkdtemp(prefix=".import-", dir=self.root))
        try:
            rootfs = staging / "rootfs"
            rootfs.mkdir()
            with tarfile.open(archive) as outer:
                config = _unpack(outer, rootfs)
            image = Image(
                name=name,
                rootfs=target / "rootfs",
                created=time.time(),
                source=archive.name,
                env=config.get("Env") or [],
                cmd=config.get("Cmd") or [],
            )
            (staging / "image.json").write_text(image.model_dump_json(indent=2), encoding="utf-8")
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)
        except (tarfile.TarError, KeyError, ValueError, json.JSONDecodeError) as exc:
            raise ImageError(f"{archive} is not a docker-save, OCI or rootfs tarball: {exc}") from exc
        finally:
            if staging.exists():
                shutil.rmtree(staging)
        return image

    def remove(self, name: str) -> None:
        shutil.rmtree(self._dir(name), ignore_errors=True)

    def _dir(self, name: str) -> Path:
        return self.root / hashlib.sha256(name.encode()).hexdigest()[:24]


def _unpack(outer: tarfile.TarFile, rootfs: Path) -> dict[str, Any]:
    """Extract the archive's filesystem into rootfs; returns the image config (may be empty)."""
    names = set(outer.getnames())
    if "manifest.json" in names:
        (manifest,) = json.load(_member(outer, "manifest.json"))
        for layer in manifest["Layers"]:
            _apply_layer(_member(outer, layer), rootfs)
        config = json.load(_member(outer, manifest["Config"]))
        return dict(config.get("config") or {})
    if "index.json" in names:
        index = json.load(_member(outer, "index.json"))
        digest = index["manifests"][0]["digest"]
        manifest = json.load(_member(outer, _blob(digest)))
        for layer in manifest["layers"]:
            _apply_layer(_member(outer, _blob(layer["digest"])), rootfs)
        config = json.load(_member(outer, _blob(manifest["config"]["digest"])))
        return dict(config.get("config") or {})
    outer.extractall(rootfs, filter="tar")
    return {}


def _blob(digest: str) -> str:
    algorithm, _, value = digest.partition(":")
    return f"blobs/{algorithm}/{value}"


def _member(outer: tarfile.TarFile, name: str) -> IO[bytes]:
    handle = outer.extractfile(name)
    if handle is None:
        raise ValueError(f"archive member {name} is not a regular file")
    return handle


def _apply_layer(stream: IO[bytes], rootfs: Path) -> None:
    """Apply one layer: whiteouts delete what lower layers put there, then extract the rest."""
    with tarfile.open(fileobj=stream, mode="r:*") as layer:
        members = layer.getmembers()
        kept = []
        for member in members:
            path = PurePosixPath(member.name)
            if path.name == OPAQUE:
                _clear_dir(rootfs, path.parent)
            elif path.name.startswith(WHITEOUT):
                _remove(rootfs, path.parent / path.name[len(WHITEOUT) :])
            else:
                kept.append(member)
        layer.extractall(rootfs, members=kept, filter="tar")


def _inside(rootfs: Path, relative: PurePosixPath) -> Path:
    """The path in rootfs; its parent resolved, so a symlink laid by a layer cannot lead out."""
    root = rootfs.resolve()
    target = Path(os.path.normpath(root / str(relative).lstrip("/")))
    parent = Path(os.path.realpath(target.parent))
    if parent != root and root not in parent.parents:
        raise ValueError(f"whiteout {relative} points outside the image")
    return parent / target.name


def _remove(rootfs: Path, relative: PurePosixPath) -> None:
    target = _inside(rootfs, relative)
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    elif target.exists() or target.is_symlink():
        target.unlink()


def _clear_dir(rootfs: Path, relative: PurePosixPath) -> None:
    directory = _inside(rootfs, relative)
    if directory.is_dir() and not directory.is_symlink():
        for entry in directory.iterdir():
            _remove(rootfs, PurePosixPath(entry.relative_to(rootfs)))
