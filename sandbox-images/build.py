"""Build the sandbox images with no registry: a rootfs tarball from local files, `docker import`,
then `docker build` on top.

Rules:
- Inputs are only files on this host: the Python that runs this script (its base prefix, stdlib
  and the shared libraries `ldd` names), the execd package and the distributions it needs from
  this environment's site-packages, busybox-static, the host's CA bundle, and the recipes here.
- Every image is tagged with a digest of those inputs (`sandgate/base:<digest>`) as well as
  `:latest`; a build whose digest tag already exists does nothing, and a built set is saved to
  the cache dir so a fresh daemon (a test's private dockerd) loads it instead of rebuilding.
- `docker build` runs with network mode none: nothing is fetched.

Theory: `rootfs.tar` holds a minimal filesystem (busybox for a shell and coreutils, Python under
/usr/local with execd's dependencies in its site-packages). `base/Dockerfile` adds the entry
script (CA trust at start, execd, then the sandbox's entrypoint) and compiles the bytecode, since
sandboxes run with a read-only root. `python/Dockerfile` adds pip and a user site in /workspace.

Usage: `python sandbox-images/build.py [--docker-host URL] [--cache DIR]`. Without a reachable
daemon it starts a private dockerd (tests/support/dockerd.py), builds, and saves the images to
the cache dir for `docker load`.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors
from packaging.requirements import Requirement

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
EXECD_SOURCE = REPO / "execd"
BUSYBOX = Path("/bin/busybox")
# Host programs copied in with their libraries: what agents expect besides Python (when present);
# bash is what execd's /session and bash code contexts run (busybox's sh is not bash).
HOST_PROGRAMS = (Path("/usr/bin/curl"), Path("/usr/bin/bash"))
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
DEFAULT_CACHE = Path(os.environ.get("SANDGATE_IMAGE_CACHE", Path.home() / ".cache" / "sandgate" / "images"))

# What execd imports besides the stdlib, and the kernels its code contexts run (execd/kernels.py);
# their dependency closure is copied in.
EXECD_REQUIREMENTS = (
    "fastapi",
    "uvicorn",
    "pydantic",
    "python-multipart",
    "h11",
    "jupyter_client",
    "ipykernel",
    "bash_kernel",
)
# Recipes in build order: image name -> folder holding its Dockerfile (built FROM the previous).
RECIPES = {"sandgate/base": HERE / "base", "sandgate/python": HERE / "python"}
ROOTFS_IMAGE = "sandgate/rootfs"
# OpenSandbox's code-interpreter image, built FROM sandgate/python with packages from the index
# (its requirements.txt, pinned to this environment's versions where execd already has them).
CODE_INTERPRETER = HERE / "code-interpreter"
CODE_INTERPRETER_IMAGE = "opensandbox/code-interpreter"
CODE_INTERPRETER_TAGS = ("v1.1.0", "latest")  # the tags OpenSandbox's SDK and guide name
# Its packages are downloaded here first (`--wheels-only`, which bootstrap runs): the build itself
# then installs offline, so it also works where only the tests' own namespaces are (no index).
WHEELHOUSE = Path(os.environ.get("SANDGATE_WHEELHOUSE", DEFAULT_CACHE.parent / "code-interpreter-wheels"))

# Parts of the stdlib a sandbox never needs (tests alone are half of it; config-* holds libpython.a).
STDLIB_SKIP = re.compile(
    r"^(test|idlelib|tkinter|turtledemo|lib2to3|config-[^/]*|site-packages|__phello__)(/|$)"
    r"|(^|/)(tests?|idle_test)/"
    r"|\.opt-[12]\.pyc$"
    r"|^lib-dynload/(_tkinter|_test|_xx|xx)"
)
PY_IMAGE_PREFIX = "/usr/local"
OS_RELEASE = 'NAME="sandgate"\nID=sandgate\nPRETTY_NAME="sandgate sandbox image (busybox, Python {python})"\n'
# The standard layout agents and their tools expect (`cd /var`, a build writing to /var/tmp, an
# installer into /opt), with their modes. The Docker runtime mounts tmpfs on /tmp, /var/tmp, /run.
ROOTFS_DIRS = {
    "tmp": 0o1777,
    "var/tmp": 0o1777,
    **dict.fromkeys(("var/cache", "var/lib", "var/log", "opt", "srv", "mnt", "home"), 0o755),
    **dict.fromkeys(("run", "workspace", "proc", "sys", "dev", "etc/sandgate", "usr/local/bin"), 0o755),
}


@dataclass(frozen=True)
class Entry:
    """One file in the rootfs: where it goes and where its bytes come from (or a symlink)."""

    path: str  # inside the image, no leading slash
    source: Path | None = None
    link: str | None = None
    data: bytes | None = None
    mode: int = 0o644


# ---------------------------------------------------------------- what goes into the rootfs


def python_version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def stdlib_entries() -> Iterator[Entry]:
    prefix = Path(sys.base_prefix)
    ver = python_version()
    binary = (prefix / "bin" / f"python{ver}").resolve()
    yield Entry(f"usr/local/bin/python{ver}", binary, mode=0o755)
    for alias in ("python3", "python"):
        yield Entry(f"usr/local/bin/{alias}", link=f"python{ver}")
    stdlib = prefix / "lib" / f"python{ver}"
    for path in sorted(stdlib.rglob("*")):
        rel = path.relative_to(stdlib).as_posix()
        if path.is_dir() or STDLIB_SKIP.search(rel):
            continue
        yield Entry(f"usr/local/lib/python{ver}/{rel}", path, mode=0o755 if rel.endswith(".so") else 0o644)


def distribution_closure(roots: Iterable[str]) -> list[importlib.metadata.Distribution]:
    """The distributions `roots` need (no extras), as installed in this environment."""
    found: dict[str, importlib.metadata.Distribution] = {}
    todo = list(roots)
    while todo:
        dist = importlib.metadata.distribution(todo.pop())
        key = dist.metadata["Name"].lower().replace("_", "-")
        if key in found:
            continue
        found[key] = dist
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return [found[k] for k in sorted(found)]


def site_packages_entries(dists: list[importlib.metadata.Distribution]) -> Iterator[Entry]:
    site = f"usr/local/lib/python{python_version()}/site-packages"
    for dist in dists:
        for file in dist.files or []:
            rel = file.as_posix()
            if rel.startswith("..") or "__pycache__" in rel:
                continue  # console scripts outside site-packages; bytecode is built in the image
            source = Path(str(file.locate()))
            if source.is_file():
                yield Entry(f"{site}/{rel}", source, mode=0o755 if rel.endswith(".so") else 0o644)
    for path in sorted([*EXECD_SOURCE.rglob("*.py"), *EXECD_SOURCE.rglob("*.js")]):
        yield Entry(f"{site}/sandgate/execd/{path.relative_to(EXECD_SOURCE).as_posix()}", path)


def shared_libraries(binaries: Iterable[Path]) -> dict[str, Path]:
    """Library name -> host file, for every library `ldd` lists for the given ELF files."""
    libs: dict[str, Path] = {}
    for binary in binaries:
        out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True).stdout
        for line in out.splitlines():
            match = re.search(r"(\S+) => (/\S+)", line) or re.search(r"^\s*(/\S+ld-linux\S*)", line)
            if match:
                host = Path(match.group(match.lastindex or 1))
                libs[host.name] = host.resolve()
    return libs


def library_entries(elf_files: list[Path]) -> Iterator[Entry]:
    for name, host in sorted(shared_libraries(elf_files).items()):
        if name.startswith("ld-linux"):
            yield Entry(f"lib64/{name}", host, mode=0o755)
        else:
            yield Entry(f"usr/lib/x86_64-linux-gnu/{name}", host, mode=0o755)


def busybox_entries() -> Iterator[Entry]:
    yield Entry("bin/busybox", BUSYBOX, mode=0o755)
    applets = subprocess.run([str(BUSYBOX), "--list"], capture_output=True, text=True, check=True).stdout
    for applet in applets.split():
        if applet != "busybox":
            yield Entry(f"bin/{applet}", link="busybox")
    yield Entry("usr/bin/env", link="/bin/busybox")


def host_program_entries() -> Iterator[Entry]:
    for program in HOST_PROGRAMS:
        if program.exists():
            yield Entry(f"usr/bin/{program.name}", program.resolve(), mode=0o755)


def system_entries() -> Iterator[Entry]:
    yield Entry("lib", link="usr/lib")
    yield Entry(
        "etc/passwd", data=b"root:x:0:0:root:/workspace:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n"
    )
    yield Entry("etc/group", data=b"root:x:0:\nnogroup:x:65534:\n")
    yield Entry("etc/nsswitch.conf", data=b"passwd: files\ngroup: files\nhosts: files dns\n")
    # what tools read to learn the system (os-release(5)): this image, not the host it came from
    yield Entry("etc/os-release", data=OS_RELEASE.format(python=python_version()).encode())
    # The trust store lives on the /run tmpfs: the entry script writes it at start (read-only root).
    yield Entry(
        "usr/share/sandgate/system-ca.crt", HOST_CA_BUNDLE if HOST_CA_BUNDLE.exists() else None, data=b""
    )
    yield Entry("etc/ssl/certs/ca-certificates.crt", link="/run/sandgate/ca-bundle.crt")
    yield Entry("etc/ssl/cert.pem", link="/run/sandgate/ca-bundle.crt")


def rootfs_entries() -> list[Entry]:
    dists = distribution_closure(EXECD_REQUIREMENTS)
    programs = list(host_program_entries())
    entries = [
        *system_entries(),
        *busybox_entries(),
        *programs,
        *stdlib_entries(),
        *site_packages_entries(dists),
    ]
    elves = [e.source for e in entries if e.source and (e.path.endswith(".so") or "/bin/python" in e.path)]
    elves += [e.source for e in programs if e.source]
    entries += library_entries([p for p in elves if p is not None])
    return entries


# ---------------------------------------------------------------- digest and tarball


def input_digest(entries: list[Entry]) -> str:
    """Changes when any input file, the recipes or this script change (size+mtime for big files)."""
    h = hashlib.sha256()
    for entry in entries:
        h.update(f"{entry.path}\0{entry.link}\0{entry.mode}\0".encode())
        if entry.source is not None:
            st = entry.source.stat()
            h.update(f"{st.st_size}:{st.st_mtime_ns}\0".encode())
        if entry.data is not None:
            h.update(entry.data)
    for recipe in sorted(HERE.rglob("*")):
        if recipe.is_file() and "__pycache__" not in recipe.parts:
            h.update(recipe.relative_to(HERE).as_posix().encode() + b"\0" + recipe.read_bytes())
    return h.hexdigest()[:16]


def write_rootfs(entries: list[Entry], out: Path) -> None:
    dirs: set[str] = set()
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for base, mode in ROOTFS_DIRS.items():
            _add_dir(tar, base, dirs, mode=mode)
        for entry in entries:
            _add_dir(tar, str(Path(entry.path).parent), dirs)
            info = tarfile.TarInfo(entry.path)
            info.mtime = int(time.time()) if entry.source is None else int(entry.source.stat().st_mtime)
            if entry.link is not None:
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, entry.link, 0o777
                tar.addfile(info)
                continue
            data = entry.source.read_bytes() if entry.source is not None else (entry.data or b"")
            info.size, info.mode = len(data), entry.mode
            tar.addfile(info, io.BytesIO(data))


def _add_dir(tar: tarfile.TarFile, path: str, seen: set[str], mode: int = 0o755) -> None:
    if path in ("", ".") or path in seen:
        return
    _add_dir(tar, str(Path(path).parent), seen)
    seen.add(path)
    info = tarfile.TarInfo(path)
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, int(time.time())
    tar.addfile(info)


# ---------------------------------------------------------------- docker


def image_names(digest: str) -> list[str]:
    return [f"{name}:{digest}" for name in RECIPES]


def have_images(client: docker.DockerClient, digest: str) -> bool:
    try:
        for ref in image_names(digest):
            client.images.get(ref)
    except docker.errors.ImageNotFound:
        return False
    return True


def build_images(client: docker.DockerClient, cache_dir: Path = DEFAULT_CACHE) -> str:
    """Make `sandgate/base` and `sandgate/python` (`:latest` and `:<digest>`) exist in the daemon.

    Returns the digest. Order of preference: already there, load the cached save, build.
    """
    entries = rootfs_entries()
    digest = input_digest(entries)
    cached = CachedImages(cache_dir, digest)
    if not have_images(client, digest) and cached.exists():
        cached.load(client)
    if not have_images(client, digest):
        _build(client, entries, digest, cache_dir)
        cached.save(client)
    for name in RECIPES:
        client.images.get(f"{name}:{digest}").tag(name, "latest")
    return digest


@dataclass(frozen=True)
class CachedImages:
    """One `docker save` of every recipe image, named by the input digest."""

    cache_dir: Path
    digest: str

    @property
    def archive(self) -> Path:
        return self.cache_dir / f"sandgate-images-{self.digest}.tar"

    def exists(self) -> bool:
        return self.archive.exists()

    def load(self, client: docker.DockerClient) -> None:
        with self.archive.open("rb") as f:
            client.images.load(f)

    def save(self, client: docker.DockerClient) -> None:
        for old in self.cache_dir.glob("sandgate-images-*"):
            old.unlink()  # one cached set at a time; a digest change makes the old one useless
        save_images(client, image_names(self.digest), self.archive)


def save_images(client: docker.DockerClient, names: list[str], archive: Path) -> None:
    """`docker save` of `names` into `archive` (written whole or not at all)."""
    # The SDK saves one image per call; the engine's endpoint takes several (shared layers once).
    api = client.api
    url = f"{api.base_url}/v{api.api_version}/images/get"
    partial = archive.with_suffix(".partial")
    with api.get(url, params={"names": names}, stream=True) as response:
        response.raise_for_status()
        with partial.open("wb") as f:
            for chunk in response.iter_content(1 << 20):
                f.write(chunk)
    partial.replace(archive)


def _build(client: docker.DockerClient, entries: list[Entry], digest: str, cache_dir: Path) -> None:
    cache_dir.mkdir(parents=True, exist_ok=True)
    rootfs = cache_dir / f"rootfs-{digest}.tar"
    try:
        write_rootfs(entries, rootfs)
        client.api.import_image(src=str(rootfs), repository=ROOTFS_IMAGE, tag=digest)
    finally:
        rootfs.unlink(missing_ok=True)
    parent = f"{ROOTFS_IMAGE}:{digest}"
    for name, folder in RECIPES.items():
        tag = f"{name}:{digest}"
        try:
            client.images.build(
                path=str(folder), tag=tag, buildargs={"FROM_IMAGE": parent}, network_mode="none", rm=True
            )
        except docker.errors.BuildError as exc:
            log = "".join(str(chunk.get("stream", chunk.get("error", ""))) for chunk in exc.build_log)
            raise RuntimeError(f"docker build of {tag} from {folder} failed:\n{log}") from exc
        parent = tag
    client.images.remove(f"{ROOTFS_IMAGE}:{digest}", noprune=True)


# ---------------------------------------------------------------- opensandbox/code-interpreter


def code_interpreter_archive(cache_dir: Path, digest: str) -> Path:
    return cache_dir / f"code-interpreter-{code_interpreter_tag(digest)}.tar"


def code_interpreter_tag(digest: str) -> str:
    """The base images' digest and the versions of the toolchains the image copies from this host."""
    return f"{digest}-{hashlib.sha256(toolchain_versions().encode()).hexdigest()[:8]}"


