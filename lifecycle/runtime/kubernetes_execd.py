"""execd in any image on Kubernetes: the execd image, the Pod's launcher and the token hand-over.

Rules:
1. The execd image holds one self-contained Python (this server's, ≥ 3.12) relocated under
   /sandgate: the host's dynamic loader (`ld.so`), the libraries it and the standard library's
   extension modules load (`lib/`), the interpreter and its standard library (`python/`, without
   tests, IDLE, Tk, the build files and the optimised bytecode `-O` would read), and `site/` with
   execd and the two packages it imports (h11, python_multipart), plus a static busybox to copy
   it; the libraries and the interpreter without their symbols (`strip`), so a Pod copies about
   40 MB. It is built from local files (`python -m sandgate.lifecycle.runtime.kubernetes_execd
   --strip-into DIR` lists them, scripts/cluster/execd-image.sh writes and imports the image);
   nothing is pulled.
2. In a Pod, an init container copies /sandgate into an emptyDir that the sandbox container
   mounts read-only at /.sandgate (`EXECD_MOUNT`): the user's image is never changed, and the
   sandbox's programs cannot change the execd that serves them.
3. The sandbox container runs `LAUNCHER` with that Python: it listens on execd's port and takes
   exactly one connection, the hand-over: one JSON line with execd's token and the CA certificate
   of the proxy that confines the Pod (its node's), answered `ok`. Then it stops listening,
   trusts the CA in the image's bundle, starts the entrypoint and becomes execd with the token in
   its memory only. The token is therefore never in the Pod spec, an env var or any object the
   API server stores.
4. The server hands over right after the Pod runs (`hand_over`); the first connection wins, so
   a create whose hand-over is not answered `ok` (someone else's came first) fails and the Pod
   is deleted: execd then never serves anybody but the server that created it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
from importlib.util import find_spec
from pathlib import Path

from sandgate.lifecycle.runtime.base import EXECD_PORT, RuntimeError_
from sandgate.lifecycle.runtime.docker_images import TRUST_PROXY_CA

EXECD_ROOT = "/sandgate"  # in the execd image
EXECD_MOUNT = "/.sandgate"  # in the Pod (the emptyDir the init container fills)
CA_DIR = "/run/sandgate"  # a small writable emptyDir: the proxy CA and the image's bundle with it
EXECD_PACKAGES = ("h11", "python_multipart")  # what execd imports beyond the standard library
SKIPPED_STDLIB = (
    "test",
    "idlelib",
    "tkinter",
    "turtledemo",
    "ensurepip",
    "site-packages",
    "pydoc_data",
    "config-",
)
# extension modules execd never loads (tests, Tk and curses, which would bring X11 and ncurses)
SKIPPED_EXTENSIONS = ("_test", "xxlimited", "_xxtestfuzz", "_tkinter", "_curses", "readline")
HANDOVER_TIMEOUT = 30.0

# argv: N, the entrypoint's N words, execd's package parent dir, its site dir, execd's args.
LAUNCHER = (
    "import os,sys,socket,json,ctypes;ctypes.CDLL(None).prctl(4,0,0,0,0)\n"
    "l=socket.create_server(('',int(os.environ['SANDGATE_EXECD_PORT'])));k,_=l.accept();l.close();b=b''\n"
    "while not b.endswith(b'\\n') and len(b)<65536:\n"
    " r=k.recv(65536)\n"
    " if not r:break\n"
    " b+=r\n"
    "h=json.loads(b);t=h['token'];k.sendall(b'ok\\n');k.close()\n"
    f"c='{CA_DIR}/proxy-ca.crt'\n"
    "if h.get('ca'):open(c,'w').write(h['ca'])\n"
    f"{TRUST_PROXY_CA}"
    "n=int(sys.argv[1]);e=sys.argv[2:2+n];p,s,*x=sys.argv[2+n:]\n"
    "if e:x+=[f'--entrypoint-pid={os.posix_spawnp(e[0],e,os.environ)}','--entrypoint='+e[0]]\n"
    "sys.path[:0]=[s];m=type(sys)('sandgate');m.__path__=[p];sys.modules['sandgate']=m\n"
    "from sandgate.execd.__main__ import main\n"
    "main(x+['--token='+t])\n"
)


def copy_command() -> list[str]:
    """The init container's command: the execd tree into the shared emptyDir."""
    return [f"{EXECD_ROOT}/bin/busybox", "cp", "-a", f"{EXECD_ROOT}/.", f"{EXECD_MOUNT}/"]


def launch_command(entrypoint: list[str]) -> list[str]:
    """The sandbox container's command: the launcher in the copied Python (rule 3)."""
    root = EXECD_MOUNT
    interpreter = [f"{root}/ld.so", "--library-path", f"{root}/lib", f"{root}/python/bin/python3"]
    return [
        *interpreter, "-I", "-S", "-c", LAUNCHER, str(len(entrypoint)), *entrypoint,
        f"{root}/site/sandgate", f"{root}/site", "--host", "0.0.0.0", "--port", str(EXECD_PORT),
    ]  # fmt: skip


