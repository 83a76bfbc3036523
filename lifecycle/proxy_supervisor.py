"""Starts the egress proxy as a child process and restarts it when it dies.

Rules:
1. The proxy runs as `<python> -m sandgate.proxy --config <file>`, in its own process: a crash
   there cannot take the control plane down, and mitmproxy gets a core of its own.
2. After every (re)start the supervisor waits until the proxy's control socket answers AND the
   child listens on its TCP and UDP ports (a proxy whose port is taken answers on its socket for
   a moment, then exits), then calls `on_ready` (lifecycle re-pushes every sandbox entry). Until
   then sandboxes have no egress: the nft redirect points at a port nobody listens on, so
   connections are refused.
3. Restarts back off (0.5 s doubling to 10 s) so a proxy that cannot start does not spin. A
   child that is not ready within its start timeout is ended before the attempt counts as
   failed: a proxy that became ready later would run with no sandbox entries, since only a
   successful start re-pushes them (on a loaded machine that left every sandbox refused). Each
   failed restart doubles the next one's start timeout (up to MAX_START_TIMEOUT), so a slow
   machine gets there and a hung child does not hold the supervisor.
4. The control socket is part of the proxy: when its path no longer names the socket the proxy
   bound (deleted, or replaced by another file or process), lifecycle could no longer push a
   policy, so the proxy is restarted (it binds a fresh socket) and re-fed like after a crash.
5. The vault's secrets never touch the disk: every start writes them into a fresh pipe whose
   read end the child inherits (`--secrets-fd`); the config file holds only where the vault is,
   and the child's environment has none of the server's `SANDGATE_*` settings.
6. With `die_with_supervisor` (the node agent's), the child gets SIGKILL when the thread that
   started it ends (PR_SET_PDEATHSIG: the supervisor's caller or its watcher, both living as long
   as the supervisor): a killed agent leaves no proxy serving its Pods.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from sandgate.proxy import config_path

log = logging.getLogger(__name__)


MAX_START_TIMEOUT = 300.0  # seconds a restart may take once earlier attempts were too slow


class ProxyStartError(RuntimeError):
    pass


@dataclass(frozen=True)
class Listeners:
    """The ports the proxy child must listen on before it counts as ready."""

    tcp: frozenset[int] = frozenset()
    udp: frozenset[int] = frozenset()


# /proc/<pid>/net/{tcp,udp}[6] socket states: TCP LISTEN, and UDP's unconnected "CLOSE".
_LISTEN_STATES = {"tcp": "0A", "tcp6": "0A", "udp": "07", "udp6": "07"}


def listening(pid: int) -> Listeners:
    """The TCP ports `pid` and its descendants listen on and the UDP ports they have bound (read
    from /proc; with proxy workers the pool holds the TCP listeners and the DNS one)."""
    inodes: set[str] = set()
    for member in process_family(pid):
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{member}/fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("socket:["):
                        inodes.add(target[8:-1])
    found: dict[str, set[int]] = {"tcp": set(), "udp": set()}
    for table, state in _LISTEN_STATES.items():
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == state and fields[9] in inodes:
                    found[table[:3]].add(int(fields[1].rsplit(":", 1)[1], 16))
    return Listeners(frozenset(found["tcp"]), frozenset(found["udp"]))


def parent_pid(pid: int | str) -> int:
    """From /proc/<pid>/stat (after the command name, which may hold spaces and parentheses);
    raises OSError if the process is gone."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def process_family(pid: int) -> list[int]:
    """`pid` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                children.setdefault(parent_pid(entry.name), []).append(int(entry.name))
    family, todo = [], [pid]
    while todo:
        member = todo.pop()
        family.append(member)
        todo += children.get(member, [])
    return family


class ProxySupervisor:
    def __init__(
        self,
        config_path: Path,
        is_healthy: Callable[[], bool],
        on_ready: Callable[[], object],
        log_path: Path,
        python: str = sys.executable,
        start_timeout: float = 20.0,
        listeners: Listeners = Listeners(),
        control_socket: Path | None = None,
        secrets: bytes | None = None,
        die_with_supervisor: bool = False,
    ) -> None:
        self.config_path = config_path
        self.secrets = secrets  # the vault's StoreSecrets JSON, piped to every start (rule 5)
        self.control_socket = control_socket
        self._socket_id: tuple[int, int, int] | None = None  # (st_dev, st_ino, st_ctime_ns) it bound
        self.listeners = listeners
        self.die_with_supervisor = die_with_supervisor  # rule 6
        self.is_healthy = is_healthy
        self.on_ready = on_ready
        self.log_path = log_path
        self.python = python
        self.start_timeout = start_timeout
        self.restarts = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def start(self) -> None:
        """Start the proxy and wait until it is ready; raises ProxyStartError if it is not."""
        self._spawn_and_wait(self.start_timeout)
        self._watcher = threading.Thread(target=self._watch, name="proxy-supervisor", daemon=True)
        self._watcher.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        if self._process:
            _end(self._process, timeout)
        if self._watcher:
            self._watcher.join(timeout)

    def _spawn_and_wait(self, timeout: float) -> None:
        argv = [self.python, "-m", "sandgate.proxy", "--config", str(self.config_path)]
        with self.log_path.open("ab") as output, secrets_pipe(self.secrets) as fds:
            self._process = subprocess.Popen(
                argv + [arg for fd in fds for arg in ("--secrets-fd", str(fd))],
                stdout=output,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                pass_fds=fds,
                env=proxy_environment(),
                preexec_fn=die_with(os.getpid()) if self.die_with_supervisor else None,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self._stopping.is_set():
            if self._process.poll() is not None:
                status = self._process.returncode
                raise ProxyStartError(
                    f"the proxy exited with status {status} while starting; "
                    f"last lines of {self.log_path}:\n{self._log_tail()}"
                )
            if self.is_healthy() and self._listens(self._process.pid):
                self._socket_id = self._current_socket_id()
                self.on_ready()
                return
            time.sleep(0.05)
        _end(self._process, 5.0)  # never leave a proxy running that nobody fed its entries
        raise ProxyStartError(
            f"the proxy did not answer on its control socket and listen on TCP {sorted(self.listeners.tcp)} "
            f"and UDP {sorted(self.listeners.udp)} within {timeout:g}s; see {self.log_path}"
        )

    def _current_socket_id(self) -> tuple[int, int, int] | None:
        if self.control_socket is None:
            return None
        try:
            found = self.control_socket.lstat()
        except FileNotFoundError:
            return None
        # ctime too: a socket bound right after the unlink may get the freed inode's number back
        return (found.st_dev, found.st_ino, found.st_ctime_ns) if stat.S_ISSOCK(found.st_mode) else None

    def _socket_lost(self) -> bool:
        """True when the socket path no longer names the socket the running proxy bound."""
        return self._socket_id is not None and self._current_socket_id() != self._socket_id

    def _listens(self, pid: int) -> bool:
        bound = listening(pid)
        return self.listeners.tcp <= bound.tcp and self.listeners.udp <= bound.udp

    def _log_tail(self, lines: int = 8) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _watch(self) -> None:
        backoff, timeout = 0.5, self.start_timeout
        while not self._stopping.is_set():
            process = self._process
            if process is not None and process.poll() is None and self._socket_lost():
                log.error(
                    "the proxy's control socket %s is gone or replaced; restarting the proxy (pid %s)",
                    self.control_socket,
                    process.pid,
                )
                _end(process, 5.0)
            if process is None or process.poll() is None:
                self._stopping.wait(0.2)
                continue
            log.error("proxy (pid %s) exited with status %s; restarting", process.pid, process.returncode)
            self._stopping.wait(backoff)
            if self._stopping.is_set():
                return
            try:
                self._spawn_and_wait(timeout)
                self.restarts += 1
                backoff, timeout = 0.5, self.start_timeout
                log.warning("proxy restarted (pid %s), entries re-pushed", self.pid)
            except Exception:
                log.exception("proxy restart failed; retrying in %.1fs", backoff)
                backoff, timeout = min(backoff * 2, 10.0), min(timeout * 2, MAX_START_TIMEOUT)


PR_SET_PDEATHSIG = 1


def die_with(parent: int) -> Callable[[], None]:
    """A preexec function: SIGKILL this child when its parent ends (or at once, if it has)."""

    def arm() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0 or os.getppid() != parent:
            os._exit(1)

    return arm


def proxy_environment() -> dict[str, str]:
    """The server's environment less its settings (`SANDGATE_*`: the API key, the vault key and
    OpenBao credentials among them): the proxy reads no setting, its config file says it all."""
    return {name: value for name, value in os.environ.items() if not name.startswith("SANDGATE_")}


@contextlib.contextmanager
def secrets_pipe(secrets: bytes | None) -> Iterator[tuple[int, ...]]:
    """The read end of a pipe that holds `secrets` (written whole and closed: a pipe buffers
    64 KiB, the secrets are a few hundred bytes), for a child to inherit; closed here after."""
    if secrets is None:
        yield ()
        return
    read, write = os.pipe()
    try:
        with os.fdopen(write, "wb") as pipe:
            pipe.write(secrets)
        yield (read,)
    finally:
        os.close(read)


def _end(process: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM, then SIGKILL after `timeout`; returns once the process is gone."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def proxy_processes(state_dir: Path) -> list[int]:
    """PIDs of proxies started for this state dir (argv `-m sandgate.proxy --config
    <state_dir>/proxy.json`), the one a server started, not the worker template and workers a
    pool forked (they carry the same argv). Beside the state dir's lock holder, each one is an
    orphan: the child of a server that was killed (SIGKILL, OOM), still holding the proxy ports."""
    config = str(config_path(state_dir)).encode()
    found: dict[int, int] = {}  # pid -> parent
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                argv = Path("/proc", entry, "cmdline").read_bytes().split(b"\0")
                if b"sandgate.proxy" in argv and config in argv:
                    found[int(entry)] = parent_pid(entry)
    return [pid for pid, parent in found.items() if parent not in found]


def stop_proxies(state_dir: Path, grace: float = 5.0) -> list[int]:
    """SIGTERM each proxy of this state dir (a pool stops its own workers), SIGKILL what is left
    after `grace` (a pool's workers die with it); returns once every process of theirs is gone
    (their ports free), with the proxies' pids. Only for the state dir's lock holder."""
    pids = proxy_processes(state_dir)
    family = [member for pid in pids for member in process_family(pid)]
    for signum in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        deadline = time.monotonic() + grace
        while any(_running(pid) for pid in family) and time.monotonic() < deadline:
            time.sleep(0.05)
    return pids


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie lingers until init reaps it)."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat_line.rsplit(")", 1)[1].split()[0] != "Z"