# ---- the Java and Go toolchains and kernels, from this host (bootstrap installs them)

# JJava's JShell needs the compiler and the debugger interface: every module of the host's JDK,
# linked into one runtime without debug symbols, man pages or headers (83 MB instead of 260).
JLINK = ["--add-modules", "ALL-MODULE-PATH", "--strip-debug", "--no-man-pages", "--no-header-files"]
IMAGE_JAVA_HOME = "/usr/lib/jvm/sandgate-jdk"
IMAGE_GOROOT = "/usr/local/go"
# What of GOROOT building a cell never reads: the toolchain's own sources, tests, docs
GOROOT_SKIP = shutil.ignore_patterns("testdata", "*_test.go")
GOROOT_SRC_SKIP = shutil.ignore_patterns("testdata", "*_test.go", "cmd")
GOROOT_SKIP_TOP = ("test", "api", "doc", "misc")
GO_TOOLS = ("gonb", "goimports", "gopls")  # GoNB and what it runs, next to .venv's Python


def host_java_home() -> Path:
    java = shutil.which("java")
    if java is None:
        raise RuntimeError("no `java` on PATH: the code-interpreter image needs a JDK (bootstrap has one)")
    return Path(java).resolve().parent.parent


def host_go() -> Path:
    """The Go next to .venv's Python (bootstrap links the host's there), else on PATH."""
    beside = Path(sys.executable).with_name("go")
    found = beside if beside.exists() else Path(shutil.which("go") or "/nonexistent")
    if not found.exists():
        raise RuntimeError("no Go toolchain: the code-interpreter image's Go needs one (bootstrap links it)")
    return found.resolve()


