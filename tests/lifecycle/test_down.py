"""`sandgate down` after a server died by SIGKILL leaves no trace of it in the kernel.

What the server made is read with the operator's own tools (`ip netns`, `ip link`, `nft list
tables`, /proc/self/mountinfo, the cgroup hierarchies, /proc for its proxy child and for the runsc
processes of its gvisor sandbox), filtered to
this server's names (its instance tag, veth prefix, nft table, state dir: other servers may run
on the machine meanwhile). Before the server started none existed; after `down --sandboxes`
none may be left. Between: down refuses beside a running server, and without --sandboxes keeps
the running sandboxes with their networks and the nft table (fail closed).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandgate.lifecycle.proxy_supervisor import parent_pid
from tests.support.server import SandgateServer

pytestmark = pytest.mark.root
CGROUP_ROOT = Path("/sys/fs/cgroup")


def lines(*argv: str) -> list[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.splitlines()


def traces(server: SandgateServer) -> dict[str, set[str]]:
    """This server's objects in the kernel, as the operator's tools show them."""
    tag = (server.state_dir / "instance-tag").read_text().strip()
    state_dir = str(server.state_dir)
    cgroup_parents = [CGROUP_ROOT, *(p for p in CGROUP_ROOT.iterdir() if p.is_dir())]
    config = str(server.state_dir / "proxy.json").encode()
    return {
        "netns": {line.split()[0] for line in lines("ip", "netns", "list") if f"sg-{tag}-" in line},
        "links": {
            line.split(":")[1].strip().split("@")[0]
            for line in lines("ip", "-o", "link", "show")
            if line.split(":")[1].strip().startswith(server.iface_prefix)
        },
        "nft": {line for line in lines("nft", "list", "tables") if line.split()[-1] == server.nft_table},
        "mounts": {
            line.split()[4]
            for line in Path("/proc/self/mountinfo").read_text().splitlines()
            if line.split()[4].startswith(state_dir) or f"/sg-{tag}-" in line.split()[4]
        },
        "cgroups": {
            str(parent / name)
            for parent in cgroup_parents
            for name in os.listdir(parent)
            if name.startswith(f"sandgate-{tag}-")
        },
        "proxy": {pid for pid in os.listdir("/proc") if pid.isdigit() and config in _argv(pid)},
        "runsc": {  # a gvisor sandbox's runsc, its sandbox and gofer (their --root is in the state dir)
            pid
            for pid in os.listdir("/proc")
            if pid.isdigit() and any(arg.startswith(f"--root={state_dir}/".encode()) for arg in _argv(pid))
        },
    }


def _argv(pid: str) -> list[bytes]:
    with contextlib.suppress(OSError):
        return Path("/proc", pid, "cmdline").read_bytes().split(b"\0")
    return []


@pytest.fixture
def server(tmp_path: Path) -> Iterator[SandgateServer]:
    server = SandgateServer(tmp_path / "state")
    try:
        yield server
    finally:
        server.stop()
        server.remove_leftovers()


def test_down_after_sigkill_leaves_no_trace(server: SandgateServer) -> None:
    server.state_dir.mkdir(parents=True)
    (server.state_dir / "instance-tag").write_text(secrets.token_hex(4) + "\n")  # known before start
    before = traces(server)
    assert before == {kind: set() for kind in before}
    server.start()
    running = server.create_sandbox()["id"]
    paused = server.create_sandbox(extensions={"sandgate.isolation": "gvisor"})["id"]  # runsc's too
    with server.client() as client:
        assert client.post(f"/v1/sandboxes/{paused}/pause").status_code == 202

    refused = server.down()
    assert server.process is not None
    assert refused.returncode == 1
    assert refused.stderr.startswith(
        f"sandgate: already running, pid {server.process.pid} (state dir {server.state_dir}): stop"
    )
    assert server.run(running, "echo still here").stdout == "still here"

    server.process.send_signal(signal.SIGKILL)
    server.process.wait()
    server.process = None
    left = traces(server)
    assert len(left["netns"]) == 2 and len(left["links"]) == 2 and len(left["mounts"]) >= 4
    # The orphaned proxy child: one process the server started (with workers, a pool, whose
    # worker template and workers carry the same argv).
    [orphan] = [pid for pid in left["proxy"] if str(parent_pid(pid)) not in left["proxy"]]
    assert left["nft"] and left["cgroups"] and len(left["runsc"]) >= 3

    kept = server.down()
    assert kept.returncode == 0, kept.stderr
    assert f"stopped proxy process {orphan}" in kept.stdout
    assert "kept 2 running sandbox(es)" in kept.stdout
    now = traces(server)
    assert now["proxy"] == set()
    assert {k: v for k, v in now.items() if k != "proxy"} == {k: v for k, v in left.items() if k != "proxy"}

    removed = server.down("--sandboxes")
    assert removed.returncode == 0, removed.stderr
    assert traces(server) == before
    for name in (*left["netns"], *left["links"], *left["mounts"], *left["runsc"]):
        assert name in removed.stdout
    for sandbox_id in (running, paused):
        assert f"stopped sandbox {sandbox_id}" in removed.stdout
        assert f"removed the record of sandbox {sandbox_id}" in removed.stdout
    assert f"removed nft table inet {server.nft_table}" in removed.stdout
    assert list((server.state_dir / "sandboxes").iterdir()) == []

    again = server.down("--sandboxes")
    assert again.stdout == f"nothing to remove: no trace of a server of {server.state_dir} in the kernel\n"
