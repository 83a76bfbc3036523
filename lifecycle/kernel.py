"""Kernel names and the few syscalls Python's standard library lacks (mount, umount2, openat2).

Rules: each wrapper raises OSError with the path in the message; nothing here decides policy.
Global kernel names (netns, cgroups) carry this server's instance tag (`instance_tag`).
Calling libc directly instead of `mount`/`umount` saves a process per call, which matters for
sandbox create-to-ready time.
"""

from __future__ import annotations

import ctypes
import errno
import os
import secrets
import threading
from collections.abc import Callable
from pathlib import Path

MS_BIND = 4096
MS_REC = 16384
MS_SHARED = 1 << 20
MNT_DETACH = 2

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str, path: Path | str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what} {path}: {os.strerror(code)}")


def mount(
    source: str, target: Path | str, fstype: str | None, flags: int = 0, data: str | None = None
) -> None:
    result = _libc.mount(
        source.encode(),
        str(target).encode(),
        fstype.encode() if fstype else None,
        ctypes.c_ulong(flags),
        data.encode() if data else None,
    )
    _check(result, f"mount {fstype or 'bind'}", target)


def umount(target: Path | str, *, lazy: bool = False) -> bool:
    """Unmount target; False (no error) when nothing is mounted there or it does not exist."""
    result = _libc.umount2(str(target).encode(), MNT_DETACH if lazy else 0)
    if result != 0 and ctypes.get_errno() in (errno.EINVAL, errno.ENOENT):
        return False
    _check(result, "umount", target)
    return True


def mount_points() -> set[str]:
    """Mount points of this process's mount namespace."""
    with open("/proc/self/mountinfo", encoding="utf-8") as info:
        return {_unescape(line.split()[4]) for line in info}


def _unescape(field: str) -> str:
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def instance_tag(state_dir: Path) -> str:
    """This server's tag for global kernel names, kept in the state dir so restarts reuse it."""
    path = state_dir / "instance-tag"
    if path.exists():
        return path.read_text(encoding="ascii").strip()
    state_dir.mkdir(parents=True, exist_ok=True)
    tag = secrets.token_hex(3)
    path.write_text(tag + "\n", encoding="ascii")
    return tag


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_SYS_OPENAT2 = 437
_RESOLVE_IN_ROOT = 0x10


def open_in_root(root_fd: int, path: str, flags: int, mode: int = 0o644) -> int:
    """openat2(RESOLVE_IN_ROOT): symlinks, even absolute ones, resolve inside root_fd's tree.

    This is how files are written into an image's root filesystem from the host without a
    symlink in the image leading the write onto the host.
    """
    how = _OpenHow(
        flags=flags | os.O_CLOEXEC, mode=mode if flags & os.O_CREAT else 0, resolve=_RESOLVE_IN_ROOT
    )
    fd = _libc.syscall(_SYS_OPENAT2, root_fd, path.encode(), ctypes.byref(how), ctypes.sizeof(how))
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"open {path} inside the sandbox root: {os.strerror(code)}")
    return int(fd)


def in_fresh_thread(work: Callable[[], None]) -> None:
    """Run `work` in a new thread (which may change its netns) and re-raise what it raised."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run, name="sandgate-netns", daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
