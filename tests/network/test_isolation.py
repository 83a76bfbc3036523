"""From inside real sandboxes (bwrap in their netns): the only way out is the proxy's ports."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandgate.lifecycle.confinement import RUN_NETNS
from tests.runtime.harness import (
    ICMP_ECHO,
    Harness,
    Listeners,
    assert_egress_fails_closed_when_the_proxy_is_down,
    assert_two_sandboxes_cannot_reach_each_other,
)

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    with Harness(tmp_path_factory.mktemp("state")) as harness:
        yield harness


@pytest.fixture(scope="module")
def listeners(harness: Harness) -> Iterator[Listeners]:
    with Listeners(harness.ports) as listeners:
        yield listeners


def test_every_tcp_connect_lands_at_the_transparent_port_and_only_dns_udp_passes(
    harness: Harness, listeners: Listeners
) -> None:
    service, explicit, dns = 25099, harness.ports.explicit, harness.ports.dns
    checks = [
        ("tcp", "198.51.100.7", 443),
        ("tcp", "203.0.113.9", 80),
        ("tcp", "GATEWAY", service),
        ("tcp", "GATEWAY", 22),
        ("tcp", "GATEWAY", explicit),
        ("tcp", "198.51.100.53", 53),
        ("udp", "198.51.100.53", 53),
        ("udp", "198.51.100.7", 443),
        ("udp", "GATEWAY", dns),
        ("udp", "GATEWAY", service),
        ("tcp6", "2001:db8::10", 443),
    ]
    with Listeners.extra_service(service) as service_hits:
        sandbox_id, net = harness.probe([checks])
        results = dict(zip(checks, harness.phase(sandbox_id, 0), strict=True))

    assert results[("tcp", "198.51.100.7", 443)] == {"ok": "orig=198.51.100.7:443"}
    assert results[("tcp", "203.0.113.9", 80)] == {"ok": "orig=203.0.113.9:80"}
    assert results[("tcp", "GATEWAY", service)] == {"ok": f"orig={net.gateway}:{service}"}
    assert results[("tcp", "GATEWAY", 22)] == {"ok": f"orig={net.gateway}:22"}
    assert results[("tcp", "GATEWAY", explicit)] == {"ok": "explicit"}
    assert results[("tcp", "198.51.100.53", 53)] == {"ok": "dns-tcp"}
    assert results[("udp", "198.51.100.53", 53)] == {"ok": "dns-udp"}
    assert listeners.dns_queries.count(b"probe") == 1  # only the port-53 datagram arrived
    assert service_hits == []  # the host's own service on that port saw nothing
    for refused in [
        ("udp", "198.51.100.7", 443),
        ("udp", "GATEWAY", dns),
        ("udp", "GATEWAY", service),
        ("tcp6", "2001:db8::10", 443),
    ]:
        assert "error" in results[refused], (refused, results[refused])


def test_icmp_and_ipv6_are_gone(harness: Harness, listeners: Listeners) -> None:
    _sandbox_id, net = harness.start(["sleep", "3600"])
    inside = ["nsenter", f"--net={net.netns_path}", "--"]
    # Raw ICMP needs CAP_NET_RAW, which sandbox processes lack; root in the netns stands in for
    # the worst case of a sandbox that had it.
    for target in (net.gateway, "198.51.100.7"):
        out = subprocess.run(
            [*inside, sys.executable, "-c", ICMP_ECHO, target], capture_output=True, text=True
        )
        assert out.stdout.strip() == "no-reply", out
    disabled = subprocess.run(
        [*inside, "cat", "/proc/sys/net/ipv6/conf/all/disable_ipv6"], capture_output=True, text=True
    )
    assert disabled.stdout.strip() == "1"
    host_v6 = subprocess.run(
        ["ip", "-6", "addr", "show", "dev", f"{harness.networks.iface_prefix}0"],
        capture_output=True,
        text=True,
    )
    assert "inet6" not in host_v6.stdout


def test_egress_fails_closed_when_the_proxy_is_down(tmp_path: Path) -> None:
    with Harness(tmp_path) as harness:
        assert_egress_fails_closed_when_the_proxy_is_down(harness)


def test_two_sandboxes_cannot_reach_each_other(harness: Harness, listeners: Listeners) -> None:
    assert_two_sandboxes_cannot_reach_each_other(harness)


def test_spoofed_source_addresses_are_dropped(harness: Harness, listeners: Listeners) -> None:
    _, victim = harness.start(["sleep", "3600"])
    _, attacker = harness.start(["sleep", "3600"])
    # Root in the attacker's netns (more than a sandbox process may do) adds the victim's address
    # and sends DNS queries from both; only the one from its own address may reach the resolver.
    inside = ["nsenter", f"--net={attacker.netns_path}", "--"]
    subprocess.run([*inside, "ip", "addr", "add", f"{victim.address}/32", "dev", "eth0"], check=True)
    send = (
        "import socket,sys,time\n"
        f"for source, payload in (('{victim.address}', b'spoofed'), ('{attacker.address}', b'genuine')):\n"
        "    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((source, 0))\n"
        "    s.sendto(payload, ('198.51.100.53', 53)); s.close()\n"
    )
    subprocess.run([*inside, sys.executable, "-c", send], check=True)
    deadline = time.monotonic() + 3
    while b"genuine" not in listeners.dns_queries and time.monotonic() < deadline:
        time.sleep(0.01)
    assert b"genuine" in listeners.dns_queries
    time.sleep(0.2)
    assert b"spoofed" not in listeners.dns_queries


def test_cleanup_leftovers_of_a_crashed_run(harness: Harness, tmp_path: Path) -> None:
    from sandgate.lifecycle.confinement import SandboxNetworks

    crashed = SandboxNetworks(
        table=harness.networks.table,
        iface_prefix=harness.networks.iface_prefix,
        address_pool=harness.networks.address_pool,
        instance=harness.networks.instance,
        ports=harness.ports,
    )
    # Indexes far from the module's live sandboxes, as a previous run would have used them.
    crashed._used.update(range(40))
    kept = crashed.create("kept-one")
    lost = crashed.create("lost-one")
    restarted = SandboxNetworks(
        table=harness.networks.table,
        iface_prefix=harness.networks.iface_prefix,
        address_pool=harness.networks.address_pool,
        instance=harness.networks.instance,
        ports=harness.ports,
    )
    live = set(harness.nets)
    adopted = restarted.cleanup_leftovers(keep={"kept-one", *live})
    assert adopted["kept-one"] == kept
    assert not (RUN_NETNS / lost.netns).exists()
    links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout
    assert f"{harness.networks.iface_prefix}41" not in links  # lost-one's veth
    assert f"{harness.networks.iface_prefix}40" in links
    assert restarted.create("kept-one") == kept  # adopted, so create is a no-op
    restarted.destroy("kept-one")
    restarted.destroy("kept-one")  # idempotent
    assert not (RUN_NETNS / kept.netns).exists()
    assert (
        f"{harness.networks.iface_prefix}40"
        not in subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout
    )