def go_tools() -> list[Path]:
    tools = [Path(sys.executable).with_name(tool) for tool in GO_TOOLS]
    missing = [t.name for t in tools if not t.is_file()]
    if missing:
        raise RuntimeError(f"{', '.join(missing)} missing next to {sys.executable}: run `make bootstrap`")
    return tools


def toolchain_versions() -> str:
    java = subprocess.run([host_java_home() / "bin" / "java", "-version"], capture_output=True, text=True)
    go = subprocess.run([host_go(), "version"], capture_output=True, text=True, check=True).stdout
    tools = [f"{t.name}:{t.stat().st_size}:{t.stat().st_mtime_ns}" for t in go_tools()]
    return "\0".join([java.stderr, go, *tools])


def linked_jdk(cache_dir: Path) -> Path:
    """The jlink'ed runtime of the host's JDK, made once per JDK version in the cache dir."""
    java_home = host_java_home()
    release = (java_home / "release").read_text(encoding="utf-8")
    out = cache_dir / f"jdk-{hashlib.sha256(release.encode()).hexdigest()[:12]}"
    if not out.is_dir():
        staging = cache_dir / f".{out.name}-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        jlink = [java_home / "bin" / "jlink", *JLINK, "--output", staging]
        subprocess.run(jlink, check=True, capture_output=True)
        staging.rename(out)
    return out


