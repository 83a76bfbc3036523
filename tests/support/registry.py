"""A real OCI registry for tests: Debian's `docker-registry` (distribution) in a namespace of its own.

Rules: two registry processes run in one network namespace with a random name, joined to the
test's host namespace by one veth with a random /30 out of 192.0.2.128/25: `open` on port 5000
(anyone may pull and push) and `private` on port 5001 (basic auth from an htpasswd file made
here). Both speak plain HTTP, so sandgate must list them in `insecure_registries`. Every process
is stopped by PID and the namespace deleted on teardown, also when a test fails.

Images are OCI layouts written here from local files (`OciLayout`) and pushed with skopeo, the
client sandgate itself pulls with, so what the registry holds went through a real push. The
rootfs of `library/python:3.12` comes from sandbox-images/build.py (the host's Python under
/usr/local, busybox, the libraries they load), not from a second recipe.

The session fixture `registry` (tests/conftest.py) starts it once and fills it (`fill`); another
suite pushes its own image with `registry.push(layout, tag, "team/image")`. A third listener,
`silent` (port 5002), accepts connections and never answers: a registry that hangs.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import hashlib
import importlib.util
import io
import json
import secrets
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from tests.support.netns import Netns, ip, unique

REPO = Path(__file__).resolve().parents[2]
OPEN_PORT = 5000
PRIVATE_PORT = 5001
SILENT_PORT = 5002
SILENT = (
    "import socket,time;s=socket.create_server(('0.0.0.0',int(__import__('sys').argv[1])));time.sleep(3600)"
)
READY_TIMEOUT = 20.0
SKOPEO_POLICY = '{"default": [{"type": "insecureAcceptAnything"}]}'
PYTHON_IMAGE = "library/python:3.12"
PYTHON_ENV = ["PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"]

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
INDEX = "application/vnd.oci.image.index.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"


# ---------------------------------------------------------------- OCI layouts from local files


def tar_layer(entries: dict[str, bytes | str | None], *, mode: int = 0o644) -> bytes:
    """A layer tar: `bytes` are files, `None` directories, `str` symlinks to that target."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, content in entries.items():
            info = tarfile.TarInfo(name)
            if content is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif isinstance(content, str):
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, content, 0o777
                tar.addfile(info)
            else:
                info.size, info.mode = len(content), mode
                tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def image_build() -> ModuleType:
    """sandbox-images/build.py, the script that lays out the sandbox images' rootfs."""
    spec = importlib.util.spec_from_file_location("sandgate_image_build", REPO / "sandbox-images/build.py")
    assert spec is not None and spec.loader is not None
    build = sys.modules.setdefault(spec.name, importlib.util.module_from_spec(spec))
    spec.loader.exec_module(build)
    return build


def python_rootfs_layer(workdir: Path) -> bytes:
    """The rootfs tar of sandbox-images/build.py: busybox, the host's Python in /usr/local."""
    build = image_build()
    path = workdir / "python-rootfs.tar"
    try:
        build.write_rootfs(build.rootfs_entries(), path)
        return path.read_bytes()
    finally:
        path.unlink(missing_ok=True)


def host_program_trees(programs: list[Path]) -> dict[str, Path]:
    """`tree_layer`'s trees for host programs and every library they load, laid out as the
    rootfs lays out its own (/usr/bin, /usr/lib/x86_64-linux-gnu): a tool the rootfs lacks."""
    trees = {f"/usr/bin/{program.name}": program.resolve() for program in programs}
    for entry in image_build().library_entries(programs):
        trees[f"/{entry.path}"] = entry.source
    return trees