def hand_over(address: str, token: str, ca_pem: str, timeout: float = HANDOVER_TIMEOUT) -> None:
    """Give the Pod's launcher execd's token and the proxy CA (rule 4); RuntimeError_ unless
    this hand-over was the one it took."""
    line = json.dumps({"token": token, "ca": ca_pem}).encode() + b"\n"
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((address, EXECD_PORT), timeout=5) as connection:
                connection.sendall(line)
                answer = connection.recv(16)
            break
        except ConnectionRefusedError:  # the launcher is not listening yet
            if time.monotonic() > deadline:
                raise RuntimeError_(
                    f"execd's launcher at {address}:{EXECD_PORT} did not listen within {timeout:.0f} s"
                ) from None
            time.sleep(0.02)
        except OSError as exc:
            raise RuntimeError_(f"handing execd its token at {address}:{EXECD_PORT} failed: {exc}") from None
    if answer != b"ok\n":
        raise RuntimeError_(
            f"execd's launcher at {address}:{EXECD_PORT} did not take the hand-over (another connection "
            "came first); the sandbox is removed"
        )


# -- the image's files (rule 1) ---------------------------------------------------------------


def image_files(python: str = sys.executable) -> dict[str, str]:
    """Path in the execd image -> path on this host, for everything rule 1 lists."""
    if Path(python).resolve() != Path(sys.executable).resolve():
        raise RuntimeError_(f"run this module with the Python to ship ({python})")
    executable = os.path.realpath(sys.executable)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = {f"{EXECD_ROOT}/python/bin/python3": executable}
    for path in _walk(stdlib):
        relative = path.relative_to(stdlib)
        skipped = relative.parts[0].startswith(SKIPPED_STDLIB) or relative.name.startswith(SKIPPED_EXTENSIONS)
        if not skipped and ".opt-" not in relative.name:  # foo.cpython-313.opt-1.pyc: for -O only
            files[f"{EXECD_ROOT}/python/lib/{stdlib.name}/{relative}"] = str(path)
    loader, libraries = _loader_and_libraries([executable, *_extension_modules(stdlib)])
    files[f"{EXECD_ROOT}/ld.so"] = loader
    files |= {f"{EXECD_ROOT}/lib/{name}": path for name, path in libraries.items()}
    busybox = shutil.which("busybox") or "/bin/busybox"
    files[f"{EXECD_ROOT}/bin/busybox"] = busybox
    for package in ("sandgate.execd", *EXECD_PACKAGES):
        spec = find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise RuntimeError_(f"{python} cannot import {package}")
        source = Path(next(iter(spec.submodule_search_locations)))
        for path in _walk(source):
            target = "/".join(package.split(".")) + "/" + str(path.relative_to(source))
            files[f"{EXECD_ROOT}/site/{target}"] = str(path)
    return files


def _walk(root: Path) -> list[Path]:
    return [path for path in sorted(root.rglob("*")) if path.is_file() and not path.is_symlink()]


def _extension_modules(stdlib: Path) -> list[str]:
    extensions = (stdlib / "lib-dynload").glob("*.so")
    return [str(path) for path in extensions if not path.name.startswith(SKIPPED_EXTENSIONS)]


def _loader_and_libraries(programs: list[str]) -> tuple[str, dict[str, str]]:
    """The dynamic loader and every library (soname -> host path) the programs load."""
    loader = ""
    libraries: dict[str, str] = {}
    for program in programs:
        listing = subprocess.run(["ldd", program], capture_output=True, text=True, timeout=30).stdout
        for name, path in re.findall(r"^\s*(\S+) => (/\S+)", listing, re.M):
            libraries[name] = os.path.realpath(path)
        found = re.search(r"^\s*(/\S*ld-linux\S*)", listing, re.M)
        loader = os.path.realpath(found.group(1)) if found else loader
    if not loader:
        raise RuntimeError_(f"cannot find the dynamic loader of {programs[0]} (is it a dynamic ELF?)")
    return loader, libraries


def stripped(files: dict[str, str], into: Path) -> dict[str, str]:
    """`files` with each ELF library and the interpreter replaced by a copy under `into` without
    its symbols (the loader and busybox stay as they are)."""
    into.mkdir(parents=True, exist_ok=True)
    result = dict(files)
    for target, source in files.items():
        if target.endswith(("/ld.so", "/busybox")) or Path(source).read_bytes()[:4] != b"\x7fELF":
            continue
        copy = into / target.lstrip("/").replace("/", "_")
        subprocess.run(["strip", "--strip-unneeded", "-o", str(copy), source], check=True, timeout=120)
        result[target] = str(copy)
    return result


if __name__ == "__main__":
    listed = image_files()
    if sys.argv[1:2] == ["--strip-into"]:
        listed = stripped(listed, Path(sys.argv[2]))
    json.dump(listed, sys.stdout, indent=0, sort_keys=True)