def add_toolchains(context: Path, cache_dir: Path) -> None:
    """The JDK runtime, GOROOT (trimmed), GoNB's tools, the libraries the JDK needs, the kernelspecs
    of JJava (from its wheel, which pip put in site/share) and GoNB into the build context."""
    from sandgate.execd.kernels import gonb_kernelspec

    shutil.copytree(linked_jdk(cache_dir), context / "jdk", symlinks=True)
    goroot = host_go().parent.parent
    (context / "go").mkdir()
    for item in goroot.iterdir():
        if item.name in GOROOT_SKIP_TOP:
            continue
        if item.is_dir():
            skip = GOROOT_SRC_SKIP if item.name == "src" else GOROOT_SKIP
            shutil.copytree(item, context / "go" / item.name, symlinks=True, ignore=skip)
        else:
            shutil.copy2(item, context / "go" / item.name)
    for tool in go_tools():
        shutil.copy2(tool, context / "bin" / tool.name)
    jdk_files = [p for p in (context / "jdk").rglob("*") if p.is_file()]
    elves = [p for p in jdk_files if p.suffix == ".so" or p.parent.name == "bin"]
    (context / "lib").mkdir()
    for name, host in shared_libraries(elves).items():
        if not name.startswith("ld-linux") and not (context / "jdk" / "lib" / name).exists():
            shutil.copy2(host, context / "lib" / name)
    (context / "site" / "share" / "jupyter" / "kernels" / "java").rename(context / "kernels" / "java")
    shutil.rmtree(context / "site" / "share")
    spec = gonb_kernelspec("/usr/local/bin/gonb", f"{IMAGE_GOROOT}/bin/go")
    (context / "kernels" / "gonb").mkdir()
    (context / "kernels" / "gonb" / "kernel.json").write_text(json.dumps(spec, indent=1), encoding="utf-8")


