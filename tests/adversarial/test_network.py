"""Everything that is not HTTP(S) to a name: UDP and QUIC, ICMP, IPv6, the host's own services
(control plane, proxy control socket, state dir, metadata), and another sandbox."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.adversarial.conftest import (
    BOUND_HOST,
    METADATA_ADDR,
    PRIVATE_ADDR,
    TEST_RUNTIME,
    Attacker,
    Canaries,
    create_attacker,
    node_counters,
    sandbox_netns,
)
from tests.support.internet import DNS_ADDR, ORIGIN_V4, ORIGIN_V6, Internet
from tests.support.server import SandgateServer

pytestmark = pytest.mark.root

LISTENER = r"""
import socket, threading
def tcp():
    s = socket.create_server(("0.0.0.0", 7777))
    while True:
        c, p = s.accept(); open("/workspace/hits", "a").write(f"tcp {p[0]}\n")
        c.sendall(b"victim\n"); c.close()
threading.Thread(target=tcp, daemon=True).start()
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("0.0.0.0", 7777))
while True:
    d, p = u.recvfrom(2000); open("/workspace/hits", "a").write(f"udp {p[0]}\n")
"""


@pytest.fixture(scope="module")
def victim(server: SandgateServer, internet: Internet, attacker: Attacker) -> Iterator[Attacker]:
    """A second sandbox of the same server, listening on TCP and UDP 7777, recording who came."""
    victim = create_attacker(server, internet, attacker.ports)
    try:
        victim.sandbox.files.write_file("/workspace/listener.py", LISTENER)
        victim.sh("touch /workspace/hits; (python3 /workspace/listener.py >/dev/null 2>&1 &) ; sleep 0.5")
        # Positive control from the host: the victim really listens; then forget that visit.
        with socket.create_connection((victim.address, 7777), 5) as probe:
            assert probe.recv(20) == b"victim\n"
        victim.sh(": > /workspace/hits")
        yield victim
    finally:
        victim.sandbox.kill()
        victim.sandbox.close()


def test_udp_and_quic_go_nowhere(attacker: Attacker, canaries: Canaries) -> None:
    for host, port in (
        (ORIGIN_V4, 443),
        (DNS_ADDR, 5353),
        (PRIVATE_ADDR, 443),
        (METADATA_ADDR, 53 + 800),
        ("GATEWAY", 443),
    ):
        outcome = attacker.attack("udp", host=host, port=port)
        assert "reply" not in outcome, (host, port, outcome)
    assert attacker.curl("--http3-only", f"https://{BOUND_HOST}/", timeout=5).exit_code != 0
    assert [hit for hit in canaries.hits() if hit["kind"] == "udp"] == []


def test_icmp_gets_no_answer(attacker: Attacker) -> None:
    for host in (ORIGIN_V4, attacker.gateway, METADATA_ADDR):
        outcome = attacker.attack("icmp", host=host)
        assert outcome["dgram"]["reply"] is False and outcome["raw"]["reply"] is False, (host, outcome)


def test_ipv6_is_off_inside(attacker: Attacker, request: pytest.FixtureRequest) -> None:
    """IPv6 is off in the sandbox's netns, read from the host side (under gVisor, whose sockets
    are that netns's own, /proc/sys inside has no ipv6 tree); inside, the sandbox's kernel agrees,
    and an IPv6 connect gets nowhere. On Kubernetes a Pod's netns is the CNI's: its IPv6 packets,
    even to its nearest peer, the node's link-local address on the bridge, are dropped by the
    node, which counts them."""
    sysctl = "/proc/sys/net/ipv6/conf/all/disable_ipv6"
    if TEST_RUNTIME == "kubernetes":
        from tests.kubernetes.serving import bridge_link_local

        before = node_counters(request)["ipv6"]
        peer = bridge_link_local(request.getfixturevalue("kubernetes_node").netns)
        sent = attacker.attack("udp", host=f"{peer}%eth0", port=9, family="inet6")
        assert attacker.attack("raw", host=ORIGIN_V6, port=443, family="inet6")["connected"] is False
        assert "reply" not in sent and node_counters(request)["ipv6"] > before, sent
        return
    netns = Path("/run/netns", sandbox_netns(attacker.sandbox.id))
    host_side = subprocess.run(
        ["nsenter", f"--net={netns}", "--", "cat", sysctl], capture_output=True, text=True
    )
    assert host_side.stdout.strip() == "1", host_side.stderr
    inside = attacker.sh(f"cat {sysctl}")
    if attacker.isolation() == "gvisor":
        assert inside.exit_code != 0 and "No such file" in inside.stderr, inside
    else:
        assert inside.stdout.strip() == "1"
    outcome = attacker.attack("raw", host=ORIGIN_V6, port=443, family="inet6")
    assert outcome["connected"] is False


def test_the_hosts_other_services_are_out_of_reach(
    attacker: Attacker, canaries: Canaries, request: pytest.FixtureRequest
) -> None:
    """The control plane, every other port of the host (or node), the metadata and private
    addresses. On the local runtime the gateway is the host, and every TCP port there lands at
    the transparent proxy, as an IP literal (403); on Kubernetes the gateway is the node, which
    drops a Pod's packets to any of its ports but the proxy's (counted: `node_ports`), and to
    the metadata range (`metadata`) before a proxy sees them."""
    server = attacker.server
    mark = len(attacker.internet.origin_requests())
    on_a_node = TEST_RUNTIME == "kubernetes"
    before = node_counters(request) if on_a_node else {}
    # The control plane listens on the host's loopback; from the sandbox, 127.0.0.1 is its own.
    own_loopback = attacker.curl(f"http://127.0.0.1:{server.port}/health", timeout=3)
    assert own_loopback.exit_code != 0
    ports = (server.port, 22, attacker.ports.dns, 8200)
    for port in ports:
        outcome = attacker.attack(
            "raw",
            host="GATEWAY",
            port=port,
            payload=f"GET /v1/sandboxes HTTP/1.1\r\nHost: {attacker.gateway}:{port}\r\n\r\n",
        )
        if on_a_node:
            assert outcome["connected"] is False, (port, outcome)
        else:
            assert outcome.get("reply", "").startswith("HTTP/1.1 403"), (port, outcome)
    for target in (METADATA_ADDR, PRIVATE_ADDR):
        for port in (80, 443):
            outcome = attacker.attack(
                "raw",
                host=target,
                port=port,
                sni="" if port == 443 else None,
                verify=False,
                payload=f"GET /latest/meta-data/ HTTP/1.1\r\nHost: {target}\r\n\r\n",
            )
            assert not outcome.get("reply", "").startswith("HTTP/1.1 200"), (target, port, outcome)
    assert canaries.hits() == []
    assert attacker.origin_requests_since(mark) == []
    # The proxy refused what reached it: the metadata address on the host; on a node the private
    # one (the node dropped the metadata connections, and each port's, and counted them).
    refused = PRIVATE_ADDR if on_a_node else METADATA_ADDR
    records = attacker.wait_audit(lambda r: r["host"] == refused and r["kind"] == "request")
    assert records and {r["reason"] for r in records} == {"ip_literal_needs_cidr_rule"}
    if on_a_node:
        after = node_counters(request)
        assert after["node_ports"] >= before["node_ports"] + len(ports), (before, after)
        assert after["metadata"] >= before["metadata"] + 2, (before, after)


def test_the_state_dir_and_control_socket_are_not_in_the_sandbox(attacker: Attacker) -> None:
    state = attacker.server.state_dir
    listing = attacker.sh(f"ls -A {state}; ls -A {state.parent}; test -e {state}/proxy.sock && echo SOCKET")
    assert "SOCKET" not in listing.stdout
    for name in ("audit.jsonl", "proxy.sock", "vault", "sandgate.db", "mitmproxy-ca.pem", "proxy.log"):
        assert name not in listing.stdout, listing
    assert (state / "proxy.sock").exists()  # positive control: it is there on the host


def test_another_sandbox_is_unreachable(
    attacker: Attacker, victim: Attacker, request: pytest.FixtureRequest
) -> None:
    """Directly, as HTTP, through the explicit proxy, over UDP: the victim hears nothing. On the
    local runtime a connect to another sandbox lands at the transparent proxy (403); two Pods on
    one node share its bridge, which drops every frame between them (counted: `bridged`)."""
    on_a_node = TEST_RUNTIME == "kubernetes"
    before = node_counters(request) if on_a_node else {}
    direct = attacker.attack("raw", host=victim.address, port=7777, payload="hello\n")
    assert "victim" not in direct.get("reply", ""), direct
    as_http = attacker.attack(
        "raw",
        host=victim.address,
        port=7777,
        payload=f"GET / HTTP/1.1\r\nHost: {victim.address}:7777\r\n\r\n",
    )
    if on_a_node:
        assert as_http["connected"] is False, as_http
        assert node_counters(request)["bridged"] >= before["bridged"] + 2, (before, as_http)
    else:
        assert as_http["reply"].startswith("HTTP/1.1 403"), as_http
    through_proxy = attacker.attack(
        "via_proxy", target=f"{victim.address}:7777", port=attacker.ports.explicit
    )
    assert through_proxy["connect_reply"].startswith("HTTP/1.1 403")
    assert "reply" not in attacker.attack("udp", host=victim.address, port=7777)
    assert victim.sh("cat /workspace/hits").stdout == ""
    records = attacker.wait_audit(lambda r: r["host"] == victim.address and r["decision"] == "deny")
    assert records and {r["reason"] for r in records} == {"ip_literal_needs_cidr_rule"}
