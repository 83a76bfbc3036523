"""The kernel-log filter every local sandbox loads, tested where it alone decides: this (root)
test process holds CAP_SYSLOG, so klogctl works here until the filter is loaded."""

from __future__ import annotations

import ctypes
import errno
import os

import pytest

from sandgate.lifecycle.runtime.seccomp import DENY_KERNEL_LOG, deny_syscalls

pytestmark = pytest.mark.root

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SYSLOG_ACTION_SIZE_BUFFER = 10


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


def klogctl_in_child(program: bytes | None) -> int:
    """errno of klogctl(SIZE_BUFFER) in a forked child, after loading `program` (0: it worked)."""
    pid = os.fork()
    if pid == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        if program is not None:
            prog = SockFprog(len(program) // 8, program)
            libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
            if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
                os._exit(200)
        os._exit(0 if libc.klogctl(SYSLOG_ACTION_SIZE_BUFFER, None, 0) >= 0 else ctypes.get_errno())
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_the_kernel_log_filter_denies_syslog() -> None:
    assert klogctl_in_child(None) == 0  # the control: root with CAP_SYSLOG reads the log's size
    assert klogctl_in_child(deny_syscalls(DENY_KERNEL_LOG)) == errno.EPERM
