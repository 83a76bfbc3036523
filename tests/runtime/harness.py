"""Real sandboxes for tests: SandboxNetworks + LocalRuntime in the test's own "host" netns.

Each Harness has its own nft table, interface prefix, address pool, instance tag and state dir,
and `close()` removes everything it made (also after a failed test). `Listeners` stand in for the
proxy's ports on the host: the transparent listener answers every connection with the original
destination it reads with SO_ORIGINAL_DST, so a test sees where a sandbox's connect really went.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from ipaddress import IPv4Network
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from sandgate.lifecycle.confinement import ProxyPorts, SandboxNet, SandboxNetworks
from sandgate.lifecycle.images import ImageStore
from sandgate.lifecycle.runtime.base import SandboxSpec
from sandgate.lifecycle.runtime.local import LocalRuntime

SO_ORIGINAL_DST = 80

# The probe runs inside a sandbox: phases of checks, results to /workspace/phase<i>.json; before
# phase i > 0 it waits for /workspace/go<i>. Each check is [kind, host, port]; host GATEWAY is the
# sandbox's default gateway.
PROBE = r"""
import json, os, socket, sys, time
def gateway():
    for line in open("/proc/net/route").read().splitlines()[1:]:
        fields = line.split()
        if fields[1] == "00000000":
            return socket.inet_ntoa(bytes.fromhex(fields[2])[::-1])
def run(kind, host, port):
    host = gateway() if host == "GATEWAY" else host
    family = socket.AF_INET6 if kind.endswith("6") else socket.AF_INET
    udp = kind.startswith("udp")
    s = socket.socket(family, socket.SOCK_DGRAM if udp else socket.SOCK_STREAM)
    s.settimeout(1.5)
    try:
        s.connect((host, port))
        if udp:
            s.send(b"probe")
        return {"ok": s.recv(200).decode(errors="replace").strip()}
    except OSError as exc:
        return {"error": type(exc).__name__, "errno": exc.errno}
    finally:
        s.close()
for i, phase in enumerate(json.loads(sys.argv[1])):
    while i and not os.path.exists(f"/workspace/go{i}"):
        time.sleep(0.01)
    results = [run(*check) for check in phase]
    with open(f"/workspace/.phase{i}", "w") as out:
        json.dump(results, out)
    os.rename(f"/workspace/.phase{i}", f"/workspace/phase{i}.json")
time.sleep(3600)
"""

# A TCP and UDP echo server on port 7777, for a sandbox that others must not reach.
ECHO_SERVER = r"""
import socket, threading
def tcp():
    s = socket.create_server(("0.0.0.0", 7777))
    while True:
        c, _ = s.accept(); c.sendall(b"echo-tcp\n"); c.close()
threading.Thread(target=tcp, daemon=True).start()
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("0.0.0.0", 7777))
while True:
    d, p = u.recvfrom(100); u.sendto(b"echo-udp", p)
"""

# One raw ICMP echo request to argv[1]; prints "reply <addr>" or "no-reply" (after a second).
ICMP_ECHO = r"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP); s.settimeout(1)
s.sendto(bytes.fromhex("0800f7ff00000000"), (sys.argv[1], 0))
try:
    while True:
        data, peer = s.recvfrom(200)
        if data[20] == 0:
            print("reply", peer[0]); break
except TimeoutError:
    print("no-reply")
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return int(s.getsockname()[1])


class Closing:
    """`with X(...) as x:` closes x at the end, also when the block failed."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class Harness(Closing):
    def __init__(self, state_dir: Path, ports: ProxyPorts | None = None, isolation: str = "standard") -> None:
        self.isolation = isolation  # what `start` asks for unless told otherwise
        self.ports = ports or ProxyPorts(transparent=free_port(), dns=free_port(), explicit=free_port())
        self.networks = SandboxNetworks(
            table=f"sgtest_{secrets.token_hex(3)}",
            iface_prefix=f"t{secrets.token_hex(2)}",
            address_pool=IPv4Network(f"10.214.{secrets.randbelow(256)}.0/24"),
            instance=secrets.token_hex(3),
            ports=self.ports,
        )
        self.networks.ensure_table()
        self.state_dir = state_dir
        self.images = ImageStore(state_dir / "images")
        self.runtime = LocalRuntime(state_dir, self.images, instance=self.networks.instance)
        self.nets: dict[str, SandboxNet] = {}

    def start(self, entrypoint: list[str], *, ready: bool = True, **spec: Any) -> tuple[str, SandboxNet]:
        sandbox_id = f"sb{secrets.token_hex(4)}"
        net = self.networks.create(sandbox_id)
        self.nets[sandbox_id] = net
        image = str(spec.pop("image", "sandgate/host"))
        spec.setdefault("isolation", self.isolation)
        try:
            self.runtime.create(SandboxSpec(sandbox_id, image, entrypoint, **spec), net)
            if ready:
                self.runtime.wait_ready(sandbox_id, net, timeout=30)
        except BaseException:
            self.stop(sandbox_id)  # a failed start leaves nothing for the module's later tests
            raise
        return sandbox_id, net

    def probe(self, phases: list[list[tuple[str, str, int]]], **spec: Any) -> tuple[str, SandboxNet]:
        return self.start(["/proc/self/exe", "-I", "-c", PROBE, json.dumps(phases)], **spec)

    def stop(self, sandbox_id: str) -> None:
        self.runtime.delete(sandbox_id)
        self.networks.destroy(sandbox_id)
        self.nets.pop(sandbox_id, None)

    def workspace(self, sandbox_id: str) -> Path:
        return self.runtime.root_path(sandbox_id) / "workspace"

    def wait_file(self, sandbox_id: str, name: str, timeout: float = 20.0) -> str:
        path = self.workspace(sandbox_id) / name
        deadline = time.monotonic() + timeout
        while not path.exists():
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{name} never appeared; sandbox output: {self.runtime.log_tail(sandbox_id)}"
                )
            time.sleep(0.01)
        return path.read_text()

    def phase(self, sandbox_id: str, index: int) -> list[dict[str, object]]:
        if index:
            (self.workspace(sandbox_id) / f"go{index}").touch()
        return list(json.loads(self.wait_file(sandbox_id, f"phase{index}.json")))

    def close(self) -> None:
        for sandbox_id in list(self.nets):
            self.stop(sandbox_id)
        self.networks.remove_table()


