"""A real OpenBao dev server on a free loopback port, for the vault tests.

`bao server -dev` keeps everything in memory, unseals itself and mounts KV v2 at `secret/`.
It runs with HOME in a temporary directory (the dev server writes a token helper file there),
and is stopped by its PID, also when the test fails.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

BAO = Path(sys.executable).with_name("bao")
START_TIMEOUT = 20.0


@dataclass(frozen=True)
class OpenBao:
    addr: str
    root_token: str


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def openbao_dev_server(listen: str | None = None, netns: str | None = None) -> Iterator[OpenBao]:
    """`listen` (host:port, default a free loopback port) in the network namespace `netns` (a
    named one, entered with nsenter; default this process's): a cluster node's, for a server
    that runs there."""
    listen = listen or f"127.0.0.1:{free_port()}"
    token = "root-" + secrets.token_hex(8)
    addr = f"http://{listen}"
    enter = ["nsenter", f"--net=/run/netns/{netns}", "--"] if netns else []
    with tempfile.TemporaryDirectory(prefix="sandgate-bao-") as home:
        log = Path(home) / "bao.log"
        with log.open("wb") as log_file:
            process = subprocess.Popen(
                [
                    *enter,
                    str(BAO),
                    "server",
                    "-dev",
                    f"-dev-listen-address={listen}",
                    f"-dev-root-token-id={token}",
                ],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env={**os.environ, "HOME": home, "BAO_ADDR": addr, "VAULT_ADDR": addr},
            )
            try:
                _wait_until_ready(addr, process, log)
                yield OpenBao(addr, token)
            finally:
                process.terminate()
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=10)


def _wait_until_ready(addr: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"bao server -dev exited with {process.returncode}:\n{log.read_text()[-2000:]}"
            )
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{addr}/v1/sys/health", timeout=1.0).status_code == 200:
                return
        time.sleep(0.05)
    raise RuntimeError(
        f"bao server -dev did not answer on {addr} within {START_TIMEOUT}s:\n{log.read_text()[-2000:]}"
    )
