"""A real `sandgate serve` for tests: its own state dir, port, nft table and veth prefix.

Use it as a context manager (or through a fixture):

    with sandgate_server(tmp_path) as server:
        server.client().get("/v1/sandboxes")          # httpx client with the API key set
        server.create_sandbox(network_policy=...)      # -> the JSON the API answered
        server.run(sandbox_id, "curl -sS http://api.example.com/")   # -> CommandResult via execd
        server.proxy_pid()                              # the supervised proxy child, to kill it
        server.restart()                               # same state dir: re-adoption

The server runs in the test process's network namespace (conftest moves pytest into a fresh
one, which plays "the host"), so sandboxes it creates are reachable at their addresses from the
test, and nothing reaches the machine's real network. Several servers may share that namespace
(a package-scoped one and a module's own), so each gets its own API port, proxy ports, address
pool, nft table and veth prefix: two proxies on the same port would leave the second one
restarting forever. `env()` gives the OPEN_SANDBOX_* variables
the OpenSandbox SDK, `osb` and `opensandbox-mcp` read. Everything the server made (sandboxes,
netns, veths, the nft table, the proxy child) is removed on exit, also when the test failed.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from ipaddress import IPv4Network
from pathlib import Path
from typing import Any

import httpx

SANDGATE = [sys.executable, "-m", "sandgate.lifecycle.cli"]
START_TIMEOUT = 120.0  # generous: a loaded CI machine imports mitmproxy slowly


TEST_POOLS = IPv4Network("10.216.0.0/14")  # test servers' address pools, one /22 each
_pool_numbers = itertools.count()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def free_ports(count: int) -> list[int]:
    """`count` distinct ports free for both TCP and UDP on every address (the proxy's DNS is UDP)."""
    held: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < count:
            udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            held.append(udp)
            udp.bind(("0.0.0.0", 0))
            port = int(udp.getsockname()[1])
            tcp = socket.socket()
            held.append(tcp)
            with contextlib.suppress(OSError):
                tcp.bind(("0.0.0.0", port))
                ports.append(port)
    finally:
        for sock in held:
            sock.close()
    return ports


def next_address_pool() -> IPv4Network:
    subnets = TEST_POOLS.subnets(new_prefix=22)
    return next(itertools.islice(subnets, next(_pool_numbers) % 256, None))


@dataclass(frozen=True)
class CommandResult:
    exit_code: int
    stdout: str
    stderr: str


def parse_execd_events(body: str) -> CommandResult:
    """execd's command stream (one JSON object per blank-line separated frame) -> its result."""
    out: dict[str, list[str]] = {"stdout": [], "stderr": []}
    exit_code: int | None = None
    for frame in body.split("\n\n"):
        if not frame.strip():
            continue
        event = json.loads(frame.strip().removeprefix("data:"))
        if event["type"] in out:
            out[event["type"]].append(event.get("text", ""))
        elif event["type"] == "execution_complete":
            exit_code = 0
        elif event["type"] == "error":
            evalue = event["error"]["evalue"]
            exit_code = int(evalue) if evalue.lstrip("-").isdigit() else -1
    if exit_code is None:
        raise AssertionError(f"execd's stream ended without a result:\n{body[-2000:]}")
    return CommandResult(exit_code, "\n".join(out["stdout"]), "\n".join(out["stderr"]))  # a line each


class SandgateServer:
    def __init__(
        self,
        state_dir: Path,
        extra_env: dict[str, str] | None = None,
        generated_key: bool = False,
        log_level: str = "warning",
        api_key: str | None = None,
    ) -> None:
        """`generated_key`: start without SANDGATE_API_KEY, as on a first start; `api_key` is then
        read from the state dir once the server answers. `log_level` info logs every request.
        `api_key`: this key instead of a random one."""
        self.state_dir = state_dir
        self.port = free_port()
        self.generated_key = generated_key
        self.log_level = log_level
        self.api_key = api_key or ("" if generated_key else secrets.token_urlsafe(16))
        self.nft_table = f"sgt{secrets.token_hex(3)}"
        self.iface_prefix = f"t{secrets.token_hex(2)}"
        self.proxy_ports = dict(zip(("TRANSPARENT", "EXPLICIT", "DNS"), free_ports(3), strict=True))
        self.address_pool = next_address_pool()
        self.log_path = state_dir.parent / f"serve-{self.port}.log"
        self.extra_env = extra_env or {}
        self.process: subprocess.Popen[bytes] | None = None
        # what the client scenarios create from: the runtime's base image (a Pod needs a pullable one)
        self.sandbox_image = "sandgate/host"

    @property
    def domain(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"http://{self.domain}"

    def env(self) -> dict[str, str]:
        """Environment for OpenSandbox clients (SDK, osb, opensandbox-mcp) pointed at this server."""
        return {
            **os.environ,
            "OPEN_SANDBOX_DOMAIN": self.domain,
            "OPEN_SANDBOX_API_KEY": self.api_key,
            "OPEN_SANDBOX_PROTOCOL": "http",
            "OPENSANDBOX_DISABLE_METRICS": "1",
            "NO_PROXY": "*",
        }

    def server_env(self) -> dict[str, str]:
        return {
            **os.environ,
            "SANDGATE_STATE_DIR": str(self.state_dir),
            "SANDGATE_HOST": "127.0.0.1",
            "SANDGATE_PORT": str(self.port),
            **({} if self.generated_key else {"SANDGATE_API_KEY": self.api_key}),
            "SANDGATE_NFT_TABLE": self.nft_table,
            "SANDGATE_IFACE_PREFIX": self.iface_prefix,
            "SANDGATE_ADDRESS_POOL": str(self.address_pool),
            **{f"SANDGATE_PROXY_{name}_PORT": str(port) for name, port in self.proxy_ports.items()},
            **self.extra_env,
        }

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [*SANDGATE, "serve", "--log-level", self.log_level],
                env=self.server_env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"sandgate serve exited ({self.process.returncode}):\n{self.log()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base_url}/health", timeout=1).status_code == 200:
                    if self.generated_key:
                        self.api_key = (self.state_dir / "api_key").read_text().strip()
                    return
            time.sleep(0.05)
        raise RuntimeError(f"sandgate serve did not answer /health in {START_TIMEOUT}s:\n{self.log()}")

    def stop(self) -> None:
        """Stop the server with SIGTERM, as a service manager does (sandboxes keep running, as
        after a real restart)."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:] if self.log_path.exists() else ""

    def client(self, timeout: float = 30.0, **kwargs: Any) -> httpx.Client:
        headers = {"OPEN-SANDBOX-API-KEY": self.api_key}
        return httpx.Client(
            base_url=self.base_url, headers=headers, timeout=timeout, trust_env=False, **kwargs
        )

    def create_sandbox(self, **fields: Any) -> dict[str, Any]:
        """POST /v1/sandboxes with the local host image; camelCase keys pass through as given."""
        body = {"image": {"uri": "sandgate/host"}, "entrypoint": ["sleep", "infinity"], "resourceLimits": {}}
        body.update(fields)
        with self.client() as client:
            response = client.post("/v1/sandboxes", json=body)
        if response.status_code != 202:
            raise AssertionError(f"create answered {response.status_code}: {response.text}")
        return response.json()  # type: ignore[no-any-return]

    def run(
        self, sandbox_id: str, command: str, timeout: float = 60.0, background: bool = False
    ) -> CommandResult:
        """Run a shell command in the sandbox (execd reached through the server's reverse proxy);
        a background command answers at once and keeps running."""
        body: dict[str, Any] = {"command": command, "background": background}
        if not background:
            body["timeout"] = int(timeout * 1000)
        with self.client(timeout=timeout) as client:
            response = client.post(f"/v1/sandboxes/{sandbox_id}/proxy/44772/command", json=body)
        if response.status_code != 200:
            raise AssertionError(f"execd answered {response.status_code}: {response.text}")
        return parse_execd_events(response.text)

    def vault_put(self, name: str, value: str) -> None:
        """Store a vault entry as an operator does: `sandgate vault put NAME`, value on stdin."""
        stored = subprocess.run(
            [sys.executable, "-m", "sandgate.lifecycle.cli", "vault", "put", name],
            input=value,
            env={**self.env(), "SANDGATE_STATE_DIR": str(self.state_dir)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert stored.returncode == 0, stored.stderr

    def sandbox_address(self, sandbox_id: str) -> str:
        """The sandbox's own address (from its diagnostics summary: endpoints name the host's)."""
        with self.client() as client:
            summary = client.get(f"/v1/sandboxes/{sandbox_id}/diagnostics/summary").text
        return next(line.split()[1] for line in summary.splitlines() if line.startswith("address "))

    def proxy_pid(self) -> int:
        """PID of the proxy child this server supervises now (it changes when it is restarted)."""
        assert self.process is not None, "the server is not running"
        config = str(self.state_dir / "proxy.json").encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if parent == self.process.pid and b"sandgate.proxy" in argv and config in argv:
                    return int(entry.name)
        raise LookupError(f"no proxy child of server pid {self.process.pid} (is it restarting?)")

    def delete_all(self) -> None:
        with self.client() as client:
            for item in client.get("/v1/sandboxes", params={"pageSize": 200}).json().get("items", []):
                client.delete(f"/v1/sandboxes/{item['id']}")

    def down(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`sandgate down ARGS` for this server's state dir and settings."""
        return subprocess.run(
            [*SANDGATE, "down", *args], env=self.server_env(), capture_output=True, text=True, timeout=120
        )

    def remove_leftovers(self) -> None:
        """Whatever a crashed server, or a test that failed before deleting its sandboxes, left:
        sandboxes still running (`sandgate down --sandboxes`), then the nft table."""
        sandboxes = self.state_dir / "sandboxes"
        if (self.state_dir / "instance-tag").exists() and sandboxes.is_dir() and any(sandboxes.iterdir()):
            self.down("--sandboxes")
        subprocess.run(["nft", "delete", "table", "inet", self.nft_table], capture_output=True)


@contextlib.contextmanager
def sandgate_server(
    tmp_path: Path, extra_env: dict[str, str] | None = None, **options: Any
) -> Iterator[SandgateServer]:
    """A started server (`options`: SandgateServer's generated_key, log_level, api_key)."""
    state_dir = tmp_path / "state"
    server = SandgateServer(state_dir, extra_env, **options)
    try:
        server.start()
        yield server
    finally:
        with contextlib.suppress(Exception):
            if server.process is None:
                server.start()
            server.delete_all()
        server.stop()
        server.remove_leftovers()