def tree_layer(trees: dict[str, Path]) -> bytes:
    """A layer of local files and directories, each at the path (in the image) its key names;
    no bytecode caches."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for target, source in trees.items():
            tar.add(source, arcname=target.lstrip("/"), filter=_no_bytecode)
    return buffer.getvalue()


def _no_bytecode(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    return None if "__pycache__" in info.name.split("/") else info


def tools_layer() -> bytes:
    """A static busybox with a link per applet in /bin: enough for a shell, `sleep` and `cat`."""
    applets = subprocess.run(["/bin/busybox", "--list"], capture_output=True, text=True, check=True).stdout
    links: dict[str, bytes | str | None] = {
        f"bin/{name}": "busybox" for name in applets.split() if name != "busybox"
    }
    return tar_layer({"bin": None, "bin/busybox": Path("/bin/busybox").read_bytes(), **links}, mode=0o755)


@dataclass
class OciLayout:
    """An OCI image layout directory: blobs by digest, `index.json` naming tags."""

    path: Path
    refs: dict[str, dict[str, object]] = field(default_factory=dict)

    def blob(self, data: bytes, media_type: str) -> dict[str, object]:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        target = self.path / "blobs" / "sha256" / digest[7:]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        return {"mediaType": media_type, "digest": digest, "size": len(data)}

    def image(
        self,
        layers: list[bytes],
        *,
        env: list[str] | None = None,
        cmd: list[str] | None = None,
        arch: str = "amd64",
        compress: bool = True,
    ) -> dict[str, object]:
        """Write an image (layers gzip-compressed); returns its manifest's descriptor."""
        blobs = [
            self.blob(gzip.compress(layer, compresslevel=1) if compress else layer,
                      LAYER_GZIP if compress else "application/vnd.oci.image.layer.v1.tar")
            for layer in layers
        ]  # fmt: skip
        config = {
            "architecture": arch,
            "os": "linux",
            "config": {"Env": env or PYTHON_ENV, "Cmd": cmd or ["/bin/sh"]},
            "rootfs": {
                "type": "layers",
                "diff_ids": ["sha256:" + hashlib.sha256(x).hexdigest() for x in layers],
            },
        }
        manifest = {
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": self.blob(json.dumps(config).encode(), CONFIG),
            "layers": blobs,
        }
        descriptor = self.blob(json.dumps(manifest).encode(), MANIFEST)
        return {**descriptor, "platform": {"architecture": arch, "os": "linux"}}

    def index(self, manifests: list[dict[str, object]]) -> dict[str, object]:
        document = {"schemaVersion": 2, "mediaType": INDEX, "manifests": manifests}
        return self.blob(json.dumps(document).encode(), INDEX)

    def tag(self, name: str, descriptor: dict[str, object]) -> None:
        entry = {k: v for k, v in descriptor.items() if k != "platform"}
        self.refs[name] = {**entry, "annotations": {"org.opencontainers.image.ref.name": name}}
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
        (self.path / "index.json").write_text(
            json.dumps({"schemaVersion": 2, "mediaType": INDEX, "manifests": list(self.refs.values())})
        )


# ---------------------------------------------------------------- the registry


@dataclass
class Registry:
    """The running registries; `open` and `private` are host:port as sandgate names them."""

    workdir: Path
    netns: str
    host_address: str
    address: str
    username: str
    password: str

    @property
    def open(self) -> str:
        return f"{self.address}:{OPEN_PORT}"

    @property
    def private(self) -> str:
        return f"{self.address}:{PRIVATE_PORT}"

    @property
    def silent(self) -> str:
        return f"{self.address}:{SILENT_PORT}"

    @property
    def mirror(self) -> str:
        """`registry_mirrors` value that makes `python:3.12` come from `open`."""
        return f"http://{self.open}"

    def push(self, layout: OciLayout, tag: str, repository: str, *, private: bool = False) -> None:
        """Copy `layout`'s `tag` (an image or an index with all its images) to the registry."""
        host = self.private if private else self.open
        argv = ["skopeo", "--policy", str(self.workdir / "policy.json"), "copy", "--quiet", "--all"]
        argv += ["--dest-tls-verify=false", "--preserve-digests"]
        if private:
            argv += ["--dest-authfile", str(self.workdir / "auth.json")]
        argv += [f"oci:{layout.path}:{tag}", f"docker://{host}/{repository}"]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            raise RuntimeError(f"skopeo push of {repository} failed: {result.stderr}")

    @contextlib.contextmanager
    def reachable_from(self, pid: int) -> Iterator[None]:
        """Let the network namespace of `pid` (a private dockerd's) reach the registry: a veth
        from the registry's namespace into it, and a route to the registry's address over it."""
        link = 4 * secrets.randbelow(32)
        registry_end, other_end = f"192.0.2.{link + 1}", f"192.0.2.{link + 2}"
        name = unique("tvd")
        ip("link", "add", name, "netns", self.netns, "type", "veth", "peer", "name", name + "p",
           "netns", str(pid))  # fmt: skip
        try:
            ip("addr", "add", f"{registry_end}/30", "dev", name, netns=self.netns)
            ip("link", "set", name, "up", netns=self.netns)
            enter = ["nsenter", f"--net=/proc/{pid}/ns/net", "--", "ip"]
            for args in (
                ["addr", "add", f"{other_end}/30", "dev", name + "p"],
                ["link", "set", name + "p", "up"],
                ["route", "add", f"{self.address}/32", "via", registry_end],
            ):
                subprocess.run([*enter, *args], check=True, capture_output=True)
            yield
        finally:
            subprocess.run(["ip", "-n", self.netns, "link", "del", name], capture_output=True)

    def blob_file(self, digest: str, *, private: bool = False) -> Path:
        """Where the registry keeps a blob (tests corrupt it to prove digests are checked)."""
        value = digest.removeprefix("sha256:")
        storage = self.workdir / ("private" if private else "open")
        return storage / "docker/registry/v2/blobs/sha256" / value[:2] / value / "data"


