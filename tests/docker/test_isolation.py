"""Egress isolation from inside real sandboxes, the same scenarios on every runtime.

For `docker` these prove that joining the container to the sandgate netns leaves it exactly the
guarantees of the local runtime: the only TCP path is the proxy's transparent port (the listener
reports SO_ORIGINAL_DST), UDP other than DNS, ICMP and IPv6 go nowhere, a closed proxy port means
connection refused, and two sandboxes never reach each other.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docker.conftest import RUNTIMES, make_harness
from tests.runtime.harness import (
    ICMP_ECHO,
    Harness,
    Listeners,
    assert_egress_fails_closed_when_the_proxy_is_down,
    assert_two_sandboxes_cannot_reach_each_other,
    in_netns,
)

pytestmark = pytest.mark.root


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
        assert in_netns(net.netns_path, sys.executable, "-c", ICMP_ECHO, target).stdout.strip() == "no-reply"


@pytest.fixture(params=RUNTIMES)
def own_sandboxes(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    with make_harness(request.param, tmp_path, request) as harness:
        yield harness


def test_egress_fails_closed_when_the_proxy_is_down(own_sandboxes: Harness) -> None:
    assert_egress_fails_closed_when_the_proxy_is_down(own_sandboxes)


def test_two_sandboxes_cannot_reach_each_other(sandboxes: Harness, listeners: Listeners) -> None:
    assert_two_sandboxes_cannot_reach_each_other(sandboxes)
