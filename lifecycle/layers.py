"""The layer store: image layers unpacked once, by digest, under `<state_dir>/images/layers`.

Rules:
1. A layer directory is named for the digest of the blob it came from (`sha256-<hex>`) and is
   the layer in overlayfs's own format, so a sandbox's root is an overlay of its image's layer
   directories (top first) and no image is ever flattened or copied: whiteouts (`.wh.NAME`)
   become 0:0 character devices, opaque markers (`.wh..wh..opq`) the `trusted.overlay.opaque`
   xattr. A sandbox's upper directory is in that format too, which makes a snapshot a layer.
2. A blob is hashed before it is unpacked; a digest that does not match is refused and nothing
   of it is kept.
3. Nothing in a layer may reach outside its directory or the host: absolute member names, `..`
   components, symlinks whose relative target climbs above the image root, hard links out,
   and device nodes are refused (the whole layer with them). Absolute symlink targets are
   allowed: they resolve inside the sandbox's root, and nothing here follows a link while
   unpacking (tarfile's `tar` filter checks every destination's real path). Owners, modes and
   setuid bits are kept: images are run as their authors built them.
4. A layer is unpacked into a staging directory and renamed into place; a reader never sees
   half a layer, and two unpackers of one layer leave one copy.
5. Garbage collection removes layers no image and no running sandbox uses.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import shutil
import stat
import tarfile
import tempfile
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import IO

from sandgate.lifecycle.errors import RuntimeError_

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
OPAQUE_XATTR = "trusted.overlay.opaque"
# Layer media types we can read (tarfile's `r|*` opens tar, gzip, bz2 and xz).
LAYER_TYPES = frozenset({
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
    "application/vnd.docker.image.rootfs.diff.tar",
})  # fmt: skip


class LayerError(RuntimeError_):
    """A layer was refused; the message names the layer and the offending member."""


def digest_of(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            sha.update(chunk)
    return f"sha256:{sha.hexdigest()}"


class LayerStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, digest: str) -> Path:
        algorithm, _, value = digest.partition(":")
        if algorithm != "sha256" or len(value) != 64 or not all(c in "0123456789abcdef" for c in value):
            raise LayerError(f"layer digest {digest!r} is not sha256:<64 hex digits>")
        return self.root / f"sha256-{value}"

    def has(self, digest: str) -> bool:
        return self.path(digest).is_dir()

    def add(self, blob: Path, digest: str, media_type: str) -> bool:
        """Verify and unpack one blob (rules 2-4); False when the layer was already there."""
        target = self.path(digest)
        if target.is_dir():
            return False
        if media_type not in LAYER_TYPES:
            raise LayerError(f"layer {digest} has media type {media_type}, which sandgate cannot unpack")
        actual = digest_of(blob)
        if actual != digest:
            raise LayerError(
                f"layer blob {digest} does not match its digest (it hashes to {actual}); refused"
            )
        self.root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".unpack-", dir=self.root))
        try:
            with blob.open("rb") as stream:
                unpack(stream, staging, digest)
            os.chmod(staging, 0o755)
            staging.rename(target)
        except OSError:
            if not target.is_dir():  # another unpacker's rename won: theirs is as good
                raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return True

    def adopt(self, directory: Path, digest: str) -> None:
        """Move an already-unpacked overlay-format directory in as layer `digest` (snapshots)."""
        target = self.path(digest)
        if target.is_dir():
            shutil.rmtree(directory, ignore_errors=True)
            return
        self.root.mkdir(parents=True, exist_ok=True)
        directory.rename(target)

    def remove(self, digests: Iterable[str]) -> None:
        for digest in digests:
            shutil.rmtree(self.path(digest), ignore_errors=True)

    def collect(self, keep: set[Path]) -> list[str]:
        """Remove every layer (and leftover staging dir) not in `keep`; returns what went."""
        removed: list[str] = []
        if not self.root.is_dir():
            return removed
        for entry in sorted(self.root.iterdir()):
            if entry not in keep:
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry.name)
        return removed


def unpack(stream: IO[bytes], destination: Path, digest: str) -> None:
    """Extract one layer into `destination` in overlayfs format (rules 1 and 3)."""
    whiteouts: list[PurePosixPath] = []
    opaque: list[PurePosixPath] = []

    def checked(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
        path = _member_path(member, digest)
        if path.name == OPAQUE:
            opaque.append(path.parent)
            return None
        if path.name.startswith(WHITEOUT):
            whiteouts.append(path.parent / path.name[len(WHITEOUT) :])
            return None
        if member.islnk():
            link = PurePosixPath(member.linkname)
            if link.is_absolute() or ".." in link.parts:
                raise LayerError(
                    f"layer {digest}: hard link {member.name} -> {member.linkname} leads out; refused"
                )
        if member.ischr() or member.isblk():
            raise LayerError(f"layer {digest}: {member.name} is a device node; refused")
        if member.issym() and not member.linkname.startswith("/"):
            target = posixpath.normpath(posixpath.join(posixpath.dirname(str(path)), member.linkname))
            if target == ".." or target.startswith("../"):
                raise LayerError(
                    f"layer {digest}: symlink {member.name} -> {member.linkname} points outside the image"
                )
        try:
            tarfile.tar_filter(member, dest)  # the real-path checks; its mode changes are not used
        except tarfile.FilterError as exc:
            raise LayerError(f"layer {digest}: {member.name}: {exc}; refused") from None
        return member

    try:
        with tarfile.open(fileobj=stream, mode="r|*") as layer:
            layer.extractall(destination, filter=checked, numeric_owner=True)
    except (tarfile.TarError, EOFError, OSError, KeyError) as exc:
        raise LayerError(f"layer {digest} is not a readable tar archive: {exc}") from None
    for directory in opaque:
        target = _inside(destination, directory, digest)
        target.mkdir(parents=True, exist_ok=True)
        os.setxattr(target, OPAQUE_XATTR, b"y")
    for path in whiteouts:
        target = _inside(destination, path, digest)
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
        os.mknod(target, stat.S_IFCHR | 0o000, os.makedev(0, 0))


def _member_path(member: tarfile.TarInfo, digest: str) -> PurePosixPath:
    path = PurePosixPath(member.name)
    if path.is_absolute():
        raise LayerError(f"layer {digest}: {member.name} is an absolute path; refused")
    if ".." in path.parts:
        raise LayerError(f"layer {digest}: {member.name} climbs out with '..'; refused")
    return path


def _inside(root: Path, relative: PurePosixPath, digest: str) -> Path:
    """`relative` under root with its parent resolved: a link laid by the layer cannot lead out."""
    target = root / relative
    parent = Path(os.path.realpath(target.parent))
    if parent != root.resolve() and root.resolve() not in parent.parents:
        raise LayerError(f"layer {digest}: whiteout {relative} points outside the image; refused")
    return parent / target.name
