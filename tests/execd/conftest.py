"""A real execd process per test module: `python -m sandgate.execd` on 127.0.0.1, a free port,
`--root` a temporary directory; stopped (by PID) when the module is done, also on failure."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import httpx
import pytest


@dataclass
class Execd:
    process: subprocess.Popen[bytes]
    port: int
    root: Path | None
    token: str | None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.endpoint}"

    def headers(self) -> dict[str, str]:
        return {"X-EXECD-ACCESS-TOKEN": self.token} if self.token else {}

    def client(self, **kwargs: object) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers(), timeout=30, **kwargs)  # type: ignore[arg-type]

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS in /proc status")

    def sdk_endpoint(self):  # type: ignore[no-untyped-def]
        from opensandbox.models.sandboxes import SandboxEndpoint

        return SandboxEndpoint(endpoint=self.endpoint, headers=self.headers())

    def sdk_config(self):  # type: ignore[no-untyped-def]
        from opensandbox.config.connection_sync import ConnectionConfigSync

        return ConnectionConfigSync(domain=self.endpoint, request_timeout=timedelta(seconds=60))

    def sdk_commands(self):  # type: ignore[no-untyped-def]
        from opensandbox.sync.adapters.command_adapter import CommandsAdapterSync

        return CommandsAdapterSync(self.sdk_config(), self.sdk_endpoint())

    def sdk_files(self):  # type: ignore[no-untyped-def]
        from opensandbox.sync.adapters.filesystem_adapter import FilesystemAdapterSync

        return FilesystemAdapterSync(self.sdk_config(), self.sdk_endpoint())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_execd(
    root: Path | None = None, token: str | None = None, env: dict[str, str] | None = None
) -> Execd:
    port = free_port()
    argv = [sys.executable, "-m", "sandgate.execd", "--host", "127.0.0.1", "--port", str(port)]
    if root is not None:
        argv += ["--root", str(root)]
    if token is not None:
        argv += ["--token", token]
    # as in a sandbox, nothing of pytest's: ipykernel skips capturing fd output under pytest
    inherited = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    process = subprocess.Popen(argv, env={**inherited, **(env or {})}, cwd=root or None)
    execd = Execd(process, port, root, token)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"execd exited with {process.returncode} before answering /ping")
        try:
            if httpx.get(f"{execd.url}/ping", timeout=1).status_code == 200:
                return execd
        except httpx.TransportError:
            time.sleep(0.02)
    stop_execd(execd)
    raise AssertionError("execd did not answer /ping within 10 s")


def stop_execd(execd: Execd) -> None:
    if execd.process.poll() is None:
        execd.process.send_signal(signal.SIGTERM)
        try:
            execd.process.wait(10)
        except subprocess.TimeoutExpired:
            execd.process.kill()
            execd.process.wait()


@pytest.fixture(scope="module")
def execd_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("execd-root")


@pytest.fixture(scope="module")
def execd(execd_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Execd]:
    env_file = tmp_path_factory.mktemp("execd-envs") / "envs"
    server = start_execd(root=execd_root, env={"EXECD_ENVS": str(env_file)})
    try:
        yield server
    finally:
        stop_execd(server)