def build_code_interpreter(client: docker.DockerClient, digest: str, cache_dir: Path = DEFAULT_CACHE) -> Path:
    """Make `opensandbox/code-interpreter` (`:<digest>` and `CODE_INTERPRETER_TAGS`) exist in the
    daemon, FROM `sandgate/python:<digest>` (build_images first). Returns its `docker save`
    archive, which is also what the local runtime's image store imports. Order of preference:
    already there, load the cached archive, build (pip reaches the package index; docker does not).
    """
    ref = f"{CODE_INTERPRETER_IMAGE}:{code_interpreter_tag(digest)}"
    archive = code_interpreter_archive(cache_dir, digest)
    if not has_image(client, ref) and archive.exists():
        with archive.open("rb") as f:
            client.images.load(f)
    if not has_image(client, ref):
        _build_code_interpreter(client, digest, cache_dir)
    if not archive.exists():
        for old in cache_dir.glob("code-interpreter-*.tar"):
            old.unlink()  # one cached build at a time
        save_images(client, [ref], archive)
    for tag in CODE_INTERPRETER_TAGS:
        client.images.get(ref).tag(CODE_INTERPRETER_IMAGE, tag)
    return archive


def has_image(client: docker.DockerClient, ref: str) -> bool:
    try:
        client.images.get(ref)
    except docker.errors.ImageNotFound:
        return False
    return True


