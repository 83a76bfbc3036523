"""Path resolution that can never leave the root: every file route goes through `PathResolver`.

Rules:
1. A request path names a place in the sandbox's view of the filesystem. With `--root DIR`, `/`
   is DIR: absolute request paths and absolute symlink targets are re-rooted at DIR, and a `..`
   that would climb above DIR is refused (`PATH_ESCAPES_ROOT`, 400). Without a root, paths are the
   machine's own and relative paths start at execd's working directory.
2. Resolution walks one component at a time from a directory fd we hold (openat style), reading
   symlinks ourselves, so no kernel path lookup ever sees a `..` or a symlink we did not vet. A
   component swapped for a symlink after we looked at it makes the next `*at` call fail
   (`O_NOFOLLOW`), never escape.
3. The result is a parent directory fd plus a final name: callers act with `dir_fd=` and never
   follow a symlink in the final component unless they asked for it (`follow_last`).
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import stat
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from .errors import FILE_NOT_FOUND, INVALID_PATH, PATH_ESCAPE, ApiError, bad_request, not_found

MAX_SYMLINK_HOPS = 40
_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass
class Resolved:
    """A parent directory fd (owned: close with `close()` or `with`) and the final name in it."""

    dir_fd: int
    name: str
    path: str  # the path as the client sees it, for responses and messages
    _closed: bool = field(default=False, repr=False)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            os.close(self.dir_fd)

    def __enter__(self) -> Resolved:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def lstat(self) -> os.stat_result:
        try:
            return os.stat(self.name, dir_fd=self.dir_fd, follow_symlinks=False)
        except OSError as exc:
            raise os_error(exc, self.path) from exc

    def exists(self) -> bool:
        try:
            os.stat(self.name, dir_fd=self.dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return True


class PathResolver:
    """Resolves request paths under a root (see the module rules)."""

    def __init__(self, root: str | None) -> None:
        self.confined = root is not None
        self.root = os.path.realpath(root) if root is not None else "/"
        if not os.path.isdir(self.root):
            raise ValueError(f"--root {root!r} is not a directory")
        # held with execd's own credentials: a request served as another identity starts at
        # the root as a chrooted process would, never needing search rights above it
        self.root_fd = os.open(self.root, _DIR_FLAGS)

    def resolve(
        self,
        user_path: str | None,
        *,
        follow_last: bool = True,
        make_parents: bool = False,
        created: list[str] | None = None,
    ) -> Resolved:
        """Resolve `user_path`; `make_parents` creates missing parent directories (mode 755),
        appending each one it made to `created` so a failed request can remove them again."""
        pending = deque(self._components(user_path))
        stack = [os.dup(self.root_fd)]
        names: list[str] = []
        hops = 0
        try:
            final: str | None = None
            while pending:
                part = pending.popleft()
                if part in ("", "."):
                    continue
                if part == "..":
                    self._climb(stack, names, user_path)
                    continue
                last = not any(p not in ("", ".") for p in pending)
                if last and not follow_last:
                    final = part
                    break
                st = self._lstat_or_none(stack[-1], part, names, user_path)
                if st is None:
                    if last:
                        final = part
                        break
                    if not make_parents:
                        raise not_found(
                            f"directory {_join(names, part)} does not exist (while resolving {user_path!r}); "
                            "create it first (POST /directories)",
                            FILE_NOT_FOUND,
                        )
                    _mkdir(stack[-1], part, _join(names, part))
                    if created is not None:
                        created.append(_join(names, part))
                    st = os.stat(part, dir_fd=stack[-1], follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode):
                    hops += 1
                    if hops > MAX_SYMLINK_HOPS:
                        raise bad_request(f"too many symlinks while resolving {user_path!r}", INVALID_PATH)
                    target = os.readlink(part, dir_fd=stack[-1])
                    if target.startswith("/"):
                        while len(stack) > 1:
                            os.close(stack.pop())
                        names.clear()
                    pending.extendleft(reversed(target.split("/")))
                    continue
                if last:
                    final = part
                    break
                if not stat.S_ISDIR(st.st_mode):
                    raise bad_request(
                        f"{_join(names, part)} is not a directory (while resolving {user_path!r})",
                        INVALID_PATH,
                    )
                stack.append(self._open_dir(stack[-1], part, _join(names, part)))
                names.append(part)
            if final is None:  # the path names a directory we already hold
                if len(stack) == 1:
                    return Resolved(os.dup(stack[0]), ".", "/" if self.confined else self.root)
                os.close(stack.pop())
                final = names.pop()
            return Resolved(os.dup(stack[-1]), final, _join(names, final))
        finally:
            for fd in stack:
                os.close(fd)

    def _components(self, user_path: str | None) -> list[str]:
        if user_path is None or not user_path.strip():
            raise bad_request(
                "missing 'path': give the file's path, e.g. path=/workspace/a.txt", INVALID_PATH
            )
        if "\0" in user_path:
            raise bad_request(f"path {user_path!r} contains a NUL byte", INVALID_PATH)
        if user_path.startswith("/") or self.confined:
            return user_path.split("/")
        return os.getcwd().split("/") + user_path.split("/")

    def _climb(self, stack: list[int], names: list[str], user_path: str | None) -> None:
        if len(stack) > 1:
            os.close(stack.pop())
            names.pop()
        elif self.confined:
            raise ApiError(
                400, PATH_ESCAPE, f"path {user_path!r} climbs above the sandbox root ('..' at '/')"
            )

    @staticmethod
    def _lstat_or_none(
        dir_fd: int, name: str, names: list[str], user_path: str | None
    ) -> os.stat_result | None:
        try:
            return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise os_error(exc, _join(names, name)) from exc

    @staticmethod
    def _open_dir(dir_fd: int, name: str, shown: str) -> int:
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
        except OSError as exc:  # swapped for a symlink or a file since we looked: refuse
            raise os_error(exc, shown) from exc


def _mkdir(dir_fd: int, name: str, shown: str) -> None:
    try:
        os.mkdir(name, 0o755, dir_fd=dir_fd)
    except FileExistsError:
        pass
    except OSError as exc:
        raise os_error(exc, shown) from exc


def _join(names: list[str], last: str) -> str:
    return "/" + "/".join([*names, last]) if last != "." else "/" + "/".join(names)


_ERRNO_ANSWERS: dict[int, tuple[int, str, str]] = {
    errno.ENOENT: (404, FILE_NOT_FOUND, "does not exist"),
    errno.ENOTDIR: (400, INVALID_PATH, "has a component that is not a directory"),
    errno.EISDIR: (400, INVALID_PATH, "is a directory; use the /directories routes"),
    errno.ELOOP: (400, INVALID_PATH, "is (or became) a symlink where none may be followed"),
    errno.EEXIST: (409, "ALREADY_EXISTS", "already exists"),
    errno.ENOTEMPTY: (409, "DIRECTORY_NOT_EMPTY", "is a directory that is not empty"),
    errno.EACCES: (403, "PERMISSION_DENIED", "is not accessible to execd (permission denied)"),
    errno.EPERM: (403, "PERMISSION_DENIED", "cannot be changed by execd (operation not permitted)"),
    errno.EROFS: (403, "READ_ONLY", "is on a read-only filesystem"),
    errno.EXDEV: (400, INVALID_PATH, "is on another filesystem; cannot move across filesystems"),
    errno.ENOSPC: (507, "NO_SPACE", "cannot be written: no space left on device"),
    errno.ENAMETOOLONG: (400, INVALID_PATH, "is too long"),
}


def os_error(exc: OSError, shown: str) -> ApiError:
    """Turn an OSError on `shown` into the answer a client can act on."""
    status, code, what = _ERRNO_ANSWERS.get(exc.errno or 0, (500, "RUNTIME_ERROR", f"failed: {exc.strerror}"))
    return ApiError(status, code, f"{shown} {what}")


def parse_mode(mode: Any, where: str) -> int | None:
    """OpenSandbox modes are octal digits written as a decimal integer (755 means 0o755)."""
    if mode is None:
        return None
    text = str(mode)
    if isinstance(mode, bool) or not text.isdigit() or len(text) > 4 or any(c in "89" for c in text):
        raise bad_request(
            f"bad mode {mode!r} for {where}: write octal permission digits as a number, e.g. 644 or 755"
        )
    return int(text, 8)


def lookup_owner(owner: str | None, group: str | None, where: str) -> tuple[int, int]:
    """User and group names (or numeric ids) to ids; -1 leaves that id unchanged."""
    uid = gid = -1
    try:
        if owner:
            uid = int(owner) if owner.isdigit() else pwd.getpwnam(owner).pw_uid
        if group:
            gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
    except KeyError:
        raise bad_request(f"unknown owner {owner!r} or group {group!r} for {where}") from None
    return uid, gid


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def entry_type(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


def file_info(st: os.stat_result, path: str) -> dict[str, Any]:
    """The OpenSandbox `FileInfo` of one entry (mode as octal digits in a decimal int)."""
    return {
        "path": path,
        "type": entry_type(st.st_mode),
        "size": st.st_size,
        "modified_at": rfc3339(st.st_mtime),
        "created_at": rfc3339(st.st_ctime),
        "owner": _user_name(st.st_uid),
        "group": _group_name(st.st_gid),
        "mode": int(oct(stat.S_IMODE(st.st_mode))[2:]),
    }


def set_mode_and_owner(dir_fd: int, name: str, shown: str, mode: int | None, uid: int, gid: int) -> None:
    """chmod/chown `name` itself, never a symlink's target (the inode is pinned by an O_PATH fd)."""
    try:
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        raise os_error(exc, shown) from exc
    try:
        if stat.S_ISLNK(os.fstat(fd).st_mode):
            raise bad_request(f"{shown} is a symlink; set permissions on its target instead", INVALID_PATH)
        if mode is not None:
            os.chmod(f"/proc/self/fd/{fd}", mode)
        if uid != -1 or gid != -1:
            os.chown(name, uid, gid, dir_fd=dir_fd, follow_symlinks=False)
    except OSError as exc:
        raise os_error(exc, shown) from exc
    finally:
        os.close(fd)
