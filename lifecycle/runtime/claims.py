"""Named volumes (`pvc` in the OpenSandbox spec): storage that outlives a sandbox, by claim name.

Rules:
1. A claim name is a DNS-1123 label (as Kubernetes names a PVC), never a path; the API checks it
   (`check_claim`) before anything is created, and so does every backend again.
2. A sandbox sees only the claims its create named. Sandboxes that name the same claim share it:
   that is a channel between them, chosen by the user (docs/security.md).
3. `subPath` is relative, without `..`; it is walked one component at a time without following
   symlinks (`open_subdir`), created when missing, so a link planted in the volume never leads out.
   The local runtime hands bwrap the open directory (`--bind-fd`), so a sandbox sharing the claim
   cannot swap a component for a link between the walk and the mount; Docker and gVisor mount
   a path, which leaves that race open (docs/security.md C7).
4. `deleteOnSandboxTermination` removes a claim only if this create made it (the spec: pre-existing
   volumes are never removed), and only once no live sandbox uses it.
5. The local runtime keeps a claim as `<state_dir>/volumes/<name>` and its bookkeeping (who made
   it for whom, who uses it) in `<state_dir>/volume-claims/<name>.json`. The Kubernetes runtime
   will map the same `ClaimMount` onto a PersistentVolumeClaim.
6. With `ClaimDisks` (runtime/claim_disks.py) a claim's directory is an ext4 filesystem of the
   claim's size, mounted while a sandbox uses it. Local and Docker claims are directories on this
   host, so any number of sandboxes may use one read-write at once (no access mode refuses it).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import threading
from pathlib import Path, PurePosixPath

from sandgate.lifecycle.errors import LifecycleError
from sandgate.lifecycle.runtime.base import BindMount, ClaimMount
from sandgate.lifecycle.runtime.claim_disks import ClaimDisks

CLAIM_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def check_claim(name: object, sub_path: object) -> None:
    """LifecycleError("invalid") unless `name` is a DNS-1123 label and `sub_path` stays inside."""
    if not (isinstance(name, str) and CLAIM_NAME.match(name)):
        raise LifecycleError("invalid", f"claimName {name!r} must be a DNS-1123 label: lower-case "
                             "letters, digits and '-', 1-63 long, alphanumeric at both ends")  # fmt: skip
    parts = PurePosixPath(sub_path).parts if isinstance(sub_path, str) else ("..",)
    if not isinstance(sub_path, str) or sub_path.startswith("/") or ".." in parts or "\0" in sub_path:
        raise LifecycleError("invalid", f"subPath {sub_path!r} must be a relative path without '..'")


def open_subdir(root: Path, sub_path: str) -> int:
    """An open fd of `root/sub_path`, made if missing, walked without following any symlink
    (rule 3); the caller closes it."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for part in PurePosixPath(sub_path).parts:
            if part in ("", "."):
                continue
            made = False
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o777, dir_fd=fd)
                made = True
            try:
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError:
                raise LifecycleError("invalid", f"subPath {sub_path!r}: {part!r} is not a directory "
                                     "(symlinks are not followed)") from None  # fmt: skip
            if made:
                os.fchmod(child, 0o777)  # any user inside the sandbox may write (the umask took some)
            os.close(fd)
            fd = child
        if not fd_path(fd).is_relative_to(root):
            raise LifecycleError("invalid", f"subPath {sub_path!r} leads out of its volume")
    except BaseException:
        os.close(fd)
        raise
    return fd


def fd_path(fd: int) -> Path:
    return Path(os.readlink(f"/proc/self/fd/{fd}"))


def subdir_path(root: Path, sub_path: str) -> Path:
    """`root/sub_path` as `open_subdir` finds it (a path: whoever mounts it resolves it again)."""
    fd = open_subdir(root, sub_path)
    try:
        return fd_path(fd)
    finally:
        os.close(fd)


def close_held(binds: list[BindMount]) -> None:
    """Close the directories `binds` hold (once the sandbox's launcher has its copies)."""
    for bind in binds:
        if bind.fd is not None:
            os.close(bind.fd)


class DirectoryClaims:
    """Claims as directories under `<state_dir>/volumes` (the local runtime's `pvc` backend)."""

    def __init__(self, state_dir: Path, disks: ClaimDisks | None = None) -> None:
        self.root = state_dir / "volumes"
        self.books = state_dir / "volume-claims"
        self.disks = disks  # the claims' size caps (rule 6); None: uncapped directories
        self._lock = threading.Lock()

    def attach(self, sandbox_id: str, claims: tuple[ClaimMount, ...]) -> list[BindMount]:
        """The binds for `claims`, making the ones allowed to be made; nothing is made unless
        every claim can be served."""
        for claim in claims:
            check_claim(claim.name, claim.sub_path)
        with self._lock:
            missing = [c.name for c in claims if not c.create and not (self.root / c.name).is_dir()]
            if missing:
                raise LifecycleError("not_found", f"volume claim(s) {', '.join(missing)} do not exist "
                                     "and createIfNotExists is false")  # fmt: skip
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.books.mkdir(parents=True, exist_ok=True, mode=0o700)
            binds: list[BindMount] = []
            try:
                for claim in claims:
                    binds.append(self._attach_one(sandbox_id, claim))
            except BaseException:
                close_held(binds)
                raise
            return binds

    def _attach_one(self, sandbox_id: str, claim: ClaimMount) -> BindMount:
        """One claim's bind, holding the directory open (bwrap binds the fd, rule 3)."""
        book = self._book(claim.name)
        where = self.root / claim.name
        if not where.is_dir():
            where.mkdir(mode=0o777)
            where.chmod(0o777)  # any user inside the sandbox may write
            book = {"delete_with": sandbox_id if claim.delete_on_end else None, "users": []}
            if self.disks is not None:
                try:
                    self.disks.make(claim.name, claim.size_bytes, where)
                except BaseException:
                    self.disks.remove(claim.name, where)
                    where.rmdir()
                    raise
        elif self.disks is not None:
            self.disks.mount(claim.name, where)
        book["users"] = sorted({*book["users"], sandbox_id})
        self._write(claim.name, book)
        fd = open_subdir(self.root / claim.name, claim.sub_path)
        return BindMount(str(fd_path(fd)), claim.target, read_only=claim.read_only, fd=fd)

    def release(self, sandbox_id: str, live: set[str]) -> list[str]:
        """Forget `sandbox_id` as a user; remove claims made to die with a sandbox that is gone,
        once no sandbox in `live` uses them. Returns the removed names."""
        removed = []
        with self._lock:
            for path in sorted(self.books.glob("*.json")) if self.books.is_dir() else ():
                name, book = path.stem, self._book(path.stem)
                users = [u for u in book["users"] if u != sandbox_id and u in live]
                if users != book["users"]:
                    self._write(name, {**book, "users": users})
                owner = book["delete_with"]
                if not users and self.disks is not None:
                    self.disks.unmount(name, self.root / name)
                if owner is not None and owner not in live and not users:
                    if self.disks is not None:
                        self.disks.remove(name, self.root / name)
                    shutil.rmtree(self.root / name, ignore_errors=True)
                    path.unlink()
                    removed.append(name)
        return removed

    def _book(self, name: str) -> dict:
        path = self.books / f"{name}.json"
        return json.loads(path.read_text()) if path.exists() else {"delete_with": None, "users": []}

    def _write(self, name: str, book: dict) -> None:
        path = self.books / f"{name}.json"
        path.with_suffix(".tmp").write_text(json.dumps(book))
        path.with_suffix(".tmp").replace(path)
