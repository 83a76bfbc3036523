"""execd out of the agent's reach, on every runtime: a command execd runs can neither open execd's
/proc memory or environ nor ptrace it, and cannot read the kernel log; the same command CAN do
all of that to a process of its own (the control), so the denials are execd's hardening, not a
broken probe.
"""

from __future__ import annotations

import json

import pytest

from tests.docker.test_execd import TOKEN, sdk_commands
from tests.runtime.harness import Harness

pytestmark = pytest.mark.root

PROBE = r"""
import ctypes, json, os, subprocess
libc = ctypes.CDLL(None, use_errno=True)
def execd_pid():  # the nearest ancestor running execd (bwrap's argv names it too, further up)
    pid = os.getppid()
    while pid > 1:
        if b"sandgate.execd" in open(f"/proc/{pid}/cmdline", "rb").read():
            return pid
        pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
def opens(path):
    try:
        os.close(os.open(path, os.O_RDONLY))
        return "opened"
    except OSError as exc:
        return exc.strerror
def attach(pid):
    if libc.ptrace(16, pid, None, None) == 0:  # PTRACE_ATTACH
        libc.ptrace(17, pid, None, None)  # PTRACE_DETACH
        return "attached"
    return os.strerror(ctypes.get_errno())
def probe(pid):
    return {"mem": opens(f"/proc/{pid}/mem"), "environ": opens(f"/proc/{pid}/environ"),
            "fd": opens(f"/proc/{pid}/fd/0"), "ptrace": attach(pid)}
own = subprocess.Popen(["sleep", "30"])
execd = execd_pid()
klog = libc.klogctl(3, ctypes.create_string_buffer(4096), 4096)  # SYSLOG_ACTION_READ_ALL
klog = os.strerror(ctypes.get_errno()) if klog < 0 else "read"
print(json.dumps({
    "execd": execd and probe(execd), "own": probe(own.pid),
    "klogctl": klog,
    "kmsg": opens("/dev/kmsg"),
}))
own.kill()
"""


def test_execd_cannot_be_read_or_traced_and_the_kernel_log_is_closed(sandboxes: Harness) -> None:
    _, net = sandboxes.start(["sleep", "3600"], execd_token=TOKEN)
    run = sdk_commands(net.address).run(["python3", "-I", "-c", PROBE])
    assert run.exit_code == 0, [m.text for m in run.logs.stderr]
    seen = json.loads("".join(m.text for m in run.logs.stdout))

    assert seen["own"] == {"mem": "opened", "environ": "opened", "fd": "opened", "ptrace": "attached"}
    assert seen["execd"] == {
        "mem": "Permission denied",
        "environ": "Permission denied",
        "fd": "Permission denied",
        "ptrace": "Operation not permitted",
    }
    assert seen["klogctl"] == "Operation not permitted"
    assert seen["kmsg"] == "No such file or directory"
