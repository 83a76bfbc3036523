"""Starts the egress proxy as a child process and restarts it when it dies.

Rules:
1. The proxy runs as `<python> -m sandgate.proxy --config <file>`, in its own process: a crash
   there cannot take the control plane down, and mitmproxy gets a core of its own.
2. After every (re)start the supervisor waits until the proxy's control socket answers, then
   calls `on_ready` (lifecycle re-pushes every sandbox entry). Until then sandboxes have no
   egress: the nft redirect points at a port nobody listens on, so connections are refused.
3. Restarts back off (0.5 s doubling to 10 s) so a proxy that cannot start does not spin.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)


class ProxyStartError(RuntimeError):
    pass


class ProxySupervisor:
    def __init__(
        self,
        config_path: Path,
        is_healthy: Callable[[], bool],
        on_ready: Callable[[], object],
        log_path: Path,
        python: str = sys.executable,
        start_timeout: float = 20.0,
    ) -> None:
        self.config_path = config_path
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
        self._spawn_and_wait()
        self._watcher = threading.Thread(target=self._watch, name="proxy-supervisor", daemon=True)
        self._watcher.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        process = self._process
        if process and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._watcher:
            self._watcher.join(timeout)

    def _spawn_and_wait(self) -> None:
        with self.log_path.open("ab") as output:
            self._process = subprocess.Popen(
                [self.python, "-m", "sandgate.proxy", "--config", str(self.config_path)],
                stdout=output,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline and not self._stopping.is_set():
            if self._process.poll() is not None:
                status = self._process.returncode
                raise ProxyStartError(
                    f"the proxy exited with status {status} while starting; see {self.log_path}"
                )
            if self.is_healthy():
                self.on_ready()
                return
            time.sleep(0.05)
        raise ProxyStartError(f"the proxy did not answer on its control socket within {self.start_timeout}s")

    def _watch(self) -> None:
        backoff = 0.5
        while not self._stopping.is_set():
            process = self._process
            if process is None or process.poll() is None:
                self._stopping.wait(0.2)
                continue
            log.error("proxy (pid %s) exited with status %s; restarting", process.pid, process.returncode)
            self._stopping.wait(backoff)
            if self._stopping.is_set():
                return
            try:
                self._spawn_and_wait()
                self.restarts += 1
                backoff = 0.5
                log.warning("proxy restarted (pid %s), entries re-pushed", self.pid)
            except Exception:
                log.exception("proxy restart failed; retrying in %.1fs", backoff)
                backoff = min(backoff * 2, 10.0)
