"""`registry_mirror_only`: a docker.io reference is pulled from `registry_mirrors` only. Proven
from a packet counter: `sandgate image pull` of a tag the mirror lacks runs in a namespace of the
test's own whose every other packet would be routed (a default route into a veth pair that ends
there) and is counted and dropped by nftables there; only the mirror request leaves."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandgate.lifecycle.registry import DOCKER_HUB, Reference, RegistryConfig, candidates
from tests.support.netns import Netns, ip
from tests.support.registry import OPEN_PORT, Registry

pytestmark = pytest.mark.root

SANDGATE = Path(sys.executable).parent / "sandgate"
ELSEWHERE = "198.51.100.9"  # TEST-NET-2: what the default route would carry off


def test_mirror_only_candidates_never_name_docker_io() -> None:
    reference = Reference.parse("python:3.12")
    config = RegistryConfig(mirrors=("http://192.0.2.1:5000",))
    assert [c.registry for c in candidates(reference, config)] == ["192.0.2.1:5000", DOCKER_HUB]
    only = RegistryConfig(mirrors=config.mirrors, mirror_only=True)
    assert [c.registry for c in candidates(reference, only)] == ["192.0.2.1:5000"]
    assert candidates(Reference.parse("192.0.2.7:5000/a:1"), only)[0].registry == "192.0.2.7:5000"


@pytest.fixture
def counted(registry: Registry) -> Iterator[Netns]:
    """A namespace that reaches the registry, routes everything else into a veth pair of its own, and
    counts (`mirror`, `other`) the TCP and UDP it sends (a lookup, a connection; not the links'
    own neighbour discovery); `other` is dropped before it goes anywhere."""
    ns = Netns("sgmo")
    holder = ns.popen(["sleep", "600"])
    try:
        ip("link", "add", "elsewhere", "type", "veth", "peer", "name", "nowhere", netns=ns.name)
        ip("addr", "add", "198.51.100.2/24", "dev", "elsewhere", netns=ns.name)
        ip("link", "set", "elsewhere", "up", netns=ns.name)
        ip("route", "add", "default", "via", "198.51.100.1", netns=ns.name)
        rules = (
            "table inet count {\n counter mirror {}\n counter other {}\n"
            " chain out { type filter hook output priority 0; policy accept;\n"
            f"  ip daddr {registry.address} tcp dport {OPEN_PORT} counter name mirror accept\n"
            "  meta l4proto { tcp, udp } counter name other drop\n }\n}\n"
        )
        loaded = ns.run(["nft", "-f", "-"], input=rules)
        assert loaded.returncode == 0, loaded.stderr
        with registry.reachable_from(holder.pid):
            yield ns
    finally:
        holder.kill()
        holder.wait()
        ns.delete()


def packets(ns: Netns, counter: str) -> int:
    listed = ns.run(["nft", "-j", "list", "counter", "inet", "count", counter])
    assert listed.returncode == 0, listed.stderr
    items = json.loads(listed.stdout)["nftables"]
    return next(int(item["counter"]["packets"]) for item in items if "counter" in item)


def test_a_missing_tag_sends_nothing_but_the_mirror_request(
    counted: Netns, registry: Registry, tmp_path: Path
) -> None:
    # The counter can fail: a datagram to anywhere else is counted (and dropped: EPERM).
    probe = f"import socket;socket.socket(socket.AF_INET,socket.SOCK_DGRAM).sendto(b'x',('{ELSEWHERE}',53))"
    assert "Operation not permitted" in counted.run([sys.executable, "-c", probe]).stderr
    assert packets(counted, "other") == 1

    log = registry.workdir / "registry.log"
    mark = log.stat().st_size
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "SANDGATE_STATE_DIR": str(tmp_path / "state"),
        "SANDGATE_REGISTRY_MIRRORS": registry.mirror,
        "SANDGATE_REGISTRY_MIRROR_ONLY": "true",
        "SANDGATE_IMAGE_PULL_TIMEOUT": "30",
    }
    pulled = counted.run([str(SANDGATE), "image", "pull", "python:0.0-absent"], env=env, timeout=120)
    assert pulled.returncode == 2, pulled.stdout + pulled.stderr
    assert "was not found at registry " + registry.open in pulled.stderr, pulled.stderr
    assert f"from the mirror(s) {registry.open} only, never from docker.io" in pulled.stderr
    assert packets(counted, "mirror") > 0
    assert packets(counted, "other") == 1, "the pull sent a packet elsewhere than the mirror"
    with log.open("rb") as handle:
        handle.seek(mark)
        asked = handle.read().decode(errors="replace")
    assert "/v2/library/python/manifests/0.0-absent" in asked


def test_mirror_only_without_mirrors_is_refused_at_start(tmp_path: Path) -> None:
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "SANDGATE_STATE_DIR": str(tmp_path / "state"),
           "SANDGATE_REGISTRY_MIRROR_ONLY": "true"}  # fmt: skip
    refused = subprocess.run([str(SANDGATE), "image", "list"], env=env, capture_output=True, text=True)
    assert refused.returncode != 0
    assert "registry_mirror_only is set but registry_mirrors is empty" in refused.stderr
