"""`/v1/filesystem/{uid}/{gid}/...`: the file routes as another Linux identity (the SDK's
`files_with_identity(uid, gid)`).

Rules:
1. The identity route runs the very same handler as the plain route; only the credentials of
   the file system calls differ. They are the thread's filesystem uid/gid and supplementary
   groups (`setfsuid`, `setfsgid` and the raw `setgroups` syscall, all per thread on Linux), so
   the kernel checks every open, create, rename and chmod as that user, new files belong to
   it, and a switch away from uid 0 drops the file capabilities (CAP_DAC_OVERRIDE, CAP_CHOWN...)
   for those calls: what the user may not do is a 403, as it would be for the user's own shell.
2. That work runs on a dedicated thread pool, never on the event loop or the shared pool. Each
   call sets the whole identity first and restores execd's own after, and a thread whose
   restore cannot be verified is never reused for another call.
3. A `uid`/`gid` that is not a decimal integer in 0..4294967294 is a 400; an execd that is not
   root can act only as itself (anything else is a 403); a kernel without setfsuid(2) (gVisor's)
   is a 501. All are answered before the body is read, so a refused request changes nothing.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from typing import Any

from .errors import ApiError, bad_request
from .web import Handler, Request, Response

MAX_ID = 4294967294  # (uid_t)-1 means "unchanged" to the kernel, so it is not an identity
# setgroups, setfsuid, setfsgid: glibc's setgroups() changes every thread, the raw call one.
SYSCALLS = {"x86_64": (116, 122, 123), "aarch64": (159, 151, 152)}
WORKERS = 4


@dataclass(frozen=True)
class FsIdentity:
    uid: int
    gid: int
    groups: tuple[int, ...]


IDENTITY: contextvars.ContextVar[FsIdentity | None] = contextvars.ContextVar("fs_identity", default=None)


def parse_id(raw: str, name: str) -> int:
    if not raw.isdigit() or int(raw) > MAX_ID:
        raise bad_request(f"{name} {raw!r} in /v1/filesystem/{{uid}}/{{gid}} must be an integer 0..{MAX_ID}")
    return int(raw)


def identity_of(request: Request) -> FsIdentity:
    uid = parse_id(request.path_params["uid"], "uid")
    gid = parse_id(request.path_params["gid"], "gid")
    require_file_credentials()
    if os.geteuid() != 0 and (uid, gid) != (os.geteuid(), os.getegid()):
        raise ApiError(
            403,
            "PERMISSION_DENIED",
            f"execd runs as uid {os.geteuid()} gid {os.getegid()} and cannot act as {uid}:{gid}",
        )
    return FsIdentity(uid, gid, supplementary_groups(uid, gid))


@cache
def _kernel_has_file_credentials() -> bool:
    syscall, (_, setfsuid, _) = libc_syscall()
    return bool(syscall(setfsuid, -1) != -1)  # -1 (ENOSYS) where setfsuid is not implemented


def require_file_credentials() -> None:
    """501 on a kernel without per-thread file credentials (gVisor implements no setfsuid)."""
    if not _kernel_has_file_credentials():
        raise ApiError(
            501,
            "NOT_SUPPORTED",
            "file identities need setfsuid(2), which this sandbox's kernel does not implement "
            "(gVisor); use the plain file routes, or a sandbox with isolation 'standard'",
        )


def supplementary_groups(uid: int, gid: int) -> tuple[int, ...]:
    """The user's groups as a login would set them; just `gid` for a uid with no passwd entry."""
    import pwd

    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        return (gid,)
    return tuple(sorted(set(os.getgrouplist(name, gid))))


def as_identity(handler: Handler) -> Handler:
    """The route `handler` serving `/v1/filesystem/{uid}/{gid}/...` as that identity."""

    async def serve(request: Request) -> Response:
        token = IDENTITY.set(identity_of(request))
        try:
            return await handler(request)
        finally:
            IDENTITY.reset(token)

    return serve


async def in_thread(function: Callable[..., Any], *args: Any) -> Any:
    """Run blocking file work in a worker thread, as the request's identity if it has one."""
    identity = IDENTITY.get()
    if identity is None:
        return await asyncio.to_thread(function, *args)
    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()
    return await loop.run_in_executor(pool(), context.run, run_as, identity, function, args)


@cache
def pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(WORKERS, thread_name_prefix="execd-identity")


@cache
def libc_syscall() -> tuple[Callable[..., int], tuple[int, int, int]]:
    import ctypes

    machine = os.uname().machine
    if machine not in SYSCALLS:
        raise ApiError(501, "NOT_SUPPORTED", f"file identities are not supported on {machine}")
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall, SYSCALLS[machine]


def run_as(identity: FsIdentity, function: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    own = FsIdentity(os.geteuid(), os.getegid(), tuple(os.getgroups()))
    try:
        switch(identity)
        return function(*args)
    finally:
        try:
            switch(own)
        except BaseException:
            stranded.add(threading.get_ident())
            raise


stranded: set[int] = set()


def switch(identity: FsIdentity) -> None:
    """Set this thread's file credentials to `identity` and check the kernel took them."""
    import ctypes

    if threading.get_ident() in stranded:
        raise OSError("this worker thread could not restore execd's identity; it serves no more calls")
    syscall, (setgroups, setfsuid, setfsgid) = libc_syscall()
    groups = (ctypes.c_uint * len(identity.groups))(*identity.groups)
    if syscall(setgroups, len(identity.groups), groups) != 0:
        why = os.strerror(ctypes.get_errno())
        raise ApiError(403, "PERMISSION_DENIED", f"cannot set groups {identity.groups}: {why}")
    syscall(setfsgid, identity.gid)
    syscall(setfsuid, identity.uid)
    # setfsuid/setfsgid return the previous id and never fail; passing -1 reads the current one
    if syscall(setfsuid, -1) != identity.uid or syscall(setfsgid, -1) != identity.gid:
        raise ApiError(
            403,
            "PERMISSION_DENIED",
            f"the kernel refused file identity {identity.uid}:{identity.gid} "
            "(in a user namespace only mapped ids can be used)",
        )
