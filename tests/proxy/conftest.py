"""Fixtures for the proxy's integration tests: the test internet, a real proxy process, and a
client namespace whose traffic nftables redirects to the proxy (the product's sandbox network in
miniature: one veth, a /30, UDP and TCP port 53 -> DNS port, other TCP -> transparent port,
explicit port open)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandgate.lifecycle.proxy_supervisor import secrets_pipe
from sandgate.proxy import ProxyConfig, ProxyControl, SandboxEntry
from tests.support.audit import audit_records
from tests.support.internet import DNS_ADDR, Internet, start_internet
from tests.support.netns import Netns, ip, unique

TRANSPARENT_PORT, EXPLICIT_PORT, DNS_PORT = 15001, 15002, 15053
GATEWAY, CLIENT_ADDR = "10.213.0.1", "10.213.0.2"
START_TIMEOUT = 60.0  # a bound, not a goal: the worker pool starts several processes


@dataclass
class RunningProxy:
    config: ProxyConfig
    process: subprocess.Popen[bytes]
    control: ProxyControl

    @property
    def ca_cert(self) -> Path:
        return self.config.state_dir / "mitmproxy-ca-cert.pem"

    def audit(self) -> list[dict[str, Any]]:
        """The records, one per id (a request's whole record replaces its write-ahead line)."""
        return audit_records(self.config.state_dir)

    def audit_lines(self) -> list[dict[str, Any]]:
        """Every line of the live file as written, write-ahead lines included."""
        path = self.config.audit_path
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def put_raw(self, sandbox_id: str, address: str, policy: Any, socket: Path | None = None) -> int:
        """PUT an entry whose policy is any JSON (a typed `SandboxEntry` cannot hold a bad one)
        on the control socket (`socket`: a worker's); the status it answers."""
        body = {"sandbox_id": sandbox_id, "address": address, "policy": policy}
        transport = httpx.HTTPTransport(uds=str(socket or self.config.socket_path))
        with httpx.Client(transport=transport, base_url="http://proxy") as client:
            return client.put(f"/sandboxes/{address}", json=body).status_code

    def wait_audit(self, count: int, timeout: float = 5.0, **match: Any) -> list[dict[str, Any]]:
        """Records matching `match`, once there are at least `count` (records are written at request end)."""
        deadline = time.monotonic() + timeout
        while True:
            found = [r for r in self.audit() if all(r.get(k) == v for k, v in match.items())]
            if len(found) >= count or time.monotonic() > deadline:
                return found
            time.sleep(0.05)


def start_proxy(
    state_dir: Path, internet: Internet, sandboxes: list[SandboxEntry] = (), **extra: Any
) -> RunningProxy:
    config = ProxyConfig(
        state_dir=state_dir,
        transparent_port=TRANSPARENT_PORT,
        explicit_port=EXPLICIT_PORT,
        dns_port=DNS_PORT,
        upstream_ca=internet.ca_cert,
        sandboxes=list(sandboxes),
        **{"upstream_dns": [DNS_ADDR], **extra},
    )
    state_dir.mkdir(parents=True, exist_ok=True)
    config_file = state_dir / "proxy.json"
    config_file.write_text(config.model_dump_json())
    log = (state_dir / "proxy.log").open("wb")
    # The vault's secrets go through a pipe, as lifecycle hands them over (never the config file).
    with secrets_pipe(config.vault_secrets.revealed_json() if config.vault else None) as fds:
        process = subprocess.Popen(
            [sys.executable, "-m", "sandgate.proxy", "--config", str(config_file), "--log-level", "INFO"]
            + [arg for fd in fds for arg in ("--secrets-fd", str(fd))],
            stdout=log,
            stderr=subprocess.STDOUT,
            pass_fds=fds,
        )
    control = ProxyControl(config.socket_path)
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        try:
            control.health()
            break
        except Exception:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"proxy did not start:\n{(state_dir / 'proxy.log').read_text()}") from None
            time.sleep(0.05)
    return RunningProxy(config, process, control)


def stop_proxy(proxy: RunningProxy) -> None:
    proxy.control.close()
    if proxy.process.poll() is None:
        proxy.process.terminate()
        try:
            proxy.process.wait(10)
        except subprocess.TimeoutExpired:
            proxy.process.kill()
            proxy.process.wait(5)


@dataclass
class Client:
    ns: Netns
    host_if: str
    address: str = CLIENT_ADDR

    def run(self, argv: list[str], timeout: float = 20) -> subprocess.CompletedProcess[str]:
        return self.ns.run(argv, timeout=timeout)

    def curl(self, *args: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
        return self.run(["curl", "-sS", "--max-time", "10", *args], timeout=timeout)

    def python(self, code: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
        return self.run([sys.executable, "-c", code], timeout=timeout)


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Internet]:
    """One test internet per module (starting one costs about a second)."""
    with start_internet(tmp_path_factory.mktemp("internet")) as running:
        yield running


@contextlib.contextmanager
def client_netns(gateway: str = GATEWAY, address: str = CLIENT_ADDR) -> Iterator[Client]:
    """A client namespace on its own /30 whose TCP nftables redirects to the proxy (a sandbox)."""
    ns = Netns("sgc")
    host_if = unique("tvc")
    table = unique("sgtest")
    try:
        ip("link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", ns.name)
        ip("addr", "add", f"{gateway}/30", "dev", host_if)
        ip("link", "set", host_if, "up")
        ip("addr", "add", f"{address}/30", "dev", "eth0", netns=ns.name)
        ip("link", "set", "eth0", "up", netns=ns.name)
        ip("route", "add", "default", "via", gateway, netns=ns.name)
        rules = f"""
table inet {table} {{
  chain prerouting {{
    type nat hook prerouting priority dstnat; policy accept;
    iifname "{host_if}" ip daddr {gateway} tcp dport {EXPLICIT_PORT} accept
    iifname "{host_if}" meta l4proto {{ tcp, udp }} th dport 53 redirect to :{DNS_PORT}
    iifname "{host_if}" meta l4proto tcp redirect to :{TRANSPARENT_PORT}
  }}
}}
"""
        subprocess.run(["nft", "-f", "-"], input=rules, text=True, check=True, capture_output=True)
        yield Client(ns, host_if, address)
    finally:
        subprocess.run(["nft", "delete", "table", "inet", table], capture_output=True)
        subprocess.run(["ip", "link", "del", host_if], capture_output=True)
        ns.delete()


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    with client_netns() as running:
        yield running
