"""A sandbox's own filesystem (docs/runtime.md, "Caps"): what it adds to a create and a delete,
and what it costs to write through it, measured through the HTTP API (root).

Runs as root in a network namespace of its own (re-executed after unshare), with two real
`sandgate serve`s (tests.support.server): one with the default `sandbox_disk` (2 GiB), one with
`sandbox_disk = "0"` (no filesystem of its own: the upper layer is a directory in the state dir).
RUNS creates and deletes on each, interleaved (`POST /v1/sandboxes` until its 202, `DELETE`);
then WRITE_MIB written with fsync (`dd ... conv=fsync`, its own timing) inside a sandbox of each
server, and from the host straight into the state dir, in MB/s.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path

from bench import sized
from bench.sandbox_rig import create_timed, delete_timed, enter_own_netns, row, run_as_root_child

RUNS = sized(30, 2)
WRITE_MIB = sized(256, 16)
CHILD_FLAG = "SANDGATE_BENCH_SANDBOX_DISK_CHILD"
BODY = {"image": {"uri": "sandgate/host"}, "entrypoint": ["sleep", "3600"], "resourceLimits": {}}
DD = f"dd if=/dev/zero of={{path}} bs=1M count={WRITE_MIB} conv=fsync 2>&1; rm -f {{path}}"
DD_RATE = re.compile(r"(\d+) bytes .* copied, ([\d.]+) s")


def main() -> None:
    run_as_root_child("bench.bench_sandbox_disk", CHILD_FLAG, "netns, loop devices, mounts")


def _write_mb_s(dd_output: str) -> float:
    found = DD_RATE.search(dd_output)
    if not found:
        raise RuntimeError(f"dd did not report its rate: {dd_output}")
    return int(found.group(1)) / float(found.group(2)) / 1e6


def _child() -> None:
    enter_own_netns()
    from tests.support.server import sandgate_server

    with tempfile.TemporaryDirectory(prefix="sandgate-bench-disk-") as temp:
        for name in ("disk", "none"):
            (Path(temp) / name).mkdir()
        with (
            sandgate_server(Path(temp) / "disk") as disk,
            sandgate_server(Path(temp) / "none", {"SANDGATE_SANDBOX_DISK": "0"}) as none,
        ):
            servers = {"own filesystem (2 GiB)": disk, "no filesystem of its own": none}
            creates: dict[str, list[float]] = {label: [] for label in servers}
            deletes: dict[str, list[float]] = {label: [] for label in servers}
            for _ in range(RUNS):
                for label, server in servers.items():
                    created, took = create_timed(server, BODY)
                    creates[label].append(took)
                    deletes[label].append(delete_timed(server, created["id"]))
            writes = {}
            for label, server in servers.items():
                created, _ = create_timed(server, BODY)
                done = server.run(created["id"], DD.format(path="/workspace/bench.data"), timeout=300)
                writes[label] = _write_mb_s(done.stdout)
                delete_timed(server, created["id"])
            command = DD.format(path=disk.state_dir / "bench.data")
            host = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=300)
            writes["host, straight into the state dir"] = _write_mb_s(host.stdout)
    print(f"{RUNS} sandboxes per server through the API, interleaved, load average {os.getloadavg()[0]:.1f}:")
    for label in servers:
        row(f"create, {label}", creates[label])
        row(f"delete, {label}", deletes[label])
    print(f"write {WRITE_MIB} MiB + fsync (dd):")
    for label, rate in writes.items():
        print(f"  {label:<36} {rate:7.0f} MB/s")


if __name__ == "__main__" and os.environ.get(CHILD_FLAG) == "1":
    _child()
