"""The image store: docker-save / rootfs imports, whiteouts, safety, and a sandbox from an import."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from sandgate.lifecycle.cli import main
from sandgate.lifecycle.images import HOST_IMAGE, ImageError, ImageNotFound, ImageStore
from tests.runtime.harness import Harness

BUSYBOX = Path("/bin/busybox")


def busybox_rootfs(target: Path) -> Path:
    """The smallest root filesystem with a shell: a static busybox."""
    (target / "bin").mkdir(parents=True)
    shutil.copy2(BUSYBOX, target / "bin/busybox")
    (target / "bin/sh").symlink_to("busybox")
    return target


def glibc_rootfs(target: Path) -> Path:
    """A small root filesystem: busybox plus the host libraries execd's Python loads."""
    busybox_rootfs(target)
    prefix = Path(sys.base_prefix)
    objects = [Path(sys.executable).resolve(), *prefix.glob("lib/python3*/lib-dynload/*.so")]
    objects += Path(sys.prefix).glob("lib/python3*/site-packages/**/*.so")
    listing = subprocess.run(["ldd", *map(str, objects)], capture_output=True, text=True).stdout
    for library in set(re.findall(r"(?:=>|^)\s*(/\S+) \(0x", listing, re.MULTILINE)):
        if not library.startswith(str(prefix)):
            destination = target / library.lstrip("/")
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(library, destination)
    return target


def layer(entries: dict[str, bytes | None], rootfs: Path | None = None) -> bytes:
    """A layer tar: files (content) and directories (None), optionally on top of a whole rootfs."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        if rootfs is not None:
            tar.add(rootfs, arcname=".")
        for name, content in entries.items():
            info = tarfile.TarInfo(name)
            if content is None:
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tar.addfile(info)
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def docker_save(path: Path, layers: list[bytes], env: list[str]) -> Path:
    config = json.dumps({"config": {"Env": env, "Cmd": ["/bin/sh"]}}).encode()
    manifest = [{"Config": "cfg.json", "RepoTags": ["test:latest"], "Layers": []}]
    with tarfile.open(path, "w") as tar:
        for index, data in enumerate(layers):
            name = f"l{index}/layer.tar"
            manifest[0]["Layers"].append(name)  # type: ignore[attr-defined]
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, data in (("cfg.json", config), ("manifest.json", json.dumps(manifest).encode())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def layered_image(work: Path, rootfs: Path) -> Path:
    """A `docker save` archive of two layers: `rootfs` with a few files, then whiteouts of some."""
    lower = layer(
        {"etc/": None, "etc/removed": b"gone", "opt/": None, "opt/old/": None, "opt/old/a": b"a"}, rootfs
    )
    upper = layer({"etc/.wh.removed": b"", "opt/old/.wh..wh..opq": b"", "opt/old/b": b"b"})
    return docker_save(work / "image.tar", [lower, upper], env=["PATH=/bin", "IMAGE_MARK=from-config"])


@pytest.fixture(scope="module")
def image_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An image execd's Python runs in (gathering its libraries takes ldd seconds of CPU)."""
    work = tmp_path_factory.mktemp("image")
    return layered_image(work, glibc_rootfs(work / "rootfs"))


def test_docker_save_import_applies_layers_and_whiteouts(tmp_path: Path) -> None:
    archive = layered_image(tmp_path, busybox_rootfs(tmp_path / "rootfs"))
    store = ImageStore(tmp_path / "images")
    image = store.import_tarball(archive, "test/layers:1")
    assert image.rootfs is not None
    assert (image.rootfs / "bin/busybox").is_file()
    assert not (image.rootfs / "etc/removed").exists()
    assert sorted(p.name for p in (image.rootfs / "opt/old").iterdir()) == ["b"]
    assert "IMAGE_MARK=from-config" in image.env
    assert [i.name for i in store.list()] == [HOST_IMAGE, "test/layers:1"]
    assert store.get("test/layers:1") == image


def test_plain_rootfs_tarball_and_unknown_image(tmp_path: Path) -> None:
    archive = tmp_path / "rootfs.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(BUSYBOX, arcname="bin/busybox")
    store = ImageStore(tmp_path / "images")
    store.import_tarball(archive, "busybox")
    with pytest.raises(ImageNotFound) as missing:
        store.get("nope:latest")
    assert missing.value.available == [HOST_IMAGE, "busybox"]
    assert "sandgate/host, busybox" in str(missing.value)


def test_an_imported_image_is_found_by_its_reference_in_any_spelling(tmp_path: Path) -> None:
    """What another suite does with a prebuilt image: import it as the name the guide uses; a
    create naming it (either spelling) finds it and pulls nothing (no registry is configured)."""
    archive = layered_image(tmp_path, busybox_rootfs(tmp_path / "rootfs"))
    store = ImageStore(tmp_path / "images")
    store.import_tarball(archive, "opensandbox/code-interpreter:v1.1.0")
    for spelling in ("opensandbox/code-interpreter:v1.1.0", "docker.io/opensandbox/code-interpreter:v1.1.0"):
        assert store.ensure(spelling).name == "opensandbox/code-interpreter:v1.1.0"


def test_a_whiteout_cannot_delete_through_a_symlink(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "canary").write_text("alive")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        link = tarfile.TarInfo("evil")
        link.type, link.linkname = tarfile.SYMTYPE, str(outside)
        tar.addfile(link)
    archive = docker_save(tmp_path / "evil.tar", [buffer.getvalue(), layer({"evil/.wh.canary": b""})], env=[])
    with pytest.raises(ImageError):
        ImageStore(tmp_path / "images").import_tarball(archive, "evil")
    assert (outside / "canary").read_text() == "alive"
    assert list((tmp_path / "images").iterdir()) == []  # nothing half-imported


def test_cli_import_and_list(tmp_path: Path) -> None:
    archive = tmp_path / "rootfs.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(BUSYBOX, arcname="bin/busybox")
    runner = CliRunner()
    imported = runner.invoke(
        main, ["--state-dir", str(tmp_path), "image", "import", str(archive), "tools/bb"]
    )
    assert imported.exit_code == 0, imported.output
    listed = runner.invoke(main, ["--state-dir", str(tmp_path), "image", "list"])
    assert listed.exit_code == 0 and "tools/bb" in listed.output and HOST_IMAGE in listed.output
    bad = runner.invoke(main, ["--state-dir", str(tmp_path), "image", "import", str(archive), "Bad Name"])
    assert bad.exit_code == 2 and "image name" in bad.output


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path / "state")
    try:
        yield harness
    finally:
        harness.close()


@pytest.mark.root
def test_sandbox_from_an_imported_image_runs_execd(harness: Harness, image_archive: Path) -> None:
    harness.images.import_tarball(image_archive, "test/glibc:1")
    script = "echo $IMAGE_MARK > /workspace/mark; ls / > /workspace/ls"
    sandbox_id, _ = harness.start(["/bin/sh", "-c", script], image="test/glibc:1")  # waits for execd /ping
    assert harness.wait_file(sandbox_id, "mark").strip() == "from-config"
    assert "opt" in harness.wait_file(sandbox_id, "ls").split()