def _config(storage: Path, port: int, address: str, htpasswd: Path | None) -> str:
    auth = f"auth:\n  htpasswd:\n    realm: sandgate-test\n    path: {htpasswd}\n" if htpasswd else ""
    return (
        "version: 0.1\nlog:\n  level: info\n"
        f"storage:\n  filesystem:\n    rootdirectory: {storage}\n  delete:\n    enabled: true\n"
        f"http:\n  addr: {address}:{port}\n{auth}"
    )


def _htpasswd(path: Path, username: str, password: str) -> None:
    """bcrypt entry (the only kind distribution accepts); the password goes in on stdin."""
    result = subprocess.run(
        ["htpasswd", "-niB", username], input=password, capture_output=True, text=True, check=True
    )
    path.write_text(result.stdout.strip() + "\n")


def _wait_ready(ns: Netns, url: str, processes: list[subprocess.Popen[bytes]], log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    while True:
        probe = ns.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", url], timeout=5)
        if probe.stdout in ("200", "401"):
            return
        if any(p.poll() is not None for p in processes) or time.monotonic() > deadline:
            raise RuntimeError(f"docker-registry did not start; log:\n{log.read_text(errors='replace')}")
        time.sleep(0.05)


@contextlib.contextmanager
def start_registry(workdir: Path) -> Iterator[Registry]:
    """Build the namespace, start both registries, yield; always tear everything down."""
    workdir.mkdir(parents=True, exist_ok=True)
    subnet = 128 + 4 * secrets.randbelow(32)
    host_address, address = f"192.0.2.{subnet + 1}", f"192.0.2.{subnet + 2}"
    username, password = "puller", secrets.token_urlsafe(12)
    _htpasswd(workdir / "htpasswd", username, password)
    (workdir / "policy.json").write_text(SKOPEO_POLICY)
    token = base64.b64encode(f"{username}:{password}".encode()).decode()
    auth = {"auths": {f"{address}:{PRIVATE_PORT}": {"auth": token}}}
    (workdir / "auth.json").write_text(json.dumps(auth))
    (workdir / "auth.json").chmod(0o600)
    ns = Netns("sgr")
    host_if = unique("tvr")
    processes: list[subprocess.Popen[bytes]] = []
    log_path = workdir / "registry.log"
    try:
        ip("link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", ns.name)
        ip("addr", "add", f"{host_address}/30", "dev", host_if)
        ip("link", "set", host_if, "up")
        ip("addr", "add", f"{address}/30", "dev", "eth0", netns=ns.name)
        ip("link", "set", "eth0", "up", netns=ns.name)
        with log_path.open("ab") as log:
            for name, port, htpasswd in (
                ("open", OPEN_PORT, None),
                ("private", PRIVATE_PORT, workdir / "htpasswd"),
            ):
                config = workdir / f"{name}.yml"
                config.write_text(_config(workdir / name, port, address, htpasswd))
                processes.append(
                    ns.popen(["docker-registry", "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
                )
        processes.append(ns.popen([sys.executable, "-c", SILENT, str(SILENT_PORT)]))
        for port in (OPEN_PORT, PRIVATE_PORT):
            _wait_ready(ns, f"http://{address}:{port}/v2/", processes, log_path)
        yield Registry(workdir, ns.name, host_address, address, username, password)
    finally:
        for process in processes:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(5)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(5)
        subprocess.run(["ip", "link", "del", host_if], capture_output=True)
        ns.delete()


def fill(registry: Registry) -> None:
    """The images every suite may use (see the module docstring for what each is)."""
    layout = OciLayout(registry.workdir / "layouts")
    python = layout.image([python_rootfs_layer(registry.workdir)], cmd=["python3"])
    layout.tag("python", python)
    registry.push(layout, "python", PYTHON_IMAGE)
    marker = {"etc/sandgate-test": b"private image\n"}
    tools = tools_layer()
    layout.tag("private", layout.image([tools, tar_layer(marker)]))
    registry.push(layout, "private", "team/agent:1.4", private=True)
    per_arch = [
        layout.image([tools, tar_layer({"etc/arch": arch.encode()})], arch=arch)
        for arch in ("amd64", "arm64")
    ]
    layout.tag("multi", layout.index(per_arch))
    registry.push(layout, "multi", "team/multi:1.0")
    layout.tag("arm-only", layout.index(per_arch[1:]))
    registry.push(layout, "arm-only", "team/arm-only:1.0")


def push_python_with(registry: Registry, trees: dict[str, Path], reference: str) -> None:
    """`python:3.12` with `trees` (image path -> local file or directory) on top, pushed as
    `reference` (a docker.io name, which the mirror serves from `open`)."""
    layout = OciLayout(registry.workdir / "layouts")
    image = layout.image([python_rootfs_layer(registry.workdir), tree_layer(trees)], cmd=["python3"])
    name = reference.replace(":", "-").replace("/", "-")  # the layout's name for it
    layout.tag(name, image)
    registry.push(layout, name, reference if "/" in reference else f"library/{reference}")