class Listeners(Closing):
    """The proxy's ports on the host, played by tiny servers that say who they are."""

    def __init__(self, ports: ProxyPorts) -> None:
        self.original_dsts: list[str] = []
        self.dns_queries: list[bytes] = []
        self._sockets: list[socket.socket] = []
        self.transparent = self._tcp(ports.transparent, self._report_original_dst)
        self._tcp(ports.dns, lambda conn: conn.sendall(b"dns-tcp\n"))
        self._tcp(ports.explicit, lambda conn: conn.sendall(b"explicit\n"))
        self._udp(ports.dns)

    def _tcp(self, port: int, answer: object) -> socket.socket:
        server = socket.create_server(("0.0.0.0", port), reuse_port=False)
        self._sockets.append(server)

        def serve() -> None:
            while True:
                try:
                    conn, _ = server.accept()
                except OSError:
                    return
                with conn:
                    answer(conn)  # type: ignore[operator]

        threading.Thread(target=serve, daemon=True).start()
        return server

    def _udp(self, port: int) -> None:
        server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        server.bind(("0.0.0.0", port))
        self._sockets.append(server)

        def serve() -> None:
            while True:
                try:
                    data, peer = server.recvfrom(2048)
                except OSError:
                    return
                if peer is None:  # closed
                    return
                self.dns_queries.append(data)
                server.sendto(b"dns-udp", peer)

        threading.Thread(target=serve, daemon=True).start()

    def _report_original_dst(self, conn: socket.socket) -> None:
        raw = conn.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
        port, address = struct.unpack_from("!2xH4s", raw)
        original = f"{socket.inet_ntoa(address)}:{port}"
        self.original_dsts.append(original)
        conn.sendall(f"orig={original}\n".encode())

    @staticmethod
    @contextlib.contextmanager
    def extra_service(port: int) -> Iterator[list[str]]:
        """A host service on TCP and UDP `port`; yields the list of hits it got."""
        hits: list[str] = []
        tcp = socket.create_server(("0.0.0.0", port))
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.bind(("0.0.0.0", port))

        def serve_tcp() -> None:
            with contextlib.suppress(OSError):
                while True:
                    conn, peer = tcp.accept()
                    hits.append(f"tcp from {peer[0]}")
                    conn.sendall(b"service\n")
                    conn.close()

        def serve_udp() -> None:
            with contextlib.suppress(OSError):
                while True:
                    _, peer = udp.recvfrom(100)
                    if peer is None:  # closed
                        return
                    hits.append(f"udp from {peer[0]}")

        threading.Thread(target=serve_tcp, daemon=True).start()
        threading.Thread(target=serve_udp, daemon=True).start()
        try:
            yield hits
        finally:
            _close(tcp)
            _close(udp)

    def stop_transparent(self) -> None:
        _close(self.transparent)

    def close(self) -> None:
        for server in self._sockets:
            _close(server)


def in_netns(netns_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """Run argv as root in the sandbox's netns (more than a sandbox process may do)."""
    return subprocess.run(["nsenter", f"--net={netns_path}", "--", *argv], capture_output=True, text=True)


def assert_egress_fails_closed_when_the_proxy_is_down(harness: Harness) -> None:
    """With the transparent port closed, a sandbox's connect is refused, never routed around."""
    with Listeners(harness.ports) as proxy:
        sandbox_id, _ = harness.probe([[("tcp", "198.51.100.7", 443)], [("tcp", "198.51.100.7", 443)]])
        assert harness.phase(sandbox_id, 0) == [{"ok": "orig=198.51.100.7:443"}]
        proxy.stop_transparent()
        assert harness.phase(sandbox_id, 1) == [{"error": "ConnectionRefusedError", "errno": 111}]


def assert_two_sandboxes_cannot_reach_each_other(harness: Harness) -> None:
    """A sandbox's TCP to another sandbox lands at the proxy; its UDP goes nowhere."""
    image_python = "python3" if harness.runtime.name == "docker" else "/proc/self/exe"
    _, target = harness.start([image_python, "-I", "-c", ECHO_SERVER])
    # Positive control: from the host the target's echo server answers, so it really listens.
    hello = f"import socket;print(socket.create_connection(('{target.address}', 7777), 2).recv(50))"
    reply = subprocess.run([sys.executable, "-c", hello], capture_output=True, text=True)
    assert "echo-tcp" in reply.stdout, reply
    prober_id, _ = harness.probe([[("tcp", target.address, 7777), ("udp", target.address, 7777)]])
    tcp, udp = harness.phase(prober_id, 0)
    assert tcp == {"ok": f"orig={target.address}:7777"}  # it reached the proxy, not the other sandbox
    assert "error" in udp


def _close(server: socket.socket) -> None:
    with contextlib.suppress(OSError):
        server.shutdown(socket.SHUT_RDWR)
    server.close()