def pinned_to_this_environment() -> str:
    """Constraints `name==version` for what the base image already has (execd's closure), so the
    code-interpreter layer never holds a second version of a package beside the base's."""
    return "".join(f"{d.metadata['Name']}=={d.version}\n" for d in distribution_closure(EXECD_REQUIREMENTS))


def download_code_interpreter_wheels(wheelhouse: Path = WHEELHOUSE) -> Path:
    """The code-interpreter's packages in `wheelhouse` (pip download from the index), once per
    change of the requirements or of the pinned versions (a stamp names both)."""
    constraints = pinned_to_this_environment()
    requirements = (CODE_INTERPRETER / "requirements.txt").read_text(encoding="utf-8")
    wanted = hashlib.sha256(f"{requirements}\0{constraints}\0{python_version()}".encode()).hexdigest()
    stamp = wheelhouse / ".complete"
    if stamp.is_file() and stamp.read_text(encoding="utf-8") == wanted:
        return wheelhouse
    wheelhouse.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as pins:
        pins.write(constraints)
        pins.flush()
        pip = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check"]
        pip += [
            "--only-binary",
            ":all:",
            "-d",
            str(wheelhouse),
            "-r",
            str(CODE_INTERPRETER / "requirements.txt"),
        ]
        subprocess.run([*pip, "-c", pins.name], check=True)
    stamp.write_text(wanted, encoding="utf-8")
    return wheelhouse


