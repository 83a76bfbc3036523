"""The layer store (lifecycle/layers.py): a layer that tries to leave its root is refused whole and
leaves nothing; whiteouts and opaque dirs become overlayfs's own format, proved by mounting a real
overlay of the layers; a blob that does not match its digest is never unpacked; prune keeps what
images and sandboxes use.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from sandgate.lifecycle.images import Image, ImageStore
from sandgate.lifecycle.layers import LayerError, LayerStore
from tests.support.registry import tar_layer

pytestmark = pytest.mark.root


def member(
    name: str, kind: bytes = tarfile.REGTYPE, link: str = "", data: bytes = b"x"
) -> Callable[[tarfile.TarFile], None]:
    def add(tar: tarfile.TarFile) -> None:
        info = tarfile.TarInfo(name)
        info.type, info.linkname = kind, link
        if kind == tarfile.REGTYPE:
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        else:
            tar.addfile(info)

    return add


def blob(tmp_path: Path, *members: Callable[[tarfile.TarFile], None]) -> tuple[Path, str]:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for add in members:
            add(tar)
    data = gzip.compress(buffer.getvalue())
    path = tmp_path / "blob"
    path.write_bytes(data)
    return path, "sha256:" + hashlib.sha256(data).hexdigest()


GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
ESCAPES = {
    "absolute-path": [member("/etc/sandgate-escape")],
    "dot-dot": [member("../sandgate-escape")],
    "dot-dot-inside": [member("usr/../../sandgate-escape")],
    "symlink-climbing-out": [member("usr/lib/link", tarfile.SYMTYPE, "../../../../etc")],
    "write-through-symlink": [member("etc", tarfile.SYMTYPE, "/etc"), member("etc/sandgate-escape")],
    "hardlink-out": [member("passwd", tarfile.LNKTYPE, "../../../etc/passwd")],
    "char-device": [member("dev/mem", tarfile.CHRTYPE)],
    "block-device": [member("dev/sda", tarfile.BLKTYPE)],
    "whiteout-through-symlink": [member("etc", tarfile.SYMTYPE, "/etc"), member("etc/.wh.hostname")],
}


@pytest.mark.parametrize("members", ESCAPES.values(), ids=ESCAPES.keys())
def test_a_layer_leaving_its_root_is_refused_and_leaves_nothing(tmp_path: Path, members: list) -> None:
    store = LayerStore(tmp_path / "layers")
    path, digest = blob(tmp_path, *members)
    hostname = Path("/etc/hostname").read_bytes() if Path("/etc/hostname").exists() else None
    with pytest.raises(LayerError, match=digest):
        store.add(path, digest, GZIP)
    assert not Path("/etc/sandgate-escape").exists() and not (tmp_path / "sandgate-escape").exists()
    assert (Path("/etc/hostname").read_bytes() if hostname is not None else None) == hostname
    assert list(store.root.iterdir()) == []


def test_absolute_symlinks_inside_the_image_are_kept(tmp_path: Path) -> None:
    """They resolve inside the sandbox's root, as /etc/alternatives links in every Debian image do."""
    store = LayerStore(tmp_path / "layers")
    path, digest = blob(tmp_path, member("usr/bin/editor", tarfile.SYMTYPE, "/etc/alternatives/editor"))
    store.add(path, digest, GZIP)
    assert os.readlink(store.path(digest) / "usr/bin/editor") == "/etc/alternatives/editor"


def test_a_blob_not_matching_its_digest_is_not_unpacked(tmp_path: Path) -> None:
    store = LayerStore(tmp_path / "layers")
    path, digest = blob(tmp_path, member("etc/file"))
    path.write_bytes(path.read_bytes() + b"\0")
    with pytest.raises(LayerError, match="does not match its digest"):
        store.add(path, digest, GZIP)
    assert not store.root.exists() or list(store.root.iterdir()) == []


def test_whiteouts_and_opaque_dirs_in_a_real_overlay(tmp_path: Path) -> None:
    store = LayerStore(tmp_path / "layers")
    lower = tar_layer({"etc": None, "etc/keep": b"k", "etc/gone": b"g", "opt": None, "opt/old": b"o"})
    upper = tar_layer({"etc/.wh.gone": b"", "opt": None, "opt/.wh..wh..opq": b"", "opt/new": b"n"})
    digests = []
    for index, data in enumerate((lower, upper)):
        path = tmp_path / f"blob{index}"
        path.write_bytes(data)
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        store.add(path, digest, "application/vnd.oci.image.layer.v1.tar")
        digests.append(digest)
    merged = tmp_path / "merged"
    merged.mkdir()
    lowerdir = ":".join(str(store.path(d)) for d in reversed(digests))
    subprocess.run(
        ["mount", "-t", "overlay", "overlay", "-o", f"lowerdir={lowerdir}", str(merged)], check=True
    )
    try:
        assert sorted(os.listdir(merged / "etc")) == ["keep"]
        assert sorted(os.listdir(merged / "opt")) == ["new"]
    finally:
        subprocess.run(["umount", str(merged)], check=True)


def test_prune_keeps_what_images_and_sandboxes_use(tmp_path: Path) -> None:
    images = ImageStore(tmp_path / "images")
    kept, used, unused = (tar_layer({f"etc/{name}": name.encode()}) for name in ("kept", "used", "unused"))
    digests = {}
    for name, data in (("kept", kept), ("used", used), ("unused", unused)):
        path = tmp_path / name
        path.write_bytes(data)
        digests[name] = "sha256:" + hashlib.sha256(data).hexdigest()
        images.layers.add(path, digests[name], "application/vnd.oci.image.layer.v1.tar")
    record = Image(
        name="example.test/team/kept:1", rootfs=None, created=0.0, source="test", layers=[digests["kept"]]
    )
    directory = images._dir(record.name)
    directory.mkdir(parents=True)
    (directory / "image.json").write_text(json.dumps(record.model_dump(mode="json")))
    removed = images.prune({images.layers.path(digests["used"])})
    assert removed == [images.layers.path(digests["unused"]).name]
    assert images.layers.has(digests["kept"]) and images.layers.has(digests["used"])
