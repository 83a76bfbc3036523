"""The local runtime on real bubblewrap sandboxes: filesystem, limits, pause, teardown, adopt."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandgate.lifecycle.cgroups import SandboxCgroup
from sandgate.lifecycle.kernel import mount_points
from sandgate.lifecycle.runtime.base import RuntimeError_, SandboxSpec, ping_execd
from sandgate.lifecycle.runtime.local import LocalRuntime
from sandgate.lifecycle.runtime.seccomp import AUDIT_ARCH_X86_64, deny_syscalls
from tests.runtime.harness import Harness

pytestmark = pytest.mark.root

PYTHON = sys.executable
CA_MARK = "SANDGATE-TEST-CA-" + os.urandom(4).hex()
CA_PEM = f"-----BEGIN CERTIFICATE-----\n{CA_MARK}\n-----END CERTIFICATE-----\n"

FS_PROBE = r"""
import json, os, socket, subprocess, sys
state_dir = sys.argv[1]
open("/etc/sandgate-probe-written", "w").write("inside")
try:
    os.makedirs("/usr/local/sandgate-probe")
    usr = "written"
except OSError as exc:
    usr = exc.strerror
result = {
    "usr": usr,
    "top": sorted(os.listdir("/")),
    "etc": sorted(os.listdir("/etc")),
    "root": os.listdir("/root"),
    "home": os.listdir("/home"),
    "state_dir": os.path.exists(state_dir),
    "mountinfo": open("/proc/self/mountinfo").read(),
    "pid1_environ": open("/proc/1/environ").read(),
    "resolv": open("/etc/resolv.conf").read(),
    "env": {k: os.environ.get(k) for k in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "GIT_SSL_CAINFO",
            "CURL_CA_BUNDLE", "AWS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "SANDGATE_SANDBOX_ID", "FROM_SPEC")},
    "bundle": open(os.environ["SSL_CERT_FILE"]).read(),
    "umount_root": subprocess.run(["umount", "/root"], capture_output=True).returncode,
    "cap_eff": [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff")][0],
    "processes": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "hostname": socket.gethostname(),
    "hosts": open("/etc/hosts").read(),
    "own_address": socket.gethostbyname(socket.gethostname()),
    "java_etc": {d: sorted(os.listdir("/etc/" + d)) for d in os.listdir("/etc") if d.startswith("java-")},
    "cwd": os.getcwd(),
}
json.dump(result, open("/workspace/.fs", "w")); os.rename("/workspace/.fs", "/workspace/fs.json")
"""


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    with Harness(tmp_path_factory.mktemp("state")) as harness:
        yield harness


def test_the_host_image_is_an_allowlist_on_an_overlay(harness: Harness, tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text(CA_PEM)
    (harness.state_dir / "vault.key").write_text("host secret")
    host_secret = Path("/root/.sandgate-test-secret")
    host_secret.write_text("host secret")
    try:
        sandbox_id, net = harness.start(
            [PYTHON, "-I", "-c", FS_PROBE, str(harness.state_dir)], ca_cert=ca, env={"FROM_SPEC": "yes"}
        )
    finally:
        host_secret.unlink()
    seen = json.loads(harness.wait_file(sandbox_id, "fs.json"))

    assert not Path("/etc/sandgate-probe-written").exists()
    assert seen["usr"] == "Read-only file system" and not Path("/usr/local/sandgate-probe").exists()
    upper = harness.state_dir / "sandboxes" / sandbox_id / "upper"
    assert (upper / "etc/sandgate-probe-written").read_text() == "inside"
    # / holds the allowlist and the first parts of the bound-back Python (/root/.pyenv, the venv).
    execd_tops = {Path(p).parts[1] for p in harness.runtime.execd_paths.binds}
    allowlist = {
        "usr",
        "bin",
        "sbin",
        "lib",
        "lib64",
        "etc",
        "tmp",
        "home",
        "root",
        "run",
        "var",
        "opt",
        "srv",
        "mnt",
    }
    assert set(seen["top"]) == allowlist | {"workspace", "proc", "dev"} | execd_tops
    assert "shadow" not in seen["etc"] and "sandgate" not in seen["etc"] and "ssh" not in seen["etc"]
    assert {"passwd", "group", "hosts", "resolv.conf", "ssl", "ld.so.cache"} <= set(seen["etc"])
    # /root holds only what leads to the bound-back Python prefix (here /root/.pyenv/...).
    bound = {
        Path(p).relative_to("/root").parts[0]
        for p in harness.runtime.execd_paths.binds
        if p.startswith("/root/")
    }
    assert set(seen["root"]) == bound and ".sandgate-test-secret" not in seen["root"]
    assert seen["home"] == [] and seen["state_dir"] is False
    assert str(harness.state_dir) not in seen["mountinfo"]
    # bwrap is PID 1: its environment is the launch chain's, nothing of the server's
    assert (
        seen["pid1_environ"] == "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\0PWD=/\0"
    )
    assert seen["umount_root"] != 0  # no CAP_SYS_ADMIN: binds stay
    # no SYS_ADMIN, NET_ADMIN, NET_RAW, MKNOD, SYS_PTRACE, SYSLOG
    assert int(seen["cap_eff"], 16) & (1 << 21 | 1 << 12 | 1 << 13 | 1 << 27 | 1 << 19 | 1 << 34) == 0
    assert seen["resolv"].startswith(f"nameserver {net.gateway}\n")
    assert seen["env"]["SSL_CERT_FILE"] == "/etc/ssl/certs/ca-certificates.crt"
    for name in ("REQUESTS_CA_BUNDLE", "GIT_SSL_CAINFO", "CURL_CA_BUNDLE", "AWS_CA_BUNDLE"):
        assert seen["env"][name] == seen["env"]["SSL_CERT_FILE"]
    assert seen["env"]["NODE_EXTRA_CA_CERTS"] == "/etc/ssl/certs/sandgate-proxy.crt"
    assert seen["env"]["SANDGATE_SANDBOX_ID"] == sandbox_id and seen["env"]["FROM_SPEC"] == "yes"
    assert CA_MARK in seen["bundle"] and "BEGIN CERTIFICATE" in seen["bundle"].split(CA_MARK)[0]
    assert CA_MARK not in Path("/etc/ssl/certs/ca-certificates.crt").read_text()  # host bundle untouched
    assert seen["hostname"] == "sandbox" and seen["cwd"] == "/workspace"
    # its own name is answered by its own /etc/hosts (no DNS query); the host's names are not there
    assert seen["own_address"] == "127.0.1.1" and socket.gethostname() not in seen["hosts"]
    # the JDKs' config comes along (java.security), JMX's management dir (password files) never
    for jdk in Path("/etc").glob("java-*-openjdk"):
        assert "security" in seen["java_etc"][jdk.name] and "management" not in seen["java_etc"][jdk.name]
    assert max(seen["processes"]) < 20  # its own pid namespace


def test_a_missing_entrypoint_is_named_without_the_launcher_source(harness: Harness) -> None:
    """The guide's entrypoint on `sandgate/host`: one line naming the path, errno and status 127."""
    with pytest.raises(RuntimeError_) as failed:
        harness.start(["/opt/code-interpreter/code-interpreter.sh"])
    message = str(failed.value)
    assert "the entrypoint /opt/code-interpreter/code-interpreter.sh cannot start" in message
    assert "No such file or directory (errno 2); exit status 127" in message
    assert "Traceback" not in message and "posix_spawnp" not in message and "import os" not in message


def test_a_failing_entrypoint_is_quoted_with_its_status_and_stderr(harness: Harness) -> None:
    """An entrypoint that starts and fails ends the sandbox; the error quotes its path, exit
    status and stderr, never the launcher."""
    with pytest.raises(RuntimeError_) as failed:
        harness.start(["/bin/sh", "-c", "echo boom-on-stderr >&2; exit 3"])
    message = str(failed.value)
    assert "boom-on-stderr" in message
    assert "the entrypoint /bin/sh exited with status 3" in message
    assert message.index("boom-on-stderr") < message.index("exited with status 3")
    assert "Traceback" not in message and "posix_spawnp" not in message and "import os" not in message


def test_memory_limit_kills_the_hog(harness: Harness) -> None:
    hog = f"{PYTHON} -I -c 'b = bytearray(600 << 20)'; echo $? > /workspace/rc"
    sandbox_id, _ = harness.start(["/bin/sh", "-c", hog], memory_bytes=160 << 20)
    assert harness.wait_file(sandbox_id, "rc").strip() == "137"  # SIGKILL from the OOM killer
    assert harness.runtime.alive(sandbox_id)


def test_pids_limit_stops_a_fork_bomb(harness: Harness) -> None:
    bomb = (
        "import os, time\n"
        "count, error = 0, None\n"
        "for _ in range(200):\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(60); os._exit(0)\n"
        "        count += 1\n"
        "    except OSError as exc:\n"
        "        error = type(exc).__name__; break\n"
        "open('/workspace/forks', 'w').write(f'{count} {error}')\n"
    )
    sandbox_id, _ = harness.start([PYTHON, "-I", "-c", bomb], pids_max=40)
    count, error = harness.wait_file(sandbox_id, "forks").split()
    assert error == "BlockingIOError" and int(count) < 40


def test_pause_freezes_every_process_and_resume_thaws(harness: Harness) -> None:
    sandbox_id, net = harness.start(["sleep", "3600"])
    harness.runtime.pause(sandbox_id)
    assert harness.runtime.paused(sandbox_id)
    assert not ping_execd(net.address)
    harness.runtime.resume(sandbox_id)
    assert ping_execd(net.address)


def test_delete_leaves_no_process_mount_cgroup_netns_or_veth(harness: Harness) -> None:
    sandbox_id, net = harness.start(["sleep", "3600"])
    cgroup = SandboxCgroup(harness.runtime._cgroup_name(sandbox_id))
    pids = cgroup.pids()
    root = harness.runtime.root_path(sandbox_id)
    assert len(pids) >= 3 and str(root) in mount_points()
    harness.stop(sandbox_id)
    harness.stop(sandbox_id)  # idempotent

    assert not [pid for pid in pids if _running(pid)]
    assert not cgroup.exists()
    assert str(root) not in mount_points()
    assert not root.parent.exists()
    assert not net.netns_path.exists()
    addresses = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True, check=True).stdout
    assert f"{net.gateway}/30" not in addresses  # the host end of the veth is gone


def test_adopt_keeps_running_sandboxes_and_removes_dead_ones(harness: Harness) -> None:
    running_id, running_net = harness.start(["sleep", "3600"])
    dead_id, _ = harness.start(["sleep", "3600"])
    for pid in SandboxCgroup(harness.runtime._cgroup_name(dead_id)).pids():
        with contextlib.suppress(ProcessLookupError):  # gone already: its parent was killed first
            os.kill(pid, 9)  # the sandbox died while the server was down

    restarted = LocalRuntime(harness.state_dir, harness.images, instance=harness.runtime.instance)
    adopted = restarted.adopt()
    assert running_id in adopted and dead_id not in adopted
    assert set(adopted) == set(harness.nets) - {dead_id}  # the module's other live sandboxes too
    assert restarted.alive(running_id) and ping_execd(running_net.address)
    assert not (harness.state_dir / "sandboxes" / dead_id).exists()
    assert not SandboxCgroup(harness.runtime._cgroup_name(dead_id)).exists()
    restarted.pause(running_id)
    restarted.resume(running_id)


def _running(pid: int) -> bool:
    """True unless the process is gone or a zombie (killed, waiting for PID 1 to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def chroot_denying_filter(path: Path) -> Path:
    """A seccomp filter file (x86_64): chroot fails with EPERM, everything else is allowed.

    Sandbox processes hold CAP_SYS_CHROOT, so only the filter can make chroot fail.
    """
    path.write_bytes(deny_syscalls(((AUDIT_ARCH_X86_64, 161),)))
    return path


CHROOT_PROBE = """
out = open("/workspace/chroot", "w")
import os
try:
    os.chroot("/workspace"); out.write("chrooted")
except OSError as exc:
    out.write(exc.strerror)
out.close()
"""


@pytest.mark.parametrize("filtered", [False, True])
def test_seccomp_profile_applies_inside(harness: Harness, tmp_path: Path, filtered: bool) -> None:
    runtime = LocalRuntime(
        harness.state_dir,
        harness.images,
        instance=harness.runtime.instance,
        seccomp_bpf=chroot_denying_filter(tmp_path / "filter.bpf") if filtered else None,
    )
    sandbox_id = "seccomp" + os.urandom(3).hex()
    net = harness.networks.create(sandbox_id)
    harness.nets[sandbox_id] = net
    try:
        runtime.create(SandboxSpec(sandbox_id, "sandgate/host", [PYTHON, "-I", "-c", CHROOT_PROBE]), net)
        runtime.wait_ready(sandbox_id, net, timeout=30)
        expected = "Operation not permitted" if filtered else "chrooted"
        assert harness.wait_file(sandbox_id, "chroot") == expected
    finally:
        runtime.delete(sandbox_id)