def _build_code_interpreter(client: docker.DockerClient, digest: str, cache_dir: Path) -> None:
    wheelhouse = download_code_interpreter_wheels()
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="code-interpreter-context-", dir=cache_dir) as temp:
        context = Path(temp) / "context"
        shutil.copytree(CODE_INTERPRETER, context)
        constraints = Path(temp) / "constraints.txt"
        constraints.write_text(pinned_to_this_environment(), encoding="utf-8")
        site = context / "site"
        pip = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-compile",
        ]
        pip += ["--no-index", "--find-links", str(wheelhouse), "--target", str(site)]
        pip += ["-r", str(CODE_INTERPRETER / "requirements.txt"), "-c", str(constraints)]
        subprocess.run(pip, check=True)
        # console scripts name this environment's Python: only Deno's binary is kept, in /usr/local/bin
        (context / "bin").mkdir()
        (site / "bin" / "deno").rename(context / "bin" / "deno")
        shutil.rmtree(site / "bin")
        add_toolchains(context, cache_dir)
        args = {"FROM_IMAGE": f"sandgate/python:{digest}", "PY_VERSION": python_version()}
        args |= {"JAVA_HOME": IMAGE_JAVA_HOME, "GOROOT": IMAGE_GOROOT}
        ref = f"{CODE_INTERPRETER_IMAGE}:{code_interpreter_tag(digest)}"
        try:
            client.images.build(path=str(context), tag=ref, buildargs=args, network_mode="none", rm=True)
        except docker.errors.BuildError as exc:
            log = "".join(str(chunk.get("stream", chunk.get("error", ""))) for chunk in exc.build_log)
            raise RuntimeError(f"docker build of {ref} from {CODE_INTERPRETER} failed:\n{log}") from exc


# ---------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--docker-host", help="daemon to build in (default: DOCKER_HOST or the system socket)"
    )
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="where built images are saved")
    parser.add_argument(
        "--wheels-only",
        action="store_true",
        help=f"only download the code-interpreter image's packages into {WHEELHOUSE} (bootstrap runs this)",
    )
    args = parser.parse_args(argv)
    if args.wheels_only:
        print(download_code_interpreter_wheels())
        return 0
    try:
        client = docker.DockerClient(base_url=args.docker_host) if args.docker_host else docker.from_env()
        client.ping()
    except docker.errors.DockerException:
        if args.docker_host:
            raise
        return _build_in_private_daemon(args.cache)
    digest = build_images(client, args.cache)
    archive = build_code_interpreter(client, digest, args.cache)
    tags = [f"{CODE_INTERPRETER_IMAGE}:{tag}" for tag in CODE_INTERPRETER_TAGS]
    images = [*image_names(digest), *(f"{n}:latest" for n in RECIPES), *tags]
    print(json.dumps({"digest": digest, "images": images, "code_interpreter_archive": str(archive)}))
    print(f"local runtime: sandgate image import {archive} {tags[0]}", file=sys.stderr)
    return 0


def _build_in_private_daemon(cache: Path) -> int:
    sys.path.insert(0, str(REPO))
    from tests.support.dockerd import private_dockerd

    with private_dockerd() as daemon:
        digest = build_images(daemon.client, cache)
        code_interpreter = build_code_interpreter(daemon.client, digest, cache)
    saved = CachedImages(cache, digest).archive
    print(f"no Docker daemon reachable: built in a private one and saved {saved}; `docker load -i` it")
    tag = f"{CODE_INTERPRETER_IMAGE}:{CODE_INTERPRETER_TAGS[0]}"
    print(f"{code_interpreter}: `docker load -i` it, or `sandgate image import {code_interpreter} {tag}`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
