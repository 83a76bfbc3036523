"""How a local sandbox's processes start: sh -> nsenter -> bwrap -> the launcher, which starts
the entrypoint and then becomes execd. runtime/local.py decides when; this module decides how.

Rules:
1. Every process of a sandbox joins its cgroup before it runs anything: the launch shell writes
   its PID into the cgroup, then execs nsenter (into the sandbox's netns) -> bwrap.
2. Sandbox processes are uid 0 with a reduced capability set (`SANDBOX_CAPS`): nothing that could
   undo the isolation (no CAP_SYS_ADMIN to unmount binds, no CAP_NET_ADMIN/NET_RAW to change or
   spoof addresses, no CAP_MKNOD to reach host devices, no CAP_SYS_PTRACE to read execd, no
   CAP_SYSLOG), and seccomp filters (passed in as fds) deny what the runtime denies.
3. The Python that runs execd (venv, prefix, the execd package) is bound read-only into every
   image at the same paths (`ExecdPython`), and so are the operator's and the sandbox's binds.
   In an image that is not `sandgate/host` (`ExecdPython.in_image`), the host's /usr is bound
   read-only at `/.sandgate/host/usr` instead of over the image's /usr, and execd's Python
   starts through the host's dynamic loader with the host's library directories
   (`ld.so --library-path`): execd then never loads the image's glibc, so any image of the
   host's architecture runs it, and what execd starts is the image's own (no LD_* variable).
4. Nothing of the server's environment enters a sandbox: every hop of the launch chain (sh,
   nsenter, bwrap, the launcher) starts from `LAUNCH_ENV`, and bwrap gives the launcher only the
   sandbox's own env (`--clearenv`). No hop's argv holds a secret.
5. execd's access token never appears in a process's argv or environment: the launch chain's
   stdin is a pipe that carries it to the launcher, which first makes itself non-dumpable (its
   memory and /proc entries are then closed to the sandbox's processes, which lack
   CAP_SYS_PTRACE), reads it, puts /dev/null in its place for the entrypoint, and hands it to
   execd in-process.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sandgate.lifecycle.confinement import SandboxNet
from sandgate.lifecycle.runtime.base import EXECD_PORT, BindMount, RuntimeError_, SandboxSpec
from sandgate.lifecycle.runtime.sandbox_root import DEFAULT_PATH, SANDBOX_HOSTNAME

SANDBOX_CAPS = (
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_SETFCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_AUDIT_WRITE",
)
# The whole environment of the launch chain's host-side hops (sh, nsenter, bwrap): bwrap's PID 1
# inside the sandbox keeps it, so it must hold nothing of the server's.
LAUNCH_ENV = {"PATH": DEFAULT_PATH}
# PR_SET_DUMPABLE(4) 0 comes first: before the token is read and before the entrypoint exists.
# argv: N, the entrypoint's N words, execd's package parent dir, its site-packages, execd's args;
# stdin: execd's token (empty for none; passed as --token=T, since a token may start with '-'),
# then /dev/null for the entrypoint. An entrypoint that cannot start (missing, not executable)
# ends the sandbox with one line naming it and exit status 127, the shell's, never a traceback
# of this source. One that starts is execd's child: execd reaps it, and if it fails, says so
# in one line and ends the sandbox with its status (execd/entrypoint.py).
# Starts the entrypoint, then becomes execd in the same interpreter (-I -S: no site, no .pth
# processing, no second interpreter start-up); `sandgate` is a bare package whose path is the
# parent of the execd package, so `sandgate.execd` imports from where it is installed.
LAUNCHER = (
    "import os,sys,ctypes;ctypes.CDLL(None).prctl(4,0,0,0,0);"
    "t=os.read(0,4096).decode();os.dup2(os.open('/dev/null',os.O_RDONLY),0);"
    "n=int(sys.argv[1]);e=sys.argv[2:2+n];p,s,*x=sys.argv[2+n:]\n"
    "try:i=e and os.posix_spawnp(e[0],e,os.environ)\n"
    "except OSError as f:os.write(2,f'sandgate: the entrypoint {e[0]} cannot start: {f.strerror}"
    " (errno {f.errno}); exit status 127\\n'.encode());os._exit(127)\n"
    "if e:x+=[f'--entrypoint-pid={i}','--entrypoint='+e[0]]\n"
    "sys.path[:0]=[s];m=type(sys)('sandgate');"
    "m.__path__=[p];sys.modules['sandgate']=m;from sandgate.execd.__main__ import main;"
    "main(x+['--token='+t] if t else x)"
)
# Prints where execd's Python lives and compiles execd's bytecode (sandboxes see it read-only,
# so without a precompiled __pycache__ every sandbox would compile execd from source).
_PYTHON_PATHS = (
    "import sys,sysconfig,compileall,importlib.util as u;s=u.find_spec('sandgate.execd');"
    "d=s.submodule_search_locations if s else [];[compileall.compile_dir(p,quiet=2) for p in d];"
    "print(sysconfig.get_paths()['purelib'],sys.prefix,sys.base_prefix,*d,sep='\\n')"
)


HOST_USR_MOUNT = "/.sandgate/host/usr"


@dataclass(frozen=True)
class ExecdPython:
    """Where the Python that runs execd lives; `binds` are made read-only in every sandbox at the
    same path, `moved` (host path, sandbox path) elsewhere; `interpreter` starts it."""

    site_packages: str
    package_dir: str
    binds: list[str]
    interpreter: tuple[str, ...] = ()
    moved: tuple[tuple[str, str], ...] = ()

    def in_image(self, python: str) -> ExecdPython:
        """The same Python for an image's root (rule 3): /usr moved, the host's loader in front."""
        executable = os.path.realpath(python)
        loader, libraries = _loader_and_libraries(executable)
        return ExecdPython(
            site_packages=_moved_usr(self.site_packages),
            package_dir=_moved_usr(self.package_dir),
            binds=[path for path in self.binds if _moved_usr(path) == path],
            interpreter=(
                _moved_usr(loader),
                "--library-path",
                ":".join(map(_moved_usr, libraries)),
                _moved_usr(executable),
            ),
            moved=(("/usr", HOST_USR_MOUNT),),
        )


def _moved_usr(path: str) -> str:
    return HOST_USR_MOUNT + path[len("/usr") :] if path == "/usr" or path.startswith("/usr/") else path


def _loader_and_libraries(executable: str) -> tuple[str, list[str]]:
    """The host's dynamic loader for `executable` and the directories its libraries are in."""
    listing = subprocess.run(["ldd", executable], capture_output=True, text=True, timeout=30).stdout
    loader = next((m.group(1) for m in re.finditer(r"^\s*(/\S*ld-linux\S*)", listing, re.M)), None)
    if loader is None:
        raise RuntimeError_(f"cannot find the dynamic loader of {executable} (is it a dynamic ELF?)")
    loader = os.path.realpath(loader)
    found = [os.path.dirname(os.path.realpath(m)) for m in re.findall(r"=> (/\S+)", listing)]
    return loader, list(dict.fromkeys([os.path.dirname(loader), *found]))


