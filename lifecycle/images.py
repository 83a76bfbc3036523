"""The local runtime's image store: root filesystems as directories under `<state_dir>/images`.

Rules:
1. An image is a name and a root filesystem directory. The built-in `sandgate/host` image is an
   allowlist of the host (`host_root`): the host's system directories (`HOST_SYSTEM_DIRS`) bound
   read-only, a curated copy of /etc (`HOST_ETC`, never keys or sandgate's config), and fresh
   private /tmp, /home, /root, /run, /var, /opt, /srv, /mnt (`PRIVATE_DIRS`). Nothing else of
   the host is in it. Every other image was imported from a tarball (one flattened `rootfs`) or
   pulled from a registry (a list of layers in the shared layer store, lifecycle/layers.py;
   fetched by lifecycle/registry.py).
2. Import accepts `docker save` archives (manifest.json; layers applied in order with whiteouts),
   OCI image layouts (index.json) and plain root filesystem tarballs. Nothing in an archive may
   write outside the image directory (tarfile's `tar` filter plus whiteout path checks).
3. An import is built in a temporary directory and renamed into place, so a failed import leaves
   nothing and a reader never sees half an image.
4. Asking for an image the store lacks raises `ImageNotFound`, which lists the images it has.
5. Names: a pulled image is stored under its normalised reference (`python:3.12` is
   `docker.io/library/python:3.12`), and every lookup normalises the same way, so an imported
   `opensandbox/code-interpreter:v1.1.0` is found by that name and by its docker.io spelling.
6. Pulls follow `image_pull_policy`: `if-not-present` uses what the store has, `always` asks the
   registry every time (unpacked layers are reused by digest), `never` only uses the store.
   Pulls (and layer garbage collection) hold one store-wide lock, across processes: concurrent
   creates of one image pull it once, and a collection never removes a layer a pull just found.
   A pull writes `image.json` last (an atomic replace); a failed pull removes the layers it
   unpacked, so nothing half-done stays for a later create to pick up.
7. A snapshot is an image, `sandgate/snapshot:<id>`: its sandbox's upper directory (already in
   overlayfs format) moved into the layer store on top of the image's own layers (or of the
   host root, for sandgate/host). It is on disk like any image, so it survives restarts, and is
   never pulled.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import fnmatch
import hashlib
import json
import os
import re
import shutil
import stat
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any, Literal

from pydantic import BaseModel

from sandgate.lifecycle.errors import RuntimeError_
from sandgate.lifecycle.layers import LayerError, LayerStore
from sandgate.lifecycle.registry import (
    Credentials,
    Platform,
    PullError,
    Reference,
    RegistryClient,
    RegistryConfig,
)

HOST_IMAGE = "sandgate/host"
PullPolicy = Literal["if-not-present", "always", "never"]
SNAPSHOT_REPOSITORY = "sandgate/snapshot"
IMAGE_NAME = re.compile(r"^[a-z0-9][a-z0-9._/-]{0,126}(:[A-Za-z0-9._-]{1,64})?$")
WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"

# The host's program and library directories, bound read-only into `sandgate/host` sandboxes
# (a merged-/usr host's /bin, /sbin, /lib* are symlinks into /usr, and stay symlinks).
HOST_SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
# What of the host's /etc a sandbox gets (copied; names are relative to /etc): users and groups
# for `id` and `ls -l`, name resolution, CA trust, the dynamic linker, time zone, shell profiles,
# the JDKs' config (Debian keeps java.security, jvm.cfg... in /etc/java-N-openjdk and links the
# JDK's lib/ and conf/ there; names are glob patterns).
# Never: shadow files, ssh, sandgate's config, package-manager credentials (pip.conf, npmrc,
# apt auth), environment files, machine-id, git's system config, hosts (the host's name and its
# LAN's names; the runtime writes each sandbox its own: runtime/sandbox_root.py SANDBOX_HOSTS).
HOST_ETC = (
    "passwd", "group", "host.conf", "nsswitch.conf", "gai.conf", "networks", "protocols",
    "services", "rpc", "ethertypes", "shells", "profile", "profile.d", "bash.bashrc", "inputrc",
    "localtime", "timezone", "os-release", "debian_version", "lsb-release", "issue",
    "ld.so.conf", "ld.so.conf.d", "ld.so.cache", "alternatives", "ssl", "ca-certificates",
    "ca-certificates.conf", "pki", "mime.types", "magic", "magic.mime", "terminfo",
    "locale.alias", "python3", "xattr.conf", "java-*-openjdk",
)  # fmt: skip
# Inside the copied directories: private keys stay out (and JMX's password files, glob patterns).
HOST_ETC_NEVER = frozenset(
    {"ssl/private", "pki/tls/private", "pki/CA/private", "pki/rsyslog", "java-*-openjdk/management"}
)
# Fresh, private and writable in each sandbox (in its overlay), with their modes: the standard
# layout agents and their tools expect (/opt, /srv, /mnt empty, not the host's).
PRIVATE_DIRS = {
    "tmp": 0o1777,
    "home": 0o755,
    "root": 0o700,
    "run": 0o755,
    "opt": 0o755,
    "srv": 0o755,
    "mnt": 0o755,
    "var": 0o755,
    "var/tmp": 0o1777,
    "var/cache": 0o755,
    "var/lib": 0o755,
    "var/log": 0o755,
    "workspace": 0o755,
    "proc": 0o555,
    "dev": 0o755,
    "etc": 0o755,
}


class ImageError(RuntimeError_):
    """An image could not be imported or used; the message says why and what to do."""


class ImageNotFound(ImageError):
    def __init__(self, name: str, available: list[str]) -> None:
        self.name = name
        self.available = available
        super().__init__(
            f"image {name!r} is not in the local image store; it has: {', '.join(available)}. "
            "Pull it (`sandgate image pull NAME`, or image_pull_policy if-not-present) or import "
            "one with `sandgate image import FILE NAME`."
        )


class SnapshotOf(BaseModel):
    """What a snapshot image was taken of (the OpenSandbox Snapshot's fields)."""

    id: str
    sandbox_id: str
    name: str | None = None


class Image(BaseModel):
    """One image: `rootfs` for an imported one, `layers` (digests, bottom first) for a pulled one;
    neither for the built-in host image."""

    name: str
    rootfs: Path | None
    created: float
    source: str
    env: list[str] = []
    cmd: list[str] = []
    layers: list[str] = []
    digest: str | None = None  # the manifest's, for a pulled image
    platform: str | None = None
    host_base: bool = False  # a snapshot of a sandgate/host sandbox: its layers go on the host root
    snapshot: SnapshotOf | None = None


@dataclass(frozen=True)
class HostRoot:
    """The `sandgate/host` image as built now: `lower` is its root (skeleton and curated /etc),
    `binds` the host directories a runtime binds read-only at the same path."""

    lower: Path
    binds: tuple[str, ...]


class ImageStore:
    def __init__(
        self,
        root: Path,
        host: Path = Path("/"),
        *,
        registry: RegistryConfig | None = None,
        pull_policy: PullPolicy = "if-not-present",
    ) -> None:
        self.root = root
        self.host = host
        self.layers = LayerStore(root / "layers")
        self.registry = RegistryClient(registry or RegistryConfig())
        self.pull_policy = pull_policy

    def list(self) -> list[Image]:
        source = "an allowlist of the host: its /usr and libraries read-only, a curated /etc"
        images = [Image(name=HOST_IMAGE, rootfs=None, created=0.0, source=source)]
        if self.root.is_dir():
            for meta in sorted(self.root.glob("*/image.json")):
                images.append(Image.model_validate_json(meta.read_text(encoding="utf-8")))
        return images

    def get(self, name: str) -> Image:
        found = self._find(name)
        if found is None:
            raise ImageNotFound(name, [image.name for image in self.list()])
        return found

    def _find(self, name: str) -> Image | None:
        if name == HOST_IMAGE:
            return self.list()[0]
        for directory in (self._dir(name), self.root / _legacy_key(name)):
            meta = directory / "image.json"
            if meta.is_file():
                return Image.model_validate_json(meta.read_text(encoding="utf-8"))
        return None

    def ensure(
        self,
        name: str,
        *,
        credentials: Credentials | None = None,
        platform: Platform | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> Image:
        """The image a create asks for, pulled as `image_pull_policy` says (rule 6)."""
        found = self._find(name)
        if found is not None and (self.pull_policy != "always" or name == HOST_IMAGE):
            return _checked_platform(found, platform)
        if self.pull_policy == "never" or name.startswith(f"{SNAPSHOT_REPOSITORY}:"):
            raise ImageNotFound(name, [image.name for image in self.list()])
        return self.pull(name, credentials=credentials, platform=platform, progress=progress)

    def pull(
        self,
        name: str,
        *,
        credentials: Credentials | None = None,
        platform: Platform | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> Image:
        """Fetch `name` from its registry (or a mirror), verify and unpack its layers, record it."""
        reference = Reference.parse(name)
        started = time.time()
        with self._pull_lock():
            found = self._find(name)
            if (
                found is not None
                and found.layers
                and (self.pull_policy != "always" or found.created >= started)
            ):
                return _checked_platform(found, platform)  # a concurrent create pulled it meanwhile
            staging = Path(tempfile.mkdtemp(prefix=".pull-", dir=self.root))
            added: list[str] = []
            try:
                layout = staging / "oci"
                source = self.registry.copy(
                    reference, layout, credentials=credentials, platform=platform, progress=progress
                )
                manifest_digest, manifest, config = _read_layout(layout, source)
                _checked_platform_config(config, platform or Platform.host(), reference)
                for layer in manifest["layers"]:
                    blob = layout / _blob(layer["digest"])
                    if self.layers.add(blob, layer["digest"], layer["mediaType"]):
                        added.append(layer["digest"])
                settings = dict(config.get("config") or {})
                image = Image(
                    name=str(reference),
                    rootfs=None,
                    created=time.time(),
                    source=f"{source}@{manifest_digest}" if not source.digest else str(source),
                    env=settings.get("Env") or [],
                    cmd=[*(settings.get("Entrypoint") or []), *(settings.get("Cmd") or [])],
                    layers=[layer["digest"] for layer in manifest["layers"]],
                    digest=manifest_digest,
                    platform=f"{config.get('os', '?')}/{config.get('architecture', '?')}",
                )
                target = self._dir(name)
                target.mkdir(parents=True, exist_ok=True)
                (staging / "image.json").write_text(image.model_dump_json(indent=2), encoding="utf-8")
                os.replace(staging / "image.json", target / "image.json")
                added.clear()
                return image
            except (KeyError, ValueError, json.JSONDecodeError) as exc:
                raise PullError(
                    "invalid", f"{reference}: the registry sent a malformed image: {exc}"
                ) from exc
            except LayerError as exc:
                raise PullError("invalid", f"{reference}: {exc}") from exc
            finally:
                self.layers.remove(added)
                shutil.rmtree(staging, ignore_errors=True)

    def lowers(self, image: Image) -> builtins.list[Path]:
        """The overlay lower directories of an image, top first."""
        if image.rootfs is not None:
            return [image.rootfs]
        layers = [self.layers.path(digest) for digest in reversed(image.layers)]
        host = image.host_base or not image.layers
        return [*layers, self.host_root().lower] if host else layers

    def add_snapshot(self, of: SnapshotOf, base: Image, upper: Path) -> Image:
        """Record a sandbox's upper directory (moved in; overlayfs format already) as a layer on
        top of its image's layers: the image `sandgate/snapshot:<id>` (rule 7)."""
        if base.rootfs is not None:
            raise ImageError(
                f"sandbox {of.sandbox_id} runs the imported image {base.name}; snapshots are taken of "
                "sandboxes from pulled images and sandgate/host"
            )
        digest = "sha256:" + hashlib.sha256(f"snapshot {of.id}".encode()).hexdigest()
        image = Image(
            name=snapshot_image(of.id),
            rootfs=None,
            created=time.time(),
            source=f"snapshot of sandbox {of.sandbox_id} ({base.name})",
            env=base.env,
            cmd=base.cmd,
            layers=[*base.layers, digest],
            platform=base.platform,
            host_base=base.name == HOST_IMAGE or base.host_base,
            snapshot=of,
        )
        with self._pull_lock():
            self.layers.adopt(upper, digest)
            target = self._dir(image.name)
            target.mkdir(parents=True, exist_ok=True)
            staging = target / ".image.json.new"
            staging.write_text(image.model_dump_json(indent=2), encoding="utf-8")
            os.replace(staging, target / "image.json")
        return image

    def snapshots(self) -> builtins.list[Image]:
        return [image for image in self.list() if image.snapshot is not None]

    def remove_snapshot(self, snapshot_id: str, in_use: set[Path]) -> bool:
        """Forget a snapshot and free its layer unless a running sandbox stands on it."""
        image = self._find(snapshot_image(snapshot_id))
        if image is None or image.snapshot is None:
            return False
        with self._pull_lock():
            self.remove(image.name)
            own = self.layers.path(image.layers[-1])
            if own not in in_use:
                self.layers.remove([image.layers[-1]])
        return True

    def prune(self, in_use: set[Path]) -> builtins.list[str]:
        """Remove layers no image and no sandbox (`in_use`: their lower dirs) uses."""
        with self._pull_lock():
            keep = set(in_use)
            for image in self.list():
                keep.update(self.lowers(image) if image.layers else [])
            return self.layers.collect(keep)

    @contextlib.contextmanager
    def _pull_lock(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        with _THREAD_LOCK, open(self.root / ".pull.lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield

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

    def remove(self, name: str) -> bool:
        """Forget an image (its layers go at the next `prune`); False when there was none."""
        found = False
        for directory in (self._dir(name), self.root / _legacy_key(name)):
            found = found or directory.is_dir()
            shutil.rmtree(directory, ignore_errors=True)
        return found

    def host_root(self) -> HostRoot:
        """The `sandgate/host` root for the host as it is now: one directory per content digest
        of the copied /etc (a changed CA bundle makes a new one; running sandboxes keep theirs)."""
        entries = list(_host_etc_entries(self.host / "etc"))
        lower = self.root / f".host-{_fingerprint(entries)}"
        if not lower.is_dir():
            self.root.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=".host-build-", dir=self.root))
            try:
                _build_host_root(staging, self.host, entries)
                staging.rename(lower)
            except OSError:
                shutil.rmtree(staging, ignore_errors=True)
                if not lower.is_dir():  # another builder won the rename
                    raise
        binds = tuple(
            f"/{name}"
            for name in HOST_SYSTEM_DIRS
            if (self.host / name).is_dir() and not (self.host / name).is_symlink()
        )
        return HostRoot(lower, binds)

    def prune_host_roots(self, keep: set[Path]) -> None:
        """Remove `sandgate/host` roots no running sandbox uses and that are not current."""
        current = self.host_root().lower
        for lower in self.root.glob(".host-*"):
            if lower != current and lower not in keep:
                shutil.rmtree(lower, ignore_errors=True)

    def _dir(self, name: str) -> Path:
        try:
            key = str(Reference.parse(name))
        except PullError:
            key = name
        return self.root / _legacy_key(key)


_THREAD_LOCK = threading.Lock()


def snapshot_image(snapshot_id: str) -> str:
    return f"{SNAPSHOT_REPOSITORY}:{snapshot_id}"


def _legacy_key(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()[:24]


def _read_layout(layout: Path, source: Reference) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """The manifest (digest, document) and config skopeo wrote, each checked against its digest."""
    index = json.loads((layout / "index.json").read_text(encoding="utf-8"))
    manifest_digest = index["manifests"][0]["digest"]
    manifest = json.loads(_verified(layout, manifest_digest, source))
    config = json.loads(_verified(layout, manifest["config"]["digest"], source))
    return manifest_digest, manifest, config


def _verified(layout: Path, digest: str, source: Reference) -> bytes:
    data = (layout / _blob(digest)).read_bytes()
    if f"sha256:{hashlib.sha256(data).hexdigest()}" != digest:
        raise PullError("invalid", f"{source}: blob {digest} does not match its digest; refused")
    return data


def _checked_platform(image: Image, platform: Platform | None) -> Image:
    if (
        platform is not None
        and image.platform is not None
        and image.platform != f"{platform.os}/{platform.architecture}"
    ):
        raise PullError(
            "platform",
            f"image {image.name} in the store is for {image.platform}, not the requested {platform}",
        )
    return image


def _checked_platform_config(config: dict[str, Any], platform: Platform, reference: Reference) -> None:
    have = (config.get("os"), config.get("architecture"))
    if have != (platform.os, platform.architecture):
        raise PullError(
            "platform", f"image {reference} is for {have[0]}/{have[1]}, not the requested platform {platform}"
        )


def _host_etc_entries(etc: Path) -> Iterator[tuple[str, os.stat_result]]:
    """(path relative to /etc, lstat) of everything `HOST_ETC` lets into a sandbox, parents first."""
    for path in (found for pattern in HOST_ETC for found in sorted(etc.glob(pattern))):
        name = path.relative_to(etc).as_posix()
        try:
            info = path.lstat()
        except FileNotFoundError:
            continue
        yield name, info
        if stat.S_ISDIR(info.st_mode):
            for parent, dirs, files in os.walk(path):
                relative_parent = Path(parent).relative_to(etc)
                dirs[:] = sorted(d for d in dirs if not _never_copied((relative_parent / d).as_posix()))
                for child in [*dirs, *sorted(files)]:
                    yield (relative_parent / child).as_posix(), (Path(parent) / child).lstat()


def _never_copied(relative: str) -> bool:
    return any(fnmatch.fnmatchcase(relative, pattern) for pattern in HOST_ETC_NEVER)


def _fingerprint(entries: list[tuple[str, os.stat_result]]) -> str:
    digest = hashlib.sha256(repr(sorted(PRIVATE_DIRS.items())).encode())  # a new skeleton dir: a new root
    for relative, info in entries:
        digest.update(f"{relative}\0{info.st_mode}\0{info.st_size}\0{info.st_mtime_ns}\0".encode())
    return digest.hexdigest()[:16]


def _build_host_root(root: Path, host: Path, entries: list[tuple[str, os.stat_result]]) -> None:
    """The skeleton: mount points for the system dirs (or their symlinks), private dirs, /etc."""
    for name in HOST_SYSTEM_DIRS:
        source = host / name
        if source.is_symlink():
            os.symlink(os.readlink(source), root / name)
        elif source.is_dir():
            (root / name).mkdir()
    for name, mode in PRIVATE_DIRS.items():
        (root / name).mkdir(exist_ok=True)
        os.chmod(root / name, mode)  # mkdir applies the umask
    for relative, info in entries:
        source, target = host / "etc" / relative, root / "etc" / relative
        if stat.S_ISLNK(info.st_mode):
            os.symlink(os.readlink(source), target)
        elif stat.S_ISDIR(info.st_mode):
            target.mkdir()
            os.chmod(target, stat.S_IMODE(info.st_mode))
        elif stat.S_ISREG(info.st_mode):
            shutil.copy2(source, target)


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
