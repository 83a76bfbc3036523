"""Seccomp filters the runtimes load into every sandbox process, compiled here to classic BPF.

Rule: a filter only ever denies (EPERM) a listed syscall and allows the rest; what an operator
adds (`LocalRuntime(seccomp_bpf=...)`) is loaded beside it and the kernel applies the stricter.
"""

from __future__ import annotations

import errno
import os
import struct

# struct seccomp_data: nr at offset 0, arch at 4.
_LOAD_NR = (0x20, 0, 0, 0)  # BPF_LD | BPF_W | BPF_ABS
_LOAD_ARCH = (0x20, 0, 0, 4)
_JEQ = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_RET = 0x06  # BPF_RET | BPF_K
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_X32 = 0x40000000  # x32 syscalls run with the x86_64 audit arch and this bit in nr

AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_I386 = 0x40000003
AUDIT_ARCH_AARCH64 = 0xC00000B7
# syslog(2) reads the kernel log (dmesg); /dev/kmsg is not in a sandbox's /dev.
DENY_KERNEL_LOG = (
    (AUDIT_ARCH_X86_64, 103),
    (AUDIT_ARCH_X86_64, _X32 | 103),
    (AUDIT_ARCH_I386, 103),
    (AUDIT_ARCH_AARCH64, 116),
)


def deny_syscalls(rules: tuple[tuple[int, int], ...], error: int = errno.EPERM) -> bytes:
    """A filter returning `error` for each (audit arch, syscall number) and allowing the rest."""
    program: list[tuple[int, int, int, int]] = []
    for arch, number in rules:
        program += [_LOAD_ARCH, (_JEQ, 0, 2, arch), _LOAD_NR, (_JEQ, -1, 0, number)]
    program += [(_RET, 0, 0, _RET_ALLOW), (_RET, 0, 0, _RET_ERRNO | error)]
    deny_at = len(program) - 1
    return b"".join(
        struct.pack("<HBBI", code, deny_at - index - 1 if jt == -1 else jt, jf, k)
        for index, (code, jt, jf, k) in enumerate(program)
    )


def filter_fd(program: bytes) -> int:
    """A memory file holding `program`, positioned at its start, for `bwrap --add-seccomp-fd`."""
    fd = os.memfd_create("sandgate-seccomp")  # close-on-exec; pass_fds hands it to bwrap
    os.write(fd, program)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