def python_paths(python: str) -> ExecdPython:
    """Ask execd's Python where it lives (venv, prefix, site-packages, the execd package)."""
    result = subprocess.run([python, "-I", "-c", _PYTHON_PATHS], capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise RuntimeError_(
            f"cannot ask {python} where it lives (is it a Python with sandgate?): {result.stderr}"
        )
    paths = [line for line in result.stdout.splitlines() if line]
    if len(paths) < 4:
        raise RuntimeError_(f"{python} cannot import sandgate.execd; install sandgate into that Python")
    site_packages, package_dir, binds = paths[0], paths[3], paths[1:]
    if not any(Path(site_packages).is_relative_to(path) for path in binds):
        binds.append(site_packages)
    return ExecdPython(site_packages, package_dir, list(dict.fromkeys(binds)))


@dataclass(frozen=True)
class Launch:
    """What one sandbox's launch chain is made of besides its spec and network."""

    root: Path  # the sandbox's `/` on the host (the overlay's mount point)
    env: dict[str, str]  # the sandbox's whole environment
    ro_binds: Sequence[str]  # host paths bound read-only at the same path (system dirs, execd's Python)
    binds: Sequence[BindMount]  # the operator's and the sandbox's binds
    seccomp_fds: Sequence[int]  # open seccomp filter programs
    execd_python: str
    execd: ExecdPython


def bwrap_argv(spec: SandboxSpec, net: SandboxNet, launch: Launch) -> list[str]:
    """bwrap's argv, ending in the launcher that starts the entrypoint and becomes execd (rules 2-4)."""
    argv = ["bwrap", "--bind", str(launch.root), "/", "--proc", "/proc", "--dev", "/dev"]
    argv += [word for path in (*launch.ro_binds, *launch.execd.binds) for word in ("--ro-bind", path, path)]
    argv += [word for source, target in launch.execd.moved for word in ("--ro-bind", source, target)]
    argv += [word for bind in launch.binds for word in bind.bwrap_args()]
    argv += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    argv += ["--hostname", SANDBOX_HOSTNAME, "--new-session", "--cap-drop", "ALL"]
    argv += [word for cap in SANDBOX_CAPS for word in ("--cap-add", cap)]
    argv += ["--chdir", "/workspace", "--clearenv"]
    argv += [word for key, value in launch.env.items() for word in ("--setenv", key, value)]
    argv += [word for fd in launch.seccomp_fds for word in ("--add-seccomp-fd", str(fd))]
    return [*argv, "--", *launcher_argv(spec, net, launch)]


def launcher_argv(spec: SandboxSpec, net: SandboxNet, launch: Launch) -> list[str]:
    """The sandbox's first process: the launcher that starts the entrypoint and becomes execd."""
    execd = [os.path.dirname(launch.execd.package_dir), launch.execd.site_packages]
    execd += ["--host", net.address, "--port", str(EXECD_PORT)]
    entrypoint = [str(len(spec.entrypoint)), *spec.entrypoint]
    python = launch.execd.interpreter or (launch.execd_python,)
    return [*python, "-I", "-S", "-c", LAUNCHER, *entrypoint, *execd]


def start_chain(
    spec: SandboxSpec,
    net: SandboxNet,
    launch: Launch,
    cgroup_procs: Sequence[Path],
    log_path: Path,
    isolator: Sequence[str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start sh -> nsenter -> bwrap (or the given `isolator` argv, e.g. runsc) in a session of
    its own (sandboxes outlive the server), its output appended to `log_path`; then call
    `hand_over_token` (rule 5)."""
    joins = " && ".join(f"echo $$ > {shlex.quote(str(path))}" for path in cgroup_procs)
    argv = ["/bin/sh", "-c", f'{joins} && exec "$@"', "sandgate-launch"]
    argv += ["nsenter", f"--net={net.netns_path}", "--", *(isolator or bwrap_argv(spec, net, launch))]
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=LAUNCH_ENV,
            cwd="/",  # the shell exports PWD: the server's directory is not the sandbox's business
            start_new_session=True,
            pass_fds=(*launch.seccomp_fds, *(bind.fd for bind in launch.binds if bind.fd is not None)),
        )


def hand_over_token(process: subprocess.Popen[bytes], token: str) -> None:
    """Write the token into the launch chain's stdin and close it (one write of a few bytes: a
    pipe takes it at once). A chain that already died is reported by `wait_ready`."""
    assert process.stdin is not None
    try:
        if token:
            os.write(process.stdin.fileno(), token.encode())
    except BrokenPipeError:
        pass
    finally:
        process.stdin.close()
