"""Egress isolation from inside real sandboxes, the same scenarios on every runtime.

For `docker` these prove that joining the container to the sandgate netns leaves it exactly the
guarantees of the local runtime: the only TCP path is the proxy's transparent port (the listener
reports SO_ORIGINAL_DST), UDP other than DNS, ICMP and IPv6 go nowhere, a closed proxy port means
connection refused, and two sandboxes never reach each other.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docker.conftest import RUNTIMES, make_harness
from tests.runtime.harness import Harness, Listeners

pytestmark = pytest.mark.root

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

RAW_ICMP_ECHO = r"""
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


def in_netns(netns_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["nsenter", f"--net={netns_path}", "--", *argv], capture_output=True, text=True)


def test_the_only_tcp_path_is_the_transparent_port(sandboxes: Harness, listeners: Listeners) -> None:
    host_service = 25111
    checks = [
        ("tcp", "198.51.100.7", 443),
        ("tcp", "203.0.113.9", 80),
        ("tcp", "GATEWAY", 22),
        ("tcp", "GATEWAY", host_service),
        ("udp", "198.51.100.7", 443),
        ("udp", "GATEWAY", host_service),
        ("tcp6", "2001:db8::10", 443),
    ]
    with Listeners.extra_service(host_service) as service_hits:
        sandbox_id, net = sandboxes.probe([checks])
        results = dict(zip(checks, sandboxes.phase(sandbox_id, 0), strict=True))
    assert results[("tcp", "198.51.100.7", 443)] == {"ok": "orig=198.51.100.7:443"}
    assert results[("tcp", "203.0.113.9", 80)] == {"ok": "orig=203.0.113.9:80"}
    assert results[("tcp", "GATEWAY", 22)] == {"ok": f"orig={net.gateway}:22"}
    assert results[("tcp", "GATEWAY", host_service)] == {"ok": f"orig={net.gateway}:{host_service}"}
    for unreachable in [
        ("udp", "198.51.100.7", 443),
        ("udp", "GATEWAY", host_service),
        ("tcp6", "2001:db8::10", 443),
    ]:
        assert "error" in results[unreachable], (unreachable, results[unreachable])
    assert service_hits == []


def test_the_sandbox_has_one_interface_one_route_and_no_ipv6(
    sandboxes: Harness, listeners: Listeners
) -> None:
    _, net = sandboxes.start(["sleep", "3600"])
    links = in_netns(net.netns_path, "ip", "-o", "link", "show").stdout
    assert [line.split(":")[1].strip().split("@")[0] for line in links.splitlines()] == ["lo", "eth0"]
    routes = in_netns(net.netns_path, "ip", "-4", "route", "show").stdout.splitlines()
    assert routes[0].startswith(f"default via {net.gateway} dev eth0")
    assert len(routes) == 2  # the default and the /30 on-link route, nothing else
    assert in_netns(net.netns_path, "cat", "/proc/sys/net/ipv6/conf/all/disable_ipv6").stdout.strip() == "1"
    assert "inet6" not in in_netns(net.netns_path, "ip", "-6", "addr").stdout
    # Raw ICMP needs CAP_NET_RAW, which no sandbox process has; root in the netns plays the worst case.
    for target in (net.gateway, "198.51.100.7"):
        assert (
            in_netns(net.netns_path, sys.executable, "-c", RAW_ICMP_ECHO, target).stdout.strip() == "no-reply"
        )


@pytest.fixture(params=RUNTIMES)
def own_sandboxes(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    harness = make_harness(request.param, tmp_path, request)
    try:
        yield harness
    finally:
        harness.close()


def test_egress_fails_closed_when_the_proxy_is_down(own_sandboxes: Harness) -> None:
    proxy = Listeners(own_sandboxes.ports)
    try:
        sandbox_id, _ = own_sandboxes.probe([[("tcp", "198.51.100.7", 443)], [("tcp", "198.51.100.7", 443)]])
        assert own_sandboxes.phase(sandbox_id, 0) == [{"ok": "orig=198.51.100.7:443"}]
        proxy.stop_transparent()
        assert own_sandboxes.phase(sandbox_id, 1) == [{"error": "ConnectionRefusedError", "errno": 111}]
    finally:
        proxy.close()


def test_two_sandboxes_cannot_reach_each_other(sandboxes: Harness, listeners: Listeners) -> None:
    image_python = "python3" if sandboxes.runtime.name == "docker" else "/proc/self/exe"
    _, target = sandboxes.start([image_python, "-I", "-c", ECHO_SERVER])
    # Positive control: from the host the target's echo server answers, so it really listens.
    hello = f"import socket;print(socket.create_connection(('{target.address}', 7777), 2).recv(50))"
    assert "echo-tcp" in subprocess.run([sys.executable, "-c", hello], capture_output=True, text=True).stdout
    prober_id, _ = sandboxes.probe([[("tcp", target.address, 7777), ("udp", target.address, 7777)]])
    tcp, udp = sandboxes.phase(prober_id, 0)
    assert tcp == {"ok": f"orig={target.address}:7777"}  # it reached the proxy, not the other sandbox
    assert "error" in udp
