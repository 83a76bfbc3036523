"""List the files of the sandgate image (server and node agent) from this host: run it with the
Python that has sandgate installed; it prints a JSON object /path/in/image -> /host/file for
`oci_image.py --files-from` (scripts/cluster/sandgate-image.sh writes and imports the image).

Rules:
1. Nothing is pulled: the image is this Python relocated to /usr/local (the interpreter, its
   standard library without tests, IDLE and Tk), sandgate itself (its component folders as the
   `sandgate.*` packages, the way a non-editable install lays them out) and the distributions
   sandgate requires, found through their installed metadata (RECORD), nothing else of the venv
   (no test or lint tools). `nft` comes too: the node agent installs its walls with it.
2. Every dynamic library those programs and extension modules load goes to /lib/x86_64-linux-gnu
   (the loader's built-in directory on Debian's glibc, so no ld.so.cache is needed) under its
   soname, the loader at the path the programs name (PT_INTERP); no file keeps a host path.
3. Deterministic for the same inputs: bytecode caches are left out (Python writes them in the
   container's own layer).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import sysconfig
from importlib.metadata import Distribution, PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement

PREFIX = "/usr/local"
LIBRARIES = "/lib/x86_64-linux-gnu"
SKIPPED_STDLIB = ("test", "idlelib", "tkinter", "turtledemo", "ensurepip", "site-packages", "config-")
ROOT = Path(__file__).resolve().parents[2]
EDITABLE_METADATA = ("RECORD", "direct_url.json")  # they name the checkout an editable install points at
COMPONENTS = ("policy", "vault", "proxy", "lifecycle", "execd")  # pyproject.toml package-dir


def wanted(path: Path) -> bool:
    return path.is_file() and "__pycache__" not in path.parts and not path.name.endswith(".pyc")


def stdlib_files() -> dict[str, str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = {f"{PREFIX}/bin/python3": str(Path(sys.executable).resolve())}
    for path in filter(wanted, stdlib.rglob("*")):
        relative = path.relative_to(stdlib)
        if not relative.parts[0].startswith(SKIPPED_STDLIB):
            files[f"{PREFIX}/lib/{stdlib.name}/{relative}"] = str(path)
    return files


def requirement_closure(root: str) -> list[Distribution]:
    """The installed distributions `root` requires, transitively (no extras)."""
    seen: dict[str, Distribution] = {}
    pending = [root]
    while pending:
        name = pending.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        try:
            found = distribution(name)
        except PackageNotFoundError:
            continue  # a requirement whose marker excluded it on this Python
        seen[key] = found
        for line in found.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                pending.append(requirement.name)
    return [found for key, found in seen.items() if key != "sandgate"]  # sandgate: package_files


def package_files(site: str) -> dict[str, str]:
    files: dict[str, str] = {}
    for component in COMPONENTS:
        source = ROOT / component
        for path in filter(wanted, source.rglob("*")):
            files[f"{site}/sandgate/{component}/{path.relative_to(source)}"] = str(path)
    for found in requirement_closure("sandgate"):
        for record in found.files or []:
            path = Path(str(found.locate_file(record))).resolve()
            if wanted(path) and ".." not in record.parts:
                files[f"{site}/{record}"] = str(path)
    own = distribution("sandgate")  # its metadata (the version the CLI reports), not the editable hook
    for record in own.files or []:
        path = Path(str(own.locate_file(record))).resolve()
        if ".dist-info" in record.parts[0] and record.name not in EDITABLE_METADATA and wanted(path):
            files[f"{site}/{record}"] = str(path)
    return files


def library_files(programs: list[str]) -> dict[str, str]:
    """The loader and every library the programs load (rule 2)."""
    files: dict[str, str] = {}
    for program in programs:
        listing = subprocess.run(["ldd", program], capture_output=True, text=True, timeout=30).stdout
        for name, path in re.findall(r"^\s*(\S+) => (/\S+)", listing, re.M):
            files[f"{LIBRARIES}/{name}"] = str(Path(path).resolve())
        for loader in re.findall(r"^\s*(/\S*ld-linux\S*)", listing, re.M):
            files[loader] = str(Path(loader).resolve())
    return files


def main() -> None:
    site = f"{PREFIX}/lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
    files = stdlib_files() | package_files(site)
    nft = shutil.which("nft") or "/usr/sbin/nft"
    files["/usr/sbin/nft"] = nft
    programs = [sys.executable, nft, *(source for source in files.values() if source.endswith(".so"))]
    files |= library_files(programs)
    json.dump(files, sys.stdout, indent=0, sort_keys=True)


if __name__ == "__main__":
    main()
