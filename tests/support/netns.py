"""Named network namespaces for tests: create, run in, and always clean up.

Names are global (/run/netns), so each carries a random suffix. `nsenter --net=...` is used to
run inside one rather than `ip netns exec`, which remounts /sys and hides the cgroup tree.
"""

from __future__ import annotations

import contextlib
import secrets
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path


def unique(prefix: str) -> str:
    """A name that is free on this machine; interface names must stay within 15 characters."""
    return f"{prefix}{secrets.token_hex(3)}"


def ip(*args: str, netns: str | None = None) -> None:
    cmd = ["ip", *(["-n", netns] if netns else []), *args]
    subprocess.run(cmd, check=True, capture_output=True, text=True)


class Netns:
    """One named namespace with lo up; `cmd()` builds a command line that runs inside it."""

    def __init__(self, prefix: str = "sgt") -> None:
        self.name = unique(prefix + "-")
        ip("netns", "add", self.name)
        ip("link", "set", "lo", "up", netns=self.name)

    @property
    def path(self) -> Path:
        return Path("/run/netns") / self.name

    def cmd(self, argv: Sequence[str]) -> list[str]:
        return ["nsenter", f"--net={self.path}", "--", *argv]

    def run(self, argv: Sequence[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.cmd(argv), capture_output=True, text=True, **kwargs)  # type: ignore[call-overload,no-any-return]

    def popen(self, argv: Sequence[str], **kwargs: object) -> subprocess.Popen[bytes]:
        return subprocess.Popen(self.cmd(argv), **kwargs)  # type: ignore[call-overload,no-any-return]

    def delete(self) -> None:
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)


def veth_to_host(ns: Netns, host_addr: str, ns_addr: str, prefixlen: int) -> str:
    """A veth between the current (host) namespace and `ns`; returns the host-side name."""
    host_if = unique("tv")
    ip("link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", ns.name)
    ip("addr", "add", f"{host_addr}/{prefixlen}", "dev", host_if)
    ip("link", "set", host_if, "up")
    ip("addr", "add", f"{ns_addr}/{prefixlen}", "dev", "eth0", netns=ns.name)
    ip("link", "set", "eth0", "up", netns=ns.name)
    return host_if


@contextlib.contextmanager
def netns(prefix: str = "sgt") -> Iterator[Netns]:
    ns = Netns(prefix)
    try:
        yield ns
    finally:
        ns.delete()
