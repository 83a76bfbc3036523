"""Write a one-layer OCI image archive from local files, for `ctr images import` (no registry).

The cluster of `make cluster` needs the Pod sandbox's pause image and test images, and no image is
ever pulled: up.sh builds them from programs on this host (the static pause that build.sh
compiles, busybox-static) and imports them into containerd's `k8s.io` namespace.

The archive is an OCI image layout (oci-layout, index.json, blobs/sha256/...) whose index entry
carries the image's name in `io.containerd.image.name`, which `ctr images import` uses as is.
Files enter the layer as root-owned, mode kept, mtime 0, so the same inputs give the same digest.

Usage: oci_image.py NAME OUT.tar --file /in/image=/host/path [--file ...] [--entrypoint /prog]
       [--user uid:gid]
       oci_image.py NAME OUT.tar --files-from FILES.json  (a JSON object: /in/image -> /host/path)
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import tarfile
from pathlib import Path, PurePosixPath


def layer_tar(files: dict[PurePosixPath, Path]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        directories = sorted(
            {parent for target in files for parent in target.parents if parent != PurePosixPath("/")}
        )
        for directory in directories:
            info = tarfile.TarInfo(str(directory).lstrip("/"))
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for target, source in sorted(files.items()):
            info = tarfile.TarInfo(str(target).lstrip("/"))
            info.size, info.mode = source.stat().st_size, source.stat().st_mode & 0o7777
            with source.open("rb") as data:
                tar.addfile(info, data)
    return buffer.getvalue()


def add_member(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    archive.addfile(info, io.BytesIO(data))


def blob(archive: tarfile.TarFile, data: bytes, media_type: str) -> dict[str, object]:
    digest = hashlib.sha256(data).hexdigest()
    add_member(archive, f"blobs/sha256/{digest}", data)
    return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}


def canonical(document: object) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def write_image(
    name: str, out: Path, files: dict[PurePosixPath, Path], entrypoint: list[str], user: str = ""
) -> None:
    layer = layer_tar(files)
    settings: dict[str, object] = {"Entrypoint": entrypoint} if entrypoint else {}
    if user:
        settings["User"] = user
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": settings,
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(layer).hexdigest()}"]},
    }
    with tarfile.open(out, "w") as archive:
        add_member(archive, "oci-layout", canonical({"imageLayoutVersion": "1.0.0"}))
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": blob(archive, canonical(config), "application/vnd.oci.image.config.v1+json"),
            "layers": [blob(archive, layer, "application/vnd.oci.image.layer.v1.tar")],
        }
        descriptor = blob(archive, canonical(manifest), "application/vnd.oci.image.manifest.v1+json")
        descriptor["platform"] = {"architecture": "amd64", "os": "linux"}
        descriptor["annotations"] = {
            "io.containerd.image.name": name,
            "org.opencontainers.image.ref.name": name,
        }
        index = canonical({"schemaVersion": 2, "manifests": [descriptor]})
        info = tarfile.TarInfo("index.json")
        info.size = len(index)
        archive.addfile(info, io.BytesIO(index))


def parse_file(spec: str) -> tuple[PurePosixPath, Path]:
    target, sep, source = spec.partition("=")
    if not sep or not target.startswith("/") or not Path(source).is_file():
        raise argparse.ArgumentTypeError(f"--file wants /path/in/image=/existing/host/file, got {spec!r}")
    return PurePosixPath(target), Path(source)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", help="image reference, e.g. sandgate.example.test/pause:1")
    parser.add_argument("out", type=Path)
    parser.add_argument("--file", type=parse_file, action="append", default=[], dest="files")
    parser.add_argument("--files-from", type=Path, help="a JSON object: /path/in/image -> /host/file")
    parser.add_argument("--entrypoint", action="append", default=[])
    parser.add_argument("--user", default="", help="the image's user, uid:gid (default: root)")
    args = parser.parse_args()
    files = dict(args.files)
    if args.files_from:
        listed = json.loads(args.files_from.read_text())
        files |= dict(parse_file(f"{target}={source}") for target, source in listed.items())
    if not files:
        parser.error("name at least one file (--file or --files-from)")
    write_image(args.name, args.out, files, args.entrypoint, args.user)


if __name__ == "__main__":
    main()
